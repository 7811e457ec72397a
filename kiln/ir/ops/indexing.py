"""Indexing ops: gather/scatter and their reductions, index/index_put, index_select, masked_scatter, nonzero.

Index tensors are int64 or int32 (masks are bool); an index out of range raises a ShapeError naming the
index, the dim and its size (torch raises IndexError/RuntimeError). Sizes that depend on the data (a
boolean mask's count, nonzero's rows) are unbacked symbols while tracing and exact in eager mode.
Kernels never write into their inputs: every scatter copies `self` first.
"""

from __future__ import annotations

import numpy as np
import sympy

from kiln.ir import dtypes
from kiln.ir.meta import (
    broadcast_shapes, canonical_dim, dtype_of, like, numel, require, require_arg, require_dtype, shape_of, tensor,
    unbacked_size,
)
from kiln.ir.ops.shape import _axis_index, fill_value, holds, same_shape, same_size
from kiln.ir.registry import defop, ops, register_decomposition

aten = ops.aten
_INDEX_DTYPES = (dtypes.int64, dtypes.int32)


def _shown(sizes) -> str:
    return "[" + ", ".join(str(s) for s in sizes) + "]"


def _outside(sizes, dim: int) -> list:
    """The sizes but the one at `dim` (all of them where there is none)."""
    return [size for k, size in enumerate(sizes) if k != dim]


def _require_index_dtype(op: str, index, message: str) -> None:
    require_dtype(dtype_of(index) in _INDEX_DTYPES, op, f"{message}, got {dtype_of(index).name}")


def _require_in_bounds(op: str, index: np.ndarray, size: int, dim: int, *, negative_ok: bool) -> None:
    """Refuse index values outside [0, size) (or [-size, size) where negatives wrap)."""
    low = -size if negative_ok else 0
    bad = (index < low) | (index >= size)
    if bad.any():
        require(False, op, f"index {int(index[bad].flat[0])} is out of bounds for dimension {dim} with size {size}")


def _nonempty(shape) -> list:
    """ATen's ensure_nonempty_*: a 0-d tensor acts as a 1-element 1-d tensor in gather/scatter."""
    return list(shape) if len(shape) else [1]


# ---------------------------------------------------------------------------------------------
# gather, scatter, scatter_add, scatter_reduce


def _gather_check(op, self, dim, index) -> int:
    self_shape, index_shape = shape_of(self), shape_of(index)
    d = canonical_dim(op, dim, len(self_shape))
    if isinstance(numel(index_shape), int) and numel(index_shape) == 0:
        return d  # torch checks nothing for an empty index
    _require_index_dtype(op, index, "gather(): expected dtype int32/int64 for index")
    self_dims, index_dims = _nonempty(self_shape), _nonempty(index_shape)
    require(len(self_dims) == len(index_dims), op,
            "index tensor must have the same number of dimensions as input tensor")
    for i, (s, n) in enumerate(zip(self_dims, index_dims)):
        if i != d:
            require(holds(sympy.Le(n, s)), op,
                    f"size does not match at dimension {i}: expected index {_shown(index_shape)} to be no larger "
                    f"than self {_shown(self_shape)} apart from dimension {d}")
    return d


def _gather(self, dim, index, sparse_grad=False):
    op = "aten.gather.default"
    d = _gather_check(op, self, dim, index)
    if index.size == 0:
        return np.empty(index.shape, self.dtype)
    source = self.reshape(_nonempty(self.shape))
    positions = index.reshape(_nonempty(index.shape)).astype(np.int64, copy=False)
    _require_in_bounds(op, positions, source.shape[d], d, negative_ok=False)
    # take_along_axis needs equal sizes off `dim`, where the index may be smaller than self.
    source = source[tuple(slice(None) if i == d else slice(0, n) for i, n in enumerate(positions.shape))]
    return np.take_along_axis(source, positions, axis=d).reshape(index.shape)


def _gather_meta(self, dim, index, sparse_grad=False):
    _gather_check("aten.gather.default", self, dim, index)
    return like(self, shape=shape_of(index))


defop("gather(Tensor self, int dim, Tensor index, *, bool sparse_grad=False) -> Tensor", _gather_meta, _gather)


