"""Activations that read their input twice (SiLU's x * sigmoid(x), hardswish, x * x) fuse into the epilogue of the
GEMM or convolution that produces x (schedule._activation_of), and into a cheap pointwise producer; anything else
that reads x keeps x in its own buffer. Numerics against the reference interpreter."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

import kiln
from kiln.compiler import compile as compile_c
from tests.modules import LambdaModule
from tests.runtime.test_c_backend import _check

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
F = kiln.nn.functional


def _kernels(fn, *shapes, tmp_path):
    """Compile `fn` (a dynamic batch), check it against the interpreter at two batch sizes; the kinds and ops of
    its kernels, as model.c's comments list them."""
    examples = tuple(kiln.randn(2, *shape) for shape in shapes)
    batch = kiln.Dim("batch", max=8)
    program = kiln.export(LambdaModule(fn).eval(), examples, dynamic_shapes=tuple({0: batch} for _ in shapes))
    compiled = compile_c(program, output=tmp_path / "model")
    for n in (1, 3):
        args = [np.random.default_rng(n + i).standard_normal((n, *shape)).astype(np.float32)
                for i, shape in enumerate(shapes)]
        _check(compiled(*args), program(*args))
    source = (tmp_path / "model" / "model.c").read_text()
    return re.findall(r"/\* (\w+): ([^*]*) \*/\nstatic void kernel_", source)


def test_silu_fuses_into_the_convolution(tmp_path):
    conv = kiln.nn.Conv2d(3, 8, 3, padding=1)
    kernels = _kernels(lambda x: F.silu(conv(x)), (3, 6, 7), tmp_path=tmp_path)
    assert kernels == [("conv", "aten.convolution.default, aten.sigmoid.default, aten.mul.Tensor")]


def test_hardswish_and_a_square_fuse_into_the_gemm(tmp_path):
    """hardswish decomposes to x * clamp(x + 3, 0, 6) / 6: a chain of three ops between the two reads of x."""
    first, second = kiln.nn.Linear(5, 6), kiln.nn.Linear(6, 4)
    def fn(x):
        y = second(F.hardswish(first(x)))
        return y * y
    kernels = _kernels(fn, (5,), tmp_path=tmp_path)
    assert kernels == [("matmul", "aten.addmm.default, aten.add.Scalar, aten.hardtanh.default, aten.mul.Tensor, "
                                  "aten.div.Scalar"),
                       ("matmul", "aten.addmm.default, aten.mul.Tensor")]


def test_silu_of_a_cheap_pointwise_producer_fuses(tmp_path):
    kernels = _kernels(lambda x: F.silu(x * 2.0 + 1.0), (4, 5), tmp_path=tmp_path)
    assert [kind for kind, _ in kernels] == ["pointwise"]


def test_what_else_reads_x_keeps_it_in_a_buffer(tmp_path):
    """x also returned, an activation that reads another tensor, and an expensive producer (exp, which fusing would
    compute twice): each keeps x materialized, and every result still matches."""
    conv = kiln.nn.Conv2d(3, 4, 1)

    def fn(x, y):
        a = conv(x)
        b = conv(y)
        e = (x * 0.5).exp()
        return a, F.silu(a), b * (b + y[:, :1]).sigmoid(), e * e.sigmoid()
    kernels = _kernels(fn, (3, 5, 5), (3, 5, 5), tmp_path=tmp_path)
    convolutions = [ops for kind, ops in kernels if kind == "conv"]
    assert convolutions == ["aten.convolution.default"] * 2  # neither takes an activation in
    assert sum(kind == "pointwise" for kind, _ in kernels) >= 4
