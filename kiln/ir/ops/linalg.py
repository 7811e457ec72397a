"""Matrix products: mm, bmm, addmm, baddbmm and friends."""

from __future__ import annotations

import numpy as np

from kiln.ir.meta import dtype_of, require, require_dtype, shape_of, tensor
from kiln.ir.ops._common import opmath
from kiln.ir.registry import defop
from kiln.ir.symbolic import sym_eq


def _mm_meta(self, mat2):
    op = "aten.mm.default"
    require(len(shape_of(self)) == 2 and len(shape_of(mat2)) == 2, op,
            f"expected 2-D matrices, got shapes {list(shape_of(self))} and {list(shape_of(mat2))}")
    require_dtype(dtype_of(self) is dtype_of(mat2), op,
                  f"expected both matrices to have the same dtype, got {dtype_of(self)} and {dtype_of(mat2)}")
    (n, k), (k2, m) = shape_of(self), shape_of(mat2)
    require(sym_eq(k, k2), op, f"mat1 and mat2 shapes cannot be multiplied ({n}x{k} and {k2}x{m})")
    return tensor([n, m], dtype_of(self))


def _matmul_kernel(self, mat2):
    if self.dtype == np.bool_:
        return (self.astype(np.int64) @ mat2.astype(np.int64)) != 0
    return opmath(self) @ opmath(mat2)


defop("mm(Tensor self, Tensor mat2) -> Tensor", _mm_meta, _matmul_kernel)