def _scatter_check(op, self, dim, index, src=None) -> int:
    """ATen's scatter_gather_dtype_check and scatter_shape_check."""
    self_shape, index_shape = shape_of(self), shape_of(index)
    d = canonical_dim(op, dim, len(self_shape))
    empty = isinstance(numel(index_shape), int) and numel(index_shape) == 0
    if not empty:
        _require_index_dtype(op, index, "expected dtype int32/int64 for index")
    if src is not None:
        require_dtype(dtype_of(src) is dtype_of(self), op,
                      f"expected self.dtype to be equal to src.dtype, got {dtype_of(self).name} and "
                      f"{dtype_of(src).name}")
    if empty:
        return d
    self_dims, index_dims = _nonempty(self_shape), _nonempty(index_shape)
    require(len(index_dims) == len(self_dims), op,
            "index tensor must have the same number of dimensions as self tensor")
    if src is not None:
        require(len(_nonempty(shape_of(src))) == len(index_dims), op,
                "index tensor must have the same number of dimensions as src tensor")
    src_dims = _nonempty(shape_of(src)) if src is not None else None
    for i, n in enumerate(index_dims):
        fits = (i == d or holds(sympy.Le(n, self_dims[i]))) and (src_dims is None or holds(sympy.Le(n, src_dims[i])))
        require(fits, op, f"expected index {_shown(index_shape)} to be no larger than self {_shown(self_shape)} apart "
                          f"from dimension {d}" + (f" and to be no larger size than src {_shown(shape_of(src))}"
                                                   if src is not None else ""))
    return d


def _scatter_target(op, self, dim, index):
    """(a copy of self to write into, the positions each index element addresses in it, the window of
    src that lines up with the index); 0-d tensors act as 1-element 1-d ones."""
    d = canonical_dim(op, dim, self.ndim)
    result = self.reshape(_nonempty(self.shape)).copy()
    positions = index.reshape(_nonempty(index.shape)).astype(np.int64, copy=False)
    _require_in_bounds(op, positions, result.shape[d], d, negative_ok=False)
    # The element at index position (i0, .., ik) goes to result[i0, .., index[i], .., ik].
    grid = list(np.indices(positions.shape, sparse=True))
    grid[d] = positions
    window = tuple(slice(0, n) for n in positions.shape)
    return result, tuple(grid), window


def _scatter_src(self, dim, index, src):
    op = "aten.scatter.src"
    _scatter_check(op, self, dim, index, src)
    if index.size == 0:
        return self.copy()
    result, target, window = _scatter_target(op, self, dim, index)
    result[target] = src.reshape(_nonempty(src.shape))[window]
    return result.reshape(self.shape)


def _scatter_value(self, dim, index, value):
    op = "aten.scatter.value"
    _scatter_check(op, self, dim, index)
    fill = fill_value(op, value, dtypes.dtype(self.dtype))
    if index.size == 0:
        return self.copy()
    result, target, _ = _scatter_target(op, self, dim, index)
    result[target] = fill
    return result.reshape(self.shape)


def _scatter_add(self, dim, index, src):
    op = "aten.scatter_add.default"
    _scatter_check(op, self, dim, index, src)
    if index.size == 0:
        return self.copy()
    result, target, window = _scatter_target(op, self, dim, index)
    # Accumulates in self's dtype, one source element at a time in index order, as ATen's CPU kernel.
    np.add.at(result, target, src.reshape(_nonempty(src.shape))[window])
    return result.reshape(self.shape)


def _scatter_meta(op):
    def meta(self, dim, index, src):
        _scatter_check(op, self, dim, index, src)
        return like(self)
    return meta


def _scatter_value_meta(self, dim, index, value):
    _scatter_check("aten.scatter.value", self, dim, index)
    fill_value("aten.scatter.value", value, dtype_of(self))
    return like(self)


defop("scatter.src(Tensor self, int dim, Tensor index, Tensor src) -> Tensor",
      _scatter_meta("aten.scatter.src"), _scatter_src)
defop("scatter.value(Tensor self, int dim, Tensor index, Scalar value) -> Tensor", _scatter_value_meta, _scatter_value)
defop("scatter_add(Tensor self, int dim, Tensor index, Tensor src) -> Tensor",
      _scatter_meta("aten.scatter_add.default"), _scatter_add)


# torch also accepts "max"/"min" as spellings of "amax"/"amin".
_REDUCTIONS = {"sum": np.add, "prod": np.multiply, "mean": np.add, "amax": np.maximum, "amin": np.minimum,
               "max": np.maximum, "min": np.minimum}


def _scatter_reduce_check(self, dim, index, src, reduce):
    op = "aten.scatter_reduce.two"
    require_arg(reduce in _REDUCTIONS, op,
                f"reduce argument must be either sum, prod, mean, amax or amin, got {reduce}")
    require_dtype(not (reduce == "mean" and dtype_of(self).is_bool), op, "reduce='mean' is not supported for bool")
    _scatter_check(op, self, dim, index, src)
    return like(self)


def _reduction_identity(reduce: str, dt: np.dtype):
    """The value excluded `self` elements start from (ATen's scatter_reduce_exclude_input_init)."""
    if reduce in ("sum", "mean"):
        return 0
    if reduce == "prod":
        return 1
    largest = reduce in ("amin", "min")
    if dt == np.bool_:
        return largest
    if np.issubdtype(dt, np.integer):
        return np.iinfo(dt).max if largest else np.iinfo(dt).min
    return np.inf if largest else -np.inf


