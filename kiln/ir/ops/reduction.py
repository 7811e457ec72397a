"""Reductions, scans, sorting and softmax: sum/prod/mean/var, amax/amin, any/all, argmax/argmin,
max/min.dim, cumsum/cumprod, sort/argsort/topk, (log_)softmax, logsumexp and linalg_vector_norm.

Semantics follow ATen on CPU (torch eager is the oracle):
- dims: `None` reduces every dim, and so does `[]` for `int[1]` lists (sum, mean, amax, var, ...); `any.dims`
  and `all.dims` are the exception, where `[]` reduces nothing. A 0-d tensor accepts dims 0 and -1.
- dtypes: sum/prod/cumsum/cumprod of integers or bools give int64 unless `dtype=` says otherwise, and `dtype=`
  casts the input before reducing. mean, var and softmax need floating inputs. any/all give bool (uint8 for
  uint8 inputs); argmax/argmin and the index results of max/min/sort/topk are int64.
- NaN wins in amax/amin/max/min/argmax/argmin (the index of the first NaN); sort and topk order NaN as the
  largest value. Ties resolve to the first occurrence, and kiln's sort is stable (ATen leaves the tie order
  of `sort.default` and `topk` unspecified; stable is one valid choice and lets argsort.stable decompose to it).
- precision: sums, means and variances accumulate in float64 (ATen accumulates float16/bfloat16 in float32 and
  uses cascade sums or double accumulators for float32; float64 makes kiln's rounding the more accurate one).
  Low-precision results are rounded through float32, like ATen's final cast. prod keeps ATen's per-step
  rounding in the input's float dtype (it overflows and rounds where ATen does), cumsum/cumprod accumulate
  sequentially in ATen's accumulator types, and float16/bfloat16 log_softmax over the last dim rounds its
  log-sum to the input dtype like ATen's CPU kernel. var_mean's mean is the plain mean: ATen's Welford update
  can turn an inf input into a nan mean, which kiln does not imitate.
- errors: like ATen, reducing a zero-size dim without an identity (amax, argmax, max.dim, min-like norms) or
  a topk k out of range raises a ShapeError, and mean/var/softmax of integers raise a DTypeError.
- composites decompose to core ops: sum/max/min/all/std/var_mean/argsort/sort.stable/(log_)softmax.int/
  logsumexp/linalg_vector_norm directly, cumprod through a log-depth scan that needs a static size along dim.
"""

from __future__ import annotations

import math

import numpy as np
import sympy

from kiln.ir import dtypes
from kiln.ir.errors import UnsupportedError
from kiln.ir.dtypes import DType
from kiln.ir.meta import (
    canonical_dim, canonical_dims, dtype_of, like, reduced_shape, require, require_arg, require_dtype, shape_of,
    tensor,
)
from kiln.ir.ops._common import checked, ignore_fp_errors
from kiln.ir.registry import defop, ops, register_decomposition
from kiln.ir.symbolic import provably

# ---------------------------------------------------------------------------------------------
# Shared helpers (meta side)


def _known_empty(size) -> bool:
    return provably(sympy.Eq(size, 0)) is True


def _is_floating(dt: DType) -> bool:
    return dt.is_floating_point or dt.is_complex


def _integer_result(dt: DType) -> DType:
    """sum/prod/cumsum/cumprod promote bool and integer inputs to int64 (ATen's `get_dtype_from_self`)."""
    return dtypes.int64 if dt.is_bool or dt.is_integral else dt


def _require_nonempty_reduction(op: str, name: str, shape, dims, *, all_dims: bool) -> None:
    """Reductions without an identity (max, argmax, ...) refuse to reduce a zero-size dim."""
    if not shape:
        return  # a 0-d tensor holds one element
    if all_dims:
        require(not any(_known_empty(s) for s in shape), op,
                f"{name}(): Expected reduction dim to be specified for input.numel() == 0",
                fix="pass the dim to reduce, or make sure the input is not empty")
        return
    for d in dims:
        require(not _known_empty(shape[d]), op, f"{name}(): Expected reduction dim {d} to have non-zero size")


def _dim_list(dim) -> list[int]:
    """An `int[1]?` argument as a list (decompositions receive the caller's raw `dim=1` or `dim=None`)."""
    if dim is None:
        return []
    return [dim] if isinstance(dim, int) else list(dim)


def _reduction_meta(self, dims, keepdim: bool, dtype: DType):
    return tensor(reduced_shape(shape_of(self), dims, keepdim), dtype)


def _cast(value, dtype: DType | None):
    """In decompositions: `value` converted to `dtype` by `_to_copy`, or unchanged if it already has it."""
    if dtype is None or dtype_of(value) is dtype:
        return value
    return ops.aten._to_copy.default(value, dtype=dtype)


# ---------------------------------------------------------------------------------------------
# Shared helpers (kernel side)


def _axes(array: np.ndarray, dims) -> tuple[int, ...]:
    """numpy axes for canonical dims (a 0-d array has none: reducing it is the identity)."""
    return tuple(dims) if array.ndim else ()


def _finish(result, dtype: DType) -> np.ndarray:
    """Round an accumulator to `dtype` through float32 for float16/bfloat16, like ATen's float32 opmath."""
    result = np.asarray(result)
    return result.astype(dtypes.opmath_dtype(dtype).numpy, copy=False).astype(dtype.numpy, copy=False)


def _accumulator(dtype: DType):
    """The numpy dtype sums accumulate in: float64 for floats, int64 for integers and bools."""
    if dtype.is_floating_point:
        return np.float64
    if dtype.is_complex:
        return np.complex128
    return np.int64


def _exact_float32(array: np.ndarray) -> np.ndarray:
    """float16/bfloat16 widened to float32 (exact), so numpy's NaN-aware comparisons and sorts apply."""
    if array.dtype in (np.float16, dtypes.bfloat16.numpy):
        return array.astype(np.float32)
    return array


# ---------------------------------------------------------------------------------------------
# sum, prod, mean


def _sum_meta(op: str):
    def meta(self, dim, keepdim=False, dtype=None):
        dims = canonical_dims(op, dim, len(shape_of(self)))
        return _reduction_meta(self, dims, keepdim, dtype or _integer_result(dtype_of(self)))
    return meta


def _sum_kernel(self, dim, keepdim=False, dtype=None):
    result_dtype = dtype or _integer_result(dtypes.dtype(self.dtype))
    dims = canonical_dims("aten.sum.dim_IntList", dim, self.ndim)
    values = self.astype(result_dtype.numpy, copy=False)  # dtype= casts the input first, like ATen
    total = np.sum(values.astype(_accumulator(result_dtype)), axis=_axes(self, dims), keepdims=keepdim)
    return _finish(total, result_dtype)


