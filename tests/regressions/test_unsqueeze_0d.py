"""unsqueeze of a 0-d tensor at dim -1: ATen's dims for it are [-1, 0], kiln wrapped -1 to 1 and numpy refused it
(fixed in kiln/ir/meta.py canonical_dim, which counted the extra position twice for 0-d tensors)."""

import numpy as np
import pytest

import kiln
from kiln.ir.errors import ShapeError
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


def test_unsqueeze_0d_at_last_dim():
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of([], kiln.float32))
    with builder:
        v0 = aten.unsqueeze.default(x0, -1)
        v1 = aten.stack.default([x0, x0], -1)
    program = builder.build([v0, v1])
    inputs = [
        np.array(0.2514604330062866, np.float32),
    ]
    check_program(program, inputs)


def test_unsqueeze_0d_out_of_range():
    with pytest.raises(ShapeError, match=r"\[-1, 0\]"):
        aten.unsqueeze.default(np.array(1.0, np.float32), 1)