def _scatter_reduce(self, dim, index, src, reduce, include_self=True):
    op = "aten.scatter_reduce.two"
    _scatter_reduce_check(self, dim, index, src, reduce)
    if index.size == 0:
        return self.copy()
    result, target, window = _scatter_target(op, self, dim, index)
    if not include_self:
        result[target] = _reduction_identity(reduce, result.dtype)
    values = src.reshape(_nonempty(src.shape))[window]
    with np.errstate(all="ignore"):
        _REDUCTIONS[reduce].at(result, target, values)
        if reduce == "mean":
            count = np.full(result.shape, 1 if include_self else 0, np.int64)
            np.add.at(count, target, 1)
            count = np.maximum(count, 1)
            if np.issubdtype(result.dtype, np.integer):
                result = np.floor_divide(result, count.astype(result.dtype))
            else:
                result = (result / count.astype(result.dtype)).astype(result.dtype)
    return result.reshape(self.shape)


defop("scatter_reduce.two(Tensor self, int dim, Tensor index, Tensor src, str reduce, *, bool include_self=True) "
      "-> Tensor",
      lambda self, dim, index, src, reduce, include_self=True: _scatter_reduce_check(self, dim, index, src, reduce),
      _scatter_reduce)


# ---------------------------------------------------------------------------------------------
# index_select


def _index_select_check(self, dim, index):
    op = "aten.index_select.default"
    shape = shape_of(self)
    d = canonical_dim(op, dim, len(shape))
    _require_index_dtype(op, index, "index_select(): expected dtype int32 or int64 for index")
    require(len(shape_of(index)) <= 1, op, "index_select(): index is supposed to be a vector")
    count = numel(shape_of(index))
    if not shape:
        require(holds(sympy.Eq(count, 1)), op,
                f"index_select(): index to scalar can have only 1 value, got {count} value(s)")
        return d, []
    result = list(shape)
    result[d] = count
    return d, result


def _index_select(self, dim, index):
    op = "aten.index_select.default"
    d, _ = _index_select_check(self, dim, index)
    positions = index.reshape(-1).astype(np.int64, copy=False)
    _require_in_bounds(op, positions, self.shape[d] if self.ndim else 1, d, negative_ok=False)
    if self.ndim == 0:
        return self.copy()
    return np.take(self, positions, axis=d)


defop("index_select(Tensor self, int dim, Tensor index) -> Tensor",
      lambda self, dim, index: like(self, shape=_index_select_check(self, dim, index)[1]), _index_select)


def _index_add_check(self, dim, index, source):
    """ATen's index_add checks; returns the wrapped dim."""
    op = "aten.index_add.default"
    shape, source_shape = list(shape_of(self)), list(shape_of(source))
    d = canonical_dim(op, dim, max(len(shape), 1))
    require_dtype(dtype_of(index) in _INDEX_DTYPES, op,
                  f"index_add_(): Expected dtype int32/int64 for index but got: {dtype_of(index).name}")
    require(len(shape_of(index)) <= 1, op, f"index_add_(): Index is supposed to be a vector, but got dim: "
                                           f"{len(shape_of(index))}")
    require_dtype(dtype_of(source) is dtype_of(self), op, f"index_add_(): self ({dtype_of(self).name}) and source "
                                                          f"({dtype_of(source).name}) must have the same scalar type")
    count = numel(shape_of(index))
    if not source_shape:  # (torch's message: formatting its own error, it asks a 0-d source for its size at dim)
        require(same_size(count, 1), op, f"Dimension specified as {dim} but tensor has no dimensions")
    else:
        require(d < len(source_shape), op, f"index_add_(): Indexing dim {d} is out of bounds of the source tensor "
                                           f"with dim {len(source_shape)}")
        require(same_size(source_shape[d], count), op, f"index_add_(): Number of indices ({count}) should be equal "
                                                       f"to source.size(dim): ({source_shape[d]}), for dim: {d}")
    # outside the dim where both have dims; a 0-d self takes only a 0-d source, and the other way round
    both = bool(shape and source_shape)
    require(same_shape(_outside(shape, d) if both else shape, _outside(source_shape, d) if both else source_shape),
            op, f"source tensor shape must match self tensor shape, excluding the specified dimension. Got "
                f"self.shape = {_shown(shape)} source.shape = {_shown(source_shape)}")
    return d


def _index_add(self, dim, index, source, alpha=1):
    d = _index_add_check(self, dim, index, source)
    positions = index.reshape(-1).astype(np.int64, copy=False)
    _require_in_bounds("aten.index_add.default", positions, self.shape[d] if self.ndim else 1, d, negative_ok=False)
    result = self.copy().reshape(self.shape or (1,))
    scaled = source.reshape(source.shape or (1,)) * np.asarray(alpha).astype(self.dtype)
    for k, position in enumerate(positions):  # in index order, as ATen's CPU kernel adds them
        result[_axis_index(result.ndim, d, position)] += scaled[_axis_index(result.ndim, d, k)]
    return result.reshape(self.shape)


def _index_add_meta(self, dim, index, source, alpha=1):
    _index_add_check(self, dim, index, source)
    return like(self)