defop("sum.dim_IntList(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
      _sum_meta("aten.sum.dim_IntList"), ignore_fp_errors(_sum_kernel))
defop("sum(Tensor self, *, ScalarType? dtype=None) -> Tensor",
      lambda self, dtype=None: _sum_meta("aten.sum.default")(self, None, False, dtype),
      ignore_fp_errors(lambda self, dtype=None: _sum_kernel(self, None, False, dtype)), tags=("composite",))


@register_decomposition("aten.sum.default")
def _sum_decomposition(self, dtype=None):
    return ops.aten.sum.dim_IntList(self, [], False, dtype=dtype)


def _prod_meta(op: str):
    def meta(self, dim, keepdim=False, dtype=None):
        dims = [canonical_dim(op, dim, len(shape_of(self)))] if dim is not None else list(
            range(len(shape_of(self))))
        return _reduction_meta(self, dims, keepdim, dtype or _integer_result(dtype_of(self)))
    return meta


def _prod_kernel(self, dim, keepdim=False, dtype=None):
    result_dtype = dtype or _integer_result(dtypes.dtype(self.dtype))
    values = self.astype(result_dtype.numpy, copy=False)
    if values.ndim == 0:
        return values
    dims = [canonical_dim("aten.prod.dim_int", dim, self.ndim)] if dim is not None else list(range(self.ndim))
    if result_dtype in (dtypes.float16, dtypes.bfloat16):
        # ATen multiplies sequentially in the low-precision dtype, rounding after every step; a sequential
        # accumulate in that dtype reproduces it (each float32 product of two halves is exact before rounding).
        kept = [d for d in range(values.ndim) if d not in dims]
        count = math.prod(values.shape[d] for d in dims)
        rows = np.transpose(values, kept + dims).reshape([values.shape[d] for d in kept] + [count])
        if count == 0:
            product = np.ones(rows.shape[:-1], values.dtype)
        else:
            product = np.multiply.accumulate(rows, axis=-1)[..., -1]
        return product.reshape(reduced_shape(values.shape, dims, keepdim))
    if result_dtype.is_bool:
        return np.all(values, axis=tuple(dims), keepdims=keepdim)
    # float32 stays float32 so products overflow and underflow where ATen's do; integers wrap in int64.
    accumulator = values.dtype if result_dtype.is_floating_point else np.int64
    return np.prod(values, axis=tuple(dims), keepdims=keepdim, dtype=accumulator)


defop("prod.dim_int(Tensor self, int dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
      _prod_meta("aten.prod.dim_int"), ignore_fp_errors(_prod_kernel))
defop("prod(Tensor self, *, ScalarType? dtype=None) -> Tensor",
      lambda self, dtype=None: _prod_meta("aten.prod.default")(self, None, False, dtype),
      ignore_fp_errors(lambda self, dtype=None: _prod_kernel(self, None, False, dtype)))


def _mean_dtype(op: str, self, dtype) -> DType:
    if dtype is not None:
        require_dtype(_is_floating(dtype), op, "mean(): could not infer output dtype. Optional dtype must be "
                      f"either a floating point or complex dtype. Got: {dtype}")
        return dtype
    require_dtype(_is_floating(dtype_of(self)), op, "mean(): could not infer output dtype. Input dtype must be "
                  f"either a floating point or complex dtype. Got: {dtype_of(self)} (pass dtype= to average "
                  "integers)")
    return dtype_of(self)


def _mean_meta(op: str):
    def meta(self, dim, keepdim=False, dtype=None):
        result_dtype = _mean_dtype(op, self, dtype)
        return _reduction_meta(self, canonical_dims(op, dim, len(shape_of(self))), keepdim, result_dtype)
    return meta


def _mean_kernel(self, dim, keepdim=False, dtype=None):
    result_dtype = dtype or dtypes.dtype(self.dtype)
    dims = canonical_dims("aten.mean.dim", dim, self.ndim)
    # ATen (CPU) sums in opmath(dtype), divides, then casts: the input is not rounded to a float16 `dtype` first.
    values = self.astype(dtypes.opmath_dtype(result_dtype).numpy, copy=False)
    count = math.prod(self.shape[d] for d in _axes(self, dims))
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.sum(values.astype(_accumulator(result_dtype)), axis=_axes(self, dims), keepdims=keepdim) / count
    return _finish(mean, result_dtype)


defop("mean.dim(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
      _mean_meta("aten.mean.dim"), _mean_kernel)
defop("mean(Tensor self, *, ScalarType? dtype=None) -> Tensor",
      lambda self, dtype=None: _mean_meta("aten.mean.default")(self, None, False, dtype),
      lambda self, dtype=None: _mean_kernel(self, None, False, dtype))


# ---------------------------------------------------------------------------------------------
# var, std, var_mean


def _var_meta(op: str):
    def meta(self, dim=None, correction=None, keepdim=False):
        require_dtype(_is_floating(dtype_of(self)), op,
                      f"std and var only support floating point and complex dtypes, got {dtype_of(self)}")
        return _reduction_meta(self, canonical_dims(op, dim, len(shape_of(self))), keepdim, dtype_of(self))
    return meta


def _variance(self, dim, correction, keepdim):
    """Two-pass variance in float64; the divisor is max(N - correction, 0) like ATen (0 gives inf or nan)."""
    correction = 1 if correction is None else float(correction)
    dims = canonical_dims("aten.var.correction", dim, self.ndim)
    axes = _axes(self, dims)
    count = math.prod(self.shape[d] for d in axes)
    values = self.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.sum(values, axis=axes, keepdims=True) / count
        squares = np.sum(np.square(values - mean), axis=axes, keepdims=keepdim)
        return squares / max(count - correction, 0)


def _var_kernel(self, dim=None, correction=None, keepdim=False):
    return _finish(_variance(self, dim, correction, keepdim), dtypes.dtype(self.dtype))


def _std_kernel(self, dim=None, correction=None, keepdim=False):
    return _finish(np.sqrt(_variance(self, dim, correction, keepdim)), dtypes.dtype(self.dtype))


defop("var.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> Tensor",
      _var_meta("aten.var.correction"), _var_kernel)
defop("var.dim(Tensor self, int[1]? dim, bool unbiased=True, bool keepdim=False) -> Tensor",
      lambda self, dim, unbiased=True, keepdim=False: _var_meta("aten.var.dim")(self, dim, None, keepdim),
      lambda self, dim, unbiased=True, keepdim=False: _var_kernel(self, dim, int(unbiased), keepdim))
defop("std.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> Tensor",
      _var_meta("aten.std.correction"), _std_kernel, tags=("composite",))
