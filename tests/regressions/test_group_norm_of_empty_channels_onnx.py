"""group_norm in ONNX over a tensor with no channels ([1, 0]): the lowering expands each group's statistics to its
channels with Expand to the constant shape [1, 1, 0], which onnxruntime 1.32's graph optimizer drops (the Reshape
after it then got the unexpanded [1, 1, 1]: "The input tensor cannot be reshaped to the requested shape"). A
statistic spread to an empty shape is now a broadcast Add of zeros. Found by the differential fuzzer (seed 9100)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("shape,groups", [([1, 0], 1), ([2, 0, 3], 1), ([3, 4, 0], 2)])
def test_group_norm_of_empty_tensors(shape, groups):
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of(shape, kiln.float32))
    with builder:
        y = aten.group_norm.default(aten.add.Scalar(x0, 2), groups, None, None, 0.001)
    program = builder.build([y])
    check_program(program, [np.zeros(shape, np.float32)], backends=("onnx",))
