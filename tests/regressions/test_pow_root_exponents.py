"""x ** 0.5 and x ** -0.5 at -inf and -0.0: ATen takes sqrt and rsqrt for float32, float64 and bfloat16 ((-inf) **
0.5 is NaN, (-0.0) ** -0.5 is -inf) and pow for float16 (inf and +inf). kiln's ONNX export wrote Pow (inf, 0) for
all, and its interpreter took sqrt for float16 too (and numpy's power takes it for a scalar exponent 0.5). Found by
a differential fuzz run (seed 9800). The C backend runs pow on float32 and float64 only, so the half types are
checked on ONNX."""

import ml_dtypes
import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program
from tests.torch_oracle import requires_torch, torch

aten = ops.aten
VALUES = [-np.inf, -4.0, -0.0, 0.0, 2.0, np.inf, np.nan]


@requires_torch
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("exponent", [0.5, -0.5])
def test_root_exponents_follow_aten(dtype, exponent):
    numpy_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    x = np.array(VALUES, numpy_dtype)
    builder = GraphBuilder()
    value = builder.add_input("x", TensorType.of([len(VALUES)], getattr(kiln, dtype)))
    with builder:
        out = aten.pow.Tensor_Scalar(value, exponent)
    program = builder.build([out])
    expected = torch.pow(torch.tensor(VALUES, dtype=getattr(torch, dtype)), exponent).float().numpy()
    got = np.asarray(program(x)).astype(np.float32)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    real = ~np.isnan(expected)
    np.testing.assert_array_equal(np.signbit(got[real]), np.signbit(expected[real]))  # -inf and -0.0 included
    np.testing.assert_allclose(got[real], expected[real], rtol=1e-2)
    check_program(program, [x], backends=("c[DEFAULT]", "c", "onnx") if dtype in ("float32", "float64") else ("onnx",))


@requires_torch
def test_float16_root_of_a_zero_dim_tensor_calls_pow():
    """numpy's power reads a 0-D exponent as a scalar and takes sqrt; ATen's float16 kernel calls pow."""
    builder = GraphBuilder()
    value = builder.add_input("x", TensorType.of([], kiln.float16))
    with builder:
        out = aten.pow.Tensor_Scalar(value, 0.5)
    program = builder.build([out])
    expected = torch.pow(torch.tensor(-np.inf, dtype=torch.float16), 0.5)
    assert expected.item() == np.inf
    assert np.asarray(program(np.array(-np.inf, np.float16))).item() == expected.item()
