"""linear with 0 in_features on a batched input: its decomposition flattened the batch with view(-1, 0), which is
ambiguous for 0 elements, so compiling it for C failed (fixed in kiln/ir/ops/composite.py: the row count is
spelled out)."""

import numpy as np

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


def test_linear_with_no_in_features():
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of([3, 2, 0], kiln.float32))
    x1 = builder.add_input('x1', TensorType.of([4, 0], kiln.float32))
    x2 = builder.add_input('x2', TensorType.of([4], kiln.float32))
    with builder:
        v0 = aten.linear.default(x0, x1, x2)
    program = builder.build([v0])
    inputs = [np.zeros((3, 2, 0), np.float32), np.zeros((4, 0), np.float32), np.arange(4, dtype=np.float32)]
    check_program(program, inputs, backends=("c", "onnx"))