defop("std.dim(Tensor self, int[1]? dim, bool unbiased=True, bool keepdim=False) -> Tensor",
      lambda self, dim, unbiased=True, keepdim=False: _var_meta("aten.std.dim")(self, dim, None, keepdim),
      lambda self, dim, unbiased=True, keepdim=False: _std_kernel(self, dim, int(unbiased), keepdim),
      tags=("composite",))
defop("var_mean.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> "
      "(Tensor, Tensor)",
      lambda self, dim=None, correction=None, keepdim=False: (
          _var_meta("aten.var_mean.correction")(self, dim, correction, keepdim),) * 2,
      lambda self, dim=None, correction=None, keepdim=False: (
          _var_kernel(self, dim, correction, keepdim), _mean_kernel(self, dim, keepdim)),
      tags=("composite",))


@register_decomposition("aten.std.correction")
def _std_correction_decomposition(self, dim=None, correction=None, keepdim=False):
    """sqrt(var) computed in opmath (float32 for float16/bfloat16) so the result is rounded once, like ATen."""
    dtype = dtype_of(self)
    variance = ops.aten.var.correction(_cast(self, dtypes.opmath_dtype(dtype)), dim, correction=correction,
                                       keepdim=keepdim)
    return _cast(ops.aten.sqrt.default(variance), dtype)


@register_decomposition("aten.std.dim")
def _std_dim_decomposition(self, dim, unbiased=True, keepdim=False):
    return _std_correction_decomposition(self, dim, int(unbiased), keepdim)


@register_decomposition("aten.var_mean.correction")
def _var_mean_decomposition(self, dim=None, correction=None, keepdim=False):
    variance = ops.aten.var.correction(self, dim, correction=correction, keepdim=keepdim)
    return variance, ops.aten.mean.dim(self, dim, keepdim)


# ---------------------------------------------------------------------------------------------
# amax, amin, max, min


def _extremum_meta(op: str, name: str):
    def meta(self, dim=(), keepdim=False):
        shape = shape_of(self)
        dims = canonical_dims(op, dim, len(shape))
        _require_nonempty_reduction(op, name, shape, dims, all_dims=not dim)
        return _reduction_meta(self, dims, keepdim, dtype_of(self))
    return meta


def _extremum_kernel(reduce):
    def kernel(self, dim=(), keepdim=False):
        dims = canonical_dims("amax/amin", dim, self.ndim)
        # numpy's max/min propagate NaN like ATen's; float16/bfloat16 widen exactly to float32 first.
        return reduce(_exact_float32(self), axis=_axes(self, dims), keepdims=keepdim).astype(self.dtype)
    return kernel


def _extremum(op: str, name: str, reduce):
    meta = _extremum_meta(op, name)
    return meta, checked(meta, _extremum_kernel(reduce))


defop("amax(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor", *_extremum("aten.amax.default", "amax", np.max))
defop("amin(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor", *_extremum("aten.amin.default", "amin", np.min))
defop("max(Tensor self) -> Tensor", *_extremum("aten.max.default", "max", np.max), tags=("composite",))
defop("min(Tensor self) -> Tensor", *_extremum("aten.min.default", "min", np.min), tags=("composite",))


@register_decomposition("aten.max.default")
def _max_decomposition(self):
    return ops.aten.amax.default(self, [])


@register_decomposition("aten.min.default")
def _min_decomposition(self):
    return ops.aten.amin.default(self, [])


def _arg_meta(op: str, name: str):
    def meta(self, dim=None, keepdim=False):
        shape = shape_of(self)
        require_dtype(not dtype_of(self).is_bool, op, f"{name}(): does not support bool input")
        if dim is None:
            _require_nonempty_reduction(op, name, shape, [], all_dims=True)
            return tensor([1] * len(shape) if keepdim else [], dtypes.int64)
        canonical = canonical_dim(op, dim, len(shape))
        dims = [canonical] if shape else []
        _require_nonempty_reduction(op, name, shape, dims, all_dims=False)
        return _reduction_meta(self, dims, keepdim, dtypes.int64)
    return meta


def _arg_index(self: np.ndarray, dim: int, pick) -> np.ndarray:
    """First index of the extremum along a (canonical) dim, kept as a size-1 dim; NaN counts as the extremum."""
    # np.argmax/argmin return the first occurrence, and the first NaN when there is one, like ATen.
    values = _exact_float32(self)
    return np.expand_dims(pick(values, axis=dim), dim)


def _arg_kernel(pick):
    def kernel(self, dim=None, keepdim=False):
        if dim is None:
            index = pick(_exact_float32(self).reshape(-1))
            return np.full([1] * self.ndim if keepdim else [], index, np.int64)
        if self.ndim == 0:
            return np.zeros((), np.int64)
        dim = canonical_dim("argmax/argmin", dim, self.ndim)
        index = _arg_index(self, dim, pick)
        return index if keepdim else np.squeeze(index, dim)
    return kernel


defop("argmax(Tensor self, int? dim=None, bool keepdim=False) -> Tensor", _arg_meta("aten.argmax.default", "argmax"),
      checked(_arg_meta("aten.argmax.default", "argmax"), _arg_kernel(np.argmax)))
defop("argmin(Tensor self, int? dim=None, bool keepdim=False) -> Tensor", _arg_meta("aten.argmin.default", "argmin"),
      checked(_arg_meta("aten.argmin.default", "argmin"), _arg_kernel(np.argmin)))


def _max_dim_meta(op: str, name: str):
    def meta(self, dim, keepdim=False):
        shape = shape_of(self)
        canonical = canonical_dim(op, dim, len(shape))
        dims = [canonical] if shape else []
        _require_nonempty_reduction(op, name, shape, dims, all_dims=False)
        values = _reduction_meta(self, dims, keepdim, dtype_of(self))
        return values, like(values, dtype=dtypes.int64)
    return meta


def _max_dim_kernel(pick):
    def kernel(self, dim, keepdim=False):
        if self.ndim == 0:
            return self.copy(), np.zeros((), np.int64)
        dim = canonical_dim("max.dim/min.dim", dim, self.ndim)
        index = _arg_index(self, dim, pick)
        values = np.take_along_axis(self, index, dim)
        return (values, index) if keepdim else (np.squeeze(values, dim), np.squeeze(index, dim))
    return kernel


defop("max.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)",
      _max_dim_meta("aten.max.dim", "max"), checked(_max_dim_meta("aten.max.dim", "max"), _max_dim_kernel(np.argmax)))
defop("min.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)",
      _max_dim_meta("aten.min.dim", "min"), checked(_max_dim_meta("aten.min.dim", "min"), _max_dim_kernel(np.argmin)))


# ---------------------------------------------------------------------------------------------
# any, all


