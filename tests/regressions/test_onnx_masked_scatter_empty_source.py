"""masked_scatter with an empty source and a mask that selects nothing: kiln's ONNX gathered every position's source
element at (running count - 1) clamped to the source's last index, which for an empty source is -1, and
onnxruntime's Gather refused it ("indices element out of data bounds, idx=-1 must be within the inclusive range
[0,-1]"), although Where then drops those values. The gather now reads a source padded by one element. Found by
the differential fuzzer (seed 9100)."""

import numpy as np

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


def test_masked_scatter_of_an_empty_source():
    builder = GraphBuilder()
    x0 = builder.add_input("x0", TensorType.of([0], kiln.float32))
    x1 = builder.add_input("x1", TensorType.of([3, 4], kiln.float32))
    x2 = builder.add_input("x2", TensorType.of([1], kiln.bool))
    with builder:
        v0 = aten.masked_scatter.default(x1, x2, x0)
    program = builder.build([v0])
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    check_program(program, [np.zeros((0,), np.float32), x, np.array([False])], backends=("onnx", "torch"))


def test_masked_scatter_takes_the_source_in_order():
    builder = GraphBuilder()
    x0 = builder.add_input("x0", TensorType.of([5], kiln.float32))
    x1 = builder.add_input("x1", TensorType.of([2, 3], kiln.float32))
    x2 = builder.add_input("x2", TensorType.of([2, 3], kiln.bool))
    with builder:
        v0 = aten.masked_scatter.default(x1, x2, x0)
    program = builder.build([v0])
    source = np.arange(5, dtype=np.float32) + 10
    mask = np.array([[True, False, True], [False, True, True]])
    check_program(program, [source, np.zeros((2, 3), np.float32), mask], backends=("onnx", "torch"))
