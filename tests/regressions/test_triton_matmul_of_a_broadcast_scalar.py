"""Triton: a matrix product whose operand is a 0-d tensor broadcast to a matrix (every stride 0) read it at an index
no block variable reaches, and Triton's interpreter refused the block mask on that scalar pointer ("Mask argument
cannot be block type if pointer argument is not a block"). Such an operand is now read once and spread over the
tile, zero past K (render._operand_tile). Found by the differential fuzzer (seed 9100)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("side", ["left", "right"])
def test_matmul_with_a_broadcast_scalar_operand(side):
    builder = GraphBuilder()
    x0 = builder.add_input("x0", TensorType.of([], kiln.float32))
    x1 = builder.add_input("x1", TensorType.of([4, 2], kiln.float32))
    with builder:
        if side == "left":
            v0 = aten.matmul.default(aten.broadcast_to.default(x0, [3, 4]), x1)
        else:
            v0 = aten.matmul.default(aten.t.default(x1), aten.broadcast_to.default(x0, [4, 5]))
    program = builder.build([v0])
    x = np.random.default_rng(0).standard_normal((4, 2)).astype(np.float32)
    check_program(program, [np.array(-0.327, np.float32), x], backends=("triton", "torch"))