defop("index_add(Tensor self, int dim, Tensor index, Tensor source, *, Scalar alpha=1) -> Tensor",
      _index_add_meta, _index_add, tags=("composite",))


@register_decomposition("aten.index_add.default")
def _index_add_decomposition(self, dim, index, source, alpha=1):
    """scatter_add with the index spread along the dim over the source's shape."""
    d = _index_add_check(self, dim, index, source)
    shape, source_shape = list(shape_of(self)), list(shape_of(source))
    if not shape:
        self, source = aten.reshape.default(self, [1]), aten.reshape.default(source, [1])
        source_shape = [1]
    along = [1] * len(source_shape)
    along[d] = numel(shape_of(index))
    spread = aten.expand.default(aten.reshape.default(aten._to_copy.default(index, dtype=dtypes.int64), along),
                                 source_shape)
    if not (isinstance(alpha, (int, float)) and alpha == 1):
        source = aten.mul.Scalar(source, alpha)
    result = aten.scatter_add.default(self, d, spread, source)
    return aten.reshape.default(result, []) if not shape else result


def _index_copy_check(self, dim, index, source):
    """ATen's index_copy checks (int64 index only, unlike index_add); returns the wrapped dim."""
    op = "aten.index_copy.default"
    shape, source_shape = list(shape_of(self)), list(shape_of(source))
    d = canonical_dim(op, dim, max(len(shape), 1))
    require_dtype(dtype_of(index) is dtypes.int64, op,
                  f"index_copy_(): Expected a long tensor for index, but got {dtype_of(index).name}")
    require(len(shape_of(index)) <= 1, op, f"index_copy_(): Index should have dimension 1 or 0 (got "
                                           f"{len(shape_of(index))})")
    require_dtype(dtype_of(source) is dtype_of(self), op, f"index_copy_(): self and source expected to have the same "
                                                          f"dtype, but got (self) {dtype_of(self).name} and (source) "
                                                          f"{dtype_of(source).name}")
    count = numel(shape_of(index))
    if not source_shape:
        require(same_size(count, 1), op, f"index_copy_(): When source is scalar, index should have one element (got "
                                         f"{count})")
    elif shape:
        require(len(source_shape) == len(shape), op,
                f"index_copy_(): When source and destination are not scalars, their dimensionality must match. "
                f"Source dimensionality ({len(source_shape)}), destination dimensionality ({len(shape)})")
    # ATen compares the shapes outside the dim (a 0-d tensor's is empty): a scalar source fits a 1-D destination only
    self_slice, source_slice = _outside(shape, d), _outside(source_shape, d)
    require(same_shape(self_slice, source_slice),
            op, f"index_copy_(): Source/destination tensor must have same slice shapes. Destination slice shape: "
                f"{' '.join(map(str, self_slice))} at dimension {d} and source slice shape: "
                f"{' '.join(map(str, source_slice))} at dimension 0.")
    if source_shape:
        require(same_size(source_shape[d], count), op, f"index_copy_(): Number of indices ({count}) should be equal "
                                                       f"to source.size(dim) ({source_shape[d]})")
    return d


def _index_copy(self, dim, index, source):
    d = _index_copy_check(self, dim, index, source)
    positions = index.reshape(-1)
    _require_in_bounds("aten.index_copy.default", positions, self.shape[d] if self.ndim else 1, d, negative_ok=False)
    result = self.copy().reshape(self.shape or (1,))
    # numpy assigns repeated positions in order, so the last copy wins, as in ATen's serial CPU kernel
    result[(slice(None),) * d + (positions,)] = source.reshape(result.shape[:d] + (len(positions),)
                                                               + result.shape[d + 1:])
    return result.reshape(self.shape)


def _index_copy_meta(self, dim, index, source):
    _index_copy_check(self, dim, index, source)
    return like(self)


defop("index_copy(Tensor self, int dim, Tensor index, Tensor source) -> Tensor", _index_copy_meta, _index_copy,
      tags=("composite",))


@register_decomposition("aten.index_copy.default")
def _index_copy_decomposition(self, dim, index, source):
    """index_put with the index at the dim (torch's reference decomposition): self[:, ..., index] = source."""
    d = _index_copy_check(self, dim, index, source)
    shape = list(shape_of(self))
    flat = aten.reshape.default(index, [-1]) if len(shape_of(index)) == 0 else index
    target = self if shape else aten.reshape.default(self, [1])
    sizes = list(shape_of(target))
    spread = aten.reshape.default(source, sizes[:d] + [numel(shape_of(index))] + sizes[d + 1:])
    result = aten.index_put.default(target, [None] * d + [flat], spread)
    return result if shape else aten.reshape.default(result, [])


# ---------------------------------------------------------------------------------------------
# Advanced indexing: index.Tensor, index_put


def _mask_count(mask):
    """How many elements a mask selects: exact for a concrete mask, a fresh unbacked symbol while tracing."""
    if isinstance(mask, np.ndarray):
        return int(np.count_nonzero(mask))
    return unbacked_size("mask")


