"""Shape and view ops: view, reshape, permute, expand, squeeze/unsqueeze, cat, split, slice, pad, ...

kiln programs are functional, so a "view" op (tag `view`) is a value that torch would alias; its
kernel may return a numpy view, and no kernel ever writes into its inputs. Meta rules keep every size
symbolic (sympy): clamping uses `Min`/`Max` unless the ShapeEnv's ranges decide it, and a question
that needs a concrete answer (how many chunks, is this dim 1?) is decided through a guard.
"""

from __future__ import annotations

import functools
import math
import sys

import ml_dtypes
import numpy as np
import sympy

from kiln.ir import dtypes
from kiln.ir.errors import GuardError
from kiln.ir.meta import (
    canonical_dim, dtype_of, like, numel, require, require_arg, shape_of, tensor,
)
from kiln.ir.ops._common import checked
from kiln.ir.registry import REGISTRY, defop, ops, register_decomposition
from kiln.ir.symbolic import as_dim, current_shape_env, floor_div, guard_bool, provably
from kiln.ir.types import SymIntType

aten = ops.aten


# ---------------------------------------------------------------------------------------------
# Symbolic helpers (`holds`, `same_size` and `fill_value` are shared with indexing.py).

def holds(condition) -> bool:
    """Decide a user-facing check: statically, else through a guard on the example values. A check on
    data-dependent (unbacked) sizes that cannot be decided is assumed to hold, like torch's
    size-oblivious checks; the kernel re-checks concrete values."""
    try:
        return guard_bool(condition)
    except GuardError:
        return True


