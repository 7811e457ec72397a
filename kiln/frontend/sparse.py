"""kiln.sparse, mirroring torch.sparse: constructors of sparse tensors, their invariant checks, and sparse ops.

The constructors (`kiln.sparse_coo_tensor`, `kiln.sparse_csr_tensor`, ...) build eager sparse tensors from
component tensors, as torch's do; `check_invariants=True` (or `check_sparse_tensor_invariants`) runs torch's
checks with torch's messages. The layouts and their formats are described in kiln/ir/sparse.py.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Sequence

import numpy as np

from kiln.ir import dtypes
from kiln.ir import sparse as layouts
from kiln.ir.errors import OpArgumentError
from kiln.ir.registry import ops
from kiln.frontend.tensor import Tensor, dispatch

aten = ops.aten

# Layout constants, compared with `Tensor.layout` as torch.sparse_csr is.
strided = "strided"
sparse_coo = "sparse_coo"
sparse_csr = "sparse_csr"
sparse_csc = "sparse_csc"
sparse_bsr = "sparse_bsr"
sparse_bsc = "sparse_bsc"
semi_structured = "semi_structured"


class check_sparse_tensor_invariants(contextlib.ContextDecorator):
    """torch.sparse.check_sparse_tensor_invariants: a context manager and decorator that turns on the invariant
    checks of sparse constructors called without `check_invariants`; `enable()`/`disable()` set it globally."""

    _enabled = False

    def __init__(self, enable: bool = True):
        self.state = enable
        self.saved: list[bool] = []

    @staticmethod
    def is_enabled() -> bool:
        return check_sparse_tensor_invariants._enabled

    @staticmethod
    def enable() -> None:
        check_sparse_tensor_invariants._enabled = True

    @staticmethod
    def disable() -> None:
        check_sparse_tensor_invariants._enabled = False

    def __enter__(self) -> "check_sparse_tensor_invariants":
        self.saved.append(check_sparse_tensor_invariants._enabled)
        check_sparse_tensor_invariants._enabled = self.state
        return self

    def __exit__(self, *exc: Any) -> None:
        check_sparse_tensor_invariants._enabled = self.saved.pop()


def _checking(check_invariants: bool | None) -> bool:
    return check_sparse_tensor_invariants.is_enabled() if check_invariants is None else bool(check_invariants)


def _array(value: Any, dtype: Any = None) -> np.ndarray:
    array = value._eager_array("a sparse constructor") if isinstance(value, Tensor) else np.asarray(value)
    if dtype is not None:
        array = array.astype(dtypes.dtype(dtype).numpy)
    elif array.dtype == np.float64 and not isinstance(value, (Tensor, np.ndarray)):
        array = array.astype(np.float32)  # Python floats become float32 values, as in torch.tensor
    return array


def sparse_coo_tensor(indices: Any, values: Any, size: Sequence[int] | None = None, *, dtype: Any = None,
                      device: Any = None, requires_grad: bool = False, check_invariants: bool | None = None,
                      is_coalesced: bool | None = None) -> Tensor:
    """torch.sparse_coo_tensor: `indices` (sparse_dim x nnz, int64) and `values` (nnz x dense dims)."""
    value = layouts.coo(_array(indices).astype(np.int64), _array(values, dtype), size,
                        is_coalesced=bool(is_coalesced), check_invariants=_checking(check_invariants))
    return Tensor(value)


def _compressed_constructor(kind: str) -> Callable[..., Tensor]:
    compressed_name, plain_name = layouts.COMPONENTS[kind][:2]

    def construct(compressed_indices: Any, plain_indices: Any, values: Any, size: Sequence[int] | None = None, *,
                  dtype: Any = None, device: Any = None, requires_grad: bool = False,
                  check_invariants: bool | None = None) -> Tensor:
        value = layouts.compressed(kind, _array(compressed_indices), _array(plain_indices), _array(values, dtype),
                                   size, check_invariants=_checking(check_invariants))
        return Tensor(value)
    construct.__name__ = f"{kind}_tensor"
    construct.__doc__ = f"torch.{kind}_tensor: {compressed_name}, {plain_name} and values."
    return construct


sparse_csr_tensor = _compressed_constructor("sparse_csr")
sparse_csc_tensor = _compressed_constructor("sparse_csc")
sparse_bsr_tensor = _compressed_constructor("sparse_bsr")
sparse_bsc_tensor = _compressed_constructor("sparse_bsc")


def sparse_compressed_tensor(compressed_indices: Any, plain_indices: Any, values: Any,
                             size: Sequence[int] | None = None, *, dtype: Any = None, layout: Any = None,
                             device: Any = None, requires_grad: bool = False,
                             check_invariants: bool | None = None) -> Tensor:
    """torch.sparse_compressed_tensor: one of the four compressed layouts, named by `layout`."""
    if layout not in layouts.COMPRESSED_KINDS:
        raise OpArgumentError(f"sparse_compressed_tensor needs layout= one of {', '.join(layouts.COMPRESSED_KINDS)},"
                              f" got {layout!r}")
    return _compressed_constructor(layout)(compressed_indices, plain_indices, values, size, dtype=dtype,
                                           check_invariants=check_invariants)


def to_sparse_semi_structured(tensor: Tensor) -> Tensor:
    """torch.sparse.to_sparse_semi_structured: a 2:4 tensor (two kept values and their positions per group of 4)."""
    return tensor.to_sparse_semi_structured()


# -- ops (torch.sparse.*)

def mm(mat1: Tensor, mat2: Tensor) -> Tensor:
    return dispatch(aten._sparse_mm.default, mat1, mat2)


def addmm(mat: Tensor, mat1: Tensor, mat2: Tensor, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
    return dispatch(aten.addmm.default, mat, mat1, mat2, beta=beta, alpha=alpha)


def sampled_addmm(input: Tensor, mat1: Tensor, mat2: Tensor, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
    return dispatch(aten.sparse_sampled_addmm.default, input, mat1, mat2, beta=beta, alpha=alpha)


def sum(input: Tensor, dim: Any = None, dtype: Any = None) -> Tensor:  # noqa: A001  (torch.sparse.sum)
    if dtype is not None:
        input = input.to(dtype)
    if dim is None:
        return dispatch(aten._sparse_sum.default, input)
    return dispatch(aten._sparse_sum.dim, input, [dim] if isinstance(dim, int) else list(dim))


def softmax(input: Tensor, dim: int, *, dtype: Any = None) -> Tensor:
    return dispatch(aten._sparse_softmax.int, input, dim, None if dtype is None else dtypes.dtype(dtype))


def log_softmax(input: Tensor, dim: int, *, dtype: Any = None) -> Tensor:
    return dispatch(aten._sparse_log_softmax.int, input, dim, None if dtype is None else dtypes.dtype(dtype))


__all__ = ["check_sparse_tensor_invariants", "sparse_coo_tensor", "sparse_csr_tensor", "sparse_csc_tensor",
           "sparse_bsr_tensor", "sparse_bsc_tensor", "sparse_compressed_tensor", "to_sparse_semi_structured", "mm",
           "addmm", "sampled_addmm", "sum", "softmax", "log_softmax"]
