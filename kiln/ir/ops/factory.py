"""Factory ops: tensors built from sizes and scalars (full, arange, empty, linspace, eye, ...) and random ones.

Scalars are converted to the result dtype the way c10 does it (`Scalar::to<T>`): truncation toward zero
for integers, wrap-around for negative ints into uint8, and an overflow error for a finite value outside
the dtype's range. Random kernels draw from one module-level numpy Generator (reseed it with
`manual_seed`); they follow torch's distributions, not its bit streams, so their samples compare only
shapes and dtypes. `empty*` kernels return zeros: their values are unspecified.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import sympy

from kiln.ir import dtypes
from kiln.ir.dtypes import DType
from kiln.ir.meta import dtype_of, require, require_arg, require_dtype, shape_of, tensor
from kiln.ir.registry import defop, ops, register_decomposition
from kiln.ir.symbolic import as_dim, sym_le

# ---------------------------------------------------------------------------------------------
# Shared rules: sizes, scalar → dtype conversion, the default dtype.

_GENERATOR = np.random.default_rng(0)


def generator() -> np.random.Generator:
    """The generator behind kiln's randomness (random ops here, parameter init in kiln.nn.init)."""
    return _GENERATOR


def manual_seed(seed: int) -> None:
    """Reseed the generator behind rand, randn, randperm (and their _like variants)."""
    global _GENERATOR
    _GENERATOR = np.random.default_rng(seed)


def _check_size(op: str, size) -> list:
    """Sizes as dims; a negative static size is refused like ATen's check_size_nonnegative."""
    dims = [as_dim(s) for s in size]
    for d in dims:
        require(not (isinstance(d, int) and d < 0), op,
                f"Trying to create tensor with negative dimension {d}: {[str(s) for s in dims]}")
    return dims


def _concrete_size(size) -> tuple[int, ...]:
    return tuple(int(s) for s in size)


def _or_default(dtype: DType | None) -> DType:
    return dtypes.default_float_dtype() if dtype is None else dtype


def _is_symbolic(value) -> bool:
    return isinstance(value, sympy.Expr) and not value.is_number


def _is_integral_scalar(value) -> bool:
    """bool, int and symbolic ints count as integral for dtype inference (like torch's isIntegral(true))."""
    return isinstance(value, (bool, int, np.integer, np.bool_)) or (
        isinstance(value, sympy.Expr) and value.is_integer is not False and not value.is_Float)


def _scalar_result_dtype(value) -> DType:
    """The dtype `full` infers from its fill value: bool → bool, int → int64, float → the default."""
    if isinstance(value, (bool, np.bool_)):
        return dtypes.bool_
    if _is_integral_scalar(value):
        return dtypes.int64
    return dtypes.default_float_dtype()


def _dtype_limits(dt: DType) -> tuple[int | float, int | float]:
    """The lowest and highest finite values as Python numbers (numpy scalars would compare in `dt`)."""
    if dt.is_integral:
        info = np.iinfo(dt.numpy)
        return int(info.min), int(info.max)
    info = ml_dtypes.finfo(dt.numpy) if dt is dtypes.bfloat16 else np.finfo(dt.numpy)
    return float(info.min), float(info.max)


def _check_convertible(op: str, value, dt: DType) -> None:
    """c10::checked_convert: refuse a scalar that overflows `dt` (inf/nan stay allowed for floats)."""
    if _is_symbolic(value) or dt.is_bool or dt.is_complex or isinstance(value, (bool, np.bool_)):
        return
    lowest, highest = _dtype_limits(dt)
    if _is_integral_scalar(value):
        value = int(value)
        if dt is dtypes.uint8:  # c10 lets negative ints wrap into unsigned types
            overflow = value > highest or (value < 0 and -value > highest)
        else:
            overflow = value < lowest or value > highest
    else:
        value = float(value)
        if math.isinf(value) or math.isnan(value):
            overflow = not dt.is_floating_point
        else:
            overflow = value < lowest or value > highest
    require_arg(not overflow, op, f"value {value} cannot be converted to type {dt.name} without overflow")


