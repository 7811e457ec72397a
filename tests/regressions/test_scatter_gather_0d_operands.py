"""scatter and gather with a 0-d index, src or self beside 1-d ones: ATen counts a 0-d operand as 1-d (one element),
so a 0-d index into a 1-d self writes or reads one element. onnxruntime's ScatterElements and GatherElements refused
the ranks ("Indices must have the same rank as Input"); kiln's ONNX lowering now reshapes the 0-d operand to one
element (kiln/codegen/onnx/lowerings.py _as_vector, _fit_to_index). Found by the differential fuzzer (seed 800)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("reduce, index_shape, src_shape", [
    (reduce, index_shape, src_shape)
    for reduce in ("sum", "mean", "amin", "prod", None, "value")
    for index_shape, src_shape in (([], []), ([], [3]), ([1], []), ([], [2, 2]))
    if len(src_shape) <= 1 or reduce == "value"])  # (ATen wants src's rank equal to self's unless it is 0-d)
def test_scatter_with_0d_operands(reduce, index_shape, src_shape):
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of([4], kiln.float32))
    x1 = builder.add_input('x1', TensorType.of(index_shape, kiln.int64))
    x2 = builder.add_input('x2', TensorType.of(src_shape, kiln.float32))
    with builder:
        if reduce is None:
            v0 = aten.scatter.src(x0, 0, x1, x2)
        elif reduce == "value":
            v0 = aten.scatter.value(x0, 0, x1, 2.5)
        else:
            v0 = aten.scatter_reduce.two(x0, 0, x1, x2, reduce, include_self=reduce != "amin")
    program = builder.build([v0])
    rng = np.random.default_rng(0)
    x = rng.standard_normal(4).astype(np.float32)
    index = np.full(index_shape, 2, np.int64)
    src = rng.standard_normal(src_shape).astype(np.float32)
    check_program(program, [x, index, src], backends=("onnx", "c[AVX2]", "torch"))


@pytest.mark.parametrize("self_shape, index_shape", [([4], []), ([], [1]), ([], [])])
def test_gather_with_0d_operands(self_shape, index_shape):
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of(self_shape, kiln.float32))
    x1 = builder.add_input('x1', TensorType.of(index_shape, kiln.int64))
    with builder:
        v0 = aten.gather.default(x0, 0, x1)
    program = builder.build([v0])
    x = np.random.default_rng(0).standard_normal(self_shape).astype(np.float32)
    index = np.full(index_shape, 3 if self_shape else 0, np.int64)
    check_program(program, [x, index], backends=("onnx", "torch"))  # (the C backend refuses these ranks)