def _indexing_shape(op, self, indices):
    """The shape of self[indices] under numpy/torch advanced indexing.

    Each mask of k dims stands for k index tensors of its count. All index tensors broadcast together;
    their result dims replace the indexed dims in place when those dims are adjacent, and go first
    otherwise.
    """
    shape = shape_of(self)
    require(any(i is not None for i in indices), op, "at least one index must be a tensor, not None",
            fix="an all-None index list selects everything: use the tensor itself")
    require(len(indices) <= len(shape), op,
            f"too many indices for tensor of dimension {len(shape)} (got {len(indices)})")
    advanced = []  # (indexed dim, shape of its index tensor)
    position = 0
    for index in indices:
        if index is None:
            position += 1
            continue
        dt = dtype_of(index)
        require_dtype(dt in _INDEX_DTYPES or dt in (dtypes.bool_, dtypes.uint8), op,
                      f"tensors used as indices must be long, int, byte or bool tensors, got {dt.name}")
        index_shape = shape_of(index)
        if dt in (dtypes.bool_, dtypes.uint8):
            require(len(index_shape) > 0, op, "a 0-d boolean index is not supported",
                    fix="torch's Python indexing turns x[True] into x.unsqueeze(0); do that instead")
            require(position + len(index_shape) <= len(shape), op,
                    f"too many indices for tensor of dimension {len(shape)} (got {position + len(index_shape)})")
            for j, size in enumerate(index_shape):
                require(same_size(size, shape[position + j]), op,
                        f"the shape of the mask {_shown(index_shape)} at index {j} does not match the shape of "
                        f"the indexed tensor {_shown(shape)} at index {position + j}")
            count = _mask_count(index)
            advanced += [(position + j, (count,)) for j in range(len(index_shape))]
            position += len(index_shape)
        else:
            advanced.append((position, tuple(index_shape)))
            position += 1
    # (a mask indexes as many dims as it has: x[mask_2d, i] needs three)
    require(position <= len(shape), op, f"too many indices for tensor of dimension {len(shape)} (got {position})")
    broadcast = list(broadcast_shapes(op, *[s for _, s in advanced]))
    dims = [d for d, _ in advanced]
    if dims == list(range(dims[0], dims[-1] + 1)):
        return list(shape[:dims[0]]) + broadcast + list(shape[dims[-1] + 1:])
    return broadcast + [s for d, s in enumerate(shape) if d not in dims]


def _numpy_key(op, self, indices):
    """The numpy index for torch's `indices`: slices for None, masks as their nonzero() arrays (which
    numpy treats exactly like the mask), integer arrays bounds-checked."""
    key = []
    for index in indices:
        if index is None:
            key.append(slice(None))
        elif index.dtype in (np.bool_, np.uint8):
            key.extend(np.nonzero(index.astype(bool, copy=False)))
        else:
            dim = len(key)
            positions = index.astype(np.int64, copy=False)
            _require_in_bounds(op, positions, self.shape[dim], dim, negative_ok=True)
            key.append(positions)
    return tuple(key)


def _index(self, indices):
    op = "aten.index.Tensor"
    _indexing_shape(op, self, indices)
    return self[_numpy_key(op, self, indices)]


defop("index.Tensor(Tensor self, Tensor?[] indices) -> Tensor",
      lambda self, indices: like(self, shape=_indexing_shape("aten.index.Tensor", self, indices)), _index)


def _index_put_check(self, indices, values):
    op = "aten.index_put.default"
    require_dtype(dtype_of(values) is dtype_of(self), op,
                  f"index put requires the source and destination dtypes match, got {dtype_of(self).name} for "
                  f"the destination and {dtype_of(values).name} for the source")
    target = _indexing_shape(op, self, indices)
    value_shape = shape_of(values)
    # `values` must expand to the indexed shape: no extra dims, each size equal or 1. A size that
    # depends on a mask's count is assumed to match (the kernel checks it).
    fits = len(value_shape) <= len(target) and all(
        (isinstance(v, int) and v == 1) or holds(sympy.Eq(v, t)) for v, t in zip(value_shape[::-1], target[::-1]))
    require(fits, op, f"shape mismatch: value tensor of shape {_shown(value_shape)} cannot be broadcast to "
                      f"indexing result of shape {_shown(target)}")
    return like(self)


def _index_put(self, indices, values, accumulate=False):
    op = "aten.index_put.default"
    _index_put_check(self, indices, values)
    key = _numpy_key(op, self, indices)
    result = self.copy()
    spread = np.broadcast_to(values, result[key].shape)
    if accumulate:
        # Duplicates add up, one at a time in index order and in self's dtype, like ATen's CPU kernel.
        np.add.at(result, key, spread)
    else:
        result[key] = spread
    return result


