"""Helpers the VJP rules share: undoing broadcasting, zeros, dtype casts. All go through `kiln.ops` handles,
so a rule that uses them still runs on numpy arrays (eager autograd) and records ops (the joint program)."""

from __future__ import annotations

from typing import Any, Sequence

from kiln.ir.dtypes import DType
from kiln.ir.meta import dtype_of, shape_of
from kiln.ir.registry import ops

aten = ops.aten


def sum_to(grad: Any, shape: Sequence[Any]) -> Any:
    """Sum `grad` over the dims that broadcasting added or stretched, so it gets `shape` (torch's sum_to_size)."""
    grad_shape = shape_of(grad)
    lead = len(grad_shape) - len(shape)
    dims = list(range(lead))
    # Summing a dim that is already 1 changes nothing, so no guard is needed (a data-dependent size cannot answer one).
    dims += [lead + i for i, size in enumerate(shape)
             if isinstance(size, int) and size == 1 and not _is_literally_one(grad_shape[lead + i])]
    if not dims:
        return grad
    summed = aten.sum.dim_IntList(grad, dims, True)
    return aten.view.default(summed, list(shape)) if lead else summed


def _is_literally_one(size: Any) -> bool:
    return isinstance(size, int) and size == 1 or getattr(size, "is_Integer", False) and int(size) == 1


def sum_like(grad: Any, like: Any) -> Any:
    """`grad` reduced to `like`'s shape and cast to its dtype: the gradient of a broadcast operand."""
    return cast(sum_to(grad, shape_of(like)), dtype_of(like))


def cast(value: Any, dtype: DType) -> Any:
    return value if dtype_of(value) is dtype else aten._to_copy.default(value, dtype=dtype)


def zeros_like(value: Any) -> Any:
    return aten.full_like.default(value, 0)

