"""log_softmax and softmax of a 0-D value: ATen gives +0 and 1 for a finite x (x - max is +0) and NaN for an infinity
or a NaN. kiln's ONNX export wrote x * 0 + 0 and x * 0 + 1; onnxruntime's optimizer drops an Add of 0 when its result
is not a graph output, leaving x * 0, which is -0 for a negative x, so 1 / log_softmax(x) was -inf against ATen's
+inf. Found by a differential fuzz run (seed 9800)."""

import numpy as np
import pytest

import kiln
from kiln.codegen.onnx import export_program
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program
from tests.torch_oracle import requires_torch, torch

aten = ops.aten
VALUES = [-0.55, -0.0, 0.0, 3.0, -np.inf, np.inf, np.nan]


@requires_torch
@pytest.mark.parametrize("op", ["_log_softmax", "_softmax"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("value", VALUES)
def test_softmax_of_one_element_follows_aten_through_a_consumer(op, dtype, value):
    builder = GraphBuilder()
    x = builder.add_input("x", TensorType.of([], getattr(kiln, dtype)))
    with builder:
        out = aten.reciprocal.default(getattr(aten, op).default(x, 0, False))  # the softmax's result is no output
    program = builder.build([out])
    inputs = [np.array(value, dtype)]
    expected = torch.reciprocal(getattr(torch, op)(torch.tensor(value, dtype=getattr(torch, dtype)), 0, False))
    expected = expected.numpy()
    np.testing.assert_array_equal(export_program(program).run(inputs)[0], expected)  # +inf, 1 or NaN; signs too
    np.testing.assert_array_equal(program(*inputs), expected)
    check_program(program, inputs, backends=("onnx",))  # (the C backend refuses a 0-D softmax)
