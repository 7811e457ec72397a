"""C kernels for reductions, constant padding, average pooling and upsampling: edge cases against the interpreter."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import kiln
import kiln.nn.functional as F
from kiln.frontend.tensor import dispatch as call
from kiln.compiler import compile as compile_c
from tests.modules import LambdaModule
from tests.runtime.test_c_backend import _check

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
aten = kiln.ops.aten


def _compare(fn, shape, tmp_path, sizes=(1, 2, 5), nan_fraction=0.0, transform=None):
    """Export `fn` with a dynamic dim 0, compile it, and compare with the interpreter at each batch size."""
    batch = kiln.Dim("batch", max=64)
    example = kiln.randn(3, *shape[1:])
    program = kiln.export(LambdaModule(fn), (example,), dynamic_shapes=({0: batch},))
    compiled = compile_c(program, output=tmp_path / "model")
    for n in sizes:
        rng = np.random.default_rng(n)
        x = rng.standard_normal((n, *shape[1:])).astype(np.float32)
        if nan_fraction:
            x[rng.random(x.shape) < nan_fraction] = np.nan
        if transform is not None:
            x = transform(x, rng)
        _check(compiled(x), program(x))
    return (tmp_path / "model" / "model.c").read_text()


# ---------------------------------------------------------------------------------------------
# Reductions

@pytest.mark.parametrize("nan_fraction", [0.0, 0.05])
def test_extrema_and_indices(nan_fraction, tmp_path):
    def fn(x):
        return (call(aten.amin.default, x, [-1], True), call(aten.amin.default, x, [0, 2]),
                call(aten.argmax.default, x, -1), call(aten.argmin.default, x, 1, True), call(aten.argmax.default, x),
                *call(aten.max.dim, x, -2), *call(aten.min.dim, x, 2, True))
    source = _compare(fn, (None, 4, 7), tmp_path, nan_fraction=nan_fraction)
    assert "aten.argmax.default" in source and "aten.min.dim" in source


def test_nan_rules_of_argmax_and_argmin(tmp_path):
    def fn(x):
        return (call(aten.argmax.default, x, 1), call(aten.argmin.default, x, 1), call(aten.amin.default, x, [1]),
                *call(aten.max.dim, x, 1))

    def rows(x, rng):
        x[:, 2] = np.nan  # every row: the first NaN wins over later NaNs and over inf
        x[:, 5] = np.nan
        x[:, 0] = np.inf
        x[:, 1] = -np.inf
        x[0] = 1.0  # ties: the first occurrence
        return x
    _compare(fn, (None, 8), tmp_path, transform=rows)


def test_reductions_over_several_dims(tmp_path):
    def fn(x):
        return (call(aten.sum.dim_IntList, x, [1, 2]),  # adjacent: one merged row
                call(aten.mean.dim, x, [0, 2], True),  # not adjacent: reduced dims copied last
                call(aten.sum.dim_IntList, x, []),  # every dim
                call(aten.mean.default, x),
                call(aten.var.correction, x, [-1, 1], correction=0, keepdim=True),
                call(aten.var.correction, x, None, correction=2.5),
                call(aten.var.correction, x, [0]))
    _compare(fn, (None, 5, 6), tmp_path, sizes=(1, 3, 8))


def test_reductions_of_strided_views(tmp_path):
    def fn(x):
        t = call(aten.permute.default, x, [0, 2, 1])  # [n, 6, 5] with strides (30, 1, 6)
        s = call(aten.slice.Tensor, x, 1, 1, 4, 1)  # an offset view whose trailing dims still chain
        return (call(aten.sum.dim_IntList, t, [1, 2]), call(aten.amin.default, t, [2]),
                call(aten.var.correction, s, [1, 2]), call(aten.argmax.default, t, 1), call(aten.prod.dim_int, t, 0))
    _compare(fn, (None, 5, 6), tmp_path, transform=lambda x, rng: (0.5 + rng.random(x.shape)).astype(np.float32))


def test_reductions_of_fused_producers(tmp_path):
    def fn(x):
        y = x * 2.0 - 1.0
        return call(aten.argmax.default, y, -1), call(aten.amin.default, y, [-1]), call(aten.sum.dim_IntList, y, [1, 2])
    source = _compare(fn, (None, 4, 9), tmp_path)
    assert "aten.mul.Scalar" in source


def test_any_and_prod(tmp_path):
    def fn(x):
        mask = call(aten.gt.Scalar, x, 0.8)
        return (call(aten.any.dim, x, 1), call(aten.any.dims, mask, [1, 2], True), call(aten.any.default, mask),
                call(aten.any.dims, x, []), call(aten.prod.dim_int, x, -1, True))

    def with_zeros(x, rng):
        x[rng.random(x.shape) < 0.5] = 0.0
        x[0, 0] = np.nan  # NaN is true
        return x
    _compare(fn, (None, 3, 4), tmp_path, transform=with_zeros)


# ---------------------------------------------------------------------------------------------
# constant_pad_nd

@pytest.mark.parametrize("pad,value", [([1, 2], 0.0), ([2, 0, 1, 1], -1.5), ([-1, 2, 1, -2], 3.0),
                                       ([-2, -1, -1, 0, 1, 1], float("-inf")), ([0, 0, 0, 0, 0, 0, 2, 1], 7.0)])
def test_constant_pad_nd(pad, value, tmp_path):
    source = _compare(lambda x: call(aten.constant_pad_nd.default, x, pad, value), (None, 4, 5, 6), tmp_path)
    assert "constant_pad_nd" in source


def test_constant_pad_nd_of_integers_and_bools(tmp_path):
    def fn(x):
        return (call(aten.constant_pad_nd.default, call(aten.gt.Scalar, x, 0.0), [1, -1], True),
                call(aten.constant_pad_nd.default, call(aten.argmax.default, x, 2, True), [0, 2, -1, 1], -7))
    _compare(fn, (None, 3, 4), tmp_path)


# ---------------------------------------------------------------------------------------------
# Average pooling and upsampling

@pytest.mark.parametrize("config", [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1),
                                    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
                                    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
                                    dict(kernel_size=(2, 3), stride=(1, 2), padding=(1, 0), divisor_override=5)])
def test_avg_pool2d(config, tmp_path):
    source = _compare(lambda x: F.avg_pool2d(x, **config), (None, 3, 9, 8), tmp_path, nan_fraction=0.01)
    assert "aten.avg_pool2d.default" in source


def _max_pool3d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """kiln.nn.functional has no max_pool3d: its values through the ATen op."""
    return call(aten.max_pool3d_with_indices.default, x, [kernel_size] * 3, [stride or kernel_size] * 3,
                [padding] * 3, [dilation] * 3, ceil_mode)[0]


@pytest.mark.parametrize("pool,shape", [(F.max_pool1d, (None, 3, 11)), (F.max_pool2d, (None, 3, 9, 8)),
                                        (_max_pool3d, (None, 2, 5, 7, 6))], ids=["1d", "2d", "3d"])
@pytest.mark.parametrize("config", [dict(kernel_size=2), dict(kernel_size=3, stride=2, ceil_mode=True),
                                    dict(kernel_size=3, stride=2, padding=1),
                                    dict(kernel_size=3, stride=2, padding=1, dilation=2, ceil_mode=True),
                                    dict(kernel_size=3, stride=1, padding=1), dict(kernel_size=5, stride=3, padding=2),
                                    dict(kernel_size=2, stride=2, padding=1, ceil_mode=True)])
def test_max_pool_values_only_keeps_the_nan_rule(pool, shape, config, tmp_path):
    """Pooled values without their indices (nothing reads them) have loops of their own (per output without
    padding; with it, per row from the window's tap rows split into their column-stride phases, the padding as
    -inf); a NaN in a window still wins and an all -inf window gives -inf, as in ATen."""
    def with_specials(x, rng):
        x[rng.random(x.shape) < 0.1] = -np.inf
        return x
    source = _compare(lambda x: pool(x, **config), shape, tmp_path, nan_fraction=0.03, transform=with_specials)
    assert "max_pool" in source and "best_index" not in source
    assert ("phases" in source) == bool(config.get("padding"))


@pytest.mark.parametrize("args", [([2, 2, 2], [], [0, 0, 0], False, True, None),
                                  ([3, 2, 3], [2, 1, 2], [1, 0, 1], True, False, None),
                                  ([3, 3, 3], [2, 2, 2], [1, 1, 1], True, True, 11)])
def test_avg_pool3d(args, tmp_path):
    _compare(lambda x: call(aten.avg_pool3d.default, x, *args), (None, 2, 5, 6, 7), tmp_path)


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("resize", [dict(size=(11, 7)), dict(size=(3, 2)), dict(scale_factor=(1.7, 2.5)),
                                    dict(size=(8, 5))])
def test_upsample_bilinear(align_corners, resize, tmp_path):
    fn = lambda x: F.interpolate(x, mode="bilinear", align_corners=align_corners, **resize)  # noqa: E731
    source = _compare(fn, (None, 2, 4, 5), tmp_path, nan_fraction=0.0)
    assert "aten.upsample_bilinear2d.vec" in source


@pytest.mark.parametrize("resize", [dict(size=(8, 10)), dict(size=(3, 11)), dict(scale_factor=(3.0, 2.5)),
                                    dict(scale_factor=(1.7, 0.6))])
def test_upsample_nearest(resize, tmp_path):
    _compare(lambda x: F.interpolate(x, mode="nearest", **resize), (None, 2, 4, 5), tmp_path)
