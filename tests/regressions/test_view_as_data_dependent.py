"""view_as onto a shape with a data-dependent size (nonzero's count): the meta rule can only assume the sizes
agree, and the interpreter's kernel reshaped without checking, so a count that did not fit surfaced as numpy's
ValueError. The kernel checks the sizes and raises kiln's ShapeError (kiln/ir/ops/shape.py)."""

import numpy as np
import pytest

import kiln
from kiln.ir.errors import ShapeError
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType

aten = ops.aten


def test_view_as_a_data_dependent_shape_checks_at_run_time():
    builder = GraphBuilder()
    x = builder.add_input('x', TensorType.of([3, 4], kiln.float32))
    mask = builder.add_input('mask', TensorType.of([6], kiln.float32))
    with builder:
        where = aten.transpose.int(aten.nonzero.default(mask), 0, 1)  # [1, u0]
        y = aten.view_as.default(x, aten.expand.default(where, [12, -1]))  # needs u0 = 1
    program = builder.build([y])
    x_values = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(program(x_values, np.eye(6, dtype=np.float32)[2]), x_values.reshape(12, 1))
    with pytest.raises(ShapeError, match="is invalid for input of size 12"):
        program(x_values, np.ones(6, np.float32))
