"""add(a, b, alpha=0) of bools where b broadcasts a to a larger shape: the ONNX lowering returned `a` alone (the
scaled b is all false) and lost the broadcast, so the output had a's shape. It expands `a` to the result's shape
now (kiln/codegen/onnx/lowerings.py)."""

import numpy as np

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


def test_bool_add_with_zero_alpha_keeps_the_broadcast_shape():
    builder = GraphBuilder()
    a = builder.add_input('a', TensorType.of([4], kiln.bool))
    b = builder.add_input('b', TensorType.of([3, 4], kiln.bool))
    with builder:
        y = aten.add.Tensor(a, b, alpha=0)
    program = builder.build([y])
    inputs = [np.array([True, False, True, False]), np.eye(3, 4, dtype=bool)]
    np.testing.assert_array_equal(program(*inputs), np.broadcast_to(inputs[0], (3, 4)))
    check_program(program, inputs, backends=("onnx", "c", "torch"))