def _logical_dtype(self) -> DType:
    """any/all give bool, except that uint8 inputs keep uint8 (a legacy ATen rule)."""
    return dtypes.uint8 if dtype_of(self) is dtypes.uint8 else dtypes.bool_


def _logical_dims(op: str, dim, rank: int) -> list[int]:
    """any/all dims: an int (.dim), a list (.dims) or None (everything)."""
    if isinstance(dim, int):
        return [canonical_dim(op, dim, rank)]
    if dim is not None and len(dim) == 0:
        return []  # any.dims/all.dims with dim=[] reduce nothing (unlike sum's int[1] dims)
    return canonical_dims(op, dim, rank)


def _logical_meta(op: str):
    def meta(self, dim=None, keepdim=False):
        dims = _logical_dims(op, dim, len(shape_of(self)))
        return _reduction_meta(self, dims, keepdim, _logical_dtype(self))
    return meta


def _logical_kernel(reduce, op: str):
    def kernel(self, dim=None, keepdim=False):
        dims = _logical_dims(op, dim, self.ndim)
        return reduce(self != 0, axis=_axes(self, dims), keepdims=keepdim)  # NaN is truthy: nan != 0
    return kernel


defop("any(Tensor self) -> Tensor", _logical_meta("aten.any.default"), _logical_kernel(np.any, "aten.any.default"))
defop("any.dim(Tensor self, int dim, bool keepdim=False) -> Tensor", _logical_meta("aten.any.dim"),
      _logical_kernel(np.any, "aten.any.dim"))
defop("any.dims(Tensor self, int[]? dim=None, bool keepdim=False) -> Tensor", _logical_meta("aten.any.dims"),
      _logical_kernel(np.any, "aten.any.dims"))
defop("all(Tensor self) -> Tensor", _logical_meta("aten.all.default"), _logical_kernel(np.all, "aten.all.default"),
      tags=("composite",))
defop("all.dim(Tensor self, int dim, bool keepdim=False) -> Tensor", _logical_meta("aten.all.dim"),
      _logical_kernel(np.all, "aten.all.dim"), tags=("composite",))
defop("all.dims(Tensor self, int[]? dim=None, bool keepdim=False) -> Tensor", _logical_meta("aten.all.dims"),
      _logical_kernel(np.all, "aten.all.dims"), tags=("composite",))


def _is_true_meta(op: str):
    def meta(self):
        require_dtype(dtype_of(self).is_bool, op, f"{op.split('.')[1]} takes a bool tensor, got {dtype_of(self).name}")
        return like(self, shape=[])
    return meta


# torch._check(mask.all()) in exported programs: whether every (any) element of a bool tensor is true, as a 0-d bool
# tensor that `item()` then reads into a size torch asserts
defop("_is_all_true(Tensor self) -> Tensor", _is_true_meta("aten._is_all_true.default"), lambda self: np.all(self),
      tags=("composite",))
defop("_is_any_true(Tensor self) -> Tensor", _is_true_meta("aten._is_any_true.default"), lambda self: np.any(self),
      tags=("composite",))


@register_decomposition("aten._is_all_true.default")
def _is_all_true_decomposition(self):
    return ops.aten.all.default(self)


@register_decomposition("aten._is_any_true.default")
def _is_any_true_decomposition(self):
    return ops.aten.any.default(self)


def _all_from_any(self, any_result):
    """all(x) = not any(not x), as torch's reference does; uint8 inputs give uint8."""
    result = ops.aten.logical_not.default(any_result)
    if dtype_of(self) is dtypes.uint8:
        result = ops.aten._to_copy.default(result, dtype=dtypes.uint8)
    return result


@register_decomposition("aten.all.default")
def _all_decomposition(self):
    return _all_from_any(self, ops.aten.any.default(ops.aten.logical_not.default(self)))


@register_decomposition("aten.all.dim")
def _all_dim_decomposition(self, dim, keepdim=False):
    return _all_from_any(self, ops.aten.any.dim(ops.aten.logical_not.default(self), dim, keepdim))


@register_decomposition("aten.all.dims")
def _all_dims_decomposition(self, dim=None, keepdim=False):
    return _all_from_any(self, ops.aten.any.dims(ops.aten.logical_not.default(self), dim, keepdim))


# ---------------------------------------------------------------------------------------------
# cumsum, cumprod


def _scan_meta(op: str):
    def meta(self, dim, dtype=None):
        canonical_dim(op, dim, len(shape_of(self)))
        return like(self, dtype=dtype or _integer_result(dtype_of(self)))
    return meta


def _scan_kernel(scan, op: str):
    def kernel(self, dim, dtype=None):
        result_dtype = dtype or _integer_result(dtypes.dtype(self.dtype))
        dim = canonical_dim(op, dim, self.ndim)
        values = self.astype(result_dtype.numpy, copy=False)  # ATen casts the input to the result dtype first
        if values.ndim == 0:
            return values.copy()
        # Sequential accumulation in ATen's CPU accumulator type: double for float32 and float64, float for
        # float16/bfloat16, int64 for integers (wrapping like a narrower result type would).
        if result_dtype.is_floating_point:
            accumulator = np.float64 if result_dtype.itemsize >= 4 else np.float32
        else:
            accumulator = np.int64
        return _finish(scan(values.astype(accumulator), axis=dim), result_dtype)
    return ignore_fp_errors(kernel)


defop("cumsum(Tensor self, int dim, *, ScalarType? dtype=None) -> Tensor", _scan_meta("aten.cumsum.default"),
      _scan_kernel(np.cumsum, "aten.cumsum.default"))
defop("cumprod(Tensor self, int dim, *, ScalarType? dtype=None) -> Tensor", _scan_meta("aten.cumprod.default"),
      _scan_kernel(np.cumprod, "aten.cumprod.default"), tags=("composite",))


@register_decomposition("aten.cumprod.default")
def _cumprod_decomposition(self, dim, dtype=None):
    """A Hillis-Steele scan: log2(n) steps of x *= x shifted by 2^i along dim (padded with ones).

    Needs a static size along `dim`; float16/bfloat16 scan in float32 so each output is rounded once."""
    aten = ops.aten
    result_dtype = dtype or _integer_result(dtype_of(self))
    shape = shape_of(self)
    if not shape:
        return aten._to_copy.default(self, dtype=result_dtype)
    dim = canonical_dim("aten.cumprod.default", dim, len(shape))
    size = shape[dim]
    if not isinstance(size, int):  # a limit of kiln's, not an error in the program: unsupported
        raise UnsupportedError(f"aten.cumprod.default: the decomposition needs a static size along dim {dim}, got "
                               f"{size}", fix="keep that dim static in dynamic_shapes")
    compute_dtype = dtypes.opmath_dtype(result_dtype)
    values = _cast(_cast(self, result_dtype), compute_dtype)  # dtype= rounds the input first, like the kernel
    shift = 1
    while shift < size:
        head = aten.slice.Tensor(values, dim, 0, size - shift)
        padding = [0, 0] * (len(shape) - 1 - dim) + [shift, 0]
        values = aten.mul.Tensor(values, aten.constant_pad_nd.default(head, padding, 1))
        shift *= 2
    return values if compute_dtype is result_dtype else aten._to_copy.default(values, dtype=result_dtype)


