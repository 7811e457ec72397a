"""Integer mm, bmm and addmm in C: products and sums wrap in the operands' type as ATen's do (computed modulo 2^64,
whose low bits are the narrower type's), addmm's float alpha and beta truncated to integers as ATen truncates them.
Against torch eager on values over each dtype's whole range, exactly."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import kiln
from kiln.compiler import compile as compile_c
from tests.torch_oracle import requires_torch, torch

pytestmark = [pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler"), requires_torch]
DTYPES = ["int64", "int32", "int8", "uint8"]


class Matmul(torch.nn.Module):
    def forward(self, a, b):
        return a @ b


class TransposedMatmul(torch.nn.Module):
    def forward(self, a, b):
        return a.t() @ b


class BatchedMatmul(torch.nn.Module):
    def forward(self, a, b):
        return torch.bmm(a, b)


class Addmm(torch.nn.Module):
    def __init__(self, beta, alpha):
        super().__init__()
        self.beta, self.alpha = beta, alpha

    def forward(self, bias, a, b):
        return torch.addmm(bias, a, b, beta=self.beta, alpha=self.alpha) + 1


CASES = {
    "mm": (Matmul(), [(5, 7), (7, 3)]),
    "mm of a transposed operand": (TransposedMatmul(), [(9, 4), (9, 6)]),
    "bmm": (BatchedMatmul(), [(2, 5, 7), (2, 7, 3)]),
    "addmm": (Addmm(3, -2), [(5, 3), (5, 7), (7, 3)]),
    "addmm with float alpha and beta": (Addmm(2.7, 1.5), [(1, 3), (5, 7), (7, 3)]),
    "addmm with beta 0": (Addmm(0, 5), [(5, 3), (5, 7), (7, 3)]),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_integer_matmul_wraps_as_aten(case, dtype):
    module, shapes = CASES[case]
    info = np.iinfo(dtype)
    rng = np.random.default_rng(0)
    args = tuple(torch.from_numpy(rng.integers(info.min, info.max, size=shape, endpoint=True).astype(dtype))
                 for shape in shapes)
    package = compile_c(kiln.from_torch(module, args))
    np.testing.assert_array_equal(package(*[a.numpy() for a in args]), module(*args).numpy())
