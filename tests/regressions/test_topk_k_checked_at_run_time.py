"""topk with a static k along a symbolic dim that is smaller than k at run time: the meta rule cannot know, and the
reference kernel failed inside numpy (IndexError); ATen raises "selected index k out of range". The kernel runs the
meta rule's check on the concrete size now (kiln/ir/ops/reduction.py)."""

import numpy as np
import pytest

import kiln
from kiln.ir.errors import ShapeError
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType

aten = ops.aten


def test_topk_checks_k_against_the_run_time_size():
    builder = GraphBuilder()
    s0 = builder.shape_env.create_symbol(5, name='s0', min=1, max=8)
    x = builder.add_input('x', TensorType.of([2, s0], kiln.float32))
    with builder:
        values, indices = aten.topk.default(x, 4, 1)
    program = builder.build([values, indices])
    x_values = np.array([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]], np.float32)
    np.testing.assert_array_equal(program(x_values)[0], [[5, 4, 3, 1], [9, 6, 5, 3]])
    with pytest.raises(ShapeError, match="selected index k=4 out of range"):
        program(x_values[:, :3])