# ---------------------------------------------------------------------------------------------
# sort, argsort, topk


def _sort_meta(op: str):
    def meta(self, dim=-1, descending=False):
        canonical_dim(op, dim, len(shape_of(self)))
        return like(self), like(self, dtype=dtypes.int64)
    return meta


def _stable_order(values: np.ndarray, dim: int, descending: bool) -> np.ndarray:
    """Stable sort order along dim; NaN is the largest value, and equal values keep their input order."""
    keys = _exact_float32(values)
    if not descending:
        return np.argsort(keys, axis=dim, kind="stable")
    # Sorting the reversed input ascending and reversing the result gives descending order with ties
    # still in increasing index order (negating the keys would not: NaN, unsigned ints, int64 min).
    size = keys.shape[dim]
    reversed_order = np.argsort(np.flip(keys, dim), axis=dim, kind="stable")
    return (size - 1) - np.flip(reversed_order, dim)


def _sort_kernel(self, dim=-1, descending=False):
    if self.ndim == 0:
        return self.copy(), np.zeros((), np.int64)
    dim = canonical_dim("aten.sort.default", dim, self.ndim)
    order = _stable_order(self, dim, descending)
    return np.take_along_axis(self, order, dim), order.astype(np.int64)


defop("sort(Tensor self, int dim=-1, bool descending=False) -> (Tensor values, Tensor indices)",
      _sort_meta("aten.sort.default"), _sort_kernel)
defop("argsort(Tensor self, int dim=-1, bool descending=False) -> Tensor",
      lambda self, dim=-1, descending=False: _sort_meta("aten.argsort.default")(self, dim, descending)[1],
      lambda self, dim=-1, descending=False: _sort_kernel(self, dim, descending)[1], tags=("composite",))
defop("argsort.stable(Tensor self, *, bool stable, int dim=-1, bool descending=False) -> Tensor",
      lambda self, stable, dim=-1, descending=False: _sort_meta("aten.argsort.stable")(self, dim, descending)[1],
      lambda self, stable, dim=-1, descending=False: _sort_kernel(self, dim, descending)[1], tags=("composite",))


defop("sort.stable(Tensor self, *, bool? stable, int dim=-1, bool descending=False) -> "
      "(Tensor values, Tensor indices)",
      lambda self, stable=None, dim=-1, descending=False: _sort_meta("aten.sort.stable")(self, dim, descending),
      lambda self, stable=None, dim=-1, descending=False: _sort_kernel(self, dim, descending), tags=("composite",))


@register_decomposition("aten.sort.stable")
def _sort_stable_decomposition(self, stable=None, dim=-1, descending=False):
    return ops.aten.sort.default(self, dim, descending)  # kiln's sort.default is stable


@register_decomposition("aten.argsort.default")
def _argsort_decomposition(self, dim=-1, descending=False):
    return ops.aten.sort.default(self, dim, descending)[1]


@register_decomposition("aten.argsort.stable")
def _argsort_stable_decomposition(self, stable, dim=-1, descending=False):
    return ops.aten.sort.default(self, dim, descending)[1]  # kiln's sort.default is stable


def _topk_meta(self, k, dim=-1, largest=True, sorted=True):
    op = "aten.topk.default"
    shape = shape_of(self)
    dim = canonical_dim(op, dim, len(shape))
    size = shape[dim] if shape else 1
    in_range = provably(sympy.Ge(k, 0)) is not False and provably(sympy.Le(k, size)) is not False
    require(in_range, op, f"selected index k={k} out of range for a dim of size {size}")
    if not shape:
        return like(self), like(self, dtype=dtypes.int64)  # ATen returns the 0-d input itself for k of 0 or 1
    out = list(shape)
    out[dim] = k
    return tensor(out, dtype_of(self)), tensor(out, dtypes.int64)


def _topk_kernel(self, k, dim=-1, largest=True, sorted=True):
    if self.ndim == 0:
        return self.copy(), np.zeros((), np.int64)
    dim = canonical_dim("aten.topk.default", dim, self.ndim)
    # `sorted=False` leaves the order unspecified in ATen; kiln returns the sorted order.
    order = np.take(_stable_order(self, dim, descending=largest), np.arange(k), axis=dim)
    return np.take_along_axis(self, order, dim), order.astype(np.int64)


defop("topk(Tensor self, SymInt k, int dim=-1, bool largest=True, bool sorted=True) -> "
      "(Tensor values, Tensor indices)", _topk_meta, checked(_topk_meta, _topk_kernel))


# ---------------------------------------------------------------------------------------------
# softmax, log_softmax, logsumexp


def _softmax_meta(op: str):
    def meta(self, dim, half_to_float):
        dt = dtype_of(self)
        require_dtype(dt.is_floating_point, op, f"softmax needs a floating-point input, got {dt} (softmax.int and "
                      "log_softmax.int take dtype= to compute in a floating dtype)")
        canonical_dim(op, dim, len(shape_of(self)))
        if half_to_float:
            # CUDA's fused half->float softmax (torch's meta functions agree); ATen's CPU kernels refuse it,
            # so torch eager on CPU cannot check these results and the samples leave it out.
            require_arg(dt in (dtypes.float16, dtypes.bfloat16), op,
                        f"half_to_float=True needs a float16 or bfloat16 input, got {dt}")
            return like(self, dtype=dtypes.float32)
        return like(self)
    return meta


def _shifted(self: np.ndarray, dim: int):
    """x - max(x) along dim in opmath precision (max of a 0-d/empty input handled without numpy errors)."""
    values = self.astype(dtypes.opmath_dtype(dtypes.dtype(self.dtype)).numpy)
    if values.size == 0:
        return values, ()
    axis = (dim,) if values.ndim else ()
    return values - np.max(values, axis=axis, keepdims=True), axis


def _softmax_kernel(self, dim, half_to_float):
    dim = canonical_dim("aten._softmax.default", dim, self.ndim)
    with np.errstate(invalid="ignore", over="ignore"):
        shifted, axis = _shifted(self, dim)
        exps = np.exp(shifted)
        result = exps / np.sum(exps, axis=axis, keepdims=True)
    return result if half_to_float else _finish(result, dtypes.dtype(self.dtype))


