"""div.Scalar_mode with rounding_mode=None: the .pt2 writer left out keyword-only arguments that were None, but
rounding_mode has no default, so torch.export.load refused the file ("aten::div() is missing value for argument
'rounding_mode'"). Fixed in kiln/ir/serde/writer.py: only arguments at their declared default are left out."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


def test_div_with_rounding_mode_none_round_trips_through_torch():
    pytest.importorskip("torch")
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of([3], kiln.float32))
    with builder:
        v0 = aten.div.Scalar_mode(x0, 2.5, rounding_mode=None)
        v1 = aten.div.Tensor_mode(x0, v0, rounding_mode=None)
    program = builder.build([v0, v1])
    check_program(program, [np.array([1.0, -3.5, 4.0], np.float32)], backends=("pt2", "torch"))
