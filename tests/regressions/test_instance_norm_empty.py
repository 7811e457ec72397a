"""instance_norm of an input with an empty dim ([2, 0]): ATen returns the empty result, and kiln's interpreter did
too, but the decomposition that ONNX export and the C backend use folds it into batch norm, which refuses an empty
input (a ShapeError inside the decompose pass). The decomposition returns the empty input as is now
(kiln/ir/ops/nn.py)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("shape", [[2, 0], [2, 0, 4], [2, 3, 0]])
def test_instance_norm_of_an_empty_input(shape):
    builder = GraphBuilder()
    x = builder.add_input('x', TensorType.of(shape, kiln.float32))
    with builder:
        y = aten.instance_norm.default(x, None, None, None, None, True, 0.1, 1e-05, True)
    program = builder.build([y])
    inputs = [np.zeros(shape, np.float32)]
    assert program(*inputs).shape == tuple(shape)
    check_program(program, inputs, backends=("onnx", "c", "torch"))
