"""Depthwise convolutions in C against the reference interpreter, in both of their forms: conv._conv_depthwise (rows
of a stencil over each (image, group)'s padded input plane) and conv._conv_depthwise_flat (narrow images: one loop
over the flattened output image, reading the input in place at stride 1, else its stride's phase planes). Kernel
sizes, strides, dilation, padding, channel multipliers, rows as narrow as one vector or wider than several, rows
left over after the multi-row passes, fused epilogues, symbolic sizes, non-finite inputs beside the padding, and
every capability's vector width."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import kiln
from kiln.compiler import compile as compile_c
from tests.modules import LambdaModule
from tests.runtime.support import use_capability
from kiln.codegen.c.conv import (FLAT_DEPTHWISE_NARROW, FLAT_DEPTHWISE_STRIDED_WIDTH, FLAT_DEPTHWISE_TAPS,
                                 FLAT_DEPTHWISE_WIDTH, FLAT_MARK, ROWS_MARK)
from tests.runtime.test_c_backend import _check

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
F = kiln.nn.functional
STENCIL = "/* depthwise convolution: "  # model.c's marker of either form


def _form(config, size) -> str:
    """The flat form for narrow output images (narrower still for more than 3x3 taps) at stride 1 with 'same' padding,
    or strided where each stride phase of an input row fits an output row; else the rows' form."""
    kernel, stride, padding, dilation = (v if isinstance(v, tuple) else (v, v) for v in config[:4])
    out = [(n + 2 * p - d * (k - 1) - 1) // s + 1 for n, p, d, k, s in zip(size, padding, dilation, kernel, stride)]
    narrow = out[1] <= FLAT_DEPTHWISE_NARROW or (kernel[0] * kernel[1] <= FLAT_DEPTHWISE_TAPS
                                                  and out[1] < FLAT_DEPTHWISE_WIDTH)
    if stride == (1, 1):
        flat = narrow and out == list(size)
    else:
        flat = narrow and out[1] <= FLAT_DEPTHWISE_STRIDED_WIDTH and -(-size[1] // stride[1]) <= out[1]
    return FLAT_MARK if flat else ROWS_MARK


def _compare(module, shape, tmp_path, batches=(1, 3)):
    """Export `module` with a dynamic batch, compile it, compare with the interpreter at each batch size; returns
    model.c."""
    program = kiln.export(module.eval(), (kiln.randn(2, *shape[1:]),),
                          dynamic_shapes=({0: kiln.Dim("batch", max=8)},))
    compiled = compile_c(program, output=tmp_path / "model")
    for n in batches:
        x = np.random.default_rng(n).standard_normal((n, *shape[1:])).astype(np.float32)
        _check(compiled(x), program(x))
    return (tmp_path / "model" / "model.c").read_text()


# (kernel, stride, padding, dilation, bias): MobileNet's 3x3, EfficientNet's strided 5x5, ConvNeXt's 7x7, and
# rectangular / dilated / strided-in-one-dim windows whose column stride splits the rows into phases
CONFIGS = {
    "3x3": (3, 1, 1, 1, True),
    "5x5 stride 2": (5, 2, 2, 1, True),
    "7x7": (7, 1, 3, 1, True),
    "3x5 no padding": ((3, 5), 1, 0, 1, False),
    "dilated, strided columns": (3, (1, 2), (2, 1), (2, 1), True),
    "strided rows": ((5, 3), (2, 1), (2, 0), 1, True),
}
# (height, width): a row narrower than one vector (and a plane smaller than a pass of rows), rows left over after
# the passes, and rows of several vectors with a partial last one
# stride 1, 'same' padding: the flat form on narrow images
FLAT_CONFIGS = {
    "3x3 dilated": (3, 1, 2, 2, True),
    "3x5": ((3, 5), 1, (1, 2), 1, False),
    "5x5 dilated rows": (5, (1, 1), (4, 2), (2, 1), True),
}
SIZES = [(5, 7), (14, 9), (23, 40), (3, 70)]


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("config", [*CONFIGS, *FLAT_CONFIGS])
def test_depthwise_conv2d(config, size, tmp_path):
    kernel, stride, padding, dilation, bias = CONFIGS.get(config) or FLAT_CONFIGS[config]
    conv = kiln.nn.Conv2d(6, 6, kernel, stride=stride, padding=padding, dilation=dilation, groups=6, bias=bias)
    source = _compare(conv, (None, 6, *size), tmp_path)
    assert _form((kernel, stride, padding, dilation, bias), size) in source


def test_depthwise_flat_with_an_even_kernel(tmp_path):
    """padding='same' with an even kernel pads one less before than after (ATen's split): the flat form's taps reach
    further past the image's end than before its start."""
    conv = kiln.nn.Conv2d(4, 4, 4, padding="same", groups=4)
    assert FLAT_MARK in _compare(conv, (None, 4, 6, 8), tmp_path)


@pytest.mark.parametrize("capability", ["DEFAULT", "AVX2", "AVX512"])
@pytest.mark.parametrize("config", ["3x3", "dilated, strided columns"])
def test_depthwise_at_every_capability(capability, config, monkeypatch, tmp_path):
    """4, 8 and 16 columns per vector: each ISA's kiln_store_lanes (memcpy, a masked AVX2 store, an AVX-512 mask) in
    the rows' form, each ISA's vectorized loop over flat pixels in the flat one (3x3 at stride 1)."""
    use_capability(capability, monkeypatch)
    kernel, stride, padding, dilation, bias = CONFIGS[config]
    conv = kiln.nn.Conv2d(4, 4, kernel, stride=stride, padding=padding, dilation=dilation, groups=4, bias=bias)
    for size in [(6, 3), (11, 21), (9, 67)]:
        source = _compare(conv, (None, 4, *size), tmp_path / f"{size}")
        assert _form(CONFIGS[config], size) in source


@pytest.mark.parametrize("stride, width, form", [(1, 18, FLAT_MARK), (2, 18, FLAT_MARK), (1, 70, ROWS_MARK)])
def test_depthwise_channel_multiplier(stride, width, form, tmp_path):
    """Each group's plane (or input image, or its phase planes, in the flat form) serves its output channels (here
    three per input channel)."""
    conv = kiln.nn.Conv2d(4, 12, 3, padding=1, stride=stride, groups=4)
    assert form in _compare(conv, (None, 4, 9, width), tmp_path)


@pytest.mark.parametrize("config", [dict(kernel_size=5, padding=2), dict(kernel_size=3, stride=2, dilation=3)])
def test_depthwise_conv1d(config, tmp_path):
    conv = kiln.nn.Conv1d(5, 5, groups=5, **config)
    for length in (9, 50):
        assert STENCIL in _compare(conv, (None, 5, length), tmp_path / f"{length}")


def test_depthwise_with_symbolic_image_sizes(tmp_path):
    """Height and width known only at run time: the rows left over after the passes go one at a time."""
    conv = kiln.nn.Conv2d(3, 3, 3, stride=1, padding=1, groups=3).eval()
    height, width = kiln.Dim("height", min=2, max=64), kiln.Dim("width", min=2, max=64)
    program = kiln.export(conv, (kiln.randn(1, 3, 10, 12),), dynamic_shapes={"input": {2: height, 3: width}})
    compiled = compile_c(program, output=tmp_path / "model")
    assert ROWS_MARK in (tmp_path / "model" / "model.c").read_text()  # the flat form wants a known width
    for size in [(2, 2), (7, 15), (13, 17), (30, 33)]:
        x = np.random.default_rng(size[0]).standard_normal((1, 3, *size)).astype(np.float32)
        _check(compiled(x), program(x))


def test_depthwise_fused_epilogues(tmp_path):
    """Batch norm, ReLU6 and a residual add fuse into the stencil (flat pixels); a residual read through a transposed
    view makes the epilogue index by (row, column) instead. Both forms: 11x11 images take the flat one, 70x70 the
    rows'."""
    conv, norm = kiln.nn.Conv2d(8, 8, 3, padding=1, groups=8), kiln.nn.BatchNorm2d(8).eval()
    norm.running_mean = kiln.randn(8) * 0.1
    norm.running_var = kiln.rand(8) + 0.5

    def fn(x):
        y = F.relu6(norm(conv(x)))
        return y + x, conv(x) + x.transpose(2, 3)
    for width, form in [(11, FLAT_MARK), (70, ROWS_MARK)]:  # square: the residual adds a transpose
        source = _compare(LambdaModule(fn), (None, 8, width, width), tmp_path / str(width))
        assert source.count(form) >= 2


@pytest.mark.parametrize("stride, width, form", [(1, 5, FLAT_MARK), (2, 5, FLAT_MARK), (1, 70, ROWS_MARK)])
def test_depthwise_with_nonfinite_inputs(stride, width, form, tmp_path):
    """A NaN or an infinity in the input reaches exactly the outputs whose windows hold it: the rows' form computes
    lanes past a row's end from other rows and never stores them; the flat form's taps past a row's edge read the
    neighbouring row's NaN or infinity, and zero it (an infinity times the zero it must be would be NaN)."""
    conv = kiln.nn.Conv2d(2, 2, 3, padding=1, stride=stride, groups=2, bias=False).eval()
    program = kiln.export(conv, (kiln.randn(1, 2, 6, width),))
    compiled = compile_c(program, output=tmp_path / "model")
    assert form in (tmp_path / "model" / "model.c").read_text()
    x = np.random.default_rng(0).standard_normal((1, 2, 6, width)).astype(np.float32)
    x[0, 0, 2, 4], x[0, 0, 3, 0], x[0, 1, 5, 0], x[0, 1, 0, 4] = np.nan, np.inf, np.inf, -np.inf
    got, expected = compiled(x), np.asarray(program(x))
    _check(got, expected)
    if (stride, width) == (1, 5):
        assert np.isnan(got[0, 0, 1:4, 3:5]).all() and np.isnan(got[0, 0]).sum() == 6
        assert np.isinf(got[0, 0, 2:5, 0:2]).all() and np.isinf(got[0, 0]).sum() == 6


def test_a_zero_pad_feeding_a_convolution_is_never_made(tmp_path):
    """TF-style 'same' padding at stride 2 pads (0, 1) per dim, which no convolution padding says: the convolution
    (depthwise or not) reads the unpadded input with its leading padding grown, and the trailing zeros are where its
    output stops. A pad read by anything else, with another fill or cropping stays a pad kernel."""
    depthwise, dense = kiln.nn.Conv2d(4, 4, 3, stride=2, groups=4), kiln.nn.Conv2d(4, 6, 3, stride=2, padding=1)

    def fn(x):
        shared = F.pad(x, (1, 0, 0, 2))
        return (depthwise(F.pad(x, (0, 1, 0, 1))), dense(F.pad(x, (2, 1, 0, 3))), depthwise(shared) * 2,
                shared.sum(), depthwise(F.pad(x, (0, 1, 0, 1), value=0.5)), dense(F.pad(x, (-1, 2, 1, 1))))
    source = _compare(LambdaModule(fn), (None, 4, 10, 9), tmp_path)
    assert source.count("/* pad: aten.constant_pad_nd.default */") == 3
