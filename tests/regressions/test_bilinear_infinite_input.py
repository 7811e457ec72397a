"""bilinear with an infinite input2 and a zero weight: the reference interpreter summed x1_i * w_oij * x2_j in one
triple sum, so -0.0 * inf made NaN, where ATen (its _trilinear sums input1 against the weight first) and kiln's C
code give inf. The interpreter now contracts in ATen's order. Found by a differential fuzz run (seed 9700)."""

import numpy as np

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program
from tests.torch_oracle import requires_torch, torch

aten = ops.aten


@requires_torch
def test_bilinear_contracts_input1_first():
    x1 = np.array([[0.502, 0.815, 1.7, -0.508], [1.0, -2.0, 0.5, 3.0]], np.float32)
    x2 = np.array([[2.08, np.inf], [np.nan, 0.5]], np.float32)
    weight = np.array([[[1.0, 0.113], [-0.708, 3.08], [0.001, 0.7], [-0.886, -0.0]],
                       [[0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]], np.float32)
    builder = GraphBuilder()
    values = [builder.add_input(name, TensorType.of(list(array.shape), kiln.float32))
              for name, array in (("x1", x1), ("x2", x2), ("weight", weight))]
    with builder:
        out = aten.add.Scalar(aten.relu.default(aten.bilinear.default(*values)), 10000.0)
    program = builder.build([out])
    expected = torch.nn.functional.bilinear(*map(torch.from_numpy, (x1, x2, weight))).relu() + 10000.0
    assert np.isinf(expected[0, 0]) and np.isnan(expected[1, 0])  # the case: inf where one triple sum gives NaN
    np.testing.assert_allclose(program(x1, x2, weight), expected.numpy(), rtol=1.3e-6, atol=1e-5, equal_nan=True)
    check_program(program, [x1, x2, weight], backends=("c[DEFAULT]", "onnx"))
