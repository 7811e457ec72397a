"""A float64 mm whose one consumer is a comparison: the comparison fuses into the GEMM's epilogue, so the kernel's
output is bool, and the C renderer, choosing the integer dot product (added for integer matmuls) by the output's
dtype instead of the product's, summed float64 values as wrapped integers (fuzz test's fixed seed, in CI). It
chooses by the accumulator's dtype now (kiln/codegen/c/render.py, _matmul)."""

import shutil

import numpy as np
import pytest

import kiln
from kiln.compiler import compile as compile_c
from tests.torch_oracle import requires_torch, torch

pytestmark = [pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler"), requires_torch]


class ComparedProduct(torch.nn.Module):
    def forward(self, a, b, bound):
        return (a @ b) <= bound


@pytest.mark.parametrize("dtype", ["float64", "int64"])
def test_matmul_with_a_fused_comparison(dtype):
    rng = np.random.default_rng(0)
    a, b = (torch.from_numpy((rng.standard_normal(shape) * 4).astype(dtype)) for shape in ((3, 2), (2, 5)))
    bound = torch.from_numpy((rng.standard_normal(5) * 4).astype(dtype))
    module = ComparedProduct()
    got = compile_c(kiln.from_torch(module, (a, b, bound)))(a.numpy(), b.numpy(), bound.numpy())
    np.testing.assert_array_equal(got, module(a, b, bound).numpy())
