"""Reshapes in ONNX whose symbolic dims are 0 at run time: view, squeeze and flatten lowered to a Reshape without
`allowzero` (set only for dims that were 0 when exporting), so onnxruntime read a run-time 0 as "copy the input's
dim": flatten(2, 3) of a [0, 3, 4, 0] tensor gave [0, 3, 4] where ATen gives [0, 3, 0], and a squeeze of an empty
batch failed in Reshape. Every Reshape now takes its sizes literally. Found by the differential fuzzer (seed 9000)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("sizes", [(0, 4), (2, 0), (0, 0), (2, 3)])
def test_flatten_view_and_squeeze_of_symbolic_zero_dims(sizes):
    builder = GraphBuilder()
    s0 = builder.shape_env.create_symbol(2, name='s0', min=0)
    s1 = builder.shape_env.create_symbol(2, name='s1', min=0)
    x0 = builder.add_input('x0', TensorType.of([s0, 3, s1, s0], kiln.float32))
    x1 = builder.add_input('x1', TensorType.of([s0, 1, s1], kiln.float32))
    with builder:
        flat = aten.exp.default(aten.flatten.using_ints(x0, 2, 3))
        viewed = aten.view.default(x1, [s0, s1])
        squeezed = aten.squeeze.dim(x1, 1)
    program = builder.build([flat, viewed, squeezed])
    batch, length = sizes
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((batch, 3, length, batch)).astype(np.float32),
              rng.standard_normal((batch, 1, length)).astype(np.float32)]
    check_program(program, inputs, backends=("onnx",))