def _log_softmax_kernel(self, dim, half_to_float):
    dim = canonical_dim("aten._log_softmax.default", dim, self.ndim)
    dtype = dtypes.dtype(self.dtype)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        shifted, axis = _shifted(self, dim)
        total = np.sum(np.exp(shifted), axis=axis, keepdims=True)
        if dtype in (dtypes.float16, dtypes.bfloat16) and dim == max(self.ndim - 1, 0) and not half_to_float:
            # ATen's CPU kernel for the last dim keeps the sum and its log in the input dtype: round them too.
            log_total = _finish(np.log(_finish(total, dtype).astype(np.float32)), dtype).astype(np.float32)
        else:
            log_total = np.log(total)
        result = shifted - log_total
    return result if half_to_float else _finish(result, dtype)


defop("_softmax(Tensor self, int dim, bool half_to_float) -> Tensor", _softmax_meta("aten._softmax.default"),
      _softmax_kernel)
defop("_log_softmax(Tensor self, int dim, bool half_to_float) -> Tensor", _softmax_meta("aten._log_softmax.default"),
      _log_softmax_kernel)


def _softmax_int_meta(op: str):
    def meta(self, dim, dtype=None):
        require_dtype(dtype is None or dtype.is_floating_point, op, f"dtype must be a floating dtype, got {dtype}")
        return _softmax_meta(op)(tensor(shape_of(self), dtype or dtype_of(self)), dim, False)
    return meta


def _softmax_int_kernel(kernel):
    def run(self, dim, dtype=None):
        return kernel(self.astype(dtype.numpy) if dtype is not None else self, dim, False)
    return run


defop("softmax.int(Tensor self, int dim, ScalarType? dtype=None) -> Tensor", _softmax_int_meta("aten.softmax.int"),
      _softmax_int_kernel(_softmax_kernel), tags=("composite",))
defop("log_softmax.int(Tensor self, int dim, ScalarType? dtype=None) -> Tensor",
      _softmax_int_meta("aten.log_softmax.int"), _softmax_int_kernel(_log_softmax_kernel), tags=("composite",))


@register_decomposition("aten.softmax.int")
def _softmax_int_decomposition(self, dim, dtype=None):
    return ops.aten._softmax.default(_cast(self, dtype), dim, False)


@register_decomposition("aten.log_softmax.int")
def _log_softmax_int_decomposition(self, dim, dtype=None):
    return ops.aten._log_softmax.default(_cast(self, dtype), dim, False)


def _logsumexp_dims(op: str, self, dim) -> list[int]:
    rank = len(shape_of(self))
    dim = _dim_list(dim)
    # ATen reduces every dim for dim=[] but then fails to add the kept maxima back (shape mismatch).
    require(len(dim) > 0 or rank == 0, op, "dim=[] is not supported for inputs with dimensions",
            fix="list the dims to reduce")
    return canonical_dims(op, dim, rank)


def _logsumexp_meta(self, dim, keepdim=False):
    op = "aten.logsumexp.default"
    dt = dtype_of(self)
    result_dtype = dt if _is_floating(dt) else dtypes.default_float_dtype()  # integers and bools promote
    return _reduction_meta(self, _logsumexp_dims(op, self, dim), keepdim, result_dtype)


def _logsumexp_kernel(self, dim, keepdim=False):
    """ATen's sequence (amax, inf maxima replaced by 0, exp(x - max), sum, log, + max), rounding every step to
    the tensor's dtype, so float16/bfloat16 results match ATen and the decomposition bit for bit."""
    dims = _logsumexp_dims("aten.logsumexp.default", self, dim)
    if not (self.dtype.kind == "f" or self.dtype == dtypes.bfloat16.numpy):
        self = self.astype(dtypes.default_float_dtype().numpy)
    result_dtype = dtypes.dtype(self.dtype)
    axes = _axes(self, dims)

    def rounded(value):
        return _finish(value, result_dtype)

    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        values = _exact_float32(self)
        if values.size == 0:
            total = np.sum(np.exp(values), axis=axes, keepdims=keepdim)
            return rounded(np.log(rounded(total)))
        maxes = np.max(values, axis=axes, keepdims=True)
        maxes = np.where(np.isinf(maxes), 0, maxes)
        exps = rounded(np.exp(rounded(values - maxes))).astype(np.float64)
        total = rounded(np.sum(exps, axis=axes, keepdims=keepdim)).astype(np.float64)
        kept_maxes = maxes if keepdim else np.reshape(maxes, total.shape)
        return rounded(rounded(np.log(total)).astype(np.float64) + kept_maxes)


defop("logsumexp(Tensor self, int[1] dim, bool keepdim=False) -> Tensor", _logsumexp_meta, _logsumexp_kernel,
      tags=("composite",))


@register_decomposition("aten.logsumexp.default")
def _logsumexp_decomposition(self, dim, keepdim=False):
    aten = ops.aten
    if not _is_floating(dtype_of(self)):
        self = aten._to_copy.default(self, dtype=dtypes.default_float_dtype())
    dims = _logsumexp_dims("aten.logsumexp.default", self, dim)
    if any(_known_empty(s) for s in shape_of(self)):  # no maximum to subtract
        return aten.log.default(aten.sum.dim_IntList(aten.exp.default(self), dims, keepdim))
    maxes = aten.amax.default(self, dims, True)
    maxes = aten.where.self(aten.isinf.default(maxes), aten.full_like.default(maxes, 0), maxes)
    total = aten.sum.dim_IntList(aten.exp.default(aten.sub.Tensor(self, maxes)), dims, keepdim)
    kept_maxes = maxes if keepdim or not shape_of(self) else aten.squeeze.dims(maxes, dims)
    return aten.add.Tensor(aten.log.default(total), kept_maxes)


# ---------------------------------------------------------------------------------------------
# linalg_vector_norm


def _norm_meta(self, ord=2, dim=None, keepdim=False, dtype=None):
    op = "aten.linalg_vector_norm.default"
    shape = shape_of(self)
    dt = dtype_of(self)
    require_dtype(_is_floating(dt), op,
                  f"linalg.vector_norm: Expected a floating point or complex tensor as input. Got {dt}")
    if dtype is not None:
        require_dtype(_is_floating(dtype) and dtypes.promote_types(dt, dtype) is dtype, op,
                      f"linalg.vector_norm: the dtype of the input ({dt}) should be convertible without "
                      f"narrowing to the specified dtype ({dtype})")
    dims = canonical_dims(op, dim, len(shape))
    if (ord < 0 or ord == math.inf) and not dim:  # min/max-like norms have no identity on empty input
        require(not any(_known_empty(s) for s in shape), op,
                f"linalg.vector_norm cannot compute the {ord} norm on an empty tensor because the operation "
                "does not have an identity")
    elif ord < 0 or ord == math.inf:
        for d in dims if shape else []:  # a 0-d tensor holds one element
            require(not _known_empty(shape[d]), op, f"linalg.vector_norm cannot compute the {ord} norm on the "
                    f"dimension {d} because this dimension is empty and the operation does not have an identity")
    return _reduction_meta(self, dims, keepdim, dtypes.complex_to_real(dtype or dt))


