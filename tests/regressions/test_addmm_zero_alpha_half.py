"""addmm / addmv with alpha = 0 and a NaN or inf in the product: BLAS (ATen's float32 and float64 path) skips the
product, but ATen's own float16 / bfloat16 kernels multiply it by 0, so the result is NaN. kiln skipped it in every
dtype (interpreter and ONNX). Found by the differential fuzzer (long run) against torch."""

import ml_dtypes
import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program
from tests.torch_oracle import to_torch

torch = pytest.importorskip("torch")
aten = kiln.ops.aten


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_zero_alpha_keeps_atens_nan_rule_per_dtype(dtype):
    numpy_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    mat = np.array([[np.nan, 1.0], [2.0, np.inf]]).astype(numpy_dtype)
    ones = np.ones((2, 3)).astype(numpy_dtype)
    bias = np.array([0.5, -1.0, 2.0]).astype(numpy_dtype)
    vec, small = ones[:, 0].copy(), bias[:2].copy()
    expected = [torch.addmm(to_torch(bias), to_torch(mat), to_torch(ones), alpha=0),
                torch.addmv(to_torch(small), to_torch(mat), to_torch(vec), alpha=0)]
    got = [aten.addmm.default(bias, mat, ones, alpha=0), aten.addmv.default(small, mat, vec, alpha=0)]
    for ours, theirs in zip(got, expected):
        torch.testing.assert_close(to_torch(ours), theirs, equal_nan=True)
    builder = GraphBuilder()
    kiln_dtype = getattr(kiln, dtype)
    inputs = [builder.add_input(name, TensorType.of(list(value.shape), kiln_dtype))
              for name, value in (("bias", bias), ("mat", mat), ("ones", ones), ("small", small), ("vec", vec))]
    with builder:
        outputs = [aten.addmm.default(*inputs[:3], alpha=0),
                   aten.addmv.default(inputs[3], inputs[1], inputs[4], alpha=0)]
    check_program(builder.build(outputs), [bias, mat, ones, small, vec], backends=("onnx",))
