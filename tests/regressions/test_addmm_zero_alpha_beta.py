"""addmm with alpha=0 or beta=0: ATen skips the product (or the bias), so an infinity or NaN in it does not reach
the result; the C backend computed 0 * inf = NaN. Its GEMM epilogue leaves out a term whose factor is 0 now
(kiln/codegen/c/render.py), as the ONNX lowering did."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("dtype", [kiln.float32, kiln.float64])
@pytest.mark.parametrize("beta,alpha", [(-1.5, 0.0), (0.0, 2.0), (0, 0)])
def test_a_zero_factor_skips_its_term(dtype, beta, alpha):
    builder = GraphBuilder()
    bias = builder.add_input('bias', TensorType.of([3], dtype))
    a = builder.add_input('a', TensorType.of([2, 4], dtype))
    b = builder.add_input('b', TensorType.of([4, 3], dtype))
    with builder:
        y = aten.addmm.default(bias, a, b, beta=beta, alpha=alpha)
    program = builder.build([y])
    inf, nan = np.inf, np.nan
    inputs = [np.array([1.0, nan, -2.0]), np.array([[-3.3, -1.8, -0.4, 0.4], [-1.0, -0.0, 0.3, -2.6]]),
              np.array([[-0.4, 2.1, -1.6], [inf, -inf, -1.0], [-4.4, -0.0, 2.7], [1.6, 0.4, inf]])]
    inputs = [x.astype(dtype.numpy) for x in inputs]
    with np.errstate(invalid="ignore"):
        expected = (beta * inputs[0] if beta else 0) + (alpha * (inputs[1] @ inputs[2]) if alpha else 0)
    np.testing.assert_allclose(program(*inputs), np.broadcast_to(expected, (2, 3)), rtol=1e-6)
    check_program(program, inputs, backends=("c", "onnx", "torch"))
