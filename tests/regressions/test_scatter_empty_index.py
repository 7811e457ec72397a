"""scatter and scatter_reduce with an index that has no elements: ATen writes nothing and skips its shape checks, so
the index may have another rank than self. kiln's C backend generated code with undeclared loop variables (the C
compiler failed) and onnxruntime's ScatterElements refused the ranks. Both now copy self (kiln/codegen/c/render.py
_scatter, kiln/codegen/onnx/lowerings.py _no_indices)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("reduce", ["sum", "mean", "amax", None])
@pytest.mark.parametrize("index_shape", [[3, 0], [0], [2, 0, 1, 3]])
def test_scatter_with_no_indices_copies_self(reduce, index_shape):
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of([2, 3, 1, 3], kiln.float32))
    x1 = builder.add_input('x1', TensorType.of(index_shape, kiln.int64))
    x2 = builder.add_input('x2', TensorType.of([1, 1], kiln.float32))
    with builder:
        if reduce is None:
            v0 = aten.scatter.src(x0, 1, x1, x2)
        else:
            v0 = aten.scatter_reduce.two(x0, 1, x1, x2, reduce)
    program = builder.build([v0])
    x = np.random.default_rng(0).standard_normal((2, 3, 1, 3)).astype(np.float32)
    check_program(program, [x, np.zeros(index_shape, np.int64), np.ones((1, 1), np.float32)],
                  backends=("onnx", "c[AVX2]", "torch"))


@pytest.mark.parametrize("index_shape", [[3, 0], [2, 0, 1, 3]])
def test_gather_with_no_indices(index_shape):  # (the C backend refuses an index of another rank)
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of([2, 3, 1, 3], kiln.float32))
    x1 = builder.add_input('x1', TensorType.of(index_shape, kiln.int64))
    with builder:
        v0 = aten.gather.default(x0, 1, x1)
    program = builder.build([v0])
    x = np.random.default_rng(0).standard_normal((2, 3, 1, 3)).astype(np.float32)
    check_program(program, [x, np.zeros(index_shape, np.int64)], backends=("onnx", "torch"))