def _converted(value, dt: DType) -> np.ndarray:
    """A 0-d array holding `value` as `dt`, converted like c10's Scalar::to<T>()."""
    if isinstance(value, sympy.Expr):
        value = int(value) if value.is_integer else float(value)
    if dt.is_bool:
        return np.asarray(value != 0)
    if dt.is_complex:
        return np.asarray(complex(value), dtype=dt.numpy)
    if dt.is_integral:
        # Truncation toward zero; negative ints wrap into uint8 (two's complement), as in c10.
        return np.asarray(math.trunc(value) if isinstance(value, float) else int(value), np.int64).astype(dt.numpy)
    if dt in (dtypes.float16, dtypes.bfloat16):
        # c10 converts a double (or int64) to Half/BFloat16 through float: two roundings.
        with np.errstate(over="ignore"):
            return np.asarray(np.float32(value)).astype(dt.numpy)
    return np.asarray(value, dtype=dt.numpy)


# ---------------------------------------------------------------------------------------------
# full, full_like, scalar_tensor, empty

def _full_meta(size, fill_value, dtype=None, layout=None, device=None, pin_memory=None):
    op = "aten.full.default"
    result_dtype = _scalar_result_dtype(fill_value) if dtype is None else dtype
    _check_convertible(op, fill_value, result_dtype)
    return tensor(_check_size(op, size), result_dtype)


def _full(size, fill_value, dtype=None, layout=None, device=None, pin_memory=None):
    result_dtype = _scalar_result_dtype(fill_value) if dtype is None else dtype
    return np.full(_concrete_size(size), _converted(fill_value, result_dtype), dtype=result_dtype.numpy)


defop("full(SymInt[] size, Scalar fill_value, *, ScalarType? dtype=None, Layout? layout=None, "
      "Device? device=None, bool? pin_memory=None) -> Tensor", _full_meta, _full)