def _norm_kernel(self, ord=2, dim=None, keepdim=False, dtype=None):
    result_dtype = dtypes.complex_to_real(dtype or dtypes.dtype(self.dtype))
    dims = canonical_dims("aten.linalg_vector_norm.default", dim, self.ndim)
    axes = _axes(self, dims)
    magnitude = np.abs(self.astype(np.complex128 if self.dtype.kind == "c" else np.float64))
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        if ord == 0:
            result = np.sum(magnitude != 0, axis=axes, keepdims=keepdim, dtype=np.float64)
        elif ord == math.inf:
            result = np.max(magnitude, axis=axes, keepdims=keepdim)
        elif ord == -math.inf:
            result = np.min(magnitude, axis=axes, keepdims=keepdim)
        elif ord == 1:
            result = np.sum(magnitude, axis=axes, keepdims=keepdim)
        elif ord == 2:
            result = np.sqrt(np.sum(np.square(magnitude), axis=axes, keepdims=keepdim))
        else:
            result = np.power(np.sum(np.power(magnitude, ord), axis=axes, keepdims=keepdim), 1.0 / ord)
    return _finish(result, result_dtype)


defop("linalg_vector_norm(Tensor self, Scalar ord=2, int[1]? dim=None, bool keepdim=False, *, "
      "ScalarType? dtype=None) -> Tensor", _norm_meta, checked(_norm_meta, _norm_kernel), tags=("composite",))


@register_decomposition("aten.linalg_vector_norm.default")
def _norm_decomposition(self, ord=2, dim=None, keepdim=False, dtype=None):
    """torch._refs.linalg.vector_norm: the power sums compute in opmath(result dtype), max/min norms in place."""
    aten = ops.aten
    result_dtype = dtype or dtype_of(self)
    dims = _dim_list(dim)
    if ord == 0:
        return aten.sum.dim_IntList(aten.ne.Scalar(self, 0), dims, keepdim, dtype=result_dtype)
    if ord in (math.inf, -math.inf):
        reduce = aten.amax.default if ord > 0 else aten.amin.default
        return _cast(reduce(aten.abs.default(self), dims, keepdim), result_dtype)
    values = aten.abs.default(_cast(self, dtypes.opmath_dtype(result_dtype)))
    if ord == 1:
        return _cast(aten.sum.dim_IntList(values, dims, keepdim), result_dtype)
    if ord == 2:
        squares = aten.mul.Tensor(values, values)
        return _cast(aten.sqrt.default(aten.sum.dim_IntList(squares, dims, keepdim)), result_dtype)
    powers = aten.pow.Tensor_Scalar(values, ord)
    return _cast(aten.pow.Tensor_Scalar(aten.sum.dim_IntList(powers, dims, keepdim), 1.0 / ord), result_dtype)


# ---------------------------------------------------------------------------------------------
# VJP rules (torch's derivatives.yaml and FunctionsManual.cpp, written with kiln.ops handles; see register_vjp)

from kiln.ir.meta import numel  # noqa: E402
from kiln.ir.ops._grad import cast  # noqa: E402
from kiln.ir.registry import register_vjp  # noqa: E402
from kiln.ir.symbolic import sym_eq, sym_le  # noqa: E402

aten = ops.aten


def _unsqueeze_dims(grad, dims, rank: int, keepdim: bool):
    """A reduction's gradient with its reduced dims back as size-1 dims (torch's unsqueeze_multiple)."""
    if keepdim or rank == 0:
        return grad
    for d in sorted(dims):
        grad = aten.unsqueeze.default(grad, d)
    return grad


def _broadcast_back(grad, self, dims, keepdim: bool):
    """torch's sum_backward: the reduced gradient expanded to the input's shape."""
    shape = shape_of(self)
    return aten.expand.default(_unsqueeze_dims(grad, dims, len(shape), keepdim), list(shape))


def _in_result_dtype(grad, out):
    """The incoming gradient in the result's dtype: torch's engine casts each gradient to the dtype of what it
    belongs to, so a `dtype=` reduction differentiates at that precision."""
    return cast(grad, dtype_of(out))


@register_vjp("aten.sum.dim_IntList")
def _sum_vjp(grad, out, self, dim, keepdim=False, *, dtype=None):
    dims = canonical_dims("aten.sum.dim_IntList", dim, len(shape_of(self)))
    return cast(_broadcast_back(_in_result_dtype(grad, out), self, dims, keepdim), dtype_of(self))


@register_vjp("aten.mean.dim")
def _mean_dim_vjp(grad, out, self, dim, keepdim=False, *, dtype=None):
    shape = shape_of(self)
    dims = canonical_dims("aten.mean.dim", dim, len(shape))
    count = numel([shape[d] for d in dims]) if shape else 1
    spread = _broadcast_back(_in_result_dtype(grad, out), self, dims, keepdim)
    return cast(aten.div.Scalar(spread, count), dtype_of(self))


@register_vjp("aten.mean.default")
def _mean_vjp(grad, out, self, *, dtype=None):
    spread = aten.expand.default(_in_result_dtype(grad, out), list(shape_of(self)))
    return cast(aten.div.Scalar(spread, numel(shape_of(self))), dtype_of(self))


def _exclusive_products(self, dim: int):
    """The product of every other element along `dim`, for each element; safe with zeros (torch's
    prod_safe_zeros_backward: an exclusive cumprod from the front times one from the back)."""
    size = shape_of(self)[dim]
    ones = aten.full_like.default(aten.slice.Tensor(self, dim, 0, 1), 1)
    before = aten.cumprod.default(aten.cat.default([ones, aten.slice.Tensor(self, dim, 0, size - 1)], dim), dim)
    after_reversed = aten.cat.default([ones, aten.flip.default(aten.slice.Tensor(self, dim, 1, size), [dim])], dim)
    after = aten.flip.default(aten.cumprod.default(after_reversed, dim), [dim])
    return aten.mul.Tensor(before, after)


def _prod_gradient(grad, self, dim: int):
    """grad * prod(others) along `dim`, grad already shaped to broadcast along it. torch divides the result by
    the input when no element is zero and takes this path otherwise; this path is the same value either way
    (up to rounding) and needs no data-dependent branch."""
    size = shape_of(self)[dim]
    if sym_eq(size, 0) or sym_eq(size, 1):  # nothing else to multiply
        return aten.expand.default(grad, list(shape_of(self)))
    return aten.mul.Tensor(grad, _exclusive_products(self, dim))