defop("index_put(Tensor self, Tensor?[] indices, Tensor values, bool accumulate=False) -> Tensor",
      lambda self, indices, values, accumulate=False: _index_put_check(self, indices, values), _index_put)


# ---------------------------------------------------------------------------------------------
# masked_scatter, nonzero


def _masked_scatter_meta(self, mask, source):
    op = "aten.masked_scatter.default"
    require_dtype(dtype_of(mask).is_bool, op,
                  f"masked_scatter only supports boolean masks, but got mask with dtype {dtype_of(mask).name}")
    require_dtype(dtype_of(source) is dtype_of(self), op,
                  f"expected self and source to have same dtypes but got {dtype_of(self).name} and "
                  f"{dtype_of(source).name}")
    return like(self, shape=broadcast_shapes(op, shape_of(self), shape_of(mask)))


def _masked_scatter(self, mask, source):
    shape = np.broadcast_shapes(self.shape, mask.shape)
    result = np.broadcast_to(self, shape).copy()
    selected = np.broadcast_to(mask, shape)
    count = int(np.count_nonzero(selected))
    require(source.size >= count, "aten.masked_scatter.default",
            f"number of elements of source ({source.size}) < number of ones in mask ({count})")
    # Masked positions take source's elements in row-major order.
    result[selected] = source.reshape(-1)[:count]
    return result


defop("masked_scatter(Tensor self, Tensor mask, Tensor source) -> Tensor", _masked_scatter_meta, _masked_scatter)


@register_decomposition("aten.masked_scatter.default")
def _masked_scatter_by_counts(self, mask, source):
    """For backends without the op (C): each masked position takes the source element that its running count of
    masked positions names (row-major order), all shapes fixed, as the ONNX lowering computes it. The source gets a
    pad element in front, which the positions outside the mask read. A mask with more positions than the source
    has elements reads past its end, which the gather's bounds check reports (ATen's own error: `number of elements
    of source < number of ones in mask`)."""
    shape = list(shape_of(_masked_scatter_meta(self, mask, source)))
    flat_mask = aten.reshape.default(aten.expand.default(mask, shape), [-1])
    counts = aten.cumsum.default(aten._to_copy.default(flat_mask, dtype=dtypes.int64), 0)
    read = aten.where.self(flat_mask, counts, aten.scalar_tensor.default(0, dtype=dtypes.int64))
    padded = aten.cat.default([aten.full.default([1], 0, dtype=dtype_of(source)), aten.reshape.default(source, [-1])])
    merged = aten.where.self(flat_mask, aten.index.Tensor(padded, [read]),
                             aten.reshape.default(aten.expand.default(self, shape), [-1]))
    return aten.reshape.default(merged, shape)


def _is_nonzero(array: np.ndarray) -> np.ndarray:
    return array if array.dtype == np.bool_ else array != 0  # NaN counts as nonzero


def _nonzero_meta(self):
    count = int(np.count_nonzero(_is_nonzero(self))) if isinstance(self, np.ndarray) else unbacked_size("nonzero")
    return tensor([count, len(shape_of(self))], dtypes.int64)


def _nonzero(self):
    return np.argwhere(_is_nonzero(self)).astype(np.int64, copy=False)


defop("nonzero(Tensor self) -> Tensor", _nonzero_meta, _nonzero)


# ---------------------------------------------------------------------------------------------
# bucketize: ATen's binary search, step by step (the same steps in the kernel and the decomposition)


def _bucketize_meta(self, boundaries, out_int32=False, right=False):
    op = "aten.bucketize.Tensor"
    require_arg(len(shape_of(boundaries)) == 1, op,
                f"boundaries tensor must be 1 dimension, but got dim({len(shape_of(boundaries))})")
    require_dtype(not dtype_of(self).is_complex and not dtype_of(boundaries).is_complex, op,
                  "bucketize is not defined for complex values")
    return like(self, dtype=dtypes.int32 if out_int32 else dtypes.int64)


def _search_steps(length: int) -> int:
    """Halvings of [0, length] until no position is left open: the binary search's iterations."""
    return length.bit_length()


def _bucketize(self, boundaries, out_int32=False, right=False):
    compute = dtypes.promote_types(dtypes.dtype(self.dtype), dtypes.dtype(boundaries.dtype)).numpy
    x, table = self.astype(compute), boundaries.astype(compute)
    start, end = np.zeros(x.shape, np.int64), np.full(x.shape, table.size, np.int64)
    for _ in range(_search_steps(table.size)):
        active = start < end
        mid = (start + end) // 2
        value = table[np.minimum(mid, table.size - 1)]
        with np.errstate(invalid="ignore"):
            right_of = ~(value > x) if right else ~(value >= x)  # NaN goes right, as in ATen
        start = np.where(active & right_of, mid + 1, start)
        end = np.where(active & ~right_of, mid, end)
    return start.astype(np.int32 if out_int32 else np.int64)


defop("bucketize.Tensor(Tensor self, Tensor boundaries, *, bool out_int32=False, bool right=False) -> Tensor",
      _bucketize_meta, _bucketize)


