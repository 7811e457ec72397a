"""A 0-d value computed from constants only (linspace then select, arange then amax): the fold-constants pass stored
it through np.ascontiguousarray, which makes a 0-d array 1-d, so the exported ONNX model returned shape [1] instead
of [] (fixed in kiln/passes/fold_constants.py)."""

import numpy as np

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


def test_folded_0d_constants_stay_0d():
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of([2], kiln.float32))
    with builder:
        v0 = aten.linspace.default(0, 1, 5)
        v1 = aten.select.int(v0, 0, 0)
        v2 = aten.amax.default(aten.arange.start_step(True, 3), [-1])
        v3 = aten.add.Tensor(x0, v1)
    program = builder.build([v1, v2, v3])
    check_program(program, [np.array([1.0, 2.0], np.float32)], backends=("onnx",))
