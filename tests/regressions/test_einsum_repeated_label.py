"""einsum with a label repeated within one operand ('ii', a diagonal) needs equal sizes there: ATen refuses a [0, 1]
operand ("subscript i is repeated for operand 0 but the sizes don't match, 1 != 0") where kiln broadcast the 1.
Between operands a size-1 dim still broadcasts. Found by the differential fuzzer (seed 1300)."""

import numpy as np
import pytest
import torch

import kiln
from kiln.ir.errors import ShapeError
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("shape", [[0, 1], [2, 1], [1, 3]])
def test_a_diagonal_of_unequal_sizes_is_refused(shape):
    with pytest.raises(RuntimeError, match="sizes don't match"):
        torch.einsum("ii", torch.zeros(shape))
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of(shape, kiln.float32))
    with pytest.raises(ShapeError, match="repeated for operand 0"), builder:
        aten.einsum.default("ii", [x0])


def test_diagonals_and_broadcasting_still_work():
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of([3, 3], kiln.float32))
    x1 = builder.add_input('x1', TensorType.of([2, 1], kiln.float32))
    x2 = builder.add_input('x2', TensorType.of([3, 2], kiln.float32))
    with builder:
        trace = aten.einsum.default("ii", [x0])
        product = aten.einsum.default("ij,jk", [x1, x2])
    program = builder.build([trace, product])
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(s).astype(np.float32) for s in ([3, 3], [2, 1], [3, 2])]
    check_program(program, inputs, backends=("onnx", "torch"))
