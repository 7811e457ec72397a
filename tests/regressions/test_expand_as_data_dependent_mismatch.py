"""expand_as onto a data-dependent shape (nonzero's [u0, 2]) that turns out not to match at run time: ATen raises
"The expanded size of the tensor (5) must match the existing size (3)"; kiln's interpreter let numpy's broadcast fail
with a ValueError. It now raises kiln's ShapeError with ATen's message, as expand does. Found by a differential fuzz
run (seed 10000)."""

import numpy as np
import pytest

import kiln
from kiln.ir import ShapeError
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.torch_oracle import requires_torch, torch

aten = ops.aten


@requires_torch
def test_expand_as_onto_a_mismatching_data_dependent_shape_is_a_shape_error():
    builder = GraphBuilder()
    x = builder.add_input("x", TensorType.of([3, 1], kiln.float32))
    mask = builder.add_input("mask", TensorType.of([5, 2], kiln.float32))
    with builder:
        y = aten.expand_as.default(x, aten.nonzero.default(mask))
    program = builder.build([y])
    values, mask_values = np.ones((3, 1), np.float32), np.eye(5, 2, dtype=np.float32) + 1  # 10 nonzeros
    with pytest.raises(RuntimeError, match="must match the existing size"):
        torch.from_numpy(values).expand_as(torch.nonzero(torch.from_numpy(mask_values)))
    with pytest.raises(ShapeError, match="must match the existing size"):
        program(values, mask_values)
    three = np.zeros((5, 2), np.float32)
    three[[0, 2, 4], 0] = 1  # exactly 3 nonzeros: the shapes match
    np.testing.assert_array_equal(program(values, three),
                                  torch.from_numpy(values).expand_as(torch.nonzero(torch.from_numpy(three))).numpy())
