"""Argument forms the C kernels do not take, rewritten into forms they do before compiling (kiln/codegen/legalize.py):
layer norm over several trailing dims, torch's training-IR batch norm, sum / mean / prod / cumsum with dtype=,
and softmax, log_softmax and cumsum of a 0-d tensor. The differential fuzzer found them refused (its summary's
"refused most"); each now compiles and matches the interpreter, and the forms the kernels take compile unchanged."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import kiln
from kiln.codegen.legalize import NEEDED
from kiln.ir import dtypes
from kiln.compiler import compile as compile_c
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.runtime.test_c_backend import _check

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")

aten = ops.aten
RNG = np.random.default_rng(0)


def _floats(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _ints(*shape, dtype=np.int32):
    return RNG.integers(-2 ** 20, 2 ** 20, shape).astype(dtype)  # sums past int32 wrap, as ATen's do


# name -> (the ops on the inputs, the inputs)
CASES = {
    "layer norm over C, H, W": (
        lambda x, w, b: aten.native_layer_norm.default(x, [3, 4, 5], w, b, 1e-5),
        [_floats(2, 3, 4, 5), _floats(3, 4, 5), _floats(3, 4, 5)]),
    "layer norm over two of three dims, no affine": (
        lambda x: aten.native_layer_norm.default(x, [4, 6], None, None, 1e-3),
        [_floats(5, 4, 6) * 100]),
    "training batch norm": (
        lambda x, w, b, mean, var: aten._native_batch_norm_legit.default(x, w, b, mean, var, True, 0.1, 1e-5),
        [_floats(2, 3, 4, 4), _floats(3), _floats(3), _floats(3), np.abs(_floats(3)) + 0.5]),
    "batch norm on running statistics": (
        lambda x, w, b, mean, var: aten._native_batch_norm_legit.default(x, w, b, mean, var, False, 0.1, 1e-5)[0],
        [_floats(2, 3, 4, 4), _floats(3), _floats(3), _floats(3), np.abs(_floats(3)) + 0.5]),
    "sum in float64": (lambda x: aten.sum.dim_IntList(x, [1], dtype=kiln.float64), [_floats(3, 7)]),
    "sum of int32 in int32": (lambda x: aten.sum.dim_IntList(x, [0], True, dtype=kiln.int32), [_ints(3000, 3)]),
    "mean of int64 in float32": (lambda x: aten.mean.dim(x, [1], dtype=kiln.float32),
                                 [_ints(4, 9, dtype=np.int64)]),
    "mean of everything in float64": (lambda x: aten.mean.default(x, dtype=kiln.float64), [_floats(5, 6)]),
    "prod in float64": (lambda x: aten.prod.dim_int(x, 1, dtype=kiln.float64), [_floats(3, 5)]),
    "prod of everything of int32 in int64": (lambda x: aten.prod.default(x, dtype=kiln.int64),
                                             [RNG.integers(-3, 4, (2, 3)).astype(np.int32)]),
    "cumsum of float32 in float64": (lambda x: aten.cumsum.default(x, 1, dtype=kiln.float64), [_floats(3, 8)]),
    "cumsum of float32 in int32": (lambda x: aten.cumsum.default(x, 0, dtype=kiln.int32), [_floats(6, 2) * 10]),
    "cumsum of a 0-d tensor": (lambda x: aten.cumsum.default(x, 0), [_floats()]),
    "softmax of a 0-d tensor": (lambda x: aten._softmax.default(x, -1, False),
                                [np.array([1.5, np.inf, -np.inf, np.nan], np.float32)]),
    "log_softmax of a 0-d tensor": (lambda x: aten._log_softmax.default(x, 0, False), [_floats()]),
}


def _program(build, inputs):
    builder = GraphBuilder()
    args = [builder.add_input(f"x{k}", TensorType.of(list(a.shape), dtypes.dtype(a.dtype))) for k, a in
            enumerate(inputs)]
    with builder:
        result = build(*args)
    return builder.build(list(result) if isinstance(result, (tuple, list)) else [result])


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_rewritten_form_compiles_and_matches_the_interpreter(name, tmp_path):
    build, inputs = CASES[name]
    if name == "softmax of a 0-d tensor":  # one 0-d value at a time: finite, +inf and -inf (NaN), NaN
        for value in inputs[0]:
            program = _program(build, [np.array(value)])
            _check(compile_c(program, output=tmp_path / f"{value}")(np.array(value)), program(np.array(value)))
        return
    program = _program(build, inputs)
    _check(compile_c(program, output=tmp_path / "model")(*inputs), program(*inputs))


def test_layer_norm_over_several_dims_with_a_symbolic_batch(tmp_path):
    class Norm(kiln.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = kiln.nn.LayerNorm([3, 4])

        def forward(self, x):
            return self.norm(x).relu()
    program = kiln.export(Norm(), (kiln.randn(2, 5, 3, 4),), dynamic_shapes=({0: kiln.Dim("batch", max=8)},))
    compiled = compile_c(program, output=tmp_path / "model")
    for batch in (1, 3, 8):
        x = _floats(batch, 5, 3, 4)
        _check(compiled(x), program(x))


@pytest.mark.parametrize("op, args, kwargs, rewritten", [
    (aten.native_layer_norm.default, ([4], None, None, 1e-5), {}, False),  # over the last dim: the kernel's own
    (aten.native_layer_norm.default, ([3, 4], None, None, 1e-5), {}, True),
    (aten.sum.dim_IntList, ([0],), {}, False),
    (aten.sum.dim_IntList, ([0],), {"dtype": kiln.float64}, True),
    (aten.sum.dim_IntList, ([0],), {"dtype": kiln.bool}, False),  # refused, as before
    (aten.cumsum.default, (1,), {}, False),
    (aten.cumsum.default, (1,), {"dtype": kiln.float32}, False),  # its own dtype: the kernel's
    (aten.cumsum.default, (1,), {"dtype": kiln.float64}, True),
])
def test_only_the_forms_the_kernels_refuse_are_rewritten(op, args, kwargs, rewritten):
    builder = GraphBuilder()
    x = builder.add_input("x", TensorType.of([3, 4], kiln.float32))
    with builder:
        result = op(x, *args, **kwargs)
    program = builder.build(list(result) if isinstance(result, (tuple, list)) else [result])
    node = next(o for o in program.nodes() if o.name == op.name)
    assert NEEDED[op.name](node) is rewritten
