"""A bool tensor compared with an integer scalar (eq(mask, -2)): ATen compares in the promoted type, int64, so no
element equals -2; the C backend converted -2 to bool (true) and compared there. Comparisons now promote a bool
operand with an integer scalar to int64 (kiln/codegen/c/render.py)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("comparison,scalar", [("eq", -2), ("ne", 2), ("lt", 2), ("ge", -1), ("eq", 1), ("gt", 0.5)])
def test_a_bool_tensor_against_an_integer_scalar(comparison, scalar):
    builder = GraphBuilder()
    x = builder.add_input('x', TensorType.of([3, 4], kiln.bool))
    with builder:
        y = getattr(aten, comparison).Scalar(x, scalar)
    program = builder.build([y])
    mask = np.array([[True, False, True, True], [False, True, False, False], [True, False, True, True]])
    expected = getattr(np, {"eq": "equal", "ne": "not_equal", "lt": "less", "ge": "greater_equal",
                            "gt": "greater"}[comparison])(mask.astype(np.int64), scalar)
    np.testing.assert_array_equal(program(mask), expected)
    check_program(program, [mask], backends=("c", "onnx", "torch"))
