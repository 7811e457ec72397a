"""Scalar ops: `_local_scalar_dense`, the `.item()` that reads a one-element tensor into a Python number.

Its value is data-dependent, so the meta rule names it with a fresh unbacked symbol, as torch's fake
tensors do: integer and bool tensors give a SymInt (a bool is the 0/1 symbol torch wraps in a SymBool),
floating ones a ScalarType.
"""

from __future__ import annotations

from kiln.ir import dtypes
from kiln.ir.meta import dtype_of, numel, require, shape_of, unbacked_size
from kiln.ir.registry import defop
from kiln.ir.symbolic import INF, sym_eq
from kiln.ir.types import ScalarType, SymIntType


def _unbacked_scalar(lower: float, upper: float):
    """A fresh unbacked symbol whose range is [lower, upper]."""
    return unbacked_size("_local_scalar_dense", min=lower, max=upper)


def _local_scalar_dense_meta(self):
    op = "aten._local_scalar_dense.default"
    require(sym_eq(numel(shape_of(self)), 1), op,
            f"a tensor with {numel(shape_of(self))} elements cannot be converted to a Python scalar "
            f"(shape {[str(d) for d in shape_of(self)]})", fix="reduce or index it to one element first")
    dtype = dtype_of(self)
    if dtype.is_bool:
        return SymIntType.of(_unbacked_scalar(0, 1))
    if dtype.is_integral:
        return SymIntType.of(_unbacked_scalar(-INF, INF))
    return ScalarType(dtype)


def _local_scalar_dense(self):
    value = self.reshape(()).item()  # float16/bfloat16 items come back as numpy scalars
    dtype = dtypes.dtype(self.dtype)
    if dtype.is_bool:
        return bool(value)
    if dtype.is_integral:
        return int(value)
    return complex(value) if dtype.is_complex else float(value)


defop("_local_scalar_dense(Tensor self) -> Scalar", _local_scalar_dense_meta, _local_scalar_dense)


# ---------------------------------------------------------------------------------------------
# VJP rules: `.item()` leaves autograd (its result is a Python number, not a tensor).

from kiln.ir.registry import mark_nondifferentiable  # noqa: E402

mark_nondifferentiable("aten._local_scalar_dense.default")