@register_vjp("aten.prod.dim_int")
def _prod_dim_vjp(grad, out, self, dim, keepdim=False, *, dtype=None):
    grad = _in_result_dtype(grad, out)
    shape = shape_of(self)
    if not shape:
        return cast(grad, dtype_of(self))
    dim = canonical_dim("aten.prod.dim_int", dim, len(shape))
    values = cast(self, dtype_of(grad))
    return cast(_prod_gradient(_unsqueeze_dims(grad, [dim], len(shape), keepdim), values, dim), dtype_of(self))


@register_vjp("aten.prod.default")
def _prod_vjp(grad, out, self, *, dtype=None):
    grad = _in_result_dtype(grad, out)
    shape = shape_of(self)
    if not shape:
        return cast(grad, dtype_of(self))
    flat = aten.view.default(cast(self, dtype_of(grad)), [numel(shape)])
    gradient = _prod_gradient(aten.view.default(grad, [1]), flat, 0)
    return cast(aten.view.default(gradient, list(shape)), dtype_of(self))


def _variance_gradient(grad, self, dim, correction, keepdim):
    """torch's var_backward: 2 / (N - correction) * grad * (x - mean). With a dim list, N is the product of the
    listed sizes, so `dim=[]` (which reduces every dim) takes N = 1 as torch does: a gradient N times too large
    (torch's gradcheck fails there), kept so that kiln's gradients agree with torch's."""
    correction = 1 if correction is None else correction
    shape = shape_of(self)
    if not shape or dim is None:
        dof = numel(shape) - correction
        mean = aten.mean.default(self)
        if sym_le(dof, 0):  # 2 / 0: nan where x == mean (inf * 0), inf elsewhere
            scale = aten.where.self(aten.eq.Tensor(self, mean), aten.full_like.default(self, math.nan),
                                    aten.full_like.default(self, math.inf))
            return aten.mul.Tensor(grad, scale)
        return aten.mul.Tensor(_scaled(grad, 2.0, dof), aten.sub.Tensor(self, mean))
    dims = [canonical_dim("aten.var.correction", d, len(shape)) for d in _dim_list(dim)]
    grad = _unsqueeze_dims(grad, dims, len(shape), keepdim or len(shape) == 1)
    dof = numel([shape[d] for d in dims]) - correction
    centered = aten.sub.Tensor(self, aten.mean.dim(self, dims, True))
    return aten.mul.Tensor(_scaled(grad, 2.0, dof), centered)


def _scaled(grad, numerator: float, denominator):
    """grad * (numerator / denominator), where a zero denominator gives an infinite factor like C++'s 2.0 / 0."""
    if isinstance(denominator, (int, float)):
        factor = math.copysign(math.inf, numerator) if denominator == 0 else numerator / denominator
        return aten.mul.Scalar(grad, factor)
    return aten.div.Scalar(aten.mul.Scalar(grad, numerator), denominator)


@register_vjp("aten.var.correction")
def _var_correction_vjp(grad, out, self, dim=None, *, correction=None, keepdim=False):
    return _variance_gradient(grad, self, dim, correction, keepdim)


@register_vjp("aten.var.dim")
def _var_dim_vjp(grad, out, self, dim, unbiased=True, keepdim=False):
    return _variance_gradient(grad, self, dim, int(unbiased), keepdim)


@register_vjp("aten.amax.default", "aten.amin.default")
def _extremum_vjp(grad, out, self, dim=(), keepdim=False):
    """The gradient is split evenly among the elements equal to the extremum (torch's scale_grad_by_count)."""
    rank = len(shape_of(self))
    dims = canonical_dims("aten.amax.default", dim, rank) if rank else []
    grad = _unsqueeze_dims(grad, dims, rank, keepdim)
    chosen = aten.eq.Tensor(_unsqueeze_dims(out, dims, rank, keepdim), self)
    count = aten.sum.dim_IntList(chosen, dims, True)
    return aten.mul.Tensor(aten.div.Tensor(grad, count), chosen)


def _selected_values_gradient(grad, self, dim, indices, keepdim: bool):
    """torch's value_selecting_reduction_backward: the gradient goes to the positions `indices` picked."""
    shape = shape_of(self)
    if not shape:
        return cast(grad, dtype_of(self))
    dim = canonical_dim("value_selecting_reduction_backward", dim, len(shape))
    if not keepdim:
        grad, indices = aten.unsqueeze.default(grad, dim), aten.unsqueeze.default(indices, dim)
    zeros = aten.full.default(list(shape), 0, dtype=dtype_of(grad))
    return cast(aten.scatter.src(zeros, dim, indices, grad), dtype_of(self))


@register_vjp("aten.max.dim", "aten.min.dim")
def _max_dim_vjp(grad, out, self, dim, keepdim=False):
    values_grad, _ = grad
    return _selected_values_gradient(values_grad, self, dim, out[1], keepdim)


@register_vjp("aten.sort.default")
def _sort_vjp(grad, out, self, dim=-1, descending=False):
    return _selected_values_gradient(grad[0], self, dim, out[1], True)


@register_vjp("aten.topk.default")
def _topk_vjp(grad, out, self, k, dim=-1, largest=True, sorted=True):
    return _selected_values_gradient(grad[0], self, dim, out[1], True)


@register_vjp("aten.cumsum.default")
def _cumsum_vjp(grad, out, self, dim, *, dtype=None):
    """A cumulative sum from the back (torch's reversed_cumsum), in the input's dtype."""
    grad = cast(_in_result_dtype(grad, out), dtype_of(self))
    if not shape_of(self):
        return grad
    dim = canonical_dim("aten.cumsum.default", dim, len(shape_of(self)))
    return aten.flip.default(aten.cumsum.default(aten.flip.default(grad, [dim]), dim), [dim])


@register_vjp("aten._softmax.default")
def _softmax_vjp(grad, out, self, dim, half_to_float):
    """torch's _softmax_backward_data: out * grad - out * sum(out * grad)."""
    weighted = aten.mul.Tensor(grad, out)
    total = aten.sum.dim_IntList(weighted, [dim], True)
    return cast(aten.sub.Tensor(weighted, aten.mul.Tensor(out, total)), dtype_of(self))


@register_vjp("aten._log_softmax.default")
def _log_softmax_vjp(grad, out, self, dim, half_to_float):
    """torch's _log_softmax_backward_data: grad - exp(out) * sum(grad)."""
    total = aten.sum.dim_IntList(grad, [dim], True)
    return cast(aten.sub.Tensor(grad, aten.mul.Tensor(aten.exp.default(out), total)), dtype_of(self))