@register_decomposition("aten.bucketize.Tensor")
def _bucketize_decomposition(self, boundaries, out_int32=False, right=False):
    """The kernel's search with core ops: per step a gather of each element's middle boundary and a compare (a
    boundary count known only at run time counts the boundaries below instead, which is the same for the sorted
    boundaries ATen requires)."""
    length = shape_of(boundaries)[0]
    compare = aten.gt.Tensor if right else aten.ge.Tensor
    result_dtype = dtypes.int32 if out_int32 else dtypes.int64
    if not isinstance(length, int):
        below = aten.logical_not.default(compare(boundaries, aten.unsqueeze.default(self, -1)))
        return aten.sum.dim_IntList(below, [-1], False, dtype=result_dtype)
    shape = list(shape_of(self))
    start = aten.full.default(shape, 0, dtype=dtypes.int64)
    end = aten.full.default(shape, length, dtype=dtypes.int64)
    for _ in range(_search_steps(length)):
        active = aten.lt.Tensor(start, end)
        mid = aten.div.Scalar_mode(aten.add.Tensor(start, end), 2, rounding_mode="floor")
        value = aten.index.Tensor(boundaries, [aten.clamp_max.default(mid, length - 1)])
        right_of = aten.logical_not.default(compare(value, self))
        start = aten.where.self(aten.logical_and.default(active, right_of), aten.add.Scalar(mid, 1), start)
        end = aten.where.self(aten.logical_and.default(active, aten.logical_not.default(right_of)), mid, end)
    return start if result_dtype is dtypes.int64 else aten._to_copy.default(start, dtype=result_dtype)


# ---------------------------------------------------------------------------------------------
# VJP rules (torch's derivatives.yaml and FunctionsManual.cpp, written with kiln.ops handles; see register_vjp).
# A gather's transpose is a scatter-add into zeros, and a scatter's is a gather; positions that a later write
# overwrote get no gradient.

from kiln.ir.ops._grad import sum_like, sum_to, zeros_like  # noqa: E402
from kiln.ir.ops.shape import gradient_for, zeros  # noqa: E402
from kiln.ir.registry import register_vjp  # noqa: E402
from kiln.ir.symbolic import as_dim  # noqa: E402


def _src_window(src, index):
    """The part of `src` that scatter reads: the index's extent from the front of every dim."""
    src_shape, index_shape = _nonempty(shape_of(src)), _nonempty(shape_of(index))
    if all(isinstance(a, int) and isinstance(b, int) and a == b for a, b in zip(src_shape, index_shape)):
        return aten.view.default(src, list(shape_of(index))) if len(shape_of(src)) != len(shape_of(index)) else src
    window = aten.view.default(src, src_shape)
    for dim, (have, want) in enumerate(zip(src_shape, index_shape)):
        if not (isinstance(have, int) and isinstance(want, int) and have == want):
            window = aten.slice.Tensor(window, dim, 0, want)
    return aten.view.default(window, list(shape_of(index)))


def _to_src(grad_window, src):
    """A gradient of the window back on `src`'s shape: zeros where scatter never read src (torch raises there)."""
    src_shape, window_shape = _nonempty(shape_of(src)), _nonempty(shape_of(grad_window))
    if all(isinstance(a, int) and isinstance(b, int) and a == b for a, b in zip(src_shape, window_shape)):
        padded = grad_window
    else:
        pad = []
        for have, want in reversed(list(zip(window_shape, src_shape))):
            pad += [0, as_dim(want - have)]
        padded = aten.constant_pad_nd.default(aten.view.default(grad_window, window_shape), pad)
    if tuple(shape_of(padded)) != tuple(shape_of(src)):
        padded = aten.view.default(padded, list(shape_of(src)))
    return gradient_for(padded, src)


@register_vjp("aten.gather.default")
def _gather_vjp(grad, out, self, dim, index, *, sparse_grad=False):
    return aten.scatter_add.default(zeros(shape_of(self), grad), dim, index, grad), None


@register_vjp("aten.scatter.src")
def _scatter_src_vjp(grad, out, self, dim, index, src):
    return (aten.scatter.value(grad, dim, index, 0), None,
            _to_src(aten.gather.default(grad, dim, index), src))


@register_vjp("aten.scatter.value")
def _scatter_value_vjp(grad, out, self, dim, index, value):
    return aten.scatter.value(grad, dim, index, 0), None


@register_vjp("aten.scatter_add.default")
def _scatter_add_vjp(grad, out, self, dim, index, src):
    return grad, None, _to_src(aten.gather.default(grad, dim, index), src)


def _where_zero(condition, values, replacement):
    """`values` with `replacement` (a number) where `condition` holds."""
    return aten.where.self(condition, aten.full_like.default(values, replacement), values)


