"""Triton: a 0-d float operand (a broadcast scalar read) compared and then combined with a block (logical_and with a
0-d tensor, atan2's quadrant tests) crashed in Triton's interpreter, whose `&` refuses a 0-d float comparison's
result. Scalar reads are now broadcast to the kernel's block (render.Exprs.load). Found by the fuzzer."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("op", ["logical_and", "logical_or", "logical_xor", "atan2", "where"])
@pytest.mark.parametrize("scalar_dtype", [kiln.float64, kiln.float32, kiln.int64])
def test_a_0d_operand_meets_a_block(op, scalar_dtype):
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of([4, 3], kiln.float32))
    x1 = builder.add_input('x1', TensorType.of([], scalar_dtype))
    with builder:
        if op == "where":
            v0 = aten.where.self(aten.gt.Scalar(x1, 0), x0, aten.neg.default(x0))
        else:
            v0 = getattr(aten, op).default(x0, x1)
    program = builder.build([v0])
    x = np.array([[3.5, -2.1, 0.0], [-0.5, -3.1, 1.6], [0.07, 1.0, -0.0], [1.1, 0.8, -0.008]], np.float32)
    for scalar in (-1, 0, 2):
        check_program(program, [x, np.array(scalar, scalar_dtype.numpy)])
