"""Building blocks for meta rules: dims, broadcasting, elementwise promotion, reductions.

A meta rule receives an op's bound arguments with tensors as anything that has `.shape` and `.dtype`
(a TensorType while tracing or verifying, a numpy array in eager mode) and returns TensorType(s).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from enum import Enum
from typing import Any, Callable, Sequence

import sympy

from kiln.ir import dtypes
from kiln.ir.dtypes import DType
from kiln.ir.errors import DTypeError, OpArgumentError, ShapeError
from kiln.ir.symbolic import SymInt, as_dim, guard_bool, sym_eq
from kiln.ir.types import TensorType


_CURRENT_OP: contextvars.ContextVar[str] = contextvars.ContextVar("kiln_current_op", default="op")


@contextlib.contextmanager
def op_context(name: str):
    """Name the op whose meta rule runs, so shared helpers can say which op refused its arguments."""
    token = _CURRENT_OP.set(name)
    try:
        yield
    finally:
        _CURRENT_OP.reset(token)


def current_op() -> str:
    return _CURRENT_OP.get()


def _described(tensor: Any) -> Any:
    """Numpy arrays and TensorTypes describe themselves; IR values (xDSL SSAValues) through their type."""
    return tensor if hasattr(tensor, "shape") else tensor.type


def dtype_of(tensor: Any) -> DType:
    return dtypes.dtype(_described(tensor).dtype)


def shape_of(tensor: Any) -> tuple[SymInt, ...]:
    return tuple(_described(tensor).shape)


def is_tensor(value: Any) -> bool:
    return (hasattr(value, "shape") and hasattr(value, "dtype")) or isinstance(getattr(value, "type", None),
                                                                             TensorType)


def tensor(shape: Sequence[SymInt], dtype: DType | str) -> TensorType:
    return TensorType.of(shape, dtype)


def like(tensor_value: Any, *, shape: Sequence[SymInt] | None = None, dtype: DType | None = None) -> TensorType:
    return TensorType.of(shape_of(tensor_value) if shape is None else shape,
                         dtype_of(tensor_value) if dtype is None else dtype)


def canonical_dim(op: str, dim: int, rank: int, *, allow_end: bool = False) -> int:
    """Wrap a negative dim like ATen's maybe_wrap_dim (a 0-d tensor accepts dims 0 and -1; `allow_end` counts one
    more position, where unsqueeze and stack insert a dim)."""
    size = max(rank + (1 if allow_end else 0), 1)
    if not -size <= dim < size:
        raise ShapeError(f"{op}: dimension {dim} is out of range for a tensor of rank {rank} "
                         f"(expected to be in [{-size}, {size - 1}])")
    return dim + size if dim < 0 else dim


def canonical_dims(op: str, dims: Sequence[int] | None, rank: int) -> list[int]:
    """Reduction dims: None or [] means all; duplicates are refused."""
    if not dims:
        return list(range(rank))
    result = [canonical_dim(op, d, rank) for d in dims]
    if len(set(result)) != len(result):
        raise ShapeError(f"{op}: dim {list(dims)} appears multiple times in the list of dims")
    return result


def broadcast_shapes(op: str, *shapes: Sequence[SymInt]) -> tuple[SymInt, ...]:
    """NumPy/ATen broadcasting; symbolic dims are compared through guards."""
    rank = max((len(s) for s in shapes), default=0)
    result: list[SymInt] = [1] * rank
    for shape in shapes:
        offset = rank - len(shape)
        for index, size in enumerate(shape):
            position = offset + index
            current = result[position]
            if isinstance(size, int) and size == 1:
                continue
            if isinstance(current, int) and current == 1:
                result[position] = size
                continue
            if sym_eq(current, size):
                continue
            if not isinstance(size, int) and guard_bool(sympy.Eq(size, 1)):
                continue
            if not isinstance(current, int) and guard_bool(sympy.Eq(current, 1)):
                result[position] = size
                continue
            raise ShapeError(
                f"{op}: shapes {[list(s) for s in shapes]} cannot be broadcast together "
                f"(size {size} vs {current} at dimension {position - rank})",
                fix="make the sizes equal, or 1, in that dimension")
    return tuple(as_dim(d) for d in result)


class Promotion(Enum):
    """torch._prims_common.ELEMENTWISE_TYPE_PROMOTION_KIND."""

    DEFAULT = "default"
    INT_TO_FLOAT = "int_to_float"
    ALWAYS_BOOL = "always_bool"
    BOOL_TO_LONG = "bool_to_long"
    NO_OPMATH = "no_opmath"


def promoted_for(kind: Promotion, common: DType) -> DType:
    """The result dtype of an elementwise op of this kind whose operands promote to `common`."""
    if kind is Promotion.ALWAYS_BOOL:
        return dtypes.bool_
    if kind is Promotion.INT_TO_FLOAT and not common.is_floating_point:
        return dtypes.default_float_dtype()
    if kind is Promotion.BOOL_TO_LONG and common.is_bool:
        return dtypes.int64
    return common


def elementwise_dtype(kind: Promotion, *operands: Any) -> DType:
    """The result dtype of an elementwise op over tensors and Python scalars."""
    return promoted_for(kind, dtypes.result_type(*operands))


def pointwise(kind: Promotion = Promotion.DEFAULT, operands: int = 2,
              check: Callable[..., None] | None = None) -> Callable[..., TensorType]:
    """Meta rule for an elementwise op whose first `operands` arguments broadcast and promote."""
    def meta(*args: Any) -> TensorType:
        participants = [a for a in args[:operands] if a is not None]
        shapes = [shape_of(a) for a in participants if is_tensor(a)]
        if check is not None:
            check(*args)
        return tensor(broadcast_shapes(current_op(), *shapes), elementwise_dtype(kind, *participants))
    return meta


def reduced_shape(shape: Sequence[SymInt], dims: Sequence[int], keepdim: bool) -> list[SymInt]:
    if keepdim:
        return [1 if i in dims else s for i, s in enumerate(shape)]
    return [s for i, s in enumerate(shape) if i not in dims]


def require(condition: bool, op: str, message: str, fix: str | None = None) -> None:
    """Raise ShapeError unless condition holds (user-facing checks in meta rules)."""
    if not condition:
        raise ShapeError(f"{op}: {message}", fix=fix)


def require_dtype(condition: bool, op: str, message: str, fix: str | None = None) -> None:
    if not condition:
        raise DTypeError(f"{op}: {message}", fix=fix)


def require_arg(condition: bool, op: str, message: str, fix: str | None = None) -> None:
    if not condition:
        raise OpArgumentError(f"{op}: {message}", fix=fix)


def numel(shape: Sequence[SymInt]) -> SymInt:
    result: SymInt = 1
    for size in shape:
        result = result * size
    return as_dim(result)


def unbacked_size(source: str = "", *, min: float = 0, max: float = math.inf) -> SymInt:
    """A fresh data-dependent integer (the length of `nonzero`'s result, a value read by `.item()`) from the
    active ShapeEnv, with the range it is known to lie in."""
    from kiln.ir.symbolic import current_shape_env
    env = current_shape_env()
    if env is None:
        env = _FALLBACK_ENV
    return env.create_unbacked_symbol(source=source, min=min, max=max)


from kiln.ir.symbolic import ShapeEnv as _ShapeEnv  # noqa: E402

_FALLBACK_ENV = _ShapeEnv()