def same_size(a, b) -> bool:
    """Check that two dims are equal: exactly for ints, else through `holds`."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return holds(sympy.Eq(a, b))


def same_shape(a, b) -> bool:
    """Check that two shapes are equal: the same rank, and each dim through `same_size`."""
    return len(a) == len(b) and all(same_size(x, y) for x, y in zip(a, b))


def _guard_or(condition, default: bool) -> bool:
    """Decide a branch through a guard, or take `default` when it depends on unbacked sizes."""
    try:
        return guard_bool(condition)
    except GuardError:
        return default


def _sym_min(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    known = provably(sympy.Le(a, b))
    return a if known is True else b if known is False else as_dim(sympy.Min(a, b))


def _sym_max(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    known = provably(sympy.Ge(a, b))
    return a if known is True else b if known is False else as_dim(sympy.Max(a, b))


def _ceil_div(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return -(-a // b)
    return as_dim(sympy.ceiling(sympy.sympify(a) / b))


def _is_one(size) -> bool:
    """Whether a dim is 1; an undecidable data-dependent dim counts as not 1 (torch's guard_or_false)."""
    if isinstance(size, int):
        return size == 1
    return _guard_or(sympy.Eq(size, 1), False)


def _is_negative_int(value) -> bool:
    return isinstance(value, int) and value < 0


_SCAN_LIMIT = 1 << 16


def _piece_count(op: str, size, count_of, what: str, constant_above: int | None = None) -> int:
    """How many results an op has when that number, `count_of(size)`, depends on a possibly symbolic size
    (`count_of` is constant for sizes above `constant_above`, when given).

    A symbolic size is pinned, through guards on its example value, to the interval of sizes that give
    the same count; later (when the program is verified without example values) the ranges alone
    decide the count again."""
    if isinstance(size, int):
        return count_of(size)
    env = current_shape_env()
    info = env.symbols.get(size) if env is not None and isinstance(size, sympy.Symbol) else None
    if info is None:
        hint = env.hint(size) if env is not None else None
        if hint is None:
            raise GuardError(f"{op}: the {what} depends on the size {size}, which has no example value",
                             fix="make that dim static, or give it an example value when tracing")
        guard_bool(sympy.Eq(size, hint))  # an expression of several symbols: specialize it
        return count_of(hint)
    low, high = info.range.lower, info.range.upper
    top = high if constant_above is None else min(high, max(low, constant_above + 1))
    if top - low <= _SCAN_LIMIT:
        counts = {count_of(value) for value in range(int(low), int(top) + 1)}
        if len(counts) == 1:
            return counts.pop()
    if info.hint is None:
        raise GuardError(f"{op}: the {what} depends on the size {size}, which has no example value here",
                         fix="make that dim static, or give it an example value when tracing")
    count = count_of(info.hint)
    first = last = info.hint
    while first - 1 >= max(low, info.hint - _SCAN_LIMIT) and count_of(first - 1) == count:
        first -= 1
    while last + 1 <= min(high, info.hint + _SCAN_LIMIT) and count_of(last + 1) == count:
        last += 1
        if constant_above is not None and last > constant_above:
            last = math.inf
            break
    guard_bool(sympy.Ge(size, first))
    if last != math.inf:
        guard_bool(sympy.Le(size, last))
    return count


def _shown(sizes) -> str:
    return "[" + ", ".join(str(s) for s in sizes) + "]"


def _rank(value) -> int:
    return len(shape_of(value))


def _dims_in_range(op: str, dims, rank: int) -> list[int]:
    """Wrap a list of dims, refusing duplicates (ATen's dim_list_to_bitset)."""
    wrapped = [canonical_dim(op, d, rank) for d in dims]
    seen = set()
    for d in wrapped:
        require(d not in seen, op, f"dim {d} appears multiple times in the list of dims")
        seen.add(d)
    return wrapped


def _axis_index(rank: int, dim: int, item) -> tuple:
    """A numpy index selecting `item` along `dim` and everything along the other dims."""
    return (slice(None),) * dim + (item,) + (slice(None),) * (rank - dim - 1)


# ---------------------------------------------------------------------------------------------
# Fill values (constant_pad_nd, pad, scatter.value): ATen's checked Scalar conversion.

def fill_value(op: str, value, dt: dtypes.DType) -> np.ndarray:
    """`value` converted to dtype `dt` as a 0-d array, refusing values that overflow it (c10's
    checked_convert): integers must fit (uint8 also accepts negatives down to -255, which wrap), and
    finite floats must not exceed the float type's range."""
    if dt.is_bool:
        return np.asarray(bool(value))
    if dt.is_integral and not isinstance(value, bool):
        info = np.iinfo(dt.numpy)
        low = -int(info.max) if not dt.is_signed else int(info.min)
        fits = (math.isfinite(value) if isinstance(value, float) else True) and low <= value <= int(info.max)
        require_arg(fits, op, f"value {value} cannot be converted to type {dt.name} without overflow")
        if isinstance(value, float):
            value = int(value)  # truncation toward zero, like static_cast
        return np.asarray(value % (int(info.max) + 1) if value < 0 and not dt.is_signed else value, dt.numpy)
    if dt.is_floating_point and isinstance(value, (int, float)) and not isinstance(value, bool):
        finite_max = float(ml_dtypes.finfo(dt.numpy).max)
        fits = not math.isfinite(float(value)) or abs(float(value)) <= finite_max
        require_arg(fits, op, f"value {value} cannot be converted to type {dt.name} without overflow")
    return np.asarray(value).astype(dt.numpy)


# ---------------------------------------------------------------------------------------------
# view, reshape and friends

def infer_size(op: str, shape, size):
    """Resolve one -1 in a requested size and check the element count matches (ATen's infer_size)."""
    size = [as_dim(s) for s in size]
    wildcard = [i for i, s in enumerate(size) if isinstance(s, int) and s == -1]
    require(len(wildcard) <= 1, op, "only one dimension can be inferred")
    for index, s in enumerate(size):
        require(not (isinstance(s, int) and s < -1), op,
                f"invalid shape dimension {s} at index {index} of shape {_shown(size)}")
    requested = _shown(size)
    total = numel(shape)
    if wildcard:
        known = numel([s for i, s in enumerate(size) if i != wildcard[0]])
        require(holds(sympy.Ne(known, 0)), op,
                f"cannot reshape tensor of {total} elements into shape {requested} because the "
                f"unspecified dimension size -1 can be any value and is ambiguous")
        if isinstance(total, int) and isinstance(known, int):
            inferred = total // known
        else:
            inferred = as_dim(sympy.floor(sympy.sympify(total) / known))
        size[wildcard[0]] = inferred
    require(same_size(numel(size), total), op, f"shape {requested} is invalid for input of size {total}")
    return size


def _view_meta(op):
    return lambda self, size: like(self, shape=infer_size(op, shape_of(self), size))


def _view_kernel(op):
    return lambda self, size: np.reshape(self, infer_size(op, self.shape, size))


defop("view(Tensor(a) self, SymInt[] size) -> Tensor(a)",
      _view_meta("aten.view.default"), _view_kernel("aten.view.default"), tags=("view",))

# kiln is functional, so reshape never needs the copy ATen makes for non-viewable strides: it is a view.
defop("reshape(Tensor(a) self, SymInt[] shape) -> Tensor(a)",
      _view_meta("aten.reshape.default"), _view_kernel("aten.reshape.default"), tags=("composite", "view"))


@register_decomposition("aten.reshape.default")
def _reshape(self, shape):
    return aten.view.default(self, shape)


defop("_unsafe_view(Tensor self, SymInt[] size) -> Tensor",
      _view_meta("aten._unsafe_view.default"), _view_kernel("aten._unsafe_view.default"), tags=("composite",))


@register_decomposition("aten._unsafe_view.default")
def _unsafe_view(self, size):
    return aten.view.default(self, size)


# view_as / reshape_as: `other`'s shape; in kiln's functional IR a view and a reshape compute the same values.
for _name in ("view_as", "reshape_as"):
    defop(f"{_name}(Tensor(a) self, Tensor other) -> Tensor(a)",
          lambda self, other, _op=f"aten.{_name}.default": like(
              self, shape=infer_size(_op, shape_of(self), shape_of(other))),
          # (the kernel checks the sizes again: `other`'s may be data-dependent, known only now)
          lambda self, other, _op=f"aten.{_name}.default": np.reshape(self, infer_size(_op, self.shape, other.shape)),
          tags=("composite", "view"))
    register_decomposition(f"aten.{_name}.default")(
        lambda self, other: aten.view.default(self, list(shape_of(other))))


def _flatten_shape(op, shape, start_dim, end_dim):
    start, end = canonical_dim(op, start_dim, len(shape)), canonical_dim(op, end_dim, len(shape))  # 0-d: 0 or -1
    if not shape:
        return [1]
    require(start <= end, op, "flatten() has invalid args: start_dim cannot come after end_dim")
    return list(shape[:start]) + [numel(shape[start:end + 1])] + list(shape[end + 1:])


defop("flatten.using_ints(Tensor(a) self, int start_dim=0, int end_dim=-1) -> Tensor(a)",
      lambda self, start_dim=0, end_dim=-1: like(
          self, shape=_flatten_shape("aten.flatten.using_ints", shape_of(self), start_dim, end_dim)),
      lambda self, start_dim=0, end_dim=-1: np.reshape(
          self, _flatten_shape("aten.flatten.using_ints", self.shape, start_dim, end_dim)),
      tags=("composite", "view"))


@register_decomposition("aten.flatten.using_ints")
def _flatten(self, start_dim=0, end_dim=-1):
    shape = shape_of(self)
    flat = _flatten_shape("aten.flatten.using_ints", shape, start_dim, end_dim)
    if len(flat) == len(shape):
        return self  # nothing merged: torch returns the input itself
    return aten.view.default(self, flat)


def _unflatten_shape(op, shape, dim, sizes):
    require(len(shape) > 0, op, "cannot unflatten a 0-dim tensor")
    require(len(sizes) > 0, op, "sizes must be non-empty")
    d = canonical_dim(op, dim, len(shape))
    if not any(isinstance(s, int) and s == -1 for s in sizes):
        require(same_size(numel(sizes), shape[d]), op, f"provided sizes {_shown(sizes)} don't multiply up to the size "
                                                   f"of dim {d} ({shape[d]}) in the input tensor")
    inner = infer_size(op, [shape[d]], sizes)
    return list(shape[:d]) + inner + list(shape[d + 1:])


defop("unflatten.int(Tensor(a) self, int dim, SymInt[] sizes) -> Tensor(a)",
      lambda self, dim, sizes: like(self, shape=_unflatten_shape("aten.unflatten.int", shape_of(self), dim, sizes)),
      lambda self, dim, sizes: np.reshape(self, _unflatten_shape("aten.unflatten.int", self.shape, dim, sizes)),
      tags=("composite", "view"))


@register_decomposition("aten.unflatten.int")
def _unflatten(self, dim, sizes):
    return aten.view.default(self, _unflatten_shape("aten.unflatten.int", shape_of(self), dim, sizes))


# ---------------------------------------------------------------------------------------------
# as_strided: a window on the input's contiguous storage


def _as_strided_meta(self, size, stride, storage_offset=None):
    op = "aten.as_strided.default"
    require(len(size) == len(stride), op,
            f"mismatch in length of strides and shape: {len(stride)} strides for {len(size)} sizes")
    require(not any(_is_negative_int(s) for s in stride), op,
            f"negative strides are not supported, got strides: {_shown(stride)}")
    require(not any(_is_negative_int(s) for s in size), op, f"negative sizes are not allowed: {_shown(size)}")
    offset = 0 if storage_offset is None else storage_offset
    require(not _is_negative_int(offset), op, f"invalid storage offset {offset}")
    if not any(isinstance(s, int) and s == 0 for s in size):
        _require_inside(size, stride, offset, numel(shape_of(self)))
    return like(self, shape=size)


def _require_inside(size, stride, offset, storage) -> None:
    """The window's last element lies inside the storage: proved where the sizes are known (meta), checked on the
    values where one is data-dependent (nonzero's rows), as torch checks at run time."""
    last = offset + sum(((s - 1) * st for s, st in zip(size, stride)), 0)
    require(holds(sympy.Lt(last, storage)), "aten.as_strided.default",
            f"sizes {_shown(size)}, strides {_shown(stride)} and storage offset {offset} reach element {last} of a "
            f"storage of {storage} elements")


def _as_strided(self, size, stride, storage_offset=None):
    if any(s == 0 for s in size):
        return np.empty(size, self.dtype)
    _require_inside(size, stride, storage_offset or 0, self.size)  # numpy's as_strided would read past the array
    storage = np.ascontiguousarray(self).reshape(-1)[storage_offset or 0:]
    window = np.lib.stride_tricks.as_strided(storage, shape=size,
                                             strides=[s * storage.itemsize for s in stride], writeable=False)
    return window.copy()  # overlapping windows must not alias each other's elements


defop("as_strided(Tensor(a) self, SymInt[] size, SymInt[] stride, SymInt? storage_offset=None) -> Tensor(a)",
      _as_strided_meta, _as_strided, tags=("view",))


# ---------------------------------------------------------------------------------------------
# permute, transpose, t, movedim


def _permute_dims(op, rank, dims):
    require(len(dims) == rank, op,
            f"number of dims in the permutation ({len(dims)}) does not match the tensor's rank ({rank})")
    wrapped = [canonical_dim(op, d, rank) for d in dims]
    require(len(set(wrapped)) == len(wrapped), op, f"duplicate dims are not allowed: {list(dims)}")
    return wrapped


def _permute_meta(self, dims):
    shape = shape_of(self)
    order = _permute_dims("aten.permute.default", len(shape), dims)
    return like(self, shape=[shape[d] for d in order])


defop("permute(Tensor(a) self, int[] dims) -> Tensor(a)", _permute_meta,
      lambda self, dims: np.transpose(self, _permute_dims("aten.permute.default", self.ndim, dims)),
      tags=("view",))


def _swap_order(op, rank, dim0, dim1):
    order = list(range(rank))
    a, b = canonical_dim(op, dim0, rank), canonical_dim(op, dim1, rank)
    if rank:
        order[a], order[b] = order[b], order[a]
    return order


def _define_swap(schema: str, name: str) -> None:
    op = f"aten.{name}"

    def meta(self, dim0, dim1):
        shape = shape_of(self)
        return like(self, shape=[shape[d] for d in _swap_order(op, len(shape), dim0, dim1)])

    defop(schema, meta, lambda self, dim0, dim1: np.transpose(self, _swap_order(op, self.ndim, dim0, dim1)),
          tags=("composite", "view"))

    @register_decomposition(op)
    def decompose(self, dim0, dim1):
        return aten.permute.default(self, _swap_order(op, _rank(self), dim0, dim1))


_define_swap("transpose.int(Tensor(a) self, int dim0, int dim1) -> Tensor(a)", "transpose.int")
_define_swap("swapaxes(Tensor(a) self, int axis0, int axis1) -> Tensor(a)", "swapaxes.default")


def _t_order(rank):
    require(rank <= 2, "aten.t.default", f"t() expects a tensor with <= 2 dimensions, but self is {rank}D")
    return list(range(rank))[::-1]


def _t_meta(self):
    shape = shape_of(self)
    return like(self, shape=[shape[d] for d in _t_order(len(shape))])


defop("t(Tensor(a) self) -> Tensor(a)", _t_meta,
      lambda self: np.transpose(self, _t_order(self.ndim)), tags=("composite", "view"))


@register_decomposition("aten.t.default")
def _t(self):
    order = _t_order(_rank(self))
    return aten.permute.default(self, order) if len(order) == 2 else self


# numpy_T: `x.T`, every dim reversed (Falcon's rotary embedding keeps it in torch.export's IR)
defop("numpy_T(Tensor(a) self) -> Tensor(a)",
      lambda self: like(self, shape=list(shape_of(self))[::-1]), lambda self: np.transpose(self),
      tags=("composite", "view"))


@register_decomposition("aten.numpy_T.default")
def _numpy_t(self):
    rank = _rank(self)
    return aten.permute.default(self, list(range(rank))[::-1]) if rank >= 2 else self


def _movedim_order(rank, source, destination):
    op = "aten.movedim.int"
    src, dst = canonical_dim(op, source, rank), canonical_dim(op, destination, rank)
    if rank == 0:
        return []
    order = [d for d in range(rank) if d != src]
    order.insert(dst, src)
    return order


defop("movedim.int(Tensor(a) self, int source, int destination) -> Tensor(a)",
      lambda self, source, destination: like(
          self, shape=[shape_of(self)[d] for d in _movedim_order(_rank(self), source, destination)]),
      lambda self, source, destination: np.transpose(self, _movedim_order(self.ndim, source, destination)),
      tags=("composite", "view"))


@register_decomposition("aten.movedim.int")
def _movedim(self, source, destination):
    return aten.permute.default(self, _movedim_order(_rank(self), source, destination))


# ---------------------------------------------------------------------------------------------
# expand, repeat


def _expand_shape(op, shape, size):
    require(len(size) >= len(shape), op,
            f"the number of sizes provided ({len(size)}) must be greater or equal to the number of "
            f"dimensions in the tensor ({len(shape)})")
    leading = len(size) - len(shape)
    result = []
    for index, target in enumerate(size):
        target = as_dim(target)
        if index < leading:
            require(not _is_negative_int(target), op,
                    f"the expanded size of the tensor ({target}) isn't allowed in a leading, "
                    f"non-existing dimension {index}")
            result.append(target)
            continue
        current = shape[index - leading]
        if isinstance(target, int) and target == -1:
            result.append(current)
            continue
        require(not _is_negative_int(target), op, f"invalid expanded size {target} at dimension {index}")
        # Equal sizes first: asking "is it 1?" about a symbol would guard it away from 1 for nothing.
        # Undecidable (no example values, e.g. when re-verifying): assume the sizes match.
        if sympy.sympify(current) == sympy.sympify(target) or _is_one(current) or _guard_or(
                sympy.Eq(current, target), True):
            result.append(target)
            continue
        require(False, op, f"the expanded size of the tensor ({target}) must match the existing size "
                           f"({current}) at non-singleton dimension {index}. Target sizes: {_shown(size)}. "
                           f"Tensor sizes: {_shown(shape)}")
    return result


defop("expand(Tensor(a) self, SymInt[] size, *, bool implicit=False) -> Tensor(a)",
      lambda self, size, implicit=False: like(self, shape=_expand_shape("aten.expand.default", shape_of(self), size)),
      lambda self, size, implicit=False: np.broadcast_to(
          self, _expand_shape("aten.expand.default", self.shape, size)),
      tags=("view",))

defop("expand_as(Tensor(a) self, Tensor other) -> Tensor(a)",
      lambda self, other: like(self, shape=_expand_shape("aten.expand_as.default", shape_of(self), shape_of(other))),
      lambda self, other: np.broadcast_to(self, _expand_shape("aten.expand_as.default", self.shape, other.shape)),
      tags=("composite", "view"))


@register_decomposition("aten.expand_as.default")
def _expand_as(self, other):
    return aten.expand.default(self, list(shape_of(other)))


# broadcast_to: torch.broadcast_to, expand by another name (WavLM's relative position bias)
defop("broadcast_to(Tensor(a) self, SymInt[] size) -> Tensor(a)",
      lambda self, size: like(self, shape=_expand_shape("aten.broadcast_to.default", shape_of(self), size)),
      lambda self, size: np.broadcast_to(self, _expand_shape("aten.broadcast_to.default", self.shape, size)),
      tags=("composite", "view"))


@register_decomposition("aten.broadcast_to.default")
def _broadcast_to(self, size):
    return aten.expand.default(self, list(size))


def _repeat_shape(op, shape, repeats):
    require(len(repeats) >= len(shape), op,
            "number of dimensions of repeat dims can not be smaller than number of dimensions of tensor")
    require(not any(_is_negative_int(r) for r in repeats), op, f"repeats must be non-negative, got {_shown(repeats)}")
    padded = [1] * (len(repeats) - len(shape)) + list(shape)
    return [as_dim(s * r) for s, r in zip(padded, repeats)]


def _repeat(self, repeats):
    padded = self.reshape((1,) * (len(repeats) - self.ndim) + self.shape)
    return np.tile(padded, repeats)


defop("repeat(Tensor self, SymInt[] repeats) -> Tensor",
      lambda self, repeats: like(self, shape=_repeat_shape("aten.repeat.default", shape_of(self), repeats)), _repeat)


def _tile_repeats(rank, dims):
    """tile's dims, padded with leading 1s to the tensor's rank (fewer dims repeat the trailing ones)."""
    return [1] * (rank - len(dims)) + list(dims)


defop("tile(Tensor self, SymInt[] dims) -> Tensor",
      lambda self, dims: like(self, shape=_repeat_shape(
          "aten.tile.default", shape_of(self), _tile_repeats(_rank(self), dims))),
      lambda self, dims: _repeat(self, _tile_repeats(self.ndim, dims)), tags=("composite",))


@register_decomposition("aten.tile.default")
def _tile(self, dims):
    return aten.repeat.default(self, _tile_repeats(_rank(self), dims))


# ---------------------------------------------------------------------------------------------
# unfold: sliding windows as a new last dim


def _unfold_windows(op, shape, dimension, size, step):
    """(the wrapped dim, its number of windows) for unfold(dimension, size, step), with ATen's checks; a 0-d
    tensor unfolds as one element."""
    d = canonical_dim(op, dimension, max(len(shape), 1))
    length = shape[d] if shape else 1
    require(size >= 0, op, f"size is {size} but must be >= 0")
    require(holds(sympy.Le(size, length)) if not isinstance(length, int) else size <= length, op,
            f"maximum size for tensor at dimension {d} is {length} but size is {size}")
    require(step > 0, op, f"step is {step} but must be > 0")
    return d, as_dim(floor_div(length - size, step) + 1)


def _unfold_meta(self, dimension, size, step):
    shape = list(shape_of(self))
    d, windows = _unfold_windows("aten.unfold.default", shape, dimension, size, step)
    return like(self, shape=[*shape[:d], windows, *shape[d + 1:], size] if shape else [size])


def _unfold_kernel(self, dimension, size, step):
    d, windows = _unfold_windows("aten.unfold.default", list(self.shape), dimension, size, step)
    if self.ndim == 0:
        return self.reshape(1)[:size].copy()
    views = np.lib.stride_tricks.sliding_window_view(self, size, axis=d)
    return np.take(views, np.arange(windows) * step, axis=d)


defop("unfold(Tensor(a) self, int dimension, int size, int step) -> Tensor(a)", _unfold_meta, _unfold_kernel,
      tags=("composite", "view"))


@register_decomposition("aten.unfold.default")
def _unfold(self, dimension, size, step):
    """Windows gathered along the dim (window w, offset k: element w * step + k), then the offsets moved last."""
    shape = list(shape_of(self))
    if not shape:
        return aten.slice.Tensor(aten.reshape.default(self, [1]), 0, 0, size)
    d, windows = _unfold_windows("aten.unfold.default", shape, dimension, size, step)
    starts = aten.mul.Scalar(aten.arange.default(windows, dtype=dtypes.int64), step)
    positions = aten.add.Tensor(aten.unsqueeze.default(starts, 1),
                                aten.unsqueeze.default(aten.arange.default(size, dtype=dtypes.int64), 0))
    gathered = aten.index_select.default(self, d, aten.reshape.default(positions, [-1]))
    split = aten.reshape.default(gathered, [*shape[:d], windows, size, *shape[d + 1:]])
    return aten.movedim.int(split, d + 1, -1)


def _repeat_interleave_shape(op, shape, repeats, dim, output_size):
    require(not _is_negative_int(repeats), op, f"repeats must be non-negative, got {repeats}")
    if dim is None:
        result = [as_dim(numel(shape) * repeats)]
        axis = 0
    else:
        # torch's implementation unsqueezes after `dim`, so a 0-d input has no valid dim.
        require(len(shape) > 0, op, "a 0-dim tensor has no dim to repeat along; pass dim=None")
        axis = canonical_dim(op, dim, len(shape))
        result = list(shape)
        result[axis] = as_dim(shape[axis] * repeats)
    if output_size is not None:
        require(same_size(output_size, result[axis]), op,
                f"invalid output_size, expected {result[axis]} but got {output_size}")
    return result


def _repeat_interleave_kernel(self, repeats, dim=None, output_size=None):
    op = "aten.repeat_interleave.self_int"
    shape = _repeat_interleave_shape(op, self.shape, repeats, dim, output_size)
    axis = None if dim is None else canonical_dim(op, dim, self.ndim)
    return np.repeat(self, repeats, axis=axis).reshape(shape)


defop("repeat_interleave.self_int(Tensor self, SymInt repeats, int? dim=None, *, SymInt? output_size=None) -> Tensor",
      lambda self, repeats, dim=None, output_size=None: like(self, shape=_repeat_interleave_shape(
          "aten.repeat_interleave.self_int", shape_of(self), repeats, dim, output_size)),
      _repeat_interleave_kernel, tags=("composite",))


@register_decomposition("aten.repeat_interleave.self_int")
def _repeat_interleave(self, repeats, dim=None, output_size=None):
    op = "aten.repeat_interleave.self_int"
    result_shape = _repeat_interleave_shape(op, shape_of(self), repeats, dim, output_size)
    if dim is None:
        self = aten.view.default(self, [numel(shape_of(self))])
        axis = 0
    else:
        axis = canonical_dim(op, dim, _rank(self))
    # Each element repeated in place: [.., n, ..] -> [.., n, 1, ..] -> [.., n, r, ..] -> [.., n*r, ..]
    shape = list(shape_of(self))
    spread = aten.expand.default(aten.unsqueeze.default(self, axis + 1),
                                 shape[:axis + 1] + [repeats] + shape[axis + 1:])
    return aten.view.default(spread, result_shape)


# ---------------------------------------------------------------------------------------------
# squeeze, unsqueeze


def _squeezed_dims(op, shape, dims):
    """The dims among `dims` that really are 1 (others are kept, as in ATen)."""
    wrapped = _dims_in_range(op, dims, len(shape))
    return [d for d in wrapped if d < len(shape) and _is_one(shape[d])]


def _squeeze_meta(op):
    def meta(self, dims):
        shape = shape_of(self)
        drop = set(_squeezed_dims(op, shape, dims))
        return like(self, shape=[s for i, s in enumerate(shape) if i not in drop])
    return meta


def _squeeze_kernel(op):
    return lambda self, dims: np.squeeze(self, axis=tuple(_squeezed_dims(op, self.shape, dims)))


defop("squeeze.dim(Tensor(a) self, int dim) -> Tensor(a)",
      lambda self, dim: _squeeze_meta("aten.squeeze.dim")(self, [dim]),
      lambda self, dim: _squeeze_kernel("aten.squeeze.dim")(self, [dim]), tags=("view",))
defop("squeeze.dims(Tensor(a) self, int[] dim) -> Tensor(a)",
      _squeeze_meta("aten.squeeze.dims"), _squeeze_kernel("aten.squeeze.dims"), tags=("view",))
defop("squeeze(Tensor(a) self) -> Tensor(a)",
      lambda self: _squeeze_meta("aten.squeeze.default")(self, list(range(_rank(self)))),
      lambda self: _squeeze_kernel("aten.squeeze.default")(self, list(range(self.ndim))),
      tags=("composite", "view"))


@register_decomposition("aten.squeeze.default")
def _squeeze(self):
    shape = shape_of(self)
    return aten.squeeze.dims(self, [d for d, size in enumerate(shape) if _is_one(size)])


def _unsqueeze_meta(self, dim):
    shape = list(shape_of(self))
    shape.insert(canonical_dim("aten.unsqueeze.default", dim, len(shape), allow_end=True), 1)
    return like(self, shape=shape)


defop("unsqueeze(Tensor(a) self, int dim) -> Tensor(a)", _unsqueeze_meta,
      lambda self, dim: np.expand_dims(self, canonical_dim("aten.unsqueeze.default", dim, self.ndim, allow_end=True)),
      tags=("view",))


# ---------------------------------------------------------------------------------------------
# contiguous: every kiln value is logically contiguous


defop("contiguous(Tensor(a) self, *, MemoryFormat memory_format=0) -> Tensor(a)",
      lambda self, memory_format=0: like(self), lambda self, memory_format=0: np.array(self, order="C"),
      tags=("composite", "view"))


@register_decomposition("aten.contiguous.default")
def _contiguous(self, memory_format=0):
    # torch.contiguous returns its input when it is already contiguous, which every kiln value is.
    return self


# ---------------------------------------------------------------------------------------------
# select, slice, narrow, diagonal and their scatters


def _select_check(op, shape, dim, index):
    """(wrapped dim, result shape) of selecting `index` along `dim`; the index must be in [-size, size)."""
    require(len(shape) > 0, op, "select() cannot be applied to a 0-dim tensor")
    d = canonical_dim(op, dim, len(shape))
    size = shape[d]
    require(holds(sympy.Ge(index, -size)) and holds(sympy.Lt(index, size)), op,
            f"index {index} out of range for tensor of size {_shown(shape)} at dimension {d}")
    return d, list(shape[:d]) + list(shape[d + 1:])


def _select_meta(self, dim, index):
    return like(self, shape=_select_check("aten.select.int", shape_of(self), dim, index)[1])


def _select(self, dim, index):
    d, _ = _select_check("aten.select.int", self.shape, dim, index)
    return np.asarray(self[_axis_index(self.ndim, d, index)])


defop("select.int(Tensor(a) self, int dim, SymInt index) -> Tensor(a)", _select_meta, _select, tags=("view",))


def _require_same_shape(op, src_shape, expected, what):
    require(same_shape(src_shape, expected), op,
            f"expected src to have a size equal to the {what} of self. src size = {_shown(src_shape)}, "
            f"{what} size = {_shown(expected)}")


def _select_scatter_meta(self, src, dim, index):
    op = "aten.select_scatter.default"
    _, expected = _select_check(op, shape_of(self), dim, index)
    _require_same_shape(op, shape_of(src), expected, "slice")
    return like(self)


def _select_scatter(self, src, dim, index):
    op = "aten.select_scatter.default"
    d, expected = _select_check(op, self.shape, dim, index)
    _require_same_shape(op, src.shape, expected, "slice")  # (again at run time: a symbolic size may differ)
    result = self.copy()
    result[_axis_index(self.ndim, d, index)] = src
    return result


defop("select_scatter(Tensor self, Tensor src, int dim, SymInt index) -> Tensor",
      _select_scatter_meta, _select_scatter)


def slice_bounds(op, size, start, end, step):
    """ATen's slice arithmetic: (start, end, length) after wrapping negatives and clamping to [0, size].

    Symbolic bounds stay exact: clamps become sympy Min/Max unless the ranges decide them, and only the
    sign of a symbolic start/end (which picks the formula) is guarded."""
    require(holds(sympy.Gt(step, 0)) if not isinstance(step, int) else step > 0, op, "slice step must be positive")
    start = 0 if start is None else as_dim(start)
    if end is None or (isinstance(end, int) and end >= sys.maxsize):
        end = size  # torch spells "to the end" as INT64_MAX
    end = as_dim(end)
    if _is_negative_int(start) or (not isinstance(start, int) and _guard_or(sympy.Lt(start, 0), False)):
        start = as_dim(start + size)
    if _is_negative_int(end) or (not isinstance(end, int) and _guard_or(sympy.Lt(end, 0), False)):
        end = as_dim(end + size)
    start = _sym_min(_sym_max(start, 0), size)
    end = _sym_max(_sym_min(end, size), start)
    if isinstance(step, int) and step == 1:
        length = as_dim(end - start)
    elif all(isinstance(v, int) for v in (start, end, step)):
        length = (end - start + step - 1) // step
    else:
        length = as_dim(sympy.floor((sympy.sympify(end) - start + step - 1) / step))
    return start, end, length


def _slice_shape(op, shape, dim, start, end, step):
    """(wrapped dim, numpy slice of that dim, result shape)."""
    require(len(shape) > 0, op, "slice() cannot be applied to a 0-dim tensor")
    d = canonical_dim(op, dim, len(shape))
    begin, stop, length = slice_bounds(op, shape[d], start, end, step)
    return d, slice(begin, stop, step), list(shape[:d]) + [length] + list(shape[d + 1:])


def _slice_index(op, array, dim, start, end, step):
    d, window, _ = _slice_shape(op, array.shape, dim, start, end, step)
    return _axis_index(array.ndim, d, window)


defop("slice.Tensor(Tensor(a) self, int dim=0, SymInt? start=None, SymInt? end=None, SymInt step=1) -> Tensor(a)",
      lambda self, dim=0, start=None, end=None, step=1: like(
          self, shape=_slice_shape("aten.slice.Tensor", shape_of(self), dim, start, end, step)[2]),
      lambda self, dim=0, start=None, end=None, step=1: self[
          _slice_index("aten.slice.Tensor", self, dim, start, end, step)],
      tags=("view",))


def _slice_scatter_meta(self, src, dim=0, start=None, end=None, step=1):
    op = "aten.slice_scatter.default"
    _, _, expected = _slice_shape(op, shape_of(self), dim, start, end, step)
    _require_same_shape(op, shape_of(src), expected, "slice")
    return like(self)


def _slice_scatter(self, src, dim=0, start=None, end=None, step=1):
    op = "aten.slice_scatter.default"
    _require_same_shape(op, src.shape, _slice_shape(op, self.shape, dim, start, end, step)[2], "slice")
    result = self.copy()
    result[_slice_index(op, self, dim, start, end, step)] = src
    return result


defop("slice_scatter(Tensor self, Tensor src, int dim=0, SymInt? start=None, SymInt? end=None, SymInt step=1) "
      "-> Tensor", _slice_scatter_meta, _slice_scatter)


def _narrow_range(op, shape, dim, start, length):
    """(dim, start, end) of a narrow, with start wrapped; checks like ATen's narrow."""
    require(len(shape) > 0, op, "narrow() cannot be applied to a 0-dim tensor")
    d = canonical_dim(op, dim, len(shape))
    size = shape[d]
    require(not _is_negative_int(length) and holds(sympy.Ge(length, 0)), op, "narrow(): length must be non-negative")
    require(holds(sympy.Ge(start, -size)) and holds(sympy.Le(start, size)), op,
            f"start out of range (expected to be in range of [{-size}, {size}], but got {start})")
    if _is_negative_int(start) or (not isinstance(start, int) and _guard_or(sympy.Lt(start, 0), False)):
        start = as_dim(start + size)
    require(holds(sympy.Le(start + length, size)), op,
            f"start ({start}) + length ({length}) exceeds dimension size ({size})")
    return d, start, as_dim(start + length)


def _narrow_meta(self, dim, start, length):
    shape = list(shape_of(self))
    d, _, _ = _narrow_range("aten.narrow.default", shape, dim, start, length)
    shape[d] = length
    return like(self, shape=shape)


def _narrow(self, dim, start, length):
    d, begin, end = _narrow_range("aten.narrow.default", self.shape, dim, start, length)
    return self[_axis_index(self.ndim, d, slice(begin, end))]


defop("narrow(Tensor(a) self, int dim, SymInt start, SymInt length) -> Tensor(a)", _narrow_meta, _narrow,
      tags=("composite", "view"))


@register_decomposition("aten.narrow.default")
def _narrow_decomposition(self, dim, start, length):
    d, begin, end = _narrow_range("aten.narrow.default", shape_of(self), dim, start, length)
    return aten.slice.Tensor(self, d, begin, end)


# diff: the n-th forward difference along dim, after concatenating prepend and append (ATen's diff_helper)

def _diff_parts(op, self, n, dim, prepend, append):
    """(dim, the tensors to concatenate, their length along dim, the effective n): n is clamped to the length."""
    rank = len(shape_of(self))
    require(rank >= 1, op, "diff expects input to be at least one-dimensional",
            fix="diff a 1-d or higher tensor")
    require(n >= 0, op, f"order must be non-negative but got {n}", fix="pass n >= 0")
    d = canonical_dim(op, dim, rank)
    parts = [t for t in (prepend, self, append) if t is not None]
    for name, extra in (("prepend", prepend), ("append", append)):
        if extra is None:
            continue
        require(len(shape_of(extra)) == rank, op, f"diff expects {name} to have the same number of dimensions "
                f"as input ({rank}), got {len(shape_of(extra))}", fix=f"reshape {name} to rank {rank}")
        for axis, (a, b) in enumerate(zip(shape_of(extra), shape_of(self))):
            require(axis == d or same_size(a, b), op, f"{name} has size {a} at dimension {axis} but input has {b}",
                    fix=f"{name} must match input in every dimension except {d}")
    length = as_dim(sum((shape_of(t)[d] for t in parts[1:]), shape_of(parts[0])[d]))
    if isinstance(length, int):
        return d, parts, length, min(n, length)
    require(_guard_or(sympy.Ge(length, n), True), op, f"diff of order {n} needs a dimension of at least {n} "
            f"elements, and dimension {d} has {length}", fix=f"make the dim's minimum at least {n}")
    return d, parts, length, n


def _diff_meta(self, n=1, dim=-1, prepend=None, append=None):
    op = "aten.diff.default"
    d, parts, length, steps = _diff_parts(op, self, n, dim, prepend, append)
    result = functools.reduce(dtypes.promote_types, (dtype_of(t) for t in parts))
    shape = list(shape_of(self))
    shape[d] = _sym_max(as_dim(length - steps), 0)
    return tensor(shape, result)


def _diff(self, n=1, dim=-1, prepend=None, append=None):
    d = canonical_dim("aten.diff.default", dim, self.ndim)
    parts = [t for t in (prepend, self, append) if t is not None]
    kind = functools.reduce(dtypes.promote_types, (dtypes.dtype(t.dtype) for t in parts))
    values = np.concatenate([t.astype(kind.numpy) for t in parts], axis=d)
    for _ in range(min(n, values.shape[d])):
        later, earlier = np.take(values, range(1, values.shape[d]), d), np.take(values, range(values.shape[d] - 1), d)
        values = np.logical_xor(later, earlier) if kind is dtypes.bool_ else (later - earlier).astype(kind.numpy)
    return values


defop("diff(Tensor self, int n=1, int dim=-1, Tensor? prepend=None, Tensor? append=None) -> Tensor", _diff_meta,
      _diff, tags=("composite",))


@register_decomposition("aten.diff.default")
def _diff_decomposition(self, n=1, dim=-1, prepend=None, append=None):
    d, parts, length, steps = _diff_parts("aten.diff.default", self, n, dim, prepend, append)
    values = parts[0] if len(parts) == 1 else aten.cat.default(parts, d)
    for step in range(steps):
        width = as_dim(length - step - 1)
        later, earlier = aten.narrow.default(values, d, 1, width), aten.narrow.default(values, d, 0, width)
        values = (aten.logical_xor.default(later, earlier) if dtype_of(values) is dtypes.bool_
                  else aten.sub.Tensor(later, earlier))
    return values


def _diagonal_shape(op, shape, offset, dim1, dim2):
    rank = len(shape)
    d1, d2 = canonical_dim(op, dim1, rank), canonical_dim(op, dim2, rank)
    require(d1 != d2, op, f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    if offset >= 0:
        length = _sym_max(_sym_min(shape[d1], as_dim(shape[d2] - offset)), 0)
    else:
        length = _sym_max(_sym_min(as_dim(shape[d1] + offset), shape[d2]), 0)
    return [s for i, s in enumerate(shape) if i not in (d1, d2)] + [length]


def _diagonal(self, offset=0, dim1=0, dim2=1):
    op = "aten.diagonal.default"
    _diagonal_shape(op, self.shape, offset, dim1, dim2)
    # numpy's diagonal has torch's conventions: positive offsets go above the main diagonal, and the
    # diagonal becomes the last dim. numpy makes it read-only; torch's is a view in-place ops write through.
    result = np.diagonal(self, offset, canonical_dim(op, dim1, self.ndim), canonical_dim(op, dim2, self.ndim))
    if self.flags.writeable:
        result.flags.writeable = True
    return result


defop("diagonal(Tensor(a) self, int offset=0, int dim1=0, int dim2=1) -> Tensor(a)",
      lambda self, offset=0, dim1=0, dim2=1: like(
          self, shape=_diagonal_shape("aten.diagonal.default", shape_of(self), offset, dim1, dim2)),
      _diagonal, tags=("view",))


# ---------------------------------------------------------------------------------------------
# flip


def _flip(self, dims):
    axes = _dims_in_range("aten.flip.default", dims, self.ndim)
    if self.ndim == 0 or not axes:
        return self.copy()
    return np.flip(self, axis=tuple(axes))


def _flip_meta(self, dims):
    _dims_in_range("aten.flip.default", dims, _rank(self))
    return like(self)


defop("flip(Tensor self, int[] dims) -> Tensor", _flip_meta, _flip)


# ---------------------------------------------------------------------------------------------
# cat, stack


def _cat_skipped(shape) -> bool:
    """ATen's legacy rule: a 1-D tensor of size 0 is ignored by cat's shape checks."""
    if len(shape) != 1:
        return False
    size = shape[0]
    return size == 0 if isinstance(size, int) else _guard_or(sympy.Eq(size, 0), False)


def _cat_shape(op, shapes, dim):
    """(wrapped dim or None when every input is skipped, result shape)."""
    require(len(shapes) > 0, op, "expected a non-empty list of tensors")
    for index, shape in enumerate(shapes):
        require(len(shape) > 0, op, f"zero-dimensional tensor (at position {index}) cannot be concatenated")
    kept = [i for i, s in enumerate(shapes) if not _cat_skipped(s)]
    if not kept:
        return None, [0]
    reference = shapes[kept[0]]
    d = canonical_dim(op, dim, len(reference))
    total = 0
    for i in kept:
        shape = shapes[i]
        require(len(shape) == len(reference), op,
                f"tensors must have same number of dimensions: got {len(reference)} and {len(shape)}")
        for axis, (expected, size) in enumerate(zip(reference, shape)):
            if axis != d:
                require(same_size(expected, size), op,
                        f"sizes of tensors must match except in dimension {d}. Expected size {expected} "
                        f"but got size {size} for tensor number {i} in the list")
        total = as_dim(total + shape[d])
    return d, list(reference[:d]) + [total] + list(reference[d + 1:])


def _cat_dtype(tensors):
    return dtypes.promote_all(dtype_of(t) for t in tensors)


def _cat_meta(tensors, dim=0):
    _, shape = _cat_shape("aten.cat.default", [shape_of(t) for t in tensors], dim)
    return tensor(shape, _cat_dtype(tensors))


def _cat(tensors, dim=0):
    out_dtype = _cat_dtype(tensors).numpy
    d, shape = _cat_shape("aten.cat.default", [t.shape for t in tensors], dim)
    if d is None:
        return np.zeros(shape, out_dtype)
    kept = [t.astype(out_dtype, copy=False) for t in tensors if not _cat_skipped(t.shape)]
    return np.concatenate(kept, axis=d)


defop("cat(Tensor[] tensors, int dim=0) -> Tensor", _cat_meta, _cat)


def _stack_shape(op, shapes, dim):
    require(len(shapes) > 0, op, "stack expects a non-empty TensorList")
    first = shapes[0]
    for index, shape in enumerate(shapes[1:], 1):
        require(same_shape(first, shape), op,
                f"stack expects each tensor to be equal size, but got {_shown(first)} at entry 0 and "
                f"{_shown(shape)} at entry {index}")
    d = canonical_dim(op, dim, len(first), allow_end=True)
    return d, list(first[:d]) + [len(shapes)] + list(first[d:])


def _stack_kernel(tensors, dim=0):
    d, _ = _stack_shape("aten.stack.default", [t.shape for t in tensors], dim)
    out_dtype = _cat_dtype(tensors).numpy
    return np.stack([t.astype(out_dtype, copy=False) for t in tensors], axis=d)


defop("stack(Tensor[] tensors, int dim=0) -> Tensor",
      lambda tensors, dim=0: tensor(_stack_shape("aten.stack.default", [shape_of(t) for t in tensors], dim)[1],
                                    _cat_dtype(tensors)),
      _stack_kernel, tags=("composite",))


@register_decomposition("aten.stack.default")
def _stack(tensors, dim=0):
    d, _ = _stack_shape("aten.stack.default", [shape_of(t) for t in tensors], dim)
    return aten.cat.default([aten.unsqueeze.default(t, d) for t in tensors], d)


# meshgrid: each 0-d/1-D input viewed along its own axis and expanded; "xy" swaps the first two axes (BEiT, Swin)

def _meshgrid_axes(op, tensors, indexing):
    """The output shape, and the output axis each input runs along."""
    require(len(tensors) > 0, op, "torch.meshgrid expects a non-empty TensorList")
    require_arg(indexing in ("ij", "xy"), op, f'indexing must be "ij" or "xy", got "{indexing}"')
    first = dtype_of(tensors[0])
    for t in tensors:
        require(dtype_of(t) is first, op, "torch.meshgrid expects all tensors to have the same dtype")
        require(len(shape_of(t)) <= 1, op,
                f"torch.meshgrid: Expected 0D or 1D tensor in the tensor list but got: {len(shape_of(t))}D")
    axes = list(range(len(tensors)))
    if indexing == "xy" and len(tensors) >= 2:
        axes[0], axes[1] = 1, 0
    shape = [None] * len(tensors)
    for t, axis in zip(tensors, axes):
        shape[axis] = numel(shape_of(t))
    return shape, axes


def _meshgrid_meta(op):
    def meta(tensors, indexing="ij"):
        shape, _ = _meshgrid_axes(op, tensors, indexing)
        return [tensor(shape, dtype_of(t)) for t in tensors]
    return meta


def _meshgrid_kernel(tensors, indexing="ij"):
    return [g.copy() for g in np.meshgrid(*[np.reshape(t, -1) for t in tensors], indexing=indexing)]


def _meshgrid_decomposition(op):
    def decomposition(tensors, indexing="ij"):
        shape, axes = _meshgrid_axes(op, tensors, indexing)
        out = []
        for t, axis in zip(tensors, axes):
            along = [1] * len(shape)
            along[axis] = shape[axis]
            out.append(aten.expand.default(aten.view.default(t, along), list(shape)))
        return out
    return decomposition


for _schema, _op in (("meshgrid.indexing(Tensor[] tensors, *, str indexing) -> Tensor[]", "aten.meshgrid.indexing"),
                     ("meshgrid(Tensor[] tensors) -> Tensor[]", "aten.meshgrid.default")):
    defop(_schema, _meshgrid_meta(_op), _meshgrid_kernel, tags=("composite",))
    register_decomposition(_op)(_meshgrid_decomposition(_op))


# ---------------------------------------------------------------------------------------------
# split_with_sizes, split, chunk, unbind


def _split_with_sizes_check(op, shape, split_sizes, dim):
    require(len(shape) > 0, op, "split expects at least a 1-dimensional tensor")
    d = canonical_dim(op, dim, len(shape))
    require(not any(_is_negative_int(s) for s in split_sizes), op,
            f"split_with_sizes expects split_sizes have only non-negative entries, but got split_sizes="
            f"{_shown(split_sizes)}")
    require(same_size(as_dim(sum(split_sizes, 0)), shape[d]), op,
            f"split_with_sizes expects split_sizes to sum exactly to {shape[d]} (input tensor's size at "
            f"dimension {d}), but got split_sizes={_shown(split_sizes)}")
    return d


def _split_pieces_meta(op, self, sizes, dim):
    shape = list(shape_of(self))
    d = _split_with_sizes_check(op, shape, sizes, dim)
    return [like(self, shape=shape[:d] + [as_dim(s)] + shape[d + 1:]) for s in sizes]


def _split_pieces(op, self, sizes, dim):
    d = _split_with_sizes_check(op, self.shape, sizes, dim)
    return np.split(self, np.cumsum(sizes)[:-1].astype(np.int64), axis=d) if sizes else []


defop("split_with_sizes(Tensor(a -> *) self, SymInt[] split_sizes, int dim=0) -> Tensor(a)[]",
      lambda self, split_sizes, dim=0: _split_pieces_meta("aten.split_with_sizes.default", self, split_sizes, dim),
      lambda self, split_sizes, dim=0: _split_pieces("aten.split_with_sizes.default", self, split_sizes, dim),
      tags=("view",))


def _split_sizes(op, shape, split_size, dim):
    """torch.split's pieces: full `split_size` pieces and a shorter last one (at least one piece)."""
    require(len(shape) > 0, op, "split expects at least a 1-dimensional tensor")
    size = shape[canonical_dim(op, dim, len(shape))]
    require(not _is_negative_int(split_size) and holds(sympy.Ge(split_size, 0)), op,
            f"split expects split_size be non-negative, but got split_size={split_size}")
    if isinstance(split_size, int) and split_size == 0:
        require(same_size(size, 0), op,
                f"split_size can only be 0 if dimension size is 0, but got dimension size of {size}")
        return [0]
    if isinstance(split_size, int):
        count = _piece_count(op, size, lambda n: max(-(-n // split_size), 1), "number of pieces")
    else:
        count = _piece_count(op, _sym_max(_ceil_div(size, split_size), 1), lambda n: n, "number of pieces")
    return [split_size] * (count - 1) + [as_dim(size - split_size * (count - 1))]


defop("split.Tensor(Tensor(a -> *) self, SymInt split_size, int dim=0) -> Tensor(a)[]",
      lambda self, split_size, dim=0: _split_pieces_meta(
          "aten.split.Tensor", self, _split_sizes("aten.split.Tensor", shape_of(self), split_size, dim), dim),
      lambda self, split_size, dim=0: _split_pieces(
          "aten.split.Tensor", self, _split_sizes("aten.split.Tensor", self.shape, split_size, dim), dim),
      tags=("composite", "view"))


@register_decomposition("aten.split.Tensor")
def _split(self, split_size, dim=0):
    return aten.split_with_sizes.default(self, _split_sizes("aten.split.Tensor", shape_of(self), split_size, dim), dim)


def _chunk_sizes(op, shape, chunks, dim):
    require(len(shape) > 0, op, "chunk expects at least a 1-dimensional tensor")
    require(chunks > 0, op, f"chunk expects `chunks` to be greater than 0, got: {chunks}")
    size = shape[canonical_dim(op, dim, len(shape))]
    # Pieces of ceil(size / chunks), which may be fewer than `chunks` (6 rows in 4 chunks: 3 pieces
    # of 2); a 0-sized dim still gives `chunks` empty pieces.
    def count_of(n):
        return chunks if n == 0 else max(-(-n // -(-n // chunks)), 1)

    # Above (chunks - 1)**2 every size gives exactly `chunks` pieces.
    count = _piece_count(op, size, count_of, "number of pieces", constant_above=(chunks - 1) ** 2)
    if isinstance(size, int) and size == 0 or not isinstance(size, int) and _guard_or(sympy.Eq(size, 0), False):
        return [0] * chunks
    piece = _ceil_div(size, chunks)
    return [piece] * (count - 1) + [as_dim(size - piece * (count - 1))]


defop("chunk(Tensor(a -> *) self, int chunks, int dim=0) -> Tensor(a)[]",
      lambda self, chunks, dim=0: _split_pieces_meta(
          "aten.chunk.default", self, _chunk_sizes("aten.chunk.default", shape_of(self), chunks, dim), dim),
      lambda self, chunks, dim=0: _split_pieces(
          "aten.chunk.default", self, _chunk_sizes("aten.chunk.default", self.shape, chunks, dim), dim),
      tags=("composite", "view"))


@register_decomposition("aten.chunk.default")
def _chunk(self, chunks, dim=0):
    return aten.split_with_sizes.default(self, _chunk_sizes("aten.chunk.default", shape_of(self), chunks, dim), dim)


def _unbind_count(op, shape, dim):
    require(len(shape) > 0, op, "unbind() cannot be applied to a 0-dim tensor")
    d = canonical_dim(op, dim, len(shape))
    return d, _piece_count(op, shape[d], lambda n: n, "number of slices")


def _unbind_meta(self, dim=0):
    shape = list(shape_of(self))
    d, count = _unbind_count("aten.unbind.int", shape, dim)
    return [like(self, shape=shape[:d] + shape[d + 1:]) for _ in range(count)]


def _unbind(self, dim=0):
    d, count = _unbind_count("aten.unbind.int", self.shape, dim)
    return [np.asarray(self[_axis_index(self.ndim, d, i)]) for i in range(count)]


defop("unbind.int(Tensor(a -> *) self, int dim=0) -> Tensor(a)[]", _unbind_meta, _unbind,
      tags=("composite", "view"))


@register_decomposition("aten.unbind.int")
def _unbind_decomposition(self, dim=0):
    d, count = _unbind_count("aten.unbind.int", shape_of(self), dim)
    return [aten.select.int(self, d, i) for i in range(count)]


def _tensor_split_bounds(op, shape, indices, dim):
    """tensor_split at `indices`: each piece is slice(index_k, index_k+1) along the dim (ATen's slice arithmetic,
    so an index past the end gives empty pieces), from 0 to the end."""
    require(len(shape) > 0, op, f"tensor_split expected at least a 1-dimensional tensor, but got a tensor with "
                                f"{len(shape)} dims")
    d = canonical_dim(op, dim, len(shape))
    bounds = [0, *indices, None]
    return d, [slice_bounds(op, shape[d], start, end, 1) for start, end in zip(bounds, bounds[1:])]


def _tensor_split_indices_meta(self, indices, dim=0):
    shape = list(shape_of(self))
    d, pieces = _tensor_split_bounds("aten.tensor_split.indices", shape, indices, dim)
    return [like(self, shape=shape[:d] + [length] + shape[d + 1:]) for _, _, length in pieces]


def _tensor_split_indices(self, indices, dim=0):
    d, pieces = _tensor_split_bounds("aten.tensor_split.indices", list(self.shape), indices, dim)
    return [self[_axis_index(self.ndim, d, slice(start, end))] for start, end, _ in pieces]


defop("tensor_split.indices(Tensor(a -> *) self, SymInt[] indices, int dim=0) -> Tensor(a)[]",
      _tensor_split_indices_meta, _tensor_split_indices, tags=("composite", "view"))


@register_decomposition("aten.tensor_split.indices")
def _tensor_split_indices_decomposition(self, indices, dim=0):
    d, pieces = _tensor_split_bounds("aten.tensor_split.indices", list(shape_of(self)), indices, dim)
    return [aten.slice.Tensor(self, d, start, end) for start, end, _ in pieces]


def _tensor_split_sizes(op, shape, sections, dim):
    """tensor_split into `sections` pieces: the first size % sections take one element more than the others."""
    require(len(shape) > 0, op, f"tensor_split expected at least a 1-dimensional tensor, but got a tensor with "
                                f"{len(shape)} dims")
    require(sections > 0, op, f"number of sections must be larger than 0, got {sections}")
    size = shape[canonical_dim(op, dim, len(shape))]
    # piece k holds floor((size + sections - 1 - k) / sections) elements: one more for the first size % sections
    return [floor_div(size + sections - 1 - k, sections) for k in range(sections)]


defop("tensor_split.sections(Tensor(a -> *) self, SymInt sections, int dim=0) -> Tensor(a)[]",
      lambda self, sections, dim=0: _split_pieces_meta("aten.tensor_split.sections", self, _tensor_split_sizes(
          "aten.tensor_split.sections", shape_of(self), sections, dim), dim),
      lambda self, sections, dim=0: _split_pieces("aten.tensor_split.sections", self, _tensor_split_sizes(
          "aten.tensor_split.sections", list(self.shape), sections, dim), dim),
      tags=("composite", "view"))


@register_decomposition("aten.tensor_split.sections")
def _tensor_split_sections(self, sections, dim=0):
    return aten.split_with_sizes.default(self, _tensor_split_sizes("aten.tensor_split.sections", shape_of(self),
                                                                   sections, dim), dim)


# ---------------------------------------------------------------------------------------------
# tril, triu: the lower or upper triangle of the last two dims, the rest zero


def _triangle_meta(op):
    def meta(self, diagonal=0):
        require(len(shape_of(self)) >= 2, op, f"{op.split('.')[1]}: input tensor must have at least 2 dimensions")
        return like(self)
    return meta


def _triangle(op, keep):
    """The decomposition: where(keep(column - row, diagonal), self, 0) over the last two dims."""
    def decomposition(self, diagonal=0):
        _triangle_meta(op)(self, diagonal)
        rows, columns = shape_of(self)[-2:]
        offset = aten.sub.Tensor(aten.unsqueeze.default(aten.arange.default(columns, dtype=dtypes.int64), 0),
                                 aten.unsqueeze.default(aten.arange.default(rows, dtype=dtypes.int64), 1))
        zero = aten.full.default([], 0, dtype=dtype_of(self))
        return aten.where.self(keep(offset, diagonal), self, zero)
    return decomposition


defop("tril(Tensor self, int diagonal=0) -> Tensor", _triangle_meta("aten.tril.default"),
      lambda self, diagonal=0: _checked_triangle("aten.tril.default", np.tril, self, diagonal), tags=("composite",))
defop("triu(Tensor self, int diagonal=0) -> Tensor", _triangle_meta("aten.triu.default"),
      lambda self, diagonal=0: _checked_triangle("aten.triu.default", np.triu, self, diagonal), tags=("composite",))
register_decomposition("aten.tril.default")(_triangle("aten.tril.default", aten.le.Scalar))
register_decomposition("aten.triu.default")(_triangle("aten.triu.default", aten.ge.Scalar))


def _checked_triangle(op, numpy_triangle, self, diagonal):
    _triangle_meta(op)(self, diagonal)
    return numpy_triangle(self, diagonal)


# ---------------------------------------------------------------------------------------------
# Padding


def _constant_pad_shape(op, shape, pad):
    require(len(pad) % 2 == 0, op, f"length of pad must be even but instead it equals {len(pad)}")
    require(len(pad) // 2 <= len(shape), op,
            f"length of pad should be no more than twice the number of dimensions of the input. Pad length "
            f"is {len(pad)} while the input has {len(shape)} dimensions")
    result = list(shape)
    for pair in range(len(pad) // 2):
        axis = len(shape) - 1 - pair
        before, after = pad[2 * pair], pad[2 * pair + 1]
        result[axis] = as_dim(shape[axis] + before + after)
        # ATen crops (narrows) for the negative pads before it pads: the crops alone must leave a size >= 0
        cropped = as_dim(shape[axis] + sympy.Min(before, 0) + sympy.Min(after, 0))
        require(not _is_negative_int(cropped) and holds(sympy.Ge(cropped, 0)), op,
                f"the input size {shape[axis]}, plus negative padding {before} and {after} resulted in a "
                f"negative output size, which is invalid. Check dimension {axis} of your input")
    return result


def _constant_pad_nd(self, pad, value=0):
    op = "aten.constant_pad_nd.default"
    shape = _constant_pad_shape(op, self.shape, pad)
    result = np.full(shape, fill_value(op, value, dtypes.dtype(self.dtype)), self.dtype)
    source, target = [slice(None)] * self.ndim, [slice(None)] * self.ndim
    for pair in range(len(pad) // 2):
        axis = self.ndim - 1 - pair
        before, after = pad[2 * pair], pad[2 * pair + 1]
        # Negative padding crops the input; positive padding offsets it inside the result.
        source[axis] = slice(max(-before, 0), self.shape[axis] - max(-after, 0))
        target[axis] = slice(max(before, 0), shape[axis] - max(after, 0))
    result[tuple(target)] = self[tuple(source)]
    return result


def _constant_pad_nd_meta(self, pad, value=0):
    op = "aten.constant_pad_nd.default"
    fill_value(op, value, dtype_of(self))
    return like(self, shape=_constant_pad_shape(op, shape_of(self), pad))


defop("constant_pad_nd(Tensor self, SymInt[] pad, Scalar value=0) -> Tensor", _constant_pad_nd_meta, _constant_pad_nd)


_PAD_MODES = ("constant", "reflect", "replicate", "circular")


def _pad_shape(op, shape, pad, mode, value):
    require_arg(mode in _PAD_MODES, op, f"unrecognised padding mode {mode!r} (expected one of {', '.join(_PAD_MODES)})")
    if mode == "constant":
        return _constant_pad_shape(op, shape, pad)
    require_arg(value is None or value == 0, op, f'padding mode "{mode}" doesn\'t take in value argument')
    pairs = len(pad) // 2
    require(len(pad) % 2 == 0 and pairs in (1, 2, 3) and len(shape) in (pairs + 1, pairs + 2), op,
            f"padding size {len(pad)} is not supported for {len(shape)}D input tensor in mode {mode!r}",
            fix="non-constant modes pad the last 1, 2 or 3 dims of a batched or unbatched input")
    result = list(shape)
    for pair in range(pairs):
        axis = len(shape) - 1 - pair
        before, after = pad[2 * pair], pad[2 * pair + 1]
        size = shape[axis]
        result[axis] = as_dim(size + before + after)
        if mode == "reflect":
            require(holds(sympy.Lt(before, size)) and holds(sympy.Lt(after, size)), op,
                    f"padding size should be less than the corresponding input dimension, but got: padding "
                    f"({before}, {after}) at dimension {axis} of input {_shown(shape)}")
        if mode == "circular":
            require(holds(sympy.Le(before, size)) and holds(sympy.Le(after, size)), op,
                    "padding value causes wrapping around more than once")
            require(holds(sympy.Ge(result[axis], 0)), op,
                    "negative padding value is resulting in an empty dimension")
        else:
            require(holds(sympy.Ge(result[axis], 1)), op,
                    f"input (size {size} at dimension {axis}) is too small for padding ({before}, {after}): "
                    f"calculated output size {result[axis]}")
    return result


def _pad(self, pad, mode="constant", value=None):
    op = "aten.pad.default"
    _pad_shape(op, self.shape, pad, mode, value)
    if mode == "constant":
        return _constant_pad_nd(self, pad, 0 if value is None else value)
    pairs = len(pad) // 2
    widths = [(0, 0)] * (self.ndim - pairs) + [(pad[2 * p], pad[2 * p + 1]) for p in reversed(range(pairs))]
    crop = tuple(slice(max(-b, 0), self.shape[a] - max(-e, 0)) for a, (b, e) in enumerate(widths))
    grow = [(max(b, 0), max(e, 0)) for b, e in widths]
    if mode == "circular":
        # torch crops first, then wraps around what is left.
        return np.pad(self[crop], grow, mode="wrap")
    # reflect/replicate read the whole input (a negative pad does not change what the other side
    # reflects), so pad first and then crop.
    padded = np.pad(self, grow, mode="reflect" if mode == "reflect" else "edge")
    return padded[tuple(slice(max(-b, 0), padded.shape[a] - max(-e, 0)) for a, (b, e) in enumerate(widths))]


def _circular_pad(self, pad):
    """Circular padding with core ops: crop each padded dim, then wrap slices of what is left."""
    pairs = len(pad) // 2
    for pair in range(pairs):
        axis = _rank(self) - 1 - pair
        before, after = pad[2 * pair], pad[2 * pair + 1]
        size = shape_of(self)[axis]
        if _is_negative_int(before) or _is_negative_int(after):
            self = aten.slice.Tensor(self, axis, max(-before, 0) if isinstance(before, int) else 0,
                                     as_dim(size - max(-after, 0)) if isinstance(after, int) else size)
            size = shape_of(self)[axis]
        left, right = (max(p, 0) if isinstance(p, int) else p for p in (before, after))
        if provably(sympy.Le(left, size)) and provably(sympy.Le(right, size)):
            pieces = []
            if not (isinstance(before, int) and before <= 0):
                pieces.append(aten.slice.Tensor(self, axis, as_dim(size - before), size))
            pieces.append(self)
            if not (isinstance(after, int) and after <= 0):
                pieces.append(aten.slice.Tensor(self, axis, 0, after))
            if len(pieces) > 1:
                self = aten.cat.default(pieces, axis)
        else:  # a pad (maybe) longer than what the other side's crop left: ATen wraps around it again (its checks
            # compare the pads with the uncropped size), position j reads (j - left) mod size
            # (counted in float64, exact for any size, since Triton computes no integer remainder)
            positions = aten.arange.start_step(-left, size + right, dtype=dtypes.float64)
            wrapped = aten._to_copy.default(aten.remainder.Scalar(positions, size), dtype=dtypes.int64)
            self = aten.index_select.default(self, axis, wrapped)
    return self


def _pad_meta(self, pad, mode="constant", value=None):
    shape = _pad_shape("aten.pad.default", shape_of(self), pad, mode, value)
    pairs = len(pad) // 2
    if mode == "reflect":  # ATen runs reflection_pad{1,2,3}d, whose checks (no empty channels, ...) apply
        REGISTRY[f"aten.reflection_pad{pairs}d.default"].meta(self, list(pad))
    elif mode == "replicate" and pairs == 1:  # replication_pad1d's checks: replication_pad2d's over a unit height
        lifted = tensor([*shape_of(self)[:-1], 1, shape_of(self)[-1]], dtype_of(self))
        REGISTRY["aten.replication_pad2d.default"].meta(lifted, list(pad) + [0, 0])
    elif mode == "replicate":
        REGISTRY[f"aten.replication_pad{pairs}d.default"].meta(self, list(pad))
    return like(self, shape=shape)


defop('pad(Tensor self, SymInt[] pad, str mode="constant", float? value=None) -> Tensor', _pad_meta,
      checked(_pad_meta, _pad), tags=("composite",))


@register_decomposition("aten.pad.default")
def _pad_decomposition(self, pad, mode="constant", value=None):
    _pad_shape("aten.pad.default", shape_of(self), pad, mode, value)
    if mode == "constant":
        return aten.constant_pad_nd.default(self, pad, 0 if value is None else value)
    if mode == "circular":
        return _circular_pad(self, pad)
    pairs = len(pad) // 2
    if mode == "reflect":
        return [aten.reflection_pad1d.default, aten.reflection_pad2d.default,
                aten.reflection_pad3d.default][pairs - 1](self, list(pad))
    if pairs == 1:
        # replication_pad1d is not a core op: pad a unit height with replication_pad2d instead.
        lifted = aten.unsqueeze.default(self, -2)
        return aten.squeeze.dim(aten.replication_pad2d.default(lifted, list(pad) + [0, 0]), -2)
    return [aten.replication_pad2d.default, aten.replication_pad3d.default][pairs - 2](self, list(pad))


# ---------------------------------------------------------------------------------------------
# Sizes as SymInts. kiln values are contiguous, so strides follow from the shape.


def contiguous_strides(shape):
    """torch's contiguous strides: each stride is the product of the later sizes, with 0 counted as 1."""
    strides = []
    running = 1
    for size in reversed(shape):
        strides.append(running)
        running = as_dim(running * _sym_max(size, 1))
    return strides[::-1]


def _size_dim(op, shape, dim):
    require(len(shape) > 0, op, f"dimension specified as {dim} but tensor has no dimensions")
    return canonical_dim(op, dim, len(shape))


defop("sym_size.int(Tensor self, int dim) -> SymInt",
      lambda self, dim: SymIntType.of(shape_of(self)[_size_dim("aten.sym_size.int", shape_of(self), dim)]),
      lambda self, dim: int(self.shape[_size_dim("aten.sym_size.int", self.shape, dim)]))
defop("sym_numel(Tensor self) -> SymInt",
      lambda self: SymIntType.of(numel(shape_of(self))), lambda self: int(self.size))
defop("sym_stride.int(Tensor self, int dim) -> SymInt",
      lambda self, dim: SymIntType.of(
          contiguous_strides(shape_of(self))[_size_dim("aten.sym_stride.int", shape_of(self), dim)]),
      lambda self, dim: int(contiguous_strides(self.shape)[_size_dim("aten.sym_stride.int", self.shape, dim)]))
defop("sym_storage_offset(Tensor self) -> SymInt",
      lambda self: SymIntType.of(0), lambda self: 0)


# ---------------------------------------------------------------------------------------------
# VJP rules (torch's derivatives.yaml, written with kiln.ops handles; see register_vjp). A view's gradient is
# its transpose: the gradient of a part is scattered into zeros, a reshape is undone, a broadcast is summed.

from kiln.ir.ops._grad import cast, sum_to  # noqa: E402
from kiln.ir.registry import register_vjp  # noqa: E402


def zeros(shape, like):
    """Zeros of `shape` in `like`'s dtype (torch's `grad.new_zeros(shape)`); shared with indexing.py."""
    return aten.full.default(list(shape), 0, dtype=dtype_of(like))


def gradient_for(grad, argument):
    """`grad` in `argument`'s dtype, or None when the argument is not floating (torch gives it no gradient)."""
    kind = dtype_of(argument)
    if not (kind.is_floating_point or kind.is_complex):
        return None
    return cast(grad, kind)


@register_vjp("aten.view.default")
def _view_vjp(grad, out, self, size):
    return aten.view.default(grad, list(shape_of(self)))


@register_vjp("aten.squeeze.dim", "aten.squeeze.dims", "aten.unsqueeze.default")
def _restore_shape_vjp(grad, out, self, dim):
    return aten.view.default(grad, list(shape_of(self)))


@register_vjp("aten.expand.default")
def _expand_vjp(grad, out, self, size, *, implicit=False):
    return sum_to(grad, shape_of(self))


@register_vjp("aten.permute.default")
def _permute_vjp(grad, out, self, dims):
    order = _permute_dims("aten.permute.default", _rank(self), dims)
    inverse = [0] * len(order)
    for position, axis in enumerate(order):
        inverse[axis] = position
    return aten.permute.default(grad, inverse)


@register_vjp("aten.flip.default")
def _flip_vjp(grad, out, self, dims):
    return aten.flip.default(grad, list(dims))


@register_vjp("aten.repeat.default")
def _repeat_vjp(grad, out, self, repeats):
    """Sum the copies: the new leading dims, then each dim split into (repeat, size) (torch's repeat_backward)."""
    shape = list(shape_of(self))
    lead = len(repeats) - len(shape)
    if lead:
        grad = aten.sum.dim_IntList(grad, list(range(lead)), False)
    split, copies = [], []
    for size, count in zip(shape, repeats[lead:]):
        if not (isinstance(count, int) and count == 1):
            copies.append(len(split))
            split.append(count)
        split.append(size)
    if not copies:
        return grad
    return aten.sum.dim_IntList(aten.view.default(grad, split), copies, False)


@register_vjp("aten.select.int")
def _select_vjp(grad, out, self, dim, index):
    return aten.select_scatter.default(zeros(shape_of(self), grad), grad, dim, index)


@register_vjp("aten.slice.Tensor")
def _slice_vjp(grad, out, self, dim=0, start=None, end=None, step=1):
    return aten.slice_scatter.default(zeros(shape_of(self), grad), grad, dim, start, end, step)


@register_vjp("aten.select_scatter.default")
def _select_scatter_vjp(grad, out, self, src, dim, index):
    return (aten.select_scatter.default(grad, zeros(shape_of(src), grad), dim, index),
            gradient_for(aten.select.int(grad, dim, index), src))


@register_vjp("aten.slice_scatter.default")
def _slice_scatter_vjp(grad, out, self, src, dim=0, start=None, end=None, step=1):
    return (aten.slice_scatter.default(grad, zeros(shape_of(src), grad), dim, start, end, step),
            gradient_for(aten.slice.Tensor(grad, dim, start, end, step), src))


@register_vjp("aten.diagonal.default")
def _diagonal_vjp(grad, out, self, offset=0, dim1=0, dim2=1):
    """Put the diagonal back into zeros (torch's diagonal_scatter): with dim1 and dim2 moved last, the diagonal's
    positions are two adjacent index tensors, so index_put lines them up with the gradient's last dim."""
    op = "aten.diagonal.default"
    shape = list(shape_of(self))
    rank = len(shape)
    d1, d2 = canonical_dim(op, dim1, rank), canonical_dim(op, dim2, rank)
    length = shape_of(grad)[-1]
    order = [d for d in range(rank) if d not in (d1, d2)] + [d1, d2]
    rows = aten.arange.start_step(max(-offset, 0), as_dim(length + max(-offset, 0)), 1, dtype=dtypes.int64)
    columns = aten.arange.start_step(max(offset, 0), as_dim(length + max(offset, 0)), 1, dtype=dtypes.int64)
    moved = aten.index_put.default(zeros([shape[d] for d in order], grad), [None] * (rank - 2) + [rows, columns],
                                   grad)
    inverse = [order.index(d) for d in range(rank)]
    return aten.permute.default(moved, inverse)


@register_vjp("aten.as_strided.default")
def _as_strided_vjp(grad, out, self, size, stride, storage_offset=None):
    """Every kiln input is contiguous, with a storage of exactly its elements: the window reads storage positions
    that the same as_strided of an arange names, and the gradient adds back into them (overlapping windows
    included, like torch's as_strided_backward for a contiguous input)."""
    count = numel(shape_of(self))
    storage = aten.view.default(aten.arange.start_step(0, count, 1, dtype=dtypes.int64), list(shape_of(self)))
    positions = aten.as_strided.default(storage, list(size), list(stride), storage_offset)
    flat = numel(shape_of(grad))
    summed = aten.index_put.default(zeros([count], grad), [aten.view.default(positions, [flat])],
                                    aten.view.default(grad, [flat]), True)
    return aten.view.default(summed, list(shape_of(self)))


@register_vjp("aten.cat.default")
def _cat_vjp(grad, out, tensors, dim=0):
    d, _ = _cat_shape("aten.cat.default", [shape_of(t) for t in tensors], dim)
    grads, offset = [], 0
    for piece in tensors:
        shape = shape_of(piece)
        if d is None or _cat_skipped(shape):  # ATen's legacy [0]-shaped input: it took no part
            grads.append(gradient_for(zeros(shape, grad), piece))
            continue
        end = as_dim(offset + shape[d])
        grads.append(gradient_for(aten.slice.Tensor(grad, d, offset, end), piece))
        offset = end
    return grads


@register_vjp("aten.split_with_sizes.default")
def _split_with_sizes_vjp(grads, out, self, split_sizes, dim=0):
    shape = list(shape_of(self))
    d = canonical_dim("aten.split_with_sizes.default", dim, len(shape))
    like_grad = next(g for g in grads if g is not None)
    pieces = [g if g is not None else zeros(shape[:d] + [size] + shape[d + 1:], like_grad)
              for g, size in zip(grads, split_sizes)]
    return aten.cat.default(pieces, d)


@register_vjp("aten.constant_pad_nd.default")
def _constant_pad_nd_vjp(grad, out, self, pad, value=0):
    """Padding's transpose is the opposite padding: what was added is cropped, what was cropped is zero."""
    return aten.constant_pad_nd.default(grad, [as_dim(-p) for p in pad])
