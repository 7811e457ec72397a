"""batch_norm in training mode on running statistics the program computes: torch's graph updates them in place, and
reading such a .pt2 back failed with a KeyError, since the updated value was no input to make a mutation output of
(fixed in kiln/ir/serde/reader.py: an update of a value computed in the graph is seen by no one and dropped)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


def test_batch_norm_on_computed_running_stats_round_trips():
    pytest.importorskip("torch")
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of([5, 3], kiln.float32))
    x1 = builder.add_input('x1', TensorType.of([3], kiln.float32))
    with builder:
        v0 = aten.numpy_T.default(x1)
        v1 = aten.relu.default(x1)
        v2 = aten.batch_norm.default(x0, v0, None, v1, v1, True, 0.1, 1e-05, True)
    program = builder.build([v2])
    inputs = [np.linspace(-2, 2, 15, dtype=np.float32).reshape(5, 3), np.array([0.5, -1.0, 2.0], np.float32)]
    check_program(program, inputs, backends=("pt2", "torch"))