@register_vjp("aten.scatter_reduce.two")
def _scatter_reduce_vjp(grad, out, self, dim, index, src, reduce, *, include_self=True):
    """torch's scatter_reduce_backward for sum, prod, mean and amax/amin (ties share the gradient evenly)."""
    window = _src_window(src, index)
    kind = dtype_of(self)
    if reduce == "sum":
        grad_self, grad_src = grad, aten.gather.default(grad, dim, index)
    elif reduce == "prod":
        # Products without the element itself, computed without dividing by a zero.
        masked_self = _where_zero(aten.eq.Scalar(self, 0), self, 1)
        masked_self_result = aten.scatter_reduce.two(masked_self, dim, index, window, "prod",
                                                     include_self=include_self)
        grad_self = aten.div.Tensor(aten.mul.Tensor(grad, masked_self_result), masked_self)
        src_zero = aten.eq.Scalar(window, 0)
        zero_counts = aten.gather.default(aten.scatter_add.default(
            zeros(shape_of(self), self), dim, index, aten._to_copy.default(src_zero, dtype=kind)), dim, index)
        single_zero = aten.logical_and.default(src_zero, aten.eq.Scalar(zero_counts, 1))
        masked_src_result = aten.scatter_reduce.two(self, dim, index, _where_zero(single_zero, window, 1), "prod",
                                                    include_self=include_self)
        grad_src = aten.where.self(
            single_zero, aten.gather.default(aten.mul.Tensor(grad, masked_src_result), dim, index),
            aten.div.Tensor(aten.gather.default(aten.mul.Tensor(grad, out), dim, index),
                            _where_zero(src_zero, window, 1)))
    elif reduce == "mean":
        counts = aten.full_like.default(grad, 1 if include_self else 0)
        counts = aten.scatter_add.default(counts, dim, index, aten.full_like.default(window, 1))
        counts = _where_zero(aten.eq.Scalar(counts, 0), counts, 1)
        grad_self = aten.div.Tensor(grad, counts)
        grad_src = aten.div.Tensor(aten.gather.default(grad, dim, index), aten.gather.default(counts, dim, index))
    else:  # amax, amin (or their spellings max, min)
        value = aten.gather.default(out, dim, index)
        self_is_result = aten._to_copy.default(aten.eq.Tensor(self, out), dtype=kind)
        src_is_result = aten._to_copy.default(aten.eq.Tensor(window, value), dtype=kind)
        shares = aten.div.Tensor(grad, aten.scatter_add.default(self_is_result, dim, index, src_is_result))
        grad_self = aten.mul.Tensor(self_is_result, shares)
        grad_src = aten.mul.Tensor(src_is_result, aten.gather.default(shares, dim, index))
    if not include_self:
        grad_self = aten.scatter.value(grad_self, dim, index, 0)
    return gradient_for(grad_self, self), None, _to_src(grad_src, src)


@register_vjp("aten.index_select.default")
def _index_select_vjp(grad, out, self, dim, index):
    shape = shape_of(self)
    if not shape:  # a 0-d self: the only valid index is 0
        return aten.view.default(grad, []), None
    d = canonical_dim("aten.index_select.default", dim, len(shape))
    positions = aten.view.default(index, [numel(shape_of(index))]) if not shape_of(index) else index
    return aten.index_put.default(zeros(shape, grad), [None] * d + [positions], grad, True), None


@register_vjp("aten.index.Tensor")
def _index_vjp(grad, out, self, indices):
    return aten.index_put.default(zeros(shape_of(self), grad), list(indices), grad, True), None


@register_vjp("aten.index_put.default")
def _index_put_vjp(grad, out, self, indices, values, accumulate=False):
    grad_self = grad if accumulate else aten.index_put.default(grad, list(indices), zeros_like(values), False)
    return grad_self, None, gradient_for(sum_to(aten.index.Tensor(grad, list(indices)), shape_of(values)), values)


@register_vjp("aten.masked_scatter.default")
def _masked_scatter_vjp(grad, out, self, mask, source):
    """self: the gradient off the mask. source: its k-th element went to the k-th masked position (row-major),
    so each masked position sends its gradient to cumsum(mask) - 1; the others go to a spare slot past the end,
    which keeps every shape independent of the mask's values."""
    grad_self = sum_like(aten.where.self(mask, zeros([], grad), grad), self)
    count = numel(shape_of(grad))
    source_count = numel(shape_of(source))
    flat_mask = aten.view.default(aten.expand.default(mask, list(shape_of(grad))), [count])
    rank = aten.sub.Scalar(aten.cumsum.default(flat_mask, 0, dtype=dtypes.int64), 1)
    positions = aten.where.self(flat_mask, rank, aten.full.default([], source_count, dtype=dtypes.int64))
    collected = aten.scatter_add.default(zeros([as_dim(source_count + 1)], grad), 0, positions,
                                         aten.view.default(grad, [count]))
    grad_source = aten.view.default(aten.slice.Tensor(collected, 0, 0, source_count), list(shape_of(source)))
    return grad_self, None, gradient_for(grad_source, source)