def _full_like_meta(self, fill_value, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    result_dtype = dtype_of(self) if dtype is None else dtype
    _check_convertible("aten.full_like.default", fill_value, result_dtype)
    return tensor(shape_of(self), result_dtype)


def _full_like(self, fill_value, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    result_dtype = dtypes.dtype(self.dtype) if dtype is None else dtype
    return np.full(self.shape, _converted(fill_value, result_dtype), dtype=result_dtype.numpy)


defop("full_like(Tensor self, Scalar fill_value, *, ScalarType? dtype=None, Layout? layout=None, "
      "Device? device=None, bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor",
      _full_like_meta, _full_like)


def _scalar_tensor_meta(s, dtype=None, layout=None, device=None, pin_memory=None):
    result_dtype = _or_default(dtype)  # the default dtype even for int and bool scalars, like torch
    if result_dtype not in (dtypes.float16, dtypes.bfloat16):  # ATen rounds these to inf unchecked
        _check_convertible("aten.scalar_tensor.default", s, result_dtype)
    return tensor([], result_dtype)


defop("scalar_tensor(Scalar s, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, "
      "bool? pin_memory=None) -> Tensor", _scalar_tensor_meta,
      lambda s, dtype=None, layout=None, device=None, pin_memory=None: _converted(s, _or_default(dtype)))


def _empty_meta(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return tensor(_check_size("aten.empty.memory_format", size), _or_default(dtype))


def _empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return np.zeros(_concrete_size(size), _or_default(dtype).numpy)  # the values are unspecified


defop("empty.memory_format(SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, "
      "bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor", _empty_meta, _empty)


def _empty_strided_meta(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    op = "aten.empty_strided.default"
    require(len(size) == len(stride), op,
            f"dimensionality of sizes ({len(size)}) must match dimensionality of strides ({len(stride)})")
    for s in stride:
        require(not (isinstance(s, int) and s < 0), op, f"strides must be non-negative, got {list(stride)}")
    return tensor(_check_size(op, size), _or_default(dtype))


defop("empty_strided(SymInt[] size, SymInt[] stride, *, ScalarType? dtype=None, Layout? layout=None, "
      "Device? device=None, bool? pin_memory=None) -> Tensor", _empty_strided_meta,
      # kiln values are dense: the strides only describe torch's memory layout, so they are ignored.
      lambda size, stride, dtype=None, layout=None, device=None, pin_memory=None: np.zeros(
          _concrete_size(size), _or_default(dtype).numpy))


# ---------------------------------------------------------------------------------------------
# arange


def _arange_dtype(start, end, step, dtype: DType | None) -> DType:
    if dtype is not None:
        return dtype
    if all(_is_integral_scalar(v) for v in (start, end, step)):
        return dtypes.int64
    return dtypes.default_float_dtype()


def _as_number(value):
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, np.generic):
        return value.item()
    return value


def _arange_accumulator(dt: DType) -> DType:
    """at::acc_type<T, /*is_cuda=*/false>: the dtype ATen computes arange's values in."""
    if dt.is_integral:
        return dtypes.int64
    return dtypes.float32 if dt in (dtypes.float16, dtypes.bfloat16) else dtypes.float64


def _arange_length(op: str, start, end, step, dt: DType):
    """ATen's compute_arange_size: bounds checked in double; the length in int64 for int64 results
    (after truncating the scalars) and in double otherwise. Symbolic bounds give a symbolic length."""
    require_dtype(not dt.is_bool and not dt.is_complex, op, f"arange does not support dtype {dt.name}")
    start, end, step = (_as_number(v) for v in (start, end, step))
    if any(_is_symbolic(v) for v in (start, end, step)):
        require_arg(all(_is_integral_scalar(v) for v in (start, end, step)), op,
                    "symbolic bounds need an integer start, end and step")
        require_arg(not _is_symbolic(step), op, "the step must be a concrete integer")
        require_arg(step != 0, op, "step must be nonzero")
        consistent = sym_le(start, end) if step > 0 else sym_le(end, start)
        require(consistent, op, "upper bound and lower bound inconsistent with step sign")
        return as_dim(sympy.ceiling(sympy.sympify(end - start) / step))
    for value in (start, end, step):
        _check_convertible(op, value, _arange_accumulator(dt))
    d_start, d_end, d_step = float(start), float(end), float(step)
    require_arg(d_step != 0, op, "step must be nonzero")
    require_arg(math.isfinite(d_start) and math.isfinite(d_end), op, f"unsupported range: {start} -> {end}")
    require_arg((d_step > 0 and d_end >= d_start) or (d_step < 0 and d_end <= d_start), op,
                "upper bound and lower bound inconsistent with step sign")
    if dt is dtypes.int64:
        i_start, i_end, i_step = (math.trunc(v) if isinstance(v, float) else int(v) for v in (start, end, step))
        require_arg(i_step != 0, op, f"step {step} truncates to 0 for an int64 result")
        return max(-((i_start - i_end) // i_step), 0)  # exact ceil((end - start) / step)
    return int(math.ceil((d_end - d_start) / d_step))


def _arange_meta(start, end, step=1, dtype=None, layout=None, device=None, pin_memory=None):
    result_dtype = _arange_dtype(start, end, step, dtype)
    return tensor([_arange_length("aten.arange.start_step", start, end, step, result_dtype)], result_dtype)


def _arange(start, end, step=1, dtype=None, layout=None, device=None, pin_memory=None):
    result_dtype = _arange_dtype(start, end, step, dtype)
    length = _arange_length("aten.arange.start_step", start, end, step, result_dtype)
    start, step = _as_number(start), _as_number(step)
    if result_dtype.is_integral:
        # ATen accumulates in int64 from the truncated start and step.
        begin, stride = (math.trunc(v) if isinstance(v, float) else int(v) for v in (start, step))
        return (begin + stride * np.arange(length, dtype=np.int64)).astype(result_dtype.numpy)
    # start + step * i in the accumulator dtype. (ATen's vectorized CPU loop computes blocks from a
    # rounded base with FMAs, so its floats can differ from this exact-formula result by an ulp.)
    acc = _arange_accumulator(result_dtype).numpy.type
    values = acc(start) + acc(step) * np.arange(length, dtype=acc)
    return values.astype(result_dtype.numpy)


defop("arange.start_step(Scalar start, Scalar end, Scalar step=1, *, ScalarType? dtype=None, Layout? layout=None, "
      "Device? device=None, bool? pin_memory=None) -> Tensor", _arange_meta, _arange)


# ---------------------------------------------------------------------------------------------
# Random ops

def _check_random_dtype(op: str, dt: DType) -> None:
    require_dtype(dt.is_floating_point or dt.is_complex, op,
                  f"{op.split('.')[1]} needs a floating dtype, got {dt.name}")


# numeric_limits<T>::digits: ATen draws uniform values on this grid, so they lie in [0, 1) exactly.
_MANTISSA_DIGITS = {dtypes.float16: 11, dtypes.bfloat16: 8, dtypes.float32: 24, dtypes.float64: 53}


def _uniform(shape, dt: DType) -> np.ndarray:
    digits = _MANTISSA_DIGITS[dt]
    integers = _GENERATOR.integers(0, 1 << digits, size=shape, dtype=np.int64)
    return np.ldexp(integers.astype(np.float64), -digits).astype(dt.numpy)


def _rand_values(shape, dt: DType) -> np.ndarray:
    if dt.is_complex:
        part = dtypes.complex_to_real(dt)
        return (_uniform(shape, part) + 1j * _uniform(shape, part)).astype(dt.numpy)
    return _uniform(shape, dt)


def _randn_values(shape, dt: DType) -> np.ndarray:
    if dt.is_complex:  # each part has variance 1/2, so |z| has variance 1, like torch
        parts = _GENERATOR.standard_normal((2, *shape)) * math.sqrt(0.5)
        return (parts[0] + 1j * parts[1]).astype(dt.numpy)
    return _GENERATOR.standard_normal(shape).astype(dt.numpy)


def _random_meta(op: str):
    def meta(size, dtype=None, layout=None, device=None, pin_memory=None):
        result_dtype = _or_default(dtype)
        _check_random_dtype(op, result_dtype)
        return tensor(_check_size(op, size), result_dtype)
    return meta


defop("rand(SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, "
      "bool? pin_memory=None) -> Tensor", _random_meta("aten.rand.default"),
      lambda size, dtype=None, layout=None, device=None, pin_memory=None: _rand_values(
          _concrete_size(size), _or_default(dtype)), tags=("random",))
defop("randn(SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, "
      "bool? pin_memory=None) -> Tensor", _random_meta("aten.randn.default"),
      lambda size, dtype=None, layout=None, device=None, pin_memory=None: _randn_values(
          _concrete_size(size), _or_default(dtype)), tags=("random",))


def _randperm_meta(n, dtype=dtypes.int64, layout=None, device=None, pin_memory=None):
    op = "aten.randperm.default"
    dtype = dtypes.int64 if dtype is None else dtype
    require_dtype(not dtype.is_bool and not dtype.is_complex, op, f"randperm does not support dtype {dtype.name}")
    require(not (isinstance(n, int) and n < 0), op, f"n must be non-negative, got {n}")
    if isinstance(n, int) and n > 0:
        # ATen's check_supported_max_int_with_precision: n - 1 must fit, and for float16/32/64 (not
        # bfloat16, which ATen lets round) every value must be exact.
        if dtype.is_floating_point:
            limit = (1 << _MANTISSA_DIGITS[dtype]) + 1
            require_arg(dtype is dtypes.bfloat16 or n <= limit, op,
                        f"n cannot be greater than {limit} for {dtype.name}")
        else:
            require_arg(n - 1 <= _dtype_limits(dtype)[1], op,
                        f"n = {n} does not fit in {dtype.name}: its largest value would be {n - 1}")
    return tensor([as_dim(n)], dtype)


def _randperm(n, dtype=dtypes.int64, layout=None, device=None, pin_memory=None):
    return _GENERATOR.permutation(int(n)).astype((dtypes.int64 if dtype is None else dtype).numpy)


defop("randperm(SymInt n, *, ScalarType? dtype=4, Layout? layout=None, Device? device=None, "
      "bool? pin_memory=None) -> Tensor", _randperm_meta, _randperm, tags=("random",))


# ---------------------------------------------------------------------------------------------
# Composite factories, each decomposed into the core ops above (and a few from other families).

aten = ops.aten
_FACTORY_KWARGS = "*, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None"
_LIKE_KWARGS = _FACTORY_KWARGS + ", MemoryFormat? memory_format=None"


def _constant_factory(name: str, value: int):
    """zeros/ones: `full` with the default dtype (not the dtype `full` would infer from an int)."""
    def meta(size, dtype=None, layout=None, device=None, pin_memory=None):
        return tensor(_check_size(f"aten.{name}.default", size), _or_default(dtype))

    def kernel(size, dtype=None, layout=None, device=None, pin_memory=None):
        return np.full(_concrete_size(size), value, _or_default(dtype).numpy)

    defop(f"{name}(SymInt[] size, {_FACTORY_KWARGS}) -> Tensor", meta, kernel, tags=("composite",))

    @register_decomposition(f"aten.{name}.default")
    def decomposition(size, dtype=None, layout=None, device=None, pin_memory=None):
        return aten.full.default(list(size), value, dtype=_or_default(dtype))


_constant_factory("zeros", 0)
_constant_factory("ones", 1)


def _constant_like(name: str, value: int):
    """zeros_like/ones_like: `full_like` keeping self's shape and (by default) dtype."""
    def meta(self, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
        return tensor(shape_of(self), dtype_of(self) if dtype is None else dtype)

    def kernel(self, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
        return np.full(self.shape, value, (dtypes.dtype(self.dtype) if dtype is None else dtype).numpy)

    defop(f"{name}(Tensor self, {_LIKE_KWARGS}) -> Tensor", meta, kernel, tags=("composite",))

    @register_decomposition(f"aten.{name}.default")
    def decomposition(self, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
        return aten.full_like.default(self, value, dtype=dtype)


_constant_like("zeros_like", 0)
_constant_like("ones_like", 1)


def _empty_like_meta(self, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return tensor(shape_of(self), dtype_of(self) if dtype is None else dtype)


defop(f"empty_like(Tensor self, {_LIKE_KWARGS}) -> Tensor", _empty_like_meta,
      lambda self, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None: np.zeros(
          self.shape, (dtypes.dtype(self.dtype) if dtype is None else dtype).numpy),
      tags=("composite",))


@register_decomposition("aten.empty_like.default")
def _empty_like_decomposition(self, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return aten.empty.memory_format(list(shape_of(self)), dtype=dtype_of(self) if dtype is None else dtype)


# new_zeros / new_ones / new_full / new_empty: a fresh tensor of `size` with self's dtype by default.

def _new_dtype(self, dtype):
    return dtype_of(self) if dtype is None else dtype


def _new_constant(name: str, value: int):
    op = f"aten.{name}.default"

    def meta(self, size, dtype=None, layout=None, device=None, pin_memory=None):
        return tensor(_check_size(op, size), _new_dtype(self, dtype))

    def kernel(self, size, dtype=None, layout=None, device=None, pin_memory=None):
        return np.full(_concrete_size(size), value, _new_dtype(self, dtype).numpy)

    defop(f"{name}(Tensor self, SymInt[] size, {_FACTORY_KWARGS}) -> Tensor", meta, kernel, tags=("composite",))

    @register_decomposition(op)
    def decomposition(self, size, dtype=None, layout=None, device=None, pin_memory=None):
        return aten.full.default(list(size), value, dtype=_new_dtype(self, dtype))


_new_constant("new_zeros", 0)
_new_constant("new_ones", 1)


def _new_full_meta(self, size, fill_value, dtype=None, layout=None, device=None, pin_memory=None):
    op = "aten.new_full.default"
    _check_convertible(op, fill_value, _new_dtype(self, dtype))
    return tensor(_check_size(op, size), _new_dtype(self, dtype))


defop(f"new_full(Tensor self, SymInt[] size, Scalar fill_value, {_FACTORY_KWARGS}) -> Tensor", _new_full_meta,
      lambda self, size, fill_value, dtype=None, layout=None, device=None, pin_memory=None: _full(
          size, fill_value, _new_dtype(self, dtype)),
      tags=("composite",))


@register_decomposition("aten.new_full.default")
def _new_full_decomposition(self, size, fill_value, dtype=None, layout=None, device=None, pin_memory=None):
    return aten.full.default(list(size), fill_value, dtype=_new_dtype(self, dtype))


defop(f"new_empty(Tensor self, SymInt[] size, {_FACTORY_KWARGS}) -> Tensor",
      lambda self, size, dtype=None, layout=None, device=None, pin_memory=None: tensor(
          _check_size("aten.new_empty.default", size), _new_dtype(self, dtype)),
      lambda self, size, dtype=None, layout=None, device=None, pin_memory=None: np.zeros(
          _concrete_size(size), _new_dtype(self, dtype).numpy),
      tags=("composite",))


@register_decomposition("aten.new_empty.default")
def _new_empty_decomposition(self, size, dtype=None, layout=None, device=None, pin_memory=None):
    return aten.empty.memory_format(list(size), dtype=_new_dtype(self, dtype))


# arange(end) and arange(start, end): arange.start_step with step 1.

defop(f"arange(Scalar end, {_FACTORY_KWARGS}) -> Tensor",
      lambda end, dtype=None, layout=None, device=None, pin_memory=None: _arange_meta(0, end, 1, dtype),
      lambda end, dtype=None, layout=None, device=None, pin_memory=None: _arange(0, end, 1, dtype),
      tags=("composite",))
defop(f"arange.start(Scalar start, Scalar end, {_FACTORY_KWARGS}) -> Tensor",
      lambda start, end, dtype=None, layout=None, device=None, pin_memory=None: _arange_meta(start, end, 1, dtype),
      lambda start, end, dtype=None, layout=None, device=None, pin_memory=None: _arange(start, end, 1, dtype),
      tags=("composite",))


@register_decomposition("aten.arange.default")
def _arange_end_decomposition(end, dtype=None, layout=None, device=None, pin_memory=None):
    return aten.arange.start_step(0, end, 1, dtype=dtype)


@register_decomposition("aten.arange.start")
def _arange_start_decomposition(start, end, dtype=None, layout=None, device=None, pin_memory=None):
    return aten.arange.start_step(start, end, 1, dtype=dtype)


# linspace: ATen computes the first half forward from start and the second half backward from end,
# so both endpoints are exact: value[i] = start + step*i for i < steps/2, else end - step*(steps-1-i).

def _linspace_plan(start, end, steps: int, dt: DType):
    """(start, end, step) as ATen computes them: in the result dtype for floats (rounded after each
    operation for float16/bfloat16), in double from the truncated ends for integer results."""
    first, last = (_converted(v, dt)[()] for v in (start, end))
    if dt.is_floating_point:
        return first, last, (last - first) / dt.numpy.type(steps - 1)
    first, last = float(first), float(last)
    return first, last, (last - first) / (steps - 1)


def _linspace_meta(start, end, steps, dtype=None, layout=None, device=None, pin_memory=None):
    op = "aten.linspace.default"
    result_dtype = _or_default(dtype)
    require_arg(steps >= 0, op, f"number of steps must be non-negative, got {steps}")
    require_dtype(not result_dtype.is_complex, op, "complex linspace is not supported")
    for bound in (start, end):
        _check_convertible(op, bound, result_dtype)
    return tensor([steps], result_dtype)


def _linspace(start, end, steps, dtype=None, layout=None, device=None, pin_memory=None):
    result_dtype = _or_default(dtype)
    if steps <= 1:
        return np.full((steps,), _converted(start, result_dtype), result_dtype.numpy)
    first, last, step = _linspace_plan(start, end, steps, result_dtype)
    halfway = steps // 2
    if result_dtype.is_floating_point:
        compute = result_dtype.numpy.type
        forward = compute(first) + compute(step) * np.arange(halfway).astype(result_dtype.numpy)
        backward = compute(last) - compute(step) * np.arange(steps - 1 - halfway, -1, -1).astype(result_dtype.numpy)
    else:
        forward = first + step * np.arange(halfway, dtype=np.float64)
        backward = last - step * np.arange(steps - 1 - halfway, -1, -1, dtype=np.float64)
    return np.concatenate([forward, backward]).astype(result_dtype.numpy)


defop(f"linspace(Scalar start, Scalar end, int steps, {_FACTORY_KWARGS}) -> Tensor", _linspace_meta,
      _linspace, tags=("composite",))


@register_decomposition("aten.linspace.default")
def _linspace_decomposition(start, end, steps, dtype=None, layout=None, device=None, pin_memory=None):
    result_dtype = _or_default(dtype)
    if steps <= 1:
        return aten.full.default([steps], start, dtype=result_dtype)
    first, last, step = _linspace_plan(start, end, steps, result_dtype)
    halfway = steps // 2
    # Integer results are computed in double and truncated at the end, like ATen's step_t = double.
    compute = result_dtype if result_dtype.is_floating_point else dtypes.float64
    first, last, step = float(first), float(last), float(step)
    forward = aten.add.Scalar(aten.mul.Scalar(aten.arange.start_step(0, halfway, 1, dtype=compute), step), first)
    countdown = aten.arange.start_step(steps - 1 - halfway, -1, -1, dtype=compute)
    backward = aten.add.Scalar(aten.mul.Scalar(countdown, -step), last)
    result = aten.cat.default([forward, backward])
    return result if compute is result_dtype else aten._to_copy.default(result, dtype=result_dtype)


# eye(n[, m]): arange(n)[:, None] == arange(m), converted to the dtype.

def _eye_meta(n, m=None, dtype=None, layout=None, device=None, pin_memory=None):
    op = "aten.eye.default" if m is None else "aten.eye.m"
    require(not (isinstance(n, int) and n < 0), op, f"n must be greater or equal to 0, got {n}")
    require(not (isinstance(m, int) and m < 0), op, f"m must be greater or equal to 0, got {m}")
    return tensor([n, n if m is None else m], _or_default(dtype))


def _eye_kernel(n, m=None, dtype=None, layout=None, device=None, pin_memory=None):
    return np.eye(int(n), int(n if m is None else m), dtype=_or_default(dtype).numpy)


def _eye_decomposition(n, m=None, dtype=None, layout=None, device=None, pin_memory=None):
    result_dtype = _or_default(dtype)
    rows = aten.arange.start_step(0, n, 1)
    columns = rows if m is None else aten.arange.start_step(0, m, 1)
    diagonal = aten.eq.Tensor(aten.unsqueeze.default(rows, 1), columns)
    if result_dtype.is_bool:
        return diagonal
    return aten.where.self(diagonal, aten.scalar_tensor.default(1, dtype=result_dtype),
                           aten.scalar_tensor.default(0, dtype=result_dtype))


defop(f"eye(SymInt n, {_FACTORY_KWARGS}) -> Tensor",
      lambda n, *rest: _eye_meta(n, None, *rest), lambda n, *rest: _eye_kernel(n, None, *rest),
      tags=("composite",))
defop(f"eye.m(SymInt n, SymInt m, {_FACTORY_KWARGS}) -> Tensor", _eye_meta, _eye_kernel, tags=("composite",))
register_decomposition("aten.eye.default")(lambda n, **kw: _eye_decomposition(n, None, **kw))
register_decomposition("aten.eye.m")(_eye_decomposition)


# rand_like / randn_like: rand / randn with self's shape and (by default) dtype.

def _random_like(name: str, base: str, values):
    op = f"aten.{name}.default"

    def meta(self, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
        result_dtype = _new_dtype(self, dtype)
        _check_random_dtype(op, result_dtype)
        return tensor(shape_of(self), result_dtype)

    def kernel(self, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
        return values(self.shape, _new_dtype(self, dtype))

    defop(f"{name}(Tensor self, {_LIKE_KWARGS}) -> Tensor", meta, kernel, tags=("composite", "random"))

    @register_decomposition(op)
    def decomposition(self, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
        return getattr(aten, base).default(list(shape_of(self)), dtype=_new_dtype(self, dtype))


_random_like("rand_like", "rand", _rand_values)
_random_like("randn_like", "randn", _randn_values)


# lift_fresh_copy: torch.export's copy of a tensor constant; a clone.

defop("lift_fresh_copy(Tensor self) -> Tensor", lambda self: tensor(shape_of(self), dtype_of(self)),
      lambda self: np.array(self, copy=True), tags=("composite",))


@register_decomposition("aten.lift_fresh_copy.default")
def _lift_fresh_copy_decomposition(self):
    return aten.clone.default(self)



# ---------------------------------------------------------------------------------------------
# VJP rules: torch gives factory results no gradient, even full_like's, whose input only lends its shape and dtype.

from kiln.ir.registry import mark_nondifferentiable  # noqa: E402

mark_nondifferentiable("aten.arange.start_step", "aten.empty.memory_format", "aten.empty_strided.default",
                       "aten.full.default", "aten.full_like.default", "aten.rand.default", "aten.randn.default",
                       "aten.randperm.default", "aten.scalar_tensor.default")
