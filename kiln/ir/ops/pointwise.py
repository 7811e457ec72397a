"""Elementwise ops: arithmetic, comparisons, logic, bitwise, unary math, activations, dtype conversion.

Tensor operands broadcast and promote like `torch.result_type` (0-d tensors and Python scalars only raise
the category). Kernels follow ATen's CPU kernels: float16/bfloat16 compute in float32; a Python scalar
operand is cast to the common dtype the way its wrapped-number tensor is (int8 + 1000 wraps to int8 - 24),
except that mul/div on float16/bfloat16 read a one-element second operand at its original precision.
Scalar *parameters* (alpha, clamp bounds, fill values) go through c10's checked conversion instead and
are refused when they overflow the dtype. Composite ops near the end decompose into the core ops above;
the VJP rules close the module.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import ml_dtypes
import numpy as np
import sympy

from kiln.ir import dtypes
from kiln.ir.dtypes import DType
from kiln.ir.errors import KilnError
from kiln.ir.meta import (
    Promotion, broadcast_shapes, dtype_of, is_tensor, promoted_for, require, require_arg, require_dtype, shape_of,
    tensor,
)
from kiln.ir.ops._common import opmath, unary_float_kernel
from kiln.ir.registry import defop, handle, ops, register_decomposition
from kiln.ir.schema import parse_schema
from kiln.ir.symbolic import sym_eq

aten = ops.aten

_REDUCED_FLOATS = dtypes.REDUCED_FLOATS


class _IntegerDivisionByZero(KilnError, ZeroDivisionError):
    """Integer div/remainder/fmod by zero (ATen raises ZeroDivisionError; numpy would return garbage)."""


# ---------------------------------------------------------------------------------------------
# Scalars: promotion operands, wrapped-number casts and checked conversions


def _promotion_operand(value: Any) -> Any:
    """What dtypes.result_type understands: IR values (in decompositions) by their type, and a symbolic
    Scalar (a SymInt expression) as a Python int."""
    if isinstance(value, sympy.Basic):
        return 0 if value.is_integer else 0.0
    if not hasattr(value, "shape") and is_tensor(value):
        return value.type
    return value


def _common_dtype(*operands: Any) -> DType:
    return dtypes.result_type(*[_promotion_operand(v) for v in operands if v is not None])


_promote = promoted_for


def _is_number(value: Any) -> bool:
    return isinstance(value, (bool, int, float))


def _check_scalar_operands(op: str, values: tuple[Any, ...]) -> None:
    for value in values:
        if isinstance(value, int) and not isinstance(value, bool):
            require_arg(-2**63 <= value < 2**63, op, f"integer scalar {value} does not fit in int64",
                        fix="pass it as a float, or split the computation")


def _wrapped(value: Any) -> np.ndarray:
    """A Python scalar as ATen wraps it: a 0-d bool, int64 or float64 tensor."""
    if isinstance(value, (bool, np.bool_)):
        return np.asarray(value, np.bool_)
    if isinstance(value, (int, np.integer)):
        return np.asarray(value, np.int64)
    return np.asarray(value, np.float64)


def _cast(value: Any, dtype: DType) -> np.ndarray:
    """A tensor or Python scalar converted to `dtype` like TensorIterator's casts: no range checks, and
    into float16/bfloat16 through float32 (c10::Half and BFloat16 are constructed from float)."""
    array = value if isinstance(value, np.ndarray) else _wrapped(value)
    with np.errstate(all="ignore"):
        if dtype in _REDUCED_FLOATS and array.dtype != dtype.numpy:
            array = array.astype(np.float32)
        return array.astype(dtype.numpy, copy=False)


def _compute(value: Any, dtype: DType) -> np.ndarray:
    """An operand cast to the common dtype, then widened to the dtype ATen computes in."""
    return opmath(_cast(value, dtype))


def _second_operand(value: Any, common: DType) -> np.ndarray:
    """mul/div's second operand. On float16/bfloat16, ATen reads a one-element operand at its original
    precision in float32 (`iter.original_scalar_value`), so fp16 * 70000 is not fp16 * inf."""
    if common in _REDUCED_FLOATS and np.size(value) == 1:
        original = value if isinstance(value, np.ndarray) else _wrapped(value)
        return original.astype(np.float32)
    return _compute(value, common)


def _finite_max(dtype: DType) -> float:
    return float(ml_dtypes.finfo(dtype.numpy).max)


def _check_fits(op: str, what: str, value: Any, dtype: DType) -> None:
    """c10's checked_convert: a Scalar parameter must be representable in `dtype` (inf/nan only in floats;
    negative integers wrap into unsigned types)."""
    if not _is_number(value) or isinstance(value, bool) or dtype.is_bool:
        return
    if dtype.is_complex:  # each part must fit the part's float type
        parts = dtypes.complex_to_real(dtype)
        _check_fits(op, what, complex(value).real, parts)
        _check_fits(op, what, complex(value).imag, parts)
        return
    if dtype.is_floating_point:
        fits = math.isinf(value) or math.isnan(value) or abs(value) <= _finite_max(dtype)
    else:
        info = np.iinfo(dtype.numpy)
        if isinstance(value, float) and math.isnan(value):
            fits = False
        elif isinstance(value, int) and value < 0 and not dtype.is_signed:
            fits = -value <= info.max
        else:
            fits = info.min <= value <= info.max
    require_arg(fits, op, f"{what} {value!r} cannot be converted to {dtype.name} without overflow",
                fix=f"use a {what} within {dtype.name}'s range, or convert the tensor to a wider dtype first")


def _scalar_as(value: Any, dtype: DType) -> np.ndarray:
    """A Scalar parameter converted to `dtype` (floats truncate toward zero into integers)."""
    return _cast(value, dtype)


# ---------------------------------------------------------------------------------------------
# Meta rules


def _qualified(schema: str) -> str:
    return parse_schema(schema).qualified_name


def _broadcast(op: str, *values: Any) -> tuple:
    return broadcast_shapes(op, *[shape_of(v) for v in values if v is not None and is_tensor(v)])


Check = Callable[..., None]  # check(op, common_dtype, *args) raises for arguments torch refuses


def _elementwise(op: str, kind: Promotion = Promotion.DEFAULT, operands: int = 2,
                 check: Check | None = None) -> Callable[..., Any]:
    """Meta rule for an op whose first `operands` arguments (tensors or Scalars) broadcast and promote."""
    def meta(*args: Any) -> Any:
        participants = args[:operands]
        _check_scalar_operands(op, participants)
        common = _common_dtype(*participants)
        if check is not None:
            check(op, common, *args)
        return tensor(_broadcast(op, *participants), _promote(kind, common))
    return meta


def _unary(op: str, kind: Promotion = Promotion.DEFAULT, check: Check | None = None) -> Callable[..., Any]:
    return _elementwise(op, kind, operands=1, check=check)


def _no_bool(what: str = "bool tensors are not supported",
             fix: str = "convert the tensor to an integer or floating-point dtype first") -> Check:
    def check(op: str, common: DType, *args: Any) -> None:
        require_dtype(not common.is_bool, op, what, fix=fix)
    return check


def _floating_only(op: str, common: DType, *args: Any) -> None:
    require_dtype(common.is_floating_point, op, f"expected a floating-point tensor, got {common.name}",
                  fix="convert the tensor to a floating-point dtype first")


def _integral_or_bool(op: str, common: DType, *args: Any) -> None:
    require_dtype(not common.is_floating_point and not common.is_complex, op,
                  f"bitwise ops need integer or bool operands, got {common.name}",
                  fix="use logical_and/or/xor/not for truth values, or convert to an integer dtype")


# ---------------------------------------------------------------------------------------------
# add, sub, rsub


def _subtraction_check(op: str, first: Any, second: Any) -> None:
    first_bool = dtype_of(first).is_bool if is_tensor(first) else isinstance(first, bool)
    second_bool = dtype_of(second).is_bool if is_tensor(second) else isinstance(second, bool)
    require_dtype(not (first_bool and second_bool), op, "subtracting two bool tensors is not supported",
                  fix="use bitwise_xor or logical_xor")
    require_dtype(not (first_bool or second_bool), op, "subtracting a bool tensor is not supported",
                  fix="to invert a mask use bitwise_not or logical_not; else convert the bool tensor first")


def _alpha_check(op: str, common: DType, alpha: Any, *, negate: bool = False) -> None:
    require_arg(not isinstance(alpha, bool) or common.is_bool, op,
                "a bool alpha is only supported for bool results", fix="pass alpha as a number")
    require_arg(common.is_floating_point or common.is_complex or not isinstance(alpha, float), op,
                "for integral input tensors, argument alpha must not be a floating point number",
                fix="pass an integer alpha, or convert the tensors to a floating-point dtype")
    if _is_number(alpha):
        _check_fits(op, "alpha", -alpha if negate else alpha, common)


def _add_check(op: str, common: DType, self: Any, other: Any, alpha: Any) -> None:
    _alpha_check(op, common, alpha)


def _sub_check(op: str, common: DType, self: Any, other: Any, alpha: Any) -> None:
    _subtraction_check(op, self, other)
    _alpha_check(op, common, alpha, negate=True)


def _rsub_check(op: str, common: DType, self: Any, other: Any, alpha: Any) -> None:
    _subtraction_check(op, other, self)
    _alpha_check(op, common, alpha, negate=True)


def _add_values(first: Any, second: Any, scale: Any) -> np.ndarray:
    """first + scale * second in the common dtype (ATen's add with alpha = scale)."""
    common = _common_dtype(first, second)
    if common.is_bool:
        return np.logical_or(_cast(first, common), np.logical_and(_cast(second, common), bool(scale)))
    a, b = _compute(first, common), _compute(second, common)
    with np.errstate(all="ignore"):
        if scale == 1:
            return a + b
        if scale == -1:
            return a - b
        return a + opmath(_scalar_as(scale, common)) * b


def _add(self, other, alpha=1):
    return _add_values(self, other, alpha)


def _sub(self, other, alpha=1):
    return _add_values(self, other, -alpha)


def _rsub(self, other, alpha=1):
    return _add_values(other, self, -alpha)


for _schema, _check, _kernel in [
    ("add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor", _add_check, _add),
    ("add.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor", _add_check, _add),
    ("sub.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor", _sub_check, _sub),
    ("sub.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor", _sub_check, _sub),
]:
    defop(_schema, _elementwise(_qualified(_schema), check=_check), _kernel)


# ---------------------------------------------------------------------------------------------
# mul, div, remainder, fmod


def _mul(self, other):
    common = _common_dtype(self, other)
    if common.is_bool:
        return np.logical_and(_cast(self, common), _cast(other, common))
    with np.errstate(all="ignore"):
        return _compute(self, common) * _second_operand(other, common)


defop("mul.Tensor(Tensor self, Tensor other) -> Tensor", _elementwise("aten.mul.Tensor"), _mul)
defop("mul.Scalar(Tensor self, Scalar other) -> Tensor", _elementwise("aten.mul.Scalar"), _mul)


def _true_divide(self, other):
    common = _promote(Promotion.INT_TO_FLOAT, _common_dtype(self, other))
    with np.errstate(all="ignore"):
        return _compute(self, common) / _second_operand(other, common)


def _check_nonzero_divisor(op: str, dividend: np.ndarray, divisor: np.ndarray) -> None:
    if np.broadcast(dividend, divisor).size and np.any(divisor == 0):
        raise _IntegerDivisionByZero(f"{op}: integer division by zero",
                                     fix="make the divisor nonzero, or divide floating-point tensors")


def _trunc_divide_integers(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    quotient = np.floor_divide(a, b)
    # floor and trunc differ when the division is inexact and the signs differ
    inexact_negative = (np.remainder(a, b) != 0) & ((a < 0) != (b < 0))
    return np.where(inexact_negative, quotient + 1, quotient)


def _floor_divide_floats(a: np.ndarray, b: np.ndarray, r: Callable = lambda v: v) -> np.ndarray:
    """c10::div_floor_floating (Python's float //, with IEEE results for division by zero); `r` rounds
    each intermediate result to the dtype ATen computes in."""
    mod = np.fmod(a, b)
    div = r(r(a - mod) / b)
    div = np.where((mod != 0) & ((b < 0) != (mod < 0)), r(div - 1), div)
    floored = np.floor(div)
    floored = np.where(r(div - floored) > 0.5, r(floored + 1), floored)
    quotient = r(a / b)
    floored = np.where(div == 0, np.copysign(np.zeros_like(div), quotient), floored)
    return np.where(b == 0, quotient, floored)


def _divide(op: str) -> Callable[..., np.ndarray]:
    def kernel(self, other, rounding_mode=None):
        if rounding_mode is None:
            return _true_divide(self, other)
        common = _common_dtype(self, other)
        with np.errstate(all="ignore"):
            if not common.is_floating_point:
                a, b = _cast(self, common), _cast(other, common)
                _check_nonzero_divisor(op, a, b)
                if rounding_mode == "trunc" or common is dtypes.uint8:
                    return _trunc_divide_integers(a, b)
                return np.floor_divide(a, b)
            a, b = _compute(self, common), _second_operand(other, common)
            # float16/bfloat16 compute in their own dtype here, rounding every step, unless the divisor
            # is one element (then ATen computes in float32, see _second_operand)
            r = _rounder(common) if common in _REDUCED_FLOATS and np.size(other) != 1 else (lambda v: v)
            return np.trunc(r(a / b)) if rounding_mode == "trunc" else _floor_divide_floats(a, b, r)
    return kernel


def _rounder(dtype: DType) -> Callable[[np.ndarray], np.ndarray]:
    """Round float32 values to `dtype` and back, like one arithmetic op on c10::Half/BFloat16."""
    return lambda values: values.astype(dtype.numpy).astype(np.float32)


def _div_mode_meta(op: str) -> Callable[..., Any]:
    def meta(self, other, rounding_mode=None):
        require_arg(rounding_mode in (None, "trunc", "floor"), op,
                    f"rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}",
                    fix="pass rounding_mode=None (true division), 'trunc' or 'floor'")
        _check_scalar_operands(op, (self, other))
        common = _common_dtype(self, other)
        if rounding_mode is None:
            return tensor(_broadcast(op, self, other), _promote(Promotion.INT_TO_FLOAT, common))
        require_dtype(not common.is_bool, op, f"rounding_mode={rounding_mode!r} is not supported for bool tensors",
                      fix="convert the tensors to an integer or floating-point dtype first")
        return tensor(_broadcast(op, self, other), common)
    return meta


defop("div.Tensor(Tensor self, Tensor other) -> Tensor",
      _elementwise("aten.div.Tensor", Promotion.INT_TO_FLOAT), _true_divide)
defop("div.Scalar(Tensor self, Scalar other) -> Tensor",
      _elementwise("aten.div.Scalar", Promotion.INT_TO_FLOAT), _true_divide)
defop("div.Tensor_mode(Tensor self, Tensor other, *, str? rounding_mode) -> Tensor",
      _div_mode_meta("aten.div.Tensor_mode"), _divide("aten.div.Tensor_mode"))
defop("div.Scalar_mode(Tensor self, Scalar other, *, str? rounding_mode) -> Tensor",
      _div_mode_meta("aten.div.Scalar_mode"), _divide("aten.div.Scalar_mode"))


def _remainder(op: str, python_sign: bool) -> Callable[..., np.ndarray]:
    """remainder takes the divisor's sign (Python's %), fmod the dividend's (C's fmod)."""
    def kernel(self, other):
        common = _common_dtype(self, other)
        if common.is_floating_point:
            a, b = _compute(self, common), _compute(other, common)
        else:
            a, b = _cast(self, common), _cast(other, common)
            _check_nonzero_divisor(op, a, b)
        with np.errstate(all="ignore"):
            mod = np.fmod(a, b)
            if python_sign:
                mod = np.where((mod != 0) & ((b < 0) != (mod < 0)), mod + b, mod)
        return mod
    return kernel


for _name, _python_sign in [("remainder", True), ("fmod", False)]:
    for _schema in [f"{_name}.Tensor(Tensor self, Tensor other) -> Tensor",
                    f"{_name}.Scalar(Tensor self, Scalar other) -> Tensor"]:
        _op = _qualified(_schema)
        defop(_schema, _elementwise(_op, check=_no_bool()), _remainder(_op, _python_sign))


# ---------------------------------------------------------------------------------------------
# pow


def _integer_power(base: np.ndarray, exponent: np.ndarray) -> np.ndarray:
    """ATen's powi: squaring in the integer dtype (so it wraps); a negative exponent gives 1, ±1 or 0."""
    base, exponent = np.broadcast_arrays(base, exponent)
    result = np.ones(base.shape, base.dtype)
    square = base.copy()
    remaining = np.where(exponent > 0, exponent, np.zeros((), exponent.dtype))
    while remaining.any():
        result = np.where((remaining & 1).astype(bool), result * square, result)
        square = square * square
        remaining = remaining >> 1
    negative = exponent < 0
    if negative.any():
        odd = (exponent % 2) != 0
        special = np.where(base == 1, 1, np.where(base == -1, np.where(odd, -1, 1), 0)).astype(base.dtype)
        result = np.where(negative, special, result)
    return result


def _power(base: Any, exponent: Any) -> np.ndarray:
    common = _common_dtype(base, exponent)
    if not isinstance(exponent, np.ndarray) and exponent in (0, 1):  # ATen fills ones / copies, even for bool
        result = _cast(base, common)
        return np.ones_like(result) if exponent == 0 else result.copy()
    with np.errstate(all="ignore"):
        if common.is_floating_point and common != dtypes.float16 and not isinstance(exponent, np.ndarray) and \
                exponent in (0.5, -0.5):
            # ATen: sqrt / rsqrt, so (-inf) ** 0.5 is NaN, not inf; its float16 kernel calls pow (torch 2.13)
            root = np.sqrt(_compute(base, common))
            return root if exponent == 0.5 else 1 / root
        if common in (dtypes.float32, dtypes.float64) and not isinstance(exponent, np.ndarray) and exponent in (2, 3):
            # ATen's pow_tensor_scalar multiplies in the tensor's dtype: x * x, and x * x * x (gelu's tanh form)
            value = _cast(base, common)
            return value * value if exponent == 2 else value * value * value
        if common.is_floating_point:
            base, exponent = np.broadcast_arrays(_compute(base, common), _compute(exponent, common))
            # the exponent as a 1-D copy: numpy's loop takes sqrt for an exponent of 0.5 it reads as a scalar (0-D
            # or a stride-0 broadcast), where ATen's float16 kernel calls pow ((-inf) ** 0.5 is inf there)
            return np.power(base.reshape(-1), exponent.reshape(-1).copy()).reshape(base.shape)
        return _integer_power(_cast(base, common), _cast(exponent, common))


def _pow_no_bool(op: str, common: DType, *args: Any) -> None:
    require_dtype(not common.is_bool, op, "pow is not supported for bool results",
                  fix="convert the tensor to an integer or floating-point dtype first")


def _pow_tensor_scalar_check(op: str, common: DType, self: Any, exponent: Any) -> None:
    if not isinstance(exponent, bool):  # a bool exponent is 0 or 1, which ATen handles without the kernel
        _pow_no_bool(op, common)
    if _is_number(exponent):
        negative_integer = isinstance(exponent, int) and not isinstance(exponent, bool) and exponent < 0
        require_arg(not (negative_integer and not dtype_of(self).is_floating_point), op,
                    "integers to negative integer powers are not allowed",
                    fix="use a floating-point exponent (x ** -1.0) or tensor")
        if common.is_integral or common in _REDUCED_FLOATS:  # ATen converts the exponent to the dtype
            _check_fits(op, "exponent", exponent, common)


defop("pow.Tensor_Tensor(Tensor self, Tensor exponent) -> Tensor",
      _elementwise("aten.pow.Tensor_Tensor", check=_pow_no_bool), _power)
defop("pow.Tensor_Scalar(Tensor self, Scalar exponent) -> Tensor",
      _elementwise("aten.pow.Tensor_Scalar", check=_pow_tensor_scalar_check), _power)
defop("pow.Scalar(Scalar self, Tensor exponent) -> Tensor",
      _elementwise("aten.pow.Scalar", check=_pow_no_bool), _power)


# ---------------------------------------------------------------------------------------------
# atan2, maximum, minimum


def _atan2(self, other, out=None):
    common = _promote(Promotion.INT_TO_FLOAT, _common_dtype(self, other))
    with np.errstate(all="ignore"):
        return np.arctan2(_compute(self, common), _compute(other, common))


def _can_cast(source: DType, target: DType) -> bool:
    """c10::canCast: no float to integral, no non-bool to bool."""
    if source.is_floating_point and target.is_integral:
        return False
    return source.is_bool or not target.is_bool


def _atan2_out_meta(self, other, out):
    op = "aten.atan2.out"
    computed = _promote(Promotion.INT_TO_FLOAT, _common_dtype(self, other))
    require_dtype(_can_cast(computed, dtype_of(out)), op,
                  f"result type {computed.name} can't be cast to the desired output type {dtype_of(out).name}",
                  fix="pass a floating-point `out` tensor")
    return tensor(_broadcast(op, self, other), dtype_of(out))


defop("atan2(Tensor self, Tensor other) -> Tensor", _elementwise("aten.atan2.default", Promotion.INT_TO_FLOAT),
      _atan2)
defop("atan2.out(Tensor self, Tensor other, *, Tensor(a!) out) -> Tensor(a!)", _atan2_out_meta, _atan2)


def _extremum(bool_fn: Callable, fn: Callable) -> Callable[..., np.ndarray]:
    def kernel(self, other):
        common = _common_dtype(self, other)
        if common.is_bool:
            return bool_fn(_cast(self, common), _cast(other, common))
        return fn(_compute(self, common), _compute(other, common))  # np.maximum/minimum propagate NaN
    return kernel


defop("maximum(Tensor self, Tensor other) -> Tensor", _elementwise("aten.maximum.default"),
      _extremum(np.logical_or, np.maximum))
defop("minimum(Tensor self, Tensor other) -> Tensor", _elementwise("aten.minimum.default"),
      _extremum(np.logical_and, np.minimum))


# ---------------------------------------------------------------------------------------------
# Comparisons, logical and bitwise ops


def _compare(fn: Callable) -> Callable[..., np.ndarray]:
    def kernel(self, other):
        common = _common_dtype(self, other)
        return fn(_compute(self, common), _compute(other, common))
    return kernel


for _name, _fn in [("eq", np.equal), ("ne", np.not_equal), ("lt", np.less), ("le", np.less_equal),
                   ("gt", np.greater), ("ge", np.greater_equal)]:
    for _schema in [f"{_name}.Tensor(Tensor self, Tensor other) -> Tensor",
                    f"{_name}.Scalar(Tensor self, Scalar other) -> Tensor"]:
        defop(_schema, _elementwise(_qualified(_schema), Promotion.ALWAYS_BOOL), _compare(_fn))


def _logical(fn: Callable) -> Callable[..., np.ndarray]:
    def kernel(self, other):
        common = _common_dtype(self, other)  # operands are cast first: nonzero-ness is judged in `common`
        return fn(_cast(self, common) != 0, _cast(other, common) != 0)
    return kernel


for _name, _fn in [("logical_and", np.logical_and), ("logical_or", np.logical_or),
                   ("logical_xor", np.logical_xor)]:
    defop(f"{_name}(Tensor self, Tensor other) -> Tensor",
          _elementwise(f"aten.{_name}.default", Promotion.ALWAYS_BOOL), _logical(_fn))
defop("logical_not(Tensor self) -> Tensor", _unary("aten.logical_not.default", Promotion.ALWAYS_BOOL),
      lambda self: opmath(self) == 0)


def _bitwise(fn: Callable) -> Callable[..., np.ndarray]:
    def kernel(self, other):
        common = _common_dtype(self, other)
        return fn(_cast(self, common), _cast(other, common))
    return kernel


_BITWISE = [("bitwise_and", np.bitwise_and), ("bitwise_or", np.bitwise_or), ("bitwise_xor", np.bitwise_xor)]
for _name, _fn in _BITWISE:
    for _schema in [f"{_name}.Tensor(Tensor self, Tensor other) -> Tensor",
                    f"{_name}.Scalar(Tensor self, Scalar other) -> Tensor"]:
        defop(_schema, _elementwise(_qualified(_schema), check=_integral_or_bool), _bitwise(_fn))
defop("bitwise_not(Tensor self) -> Tensor", _unary("aten.bitwise_not.default", check=_integral_or_bool),
      lambda self: np.logical_not(self) if self.dtype == np.bool_ else np.invert(self))


# ---------------------------------------------------------------------------------------------
# Unary math


# erf: numpy has none. FreeBSD msun's s_erf.c (Sun Microsystems, freely distributable) rational
# approximations, < 1 ulp in float64, each evaluated on the elements of its interval.
_ERF_SMALL_P = (1.28379167095512558561e-01, -3.25042107247001499370e-01, -2.84817495755985104766e-02,
                -5.77027029648944159157e-03, -2.37630166566501626084e-05)
_ERF_SMALL_Q = (1.0, 3.97917223959155352819e-01, 6.50222499887672944485e-02, 5.08130628187576562776e-03,
                1.32494738004321644526e-04, -3.96022827877536812320e-06)
_ERF_ONE_P = (-2.36211856075265944077e-03, 4.14856118683748331666e-01, -3.72207876035701323847e-01,
              3.18346619901161753674e-01, -1.10894694282396677476e-01, 3.54783043256182359371e-02,
              -2.16637559486879084300e-03)
_ERF_ONE_Q = (1.0, 1.06420880400844228286e-01, 5.40397917702171048937e-01, 7.18286544141962662868e-02,
              1.26171219808761642112e-01, 1.36370839120290507362e-02, 1.19844998467991074170e-02)
_ERF_ONE_C = 8.45062911510467529297e-01  # erf(1) rounded to 24 bits
_ERFC_MID_R = (-9.86494403484714822705e-03, -6.93858572707181764372e-01, -1.05586262253232909814e+01,
               -6.23753324503260060396e+01, -1.62396669462573470355e+02, -1.84605092906711035994e+02,
               -8.12874355063065934246e+01, -9.81432934416914548592e+00)
_ERFC_MID_S = (1.0, 1.96512716674392571292e+01, 1.37657754143519042600e+02, 4.34565877475229228821e+02,
               6.45387271733267880336e+02, 4.29008140027567833386e+02, 1.08635005541779435134e+02,
               6.57024977031928170135e+00, -6.04244152148580987438e-02)
_ERFC_FAR_R = (-9.86494292470009928597e-03, -7.99283237680523006574e-01, -1.77579549177547519889e+01,
               -1.60636384855821916062e+02, -6.37566443368389627722e+02, -1.02509513161107724954e+03,
               -4.83519191608651397019e+02)
_ERFC_FAR_S = (1.0, 3.03380607434824582924e+01, 3.25792512996573918826e+02, 1.53672958608443695994e+03,
               3.19985821950859553908e+03, 2.55305040643316442583e+03, 4.74528541206955367215e+02,
               -2.24409524465858183362e+01)


def _high_word_bound(high: int) -> float:
    """The double whose high 32 bits are `high` (s_erf.c compares |x|'s high word against these)."""
    return float(np.array(high << 32, np.uint64).view(np.float64))


_ERF_BOUNDS = [_high_word_bound(h) for h in (0x3FEB0000, 0x3FF40000, 0x4006DB6E, 0x40180000)]


def _polynomial(coefficients: tuple[float, ...], x: np.ndarray) -> np.ndarray:
    result = np.full_like(x, coefficients[-1])
    for c in reversed(coefficients[:-1]):
        result = result * x + c
    return result


def _erf(x: np.ndarray) -> np.ndarray:
    x64 = np.asarray(x, np.float64)
    ax = np.abs(x64)
    result = np.copysign(1.0, x64, out=np.empty_like(x64))  # |x| >= 6 and ±inf: ±1 in double precision
    with np.errstate(all="ignore"):
        small = ax < _ERF_BOUNDS[0]
        xs = x64[small]
        z = xs * xs
        result[small] = xs + xs * (_polynomial(_ERF_SMALL_P, z) / _polynomial(_ERF_SMALL_Q, z))
        near_one = (ax >= _ERF_BOUNDS[0]) & (ax < _ERF_BOUNDS[1])
        s = ax[near_one] - 1.0
        result[near_one] = np.copysign(_ERF_ONE_C + _polynomial(_ERF_ONE_P, s) / _polynomial(_ERF_ONE_Q, s),
                                       x64[near_one])
        for low, high, r_coefficients, s_coefficients in ((_ERF_BOUNDS[1], _ERF_BOUNDS[2], _ERFC_MID_R, _ERFC_MID_S),
                                                          (_ERF_BOUNDS[2], _ERF_BOUNDS[3], _ERFC_FAR_R, _ERFC_FAR_S)):
            tail = (ax >= low) & (ax < high)
            a = ax[tail]
            t = 1.0 / (a * a)
            # exp(-x*x) as exp(-h*h) * exp((h-x)(h+x)), h = x with its low 32 bits cleared, for accuracy
            h = (a.view(np.uint64) & np.uint64(0xFFFFFFFF00000000)).view(np.float64)
            erfc = np.exp(-h * h - 0.5625) * np.exp((h - a) * (h + a) + _polynomial(r_coefficients, t)
                                                     / _polynomial(s_coefficients, t)) / a
            result[tail] = np.copysign(1.0 - erfc, x64[tail])
    result[np.isnan(x64)] = np.nan
    return result.astype(np.result_type(x, np.float32))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


_FLOAT_MATH: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "acos": np.arccos, "acosh": np.arccosh, "asin": np.arcsin, "asinh": np.arcsinh, "atan": np.arctan,
    "atanh": np.arctanh, "cos": np.cos, "cosh": np.cosh, "erf": _erf, "exp": np.exp, "expm1": np.expm1,
    "log": np.log, "log10": np.log10, "log1p": np.log1p, "log2": np.log2, "reciprocal": np.reciprocal,
    "rsqrt": lambda x: 1 / np.sqrt(x), "sigmoid": _sigmoid, "sin": np.sin, "sinh": np.sinh, "sqrt": np.sqrt,
    "tan": np.tan, "tanh": np.tanh,
}
for _name, _fn in _FLOAT_MATH.items():
    defop(f"{_name}(Tensor self) -> Tensor", _unary(f"aten.{_name}.default", Promotion.INT_TO_FLOAT),
          unary_float_kernel(_fn))


def _rounding(fn: Callable) -> Callable[[np.ndarray], np.ndarray]:
    """ceil/floor/round/trunc: the identity on integers; round is half-to-even like std::nearbyint."""
    return lambda self: self.copy() if not dtypes.dtype(self.dtype).is_floating_point else fn(opmath(self))


for _name, _fn in [("ceil", np.ceil), ("floor", np.floor), ("round", np.round), ("trunc", np.trunc)]:
    defop(f"{_name}(Tensor self) -> Tensor", _unary(f"aten.{_name}.default", check=_no_bool()), _rounding(_fn))


def _sign(self):
    if self.dtype == np.bool_:
        return self.copy()
    x = opmath(self)  # (0 < x) - (x < 0) like ATen: sign(NaN) is 0, not NaN
    return (x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)


def _isnan(self):
    return np.isnan(opmath(self)) if dtypes.dtype(self.dtype).is_floating_point else np.zeros(self.shape, bool)


def _isinf(self):
    return np.isinf(opmath(self)) if dtypes.dtype(self.dtype).is_floating_point else np.zeros(self.shape, bool)


def _abs_meta(self):
    """abs of a complex tensor is its modulus, in the parts' real dtype."""
    result = _unary("aten.abs.default", check=_no_bool())(self)
    return tensor(result.shape, dtypes.complex_to_real(result.dtype)) if result.dtype.is_complex else result


defop("abs(Tensor self) -> Tensor", _abs_meta,
      lambda self: np.abs(opmath(self)))  # np.abs wraps INT_MIN like ATen
defop("neg(Tensor self) -> Tensor",
      _unary("aten.neg.default", check=_no_bool("negating a bool tensor is not supported",
                                                "to invert a mask use bitwise_not or logical_not")),
      lambda self: np.negative(opmath(self)))
defop("sign(Tensor self) -> Tensor", _unary("aten.sign.default"), _sign)
defop("isnan(Tensor self) -> Tensor", _unary("aten.isnan.default", Promotion.ALWAYS_BOOL), _isnan)
defop("isinf(Tensor self) -> Tensor", _unary("aten.isinf.default", Promotion.ALWAYS_BOOL), _isinf)


# ---------------------------------------------------------------------------------------------
# Activations


def _relu(self):
    x = opmath(self)
    return np.maximum(x, x.dtype.type(0))  # NaN stays NaN


defop("relu(Tensor self) -> Tensor", _unary("aten.relu.default", check=_no_bool()), _relu)


def _opmath_scalar(value: Any, dtype: DType) -> Any:
    """A Scalar parameter as ATen's activation kernels read it: in the opmath dtype of `dtype`."""
    return np.asarray(value, np.float64).astype(dtypes.opmath_dtype(dtype).numpy)[()]


def _opmath_params_check(*names: str) -> Check:
    """Activation parameters are converted (with overflow checks) to the computation dtype."""
    def check(op: str, common: DType, self: Any, *params: Any) -> None:
        _floating_only(op, common)
        for name, value in zip(names, params):
            _check_fits(op, name, value, dtypes.opmath_dtype(common))
    return check


def _leaky_relu(self, negative_slope=0.01):
    x = opmath(self)
    with np.errstate(all="ignore"):
        return np.where(x > 0, x, x * _opmath_scalar(negative_slope, dtypes.dtype(self.dtype)))


def _elu(self, alpha=1, scale=1, input_scale=1):
    dt = dtypes.dtype(self.dtype)
    x = opmath(self)
    negative_scale = _opmath_scalar(alpha, dt) * _opmath_scalar(scale, dt)
    with np.errstate(all="ignore"):
        return np.where(x > 0, x * _opmath_scalar(scale, dt),
                        np.expm1(x * _opmath_scalar(input_scale, dt)) * negative_scale)


_GELU_TANH_BETA = math.sqrt(2.0) * (2.0 / math.sqrt(math.pi)) * 0.5  # sqrt(2 / pi)
_GELU_TANH_KAPPA = 0.044715


def _gelu(self, approximate="none"):
    x = opmath(self)
    with np.errstate(all="ignore"):
        if approximate == "tanh":
            beta, kappa = x.dtype.type(_GELU_TANH_BETA), x.dtype.type(_GELU_TANH_KAPPA)
            return 0.5 * x * (1 + np.tanh(beta * (x + kappa * (x * x * x))))
        return x * 0.5 * (1 + _erf(x * x.dtype.type(math.sqrt(0.5))).astype(x.dtype))


def _gelu_check(op: str, common: DType, self: Any, approximate: str) -> None:
    _floating_only(op, common)
    require_arg(approximate in ("none", "tanh"), op, f"approximate must be 'none' or 'tanh', got {approximate!r}",
                fix="pass approximate='none' (erf) or approximate='tanh'")


defop("leaky_relu(Tensor self, Scalar negative_slope=0.01) -> Tensor",
      _unary("aten.leaky_relu.default", check=_opmath_params_check("negative_slope")), _leaky_relu)
defop("elu(Tensor self, Scalar alpha=1, Scalar scale=1, Scalar input_scale=1) -> Tensor",
      _unary("aten.elu.default", check=_opmath_params_check("alpha", "scale", "input_scale")), _elu)
defop('gelu(Tensor self, *, str approximate="none") -> Tensor', _unary("aten.gelu.default", check=_gelu_check),
      _gelu)


# clamp and hardtanh: min(max(x, lo), hi), so lo > hi gives hi; a NaN input stays NaN and a NaN bound
# makes every element NaN (ATen fills the result).

def _any_nan(*bounds: Any) -> bool:
    return any(isinstance(b, float) and math.isnan(b) for b in bounds)


def _clamp_values(x: np.ndarray, lo: Any, hi: Any, dtype: DType) -> np.ndarray:
    """x (already in `dtype`) clamped by Scalar bounds converted to `dtype`."""
    if _any_nan(lo, hi):
        return np.full(x.shape, np.nan, opmath(x).dtype)
    result = opmath(x)
    if lo is not None:
        result = np.maximum(result, opmath(_scalar_as(lo, dtype)))
    if hi is not None:
        result = np.minimum(result, opmath(_scalar_as(hi, dtype)))
    return result


def _clamp_dtype(self: Any, lo: Any, hi: Any) -> DType:
    """clamp's result dtype: floating inputs keep theirs; others promote with the bounds."""
    own = dtype_of(self)
    return own if own.is_floating_point else _common_dtype(self, lo, hi)


def _clamp_meta(op: str) -> Callable[..., Any]:
    def meta(self, min=None, max=None):
        require_arg(min is not None or max is not None, op, "at least one of 'min' and 'max' must be given",
                    fix="pass min, max or both")
        _check_scalar_operands(op, (min, max))
        result = _clamp_dtype(self, min, max)
        require_dtype(not result.is_bool, op, "clamping bool tensors by bool bounds is not supported",
                      fix="pass integer bounds, or convert the tensor first")
        for name, bound in (("min", min), ("max", max)):
            if bound is not None and not _any_nan(min, max):  # a NaN bound fills NaN, converting nothing
                _check_fits(op, name, bound, result)
        return tensor(shape_of(self), result)
    return meta


def _clamp(self, min=None, max=None):
    result = _clamp_dtype(self, min, max)
    return _clamp_values(_cast(self, result), min, max, result)


defop("clamp(Tensor self, Scalar? min=None, Scalar? max=None) -> Tensor", _clamp_meta("aten.clamp.default"),
      _clamp)


def _clamp_tensor_meta(self, min=None, max=None):
    op = "aten.clamp.Tensor"
    require_arg(min is not None or max is not None, op, "at least one of 'min' and 'max' must be given",
                fix="pass min, max or both")
    result = _common_dtype(self, min, max)
    require_dtype(not (result.is_bool and min is not None and max is not None), op,
                  "clamping bool tensors by both min and max is not supported",
                  fix="use logical_and/logical_or, or convert the tensors first")
    return tensor(_broadcast(op, self, min, max), result)


def _clamp_tensor(self, min=None, max=None):
    result_dtype = _common_dtype(self, min, max)
    if result_dtype.is_bool:  # only one bound: maximum/minimum of bools
        return np.logical_or(self, min) if min is not None else np.logical_and(self, max)
    result = _compute(self, result_dtype)
    if min is not None:
        result = np.maximum(result, _compute(min, result_dtype))  # NaN bounds propagate elementwise
    if max is not None:
        result = np.minimum(result, _compute(max, result_dtype))
    return result


defop("clamp.Tensor(Tensor self, Tensor? min=None, Tensor? max=None) -> Tensor", _clamp_tensor_meta,
      _clamp_tensor)


def _hardtanh_bounds(self: Any, min_val: Any, max_val: Any) -> tuple[Any, Any]:
    """Integer tensors read the bounds as integers (Scalar.toLong truncates); floating ones as given."""
    if dtype_of(self).is_floating_point:
        return min_val, max_val
    return tuple(int(b) if isinstance(b, bool) or isinstance(b, float) and math.isfinite(b) else b
                 for b in (min_val, max_val))


def _hardtanh_meta(op: str) -> Callable[..., Any]:
    def meta(self, min_val=-1, max_val=1):
        own = dtype_of(self)
        require_dtype(not own.is_bool, op, "bool tensors are not supported",
                      fix="convert the tensor to an integer or floating-point dtype first")
        lo, hi = _hardtanh_bounds(self, min_val, max_val)
        if not own.is_floating_point:
            for name, value in (("min_val", lo), ("max_val", hi)):
                require_arg(not isinstance(value, float), op, f"{name} {value!r} cannot be converted to an integer",
                            fix="pass finite bounds")
        negative = any(_is_number(b) and b < 0 for b in (lo, hi))
        require_arg(own is not dtypes.uint8 or not negative, op,
                    "cannot do hardtanh on an unsigned type with negative limits", fix="pass limits >= 0")
        if not _any_nan(lo, hi):  # a NaN limit fills NaN, converting nothing
            _check_fits(op, "min_val", lo, own)
            _check_fits(op, "max_val", hi, own)
        return tensor(shape_of(self), own)
    return meta


def _hardtanh(self, min_val=-1, max_val=1):
    lo, hi = _hardtanh_bounds(self, min_val, max_val)
    return _clamp_values(self, lo, hi, dtypes.dtype(self.dtype))


defop("hardtanh(Tensor self, Scalar min_val=-1, Scalar max_val=1) -> Tensor",
      _hardtanh_meta("aten.hardtanh.default"), _hardtanh)


# ---------------------------------------------------------------------------------------------
# where


def _where_meta(condition, self, other):
    op = "aten.where.self"
    condition_dtype = dtype_of(condition)
    require_dtype(condition_dtype in (dtypes.bool_, dtypes.uint8), op,
                  f"condition must be a bool tensor, got {condition_dtype.name}",
                  fix="compare to get a bool tensor, e.g. condition != 0")
    return tensor(_broadcast(op, condition, self, other), _common_dtype(self, other))


def _where(condition, self, other):
    common = _common_dtype(self, other)
    return np.where(condition.astype(bool), _cast(self, common), _cast(other, common))


defop("where.self(Tensor condition, Tensor self, Tensor other) -> Tensor", _where_meta, _where)


# ---------------------------------------------------------------------------------------------
# Copies and conversions


def _format_name(value: Any) -> str | None:
    """Layout/MemoryFormat values arrive as torch objects, names or (for strided) 0; normalize to names."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return "strided" if value == 0 else str(value)
    return str(value).removeprefix("torch.")


_MEMORY_FORMAT_RANK = {"channels_last": 4, "channels_last_3d": 5}


def _check_memory_format(op: str, self: Any, memory_format: Any) -> None:
    name = _format_name(memory_format)
    require_arg(name in (None, "preserve_format", "contiguous_format", *_MEMORY_FORMAT_RANK), op,
                f"unknown memory format {memory_format!r}",
                fix="use preserve_format, contiguous_format, channels_last or channels_last_3d")
    if name in _MEMORY_FORMAT_RANK:
        rank = _MEMORY_FORMAT_RANK[name]
        require_arg(len(shape_of(self)) == rank, op, f"memory format {name} needs a rank-{rank} tensor, "
                    f"got rank {len(shape_of(self))}", fix="use contiguous_format for this tensor")


def _to_copy_meta(self, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
                  memory_format=None):
    op = "aten._to_copy.default"
    layout_name = _format_name(layout)
    require_arg(layout_name in (None, "strided"), op, f"converting to layout {layout_name} is not supported",
                fix="pass layout=torch.strided or leave it unset")
    _check_memory_format(op, self, memory_format)
    return tensor(shape_of(self), dtype_of(self) if dtype is None else dtype)


def _to_copy(self, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
             memory_format=None):
    return _cast(self, dtypes.dtype(self.dtype) if dtype is None else dtype).copy()


def _clone_meta(self, memory_format=None):
    _check_memory_format("aten.clone.default", self, memory_format)
    return tensor(shape_of(self), dtype_of(self))


def _copy_meta(self, src, non_blocking=False):
    op = "aten.copy.default"
    broadcast = broadcast_shapes(op, shape_of(self), shape_of(src))
    fits = len(broadcast) == len(shape_of(self)) and all(sym_eq(a, b) for a, b in zip(broadcast, shape_of(self)))
    require_arg(fits, op,
                f"src of shape {list(shape_of(src))} cannot be broadcast to self's shape {list(shape_of(self))}",
                fix="src must broadcast to self's shape without growing it")
    return tensor(shape_of(self), dtype_of(self))


def _fill_meta(self, value):
    op = "aten.fill.Scalar"
    own = dtype_of(self)
    one_element = all(isinstance(d, int) for d in shape_of(self)) and math.prod(shape_of(self)) == 1
    if not (one_element and own in _REDUCED_FLOATS):  # ATen's one-element fast path rounds to inf unchecked
        _check_fits(op, "value", value, own)
    return tensor(shape_of(self), own)


defop("_to_copy(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, "
      "bool? pin_memory=None, bool non_blocking=False, MemoryFormat? memory_format=None) -> Tensor",
      _to_copy_meta, _to_copy)
defop("clone(Tensor self, *, MemoryFormat? memory_format=None) -> Tensor", _clone_meta,
      lambda self, memory_format=None: self.copy())
defop("copy(Tensor self, Tensor src, bool non_blocking=False) -> Tensor", _copy_meta,
      lambda self, src, non_blocking=False: np.broadcast_to(_cast(src, dtypes.dtype(self.dtype)), self.shape).copy())
defop("alias(Tensor(a) self) -> Tensor(a)", lambda self: tensor(shape_of(self), dtype_of(self)),
      lambda self: self.view(), tags=("view",))
defop("fill.Scalar(Tensor self, Scalar value) -> Tensor", _fill_meta,
      lambda self, value: np.full(self.shape, _scalar_as(value, dtypes.dtype(self.dtype))))
defop("zero(Tensor self) -> Tensor", lambda self: tensor(shape_of(self), dtype_of(self)),
      lambda self: np.zeros_like(self), tags=("composite",))  # zero_'s functional form, as torch reads `x.zero_()`


@register_decomposition("aten.zero.default")
def _zero(self):
    return aten.fill.Scalar(self, 0)


# ---------------------------------------------------------------------------------------------
# Composite ops, each with a decomposition into the core ops above


def _in_opmath(x: Any, body: Callable[[Any], Any]) -> Any:
    """Run a decomposition's arithmetic in float32 for float16/bfloat16 inputs, rounding once at the end,
    as ATen's fused kernels do."""
    dt = dtype_of(x)
    if dt in _REDUCED_FLOATS:
        return aten._to_copy.default(body(aten._to_copy.default(x, dtype=dtypes.float32)), dtype=dt)
    return body(x)


def _composite(schema: str, meta: Callable[..., Any], kernel: Callable[..., Any],
               decomposition: Callable[..., Any]) -> None:
    opdef = defop(schema, meta, kernel, tags=("composite",))
    register_decomposition(opdef.name)(decomposition)


def _float_errors_ignored(fn: Callable[..., np.ndarray], *args: Any) -> np.ndarray:
    with np.errstate(all="ignore"):
        return fn(*args)


def _floating_unary_composite(name: str, kernel: Callable[[np.ndarray], np.ndarray],
                              body: Callable[[Any], Any]) -> None:
    """A float-only activation: kernel on opmath arrays, decomposition `body` on opmath values."""
    _composite(f"{name}(Tensor self) -> Tensor", _unary(f"aten.{name}.default", check=_floating_only),
               lambda self: _float_errors_ignored(kernel, opmath(self)),
               lambda self: _in_opmath(self, body))


_floating_unary_composite("silu", lambda x: x / (1 + np.exp(-x)),
                          lambda x: aten.mul.Tensor(x, aten.sigmoid.default(x)))
_floating_unary_composite("hardswish", lambda x: x * np.minimum(np.maximum(x + 3, 0), 6) / 6,
                          lambda x: aten.div.Scalar(
                              aten.mul.Tensor(x, aten.hardtanh.default(aten.add.Scalar(x, 3), 0, 6)), 6))
_floating_unary_composite("hardsigmoid", lambda x: np.minimum(np.maximum(x + 3, 0), 6) / 6,
                          lambda x: aten.div.Scalar(aten.hardtanh.default(aten.add.Scalar(x, 3), 0, 6), 6))
_floating_unary_composite("mish", lambda x: x * np.tanh(np.log1p(np.exp(x))),
                          lambda x: aten.mul.Tensor(x, aten.tanh.default(aten.log1p.default(aten.exp.default(x)))))

# ATen's log_sigmoid_forward: min(x, 0) - log1p(exp(-|x|)), finite for any x; minimum splits the gradient at x = 0
# as log_sigmoid_backward does (xLSTM's gates, binary cross-entropy with logits)
_floating_unary_composite("log_sigmoid", lambda x: np.minimum(x, 0) - np.log1p(np.exp(-np.abs(x))),
                          lambda x: aten.sub.Tensor(aten.minimum.default(x, aten.full_like.default(x, 0)),
                                                    aten.log1p.default(aten.exp.default(aten.neg.default(
                                                        aten.abs.default(x))))))


def _softplus(self, beta=1, threshold=20):
    dt = dtypes.dtype(self.dtype)
    x = opmath(self)
    beta, threshold = _opmath_scalar(beta, dt), _opmath_scalar(threshold, dt)
    with np.errstate(all="ignore"):
        scaled = x * beta
        return np.where(scaled > threshold, x, np.log1p(np.exp(scaled)) / beta)


def _softplus_decomposition(self, beta=1, threshold=20):
    def body(x):
        scaled = aten.mul.Scalar(x, beta)
        smooth = aten.div.Scalar(aten.log1p.default(aten.exp.default(scaled)), beta)
        return aten.where.self(aten.gt.Scalar(scaled, threshold), x, smooth)
    return _in_opmath(self, body)


_composite("softplus(Tensor self, Scalar beta=1, Scalar threshold=20) -> Tensor",
           _unary("aten.softplus.default", check=_opmath_params_check("beta", "threshold")), _softplus,
           _softplus_decomposition)

_composite("relu6(Tensor self) -> Tensor", lambda self: _hardtanh_meta("aten.relu6.default")(self, 0, 6),
           lambda self: _hardtanh(self, 0, 6), lambda self: aten.hardtanh.default(self, 0, 6))
# square is pow(self, 2), so a bool tensor squares to int64
_composite("square(Tensor self) -> Tensor",
           lambda self: _elementwise("aten.square.default", check=_pow_no_bool)(self, 2),
           lambda self: _power(self, 2), lambda self: aten.pow.Tensor_Scalar(self, 2))


def _rsub_decomposition(self, other, alpha=1):
    return aten.sub.Tensor(other, self, alpha=alpha)


def _rsub_scalar_decomposition(self, other, alpha=1):
    # other - alpha * self == (-alpha) * self + other, computed in the result dtype (uint8 - 1.5 is float)
    common = _common_dtype(self, other)
    if dtype_of(self) is not common:
        self = aten._to_copy.default(self, dtype=common)
    scaled = aten.neg.default(self) if alpha == 1 else aten.mul.Scalar(self, -alpha)
    return aten.add.Scalar(scaled, other)


_composite("rsub.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
           _elementwise("aten.rsub.Tensor", check=_rsub_check), _rsub, _rsub_decomposition)
_composite("rsub.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor",
           _elementwise("aten.rsub.Scalar", check=_rsub_check), _rsub, _rsub_scalar_decomposition)


# clamp_min / clamp_max

def _one_sided_clamp(bound: str) -> None:
    """clamp_min/clamp_max (Scalar and Tensor bound): clamp with only that bound."""
    scalar_meta = _clamp_meta(f"aten.clamp_{bound}.default")
    _composite(f"clamp_{bound}(Tensor self, Scalar {bound}) -> Tensor",
               lambda self, value: scalar_meta(self, **{bound: value}),
               lambda self, value: _clamp(self, **{bound: value}),
               lambda self, value: aten.clamp.default(self, **{bound: value}))
    _composite(f"clamp_{bound}.Tensor(Tensor self, Tensor {bound}) -> Tensor",
               lambda self, value: _clamp_tensor_meta(self, **{bound: value}),
               lambda self, value: _clamp_tensor(self, **{bound: value}),
               lambda self, value: aten.clamp.Tensor(self, **{bound: value}))


_one_sided_clamp("min")
_one_sided_clamp("max")


# masked_fill: result has self's dtype and the broadcast shape of self and mask

def _masked_fill_meta(op: str) -> Callable[..., Any]:
    def meta(self, mask, value):
        require_dtype(dtype_of(mask).is_bool, op, f"mask must be a bool tensor, got {dtype_of(mask).name}",
                      fix="convert the mask with mask.bool() or a comparison")
        if is_tensor(value):
            require_arg(len(shape_of(value)) == 0, op,
                        f"value must be a 0-d tensor, got one of rank {len(shape_of(value))}",
                        fix="pass a Python number or a 0-d tensor")
        else:
            _check_fits(op, "value", value, dtype_of(self))
        return tensor(_broadcast(op, self, mask), dtype_of(self))
    return meta


def _masked_fill(self, mask, value):
    if isinstance(value, np.ndarray):  # ATen reads the 0-d value with a checked conversion
        item = value.item()
        _check_fits("aten.masked_fill.Tensor", "value", item, dtypes.dtype(self.dtype))
        value = item
    return np.where(mask, _scalar_as(value, dtypes.dtype(self.dtype)), self)


_composite("masked_fill.Scalar(Tensor self, Tensor mask, Scalar value) -> Tensor",
           _masked_fill_meta("aten.masked_fill.Scalar"), _masked_fill,
           lambda self, mask, value: aten.where.self(mask, aten.fill.Scalar(self, value), self))
_composite("masked_fill.Tensor(Tensor self, Tensor mask, Tensor value) -> Tensor",
           _masked_fill_meta("aten.masked_fill.Tensor"), _masked_fill,
           lambda self, mask, value: aten.where.self(
               mask, aten._to_copy.default(value, dtype=dtype_of(self)), self))


# where with Scalar branches: the Scalar promotes like a wrapped number and becomes a scalar_tensor,
# converted with an overflow check except into float16/bfloat16 (ATen's scalar_fill rounds those to inf)

def _where_scalar_meta(op: str) -> Callable[..., Any]:
    def meta(condition, self, other):
        require_dtype(dtype_of(condition) in (dtypes.bool_, dtypes.uint8), op,
                      f"condition must be a bool tensor, got {dtype_of(condition).name}",
                      fix="compare to get a bool tensor, e.g. condition != 0")
        _check_scalar_operands(op, (self, other))
        result = _common_dtype(self, other)
        for name, value in (("self", self), ("other", other)):
            if not is_tensor(value) and result not in _REDUCED_FLOATS:
                _check_fits(op, name, value, result)
        return tensor(_broadcast(op, condition, self, other), result)
    return meta


def _where_scalar(condition, self, other):
    common = _common_dtype(self, other)
    return np.where(condition.astype(bool), _cast(self, common), _cast(other, common))


def _where_scalar_decomposition(condition, self, other):
    result = _common_dtype(self, other)
    # a tensor of the result dtype to fill: the tensor branch, else the condition itself
    base = next((v for v in (self, other) if is_tensor(v)), condition)
    if dtype_of(base) is not result:
        base = aten._to_copy.default(base, dtype=result)

    def filled(value):
        if result not in _REDUCED_FLOATS:
            return aten.fill.Scalar(base, value)
        # unchecked like ATen's scalar_tensor: fill in float64, then round (70000 becomes inf)
        wide = aten.fill.Scalar(aten._to_copy.default(base, dtype=dtypes.float64), value)
        return aten._to_copy.default(wide, dtype=result)

    return aten.where.self(condition, *[v if is_tensor(v) else filled(v) for v in (self, other)])


for _schema in ["where.ScalarSelf(Tensor condition, Scalar self, Tensor other) -> Tensor",
                "where.ScalarOther(Tensor condition, Tensor self, Scalar other) -> Tensor",
                "where.Scalar(Tensor condition, Scalar self, Scalar other) -> Tensor"]:
    _composite(_schema, _where_scalar_meta(_qualified(_schema)), _where_scalar, _where_scalar_decomposition)


# to.dtype: a no-op alias when nothing changes, else _to_copy

def _to_dtype_meta(self, dtype, non_blocking=False, copy=False, memory_format=None):
    _check_memory_format("aten.to.dtype", self, memory_format)
    return tensor(shape_of(self), dtype)


def _to_dtype_decomposition(self, dtype, non_blocking=False, copy=False, memory_format=None):
    if dtype_of(self) is dtype and not copy:
        return aten.alias.default(self)
    return aten._to_copy.default(self, dtype=dtype, memory_format=memory_format)


_composite("to.dtype(Tensor(a) self, ScalarType dtype, bool non_blocking=False, bool copy=False, "
           "MemoryFormat? memory_format=None) -> Tensor(a)", _to_dtype_meta,
           lambda self, dtype, non_blocking=False, copy=False, memory_format=None: _cast(self, dtype).copy(),
           _to_dtype_decomposition)


# to.dtype_layout / to.device / to.other: what `x.to(dtype)`, `x.to(device, dtype)` and `x.to(other)` leave in
# torch.export's default IR. Devices are accepted and ignored (kiln programs have none); the dtype works like to.dtype.

def _to_meta(op: str, conversion: Callable[..., tuple]) -> Callable[..., Any]:
    def meta(*args, **kwargs):
        self, dtype, layout, _, memory_format = conversion(*args, **kwargs)
        layout_name = _format_name(layout)
        require_arg(layout_name in (None, "strided"), op, f"converting to layout {layout_name} is not supported",
                    fix="pass layout=torch.strided or leave it unset")
        _check_memory_format(op, self, memory_format)
        return tensor(shape_of(self), dtype)
    return meta


def _to_kernel(conversion: Callable[..., tuple]) -> Callable[..., np.ndarray]:
    def kernel(*args, **kwargs):
        self, dtype, *_ = conversion(*args, **kwargs)
        return _cast(self, dtype).copy()
    return kernel


def _to_decomposition(conversion: Callable[..., tuple]) -> Callable[..., Any]:
    def decomposition(*args, **kwargs):
        self, dtype, _, copy, memory_format = conversion(*args, **kwargs)
        return _to_dtype_decomposition(self, dtype, copy=copy, memory_format=memory_format)
    return decomposition


# schema -> its arguments (in schema order) as (self, dtype, layout, copy, memory_format)
_TO_OVERLOADS: dict[str, Callable[..., tuple]] = {
    "to.dtype_layout(Tensor(a) self, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, "
    "bool? pin_memory=None, bool non_blocking=False, bool copy=False, MemoryFormat? memory_format=None) "
    "-> Tensor(a)": lambda self, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
    copy=False, memory_format=None: (self, dtype_of(self) if dtype is None else dtype, layout, copy, memory_format),
    "to.device(Tensor(a) self, Device device, ScalarType dtype, bool non_blocking=False, bool copy=False, "
    "MemoryFormat? memory_format=None) -> Tensor(a)": lambda self, device, dtype, non_blocking=False, copy=False,
    memory_format=None: (self, dtype, None, copy, memory_format),
    "to.other(Tensor(a) self, Tensor other, bool non_blocking=False, bool copy=False, "
    "MemoryFormat? memory_format=None) -> Tensor(a)": lambda self, other, non_blocking=False, copy=False,
    memory_format=None: (self, dtype_of(other), None, copy, memory_format),
}
for _schema, _conversion in _TO_OVERLOADS.items():
    _composite(_schema, _to_meta(_qualified(_schema), _conversion), _to_kernel(_conversion),
               _to_decomposition(_conversion))

# type_as: `x.type_as(other)`, which is x.to(other.dtype) (RoBERTa's position ids keep it in torch.export's IR)
_composite("type_as(Tensor self, Tensor other) -> Tensor",
           _to_meta("aten.type_as.default", lambda self, other: (self, dtype_of(other), None, False, None)),
           lambda self, other: _cast(self, dtypes.dtype(other.dtype)).copy(),
           lambda self, other: _to_dtype_decomposition(self, dtype_of(other)))


# max.other / min.other: `torch.max(a, b)` / `torch.min(a, b)`, which are maximum / minimum by another name
for _name, _target, _extremum_fns in (("max", "maximum", (np.logical_or, np.maximum)),
                                      ("min", "minimum", (np.logical_and, np.minimum))):
    _composite(f"{_name}.other(Tensor self, Tensor other) -> Tensor", _elementwise(f"aten.{_name}.other"),
               _extremum(*_extremum_fns), lambda self, other, _target=f"aten.{_target}.default":
               handle(_target)(self, other))


# fill.Tensor: the functional form of `x.fill_(value)` with a 0-d value tensor (BEiT's relative position index)

def _fill_tensor_meta(self, value):
    require(len(shape_of(value)) == 0, "aten.fill.Tensor",
            f"fill_ only supports 0-dimension value tensor but got tensor with {len(shape_of(value))} dimensions.")
    return tensor(shape_of(self), dtype_of(self))


_composite("fill.Tensor(Tensor self, Tensor value) -> Tensor", _fill_tensor_meta,
           lambda self, value: np.broadcast_to(_cast(value, dtypes.dtype(self.dtype)), self.shape).copy(),
           lambda self, value: aten.clone.default(aten.expand.default(
               aten._to_copy.default(value, dtype=dtype_of(self)), list(shape_of(self)))))


# multiply: `torch.multiply(a, b)`, mul by another name (ConvBERT's attention keeps it in torch.export's IR)
for _overload, _operand in (("Tensor", "Tensor"), ("Scalar", "Scalar")):
    _composite(f"multiply.{_overload}(Tensor self, {_operand} other) -> Tensor",
               _elementwise(f"aten.multiply.{_overload}"), _mul,
               lambda self, other, _target=f"aten.mul.{_overload}": handle(_target)(self, other))


# `&`, `|`, `^` on tensors: torch.export keeps the dunder ops (__and__.Tensor, ...), bitwise ops by another name.
for _name, _fn in _BITWISE:
    for _overload, _operand in (("Tensor", "Tensor"), ("Scalar", "Scalar")):
        _schema = f"__{_name.removeprefix('bitwise_')}__.{_overload}(Tensor self, {_operand} other) -> Tensor"
        _composite(_schema, _elementwise(_qualified(_schema), check=_integral_or_bool), _bitwise(_fn),
                   lambda self, other, _target=f"aten.{_name}.{_overload}": handle(_target)(self, other))


# floor_divide: division rounded toward -inf (what `//` means on tensors)

_composite("floor_divide(Tensor self, Tensor other) -> Tensor", _elementwise("aten.floor_divide.default",
           check=_no_bool()), lambda self, other: _divide("aten.floor_divide.default")(self, other, "floor"),
           lambda self, other: aten.div.Tensor_mode(self, other, rounding_mode="floor"))
_composite("floor_divide.Scalar(Tensor self, Scalar other) -> Tensor", _elementwise("aten.floor_divide.Scalar",
           check=_no_bool()), lambda self, other: _divide("aten.floor_divide.Scalar")(self, other, "floor"),
           lambda self, other: aten.div.Scalar_mode(self, other, rounding_mode="floor"))


# lerp: start + weight * (end - start), from the nearer end for accuracy (ATen's Lerp.h)

def _lerp_meta(op: str) -> Callable[..., Any]:
    def meta(self, end, weight):
        for name, value in (("end", end), ("weight", weight)):
            if is_tensor(value):
                require_dtype(dtype_of(value) is dtype_of(self), op,
                              f"expected dtype {dtype_of(self).name} for `{name}` but got {dtype_of(value).name}",
                              fix="convert all tensors to one floating-point dtype")
            else:
                _check_fits(op, name, value, dtypes.opmath_dtype(dtype_of(self)))
        _floating_only(op, dtype_of(self))
        return tensor(_broadcast(op, self, end, weight), dtype_of(self))
    return meta


def _lerp(self, end, weight):
    start, end = opmath(self), opmath(end)
    weight = opmath(weight) if isinstance(weight, np.ndarray) else start.dtype.type(weight)
    with np.errstate(all="ignore"):
        difference = end - start
        return np.where(np.abs(weight) < 0.5, start + weight * difference, end - difference * (1 - weight))


def _lerp_scalar_decomposition(self, end, weight):
    def body(start, finish):
        difference = aten.sub.Tensor(finish, start)
        if abs(weight) < 0.5:
            return aten.add.Tensor(start, aten.mul.Scalar(difference, weight))
        return aten.sub.Tensor(finish, aten.mul.Scalar(difference, _one_minus(weight, dtype_of(start))))
    return _in_opmath_all(body, self, end)


def _lerp_tensor_decomposition(self, end, weight):
    def body(start, finish, w):
        difference = aten.sub.Tensor(finish, start)
        near_start = aten.add.Tensor(start, aten.mul.Tensor(w, difference))
        near_end = aten.sub.Tensor(finish, aten.mul.Tensor(difference, aten.add.Scalar(aten.neg.default(w), 1)))
        return aten.where.self(aten.lt.Scalar(aten.abs.default(w), 0.5), near_start, near_end)
    return _in_opmath_all(body, self, end, weight)


def _one_minus(weight: Any, dtype: DType) -> float:
    """1 - weight rounded as the kernel computes it, in `dtype`."""
    return float(np.asarray(1, dtype.numpy) - np.asarray(weight, np.float64).astype(dtype.numpy))


def _in_opmath_all(body: Callable[..., Any], *tensors: Any) -> Any:
    """Like _in_opmath, for several tensors of one dtype."""
    dt = dtype_of(tensors[0])
    if dt not in _REDUCED_FLOATS:
        return body(*tensors)
    widened = [aten._to_copy.default(t, dtype=dtypes.float32) for t in tensors]
    return aten._to_copy.default(body(*widened), dtype=dt)


_composite("lerp.Scalar(Tensor self, Tensor end, Scalar weight) -> Tensor", _lerp_meta("aten.lerp.Scalar"),
           _lerp, _lerp_scalar_decomposition)
_composite("lerp.Tensor(Tensor self, Tensor end, Tensor weight) -> Tensor", _lerp_meta("aten.lerp.Tensor"),
           _lerp, _lerp_tensor_decomposition)


# addcmul / addcdiv: self + value * tensor1 (* or /) tensor2

def _addc_meta(op: str, divide: bool) -> Callable[..., Any]:
    def meta(self, tensor1, tensor2, value=1):
        if divide:
            require_dtype(dtype_of(tensor1).is_floating_point or dtype_of(tensor2).is_floating_point, op,
                          "integer division of tensor1 by tensor2 is not supported",
                          fix="convert tensor1 or tensor2 to a floating-point dtype")
        common = _common_dtype(self, tensor1, tensor2)
        require_dtype(not common.is_bool, op, "bool tensors are not supported",
                      fix="convert the tensors to an integer or floating-point dtype first")
        # ATen reads value as the dtype (float32 for float16/bfloat16): 2.5 truncates to 2 for integers
        _check_fits(op, "value", value, dtypes.opmath_dtype(common))
        return tensor(_broadcast(op, self, tensor1, tensor2), common)
    return meta


def _addc(divide: bool) -> Callable[..., np.ndarray]:
    def kernel(self, tensor1, tensor2, value=1):
        common = _common_dtype(self, tensor1, tensor2)
        scale = opmath(_scalar_as(value, dtypes.opmath_dtype(common) if common in _REDUCED_FLOATS else common))
        a, b, c = (_compute(t, common) for t in (self, tensor1, tensor2))
        with np.errstate(all="ignore"):
            return a + (scale * b / c if divide else scale * b * c)
    return kernel


def _addc_decomposition(divide: bool) -> Callable[..., Any]:
    def decomposition(self, tensor1, tensor2, value=1):
        common = _common_dtype(self, tensor1, tensor2)
        scale = value if common.is_floating_point or not _is_number(value) else int(value)

        def body(a, b, c):
            scaled = aten.mul.Scalar(b, scale) if scale != 1 else b
            product = aten.div.Tensor(scaled, c) if divide else aten.mul.Tensor(scaled, c)
            return aten.add.Tensor(a, product)
        converted = [t if dtype_of(t) is common else aten._to_copy.default(t, dtype=common)
                     for t in (self, tensor1, tensor2)]
        return _in_opmath_all(body, *converted)
    return decomposition


_composite("addcmul(Tensor self, Tensor tensor1, Tensor tensor2, *, Scalar value=1) -> Tensor",
           _addc_meta("aten.addcmul.default", divide=False), _addc(False), _addc_decomposition(False))
_composite("addcdiv(Tensor self, Tensor tensor1, Tensor tensor2, *, Scalar value=1) -> Tensor",
           _addc_meta("aten.addcdiv.default", divide=True), _addc(True), _addc_decomposition(True))


# logit: log(x / (1 - x)), with x clamped to [eps, 1 - eps] when eps is given

def _logit_bounds(eps: float, dtype: DType) -> tuple[float, float]:
    """[eps, 1 - eps] as ATen computes them, in the result dtype."""
    lo = np.asarray(eps, np.float64).astype(dtype.numpy)
    return float(lo), float(np.asarray(1, dtype.numpy) - lo)


def _logit(self, eps=None):
    result_dtype = _promote(Promotion.INT_TO_FLOAT, dtypes.dtype(self.dtype))

    def rounded(values):  # ATen's logit computes in the tensor's dtype: float16 rounds after every op
        return opmath(values.astype(result_dtype.numpy))

    x = opmath(_cast(self, result_dtype))
    with np.errstate(all="ignore"):
        if eps is not None and eps >= 0:
            lo, hi = _logit_bounds(eps, result_dtype)
            x = np.where(x < lo, x.dtype.type(lo), np.where(x > hi, x.dtype.type(hi), x))
        return np.log(rounded(x / rounded(1 - x)))


def _logit_decomposition(self, eps=None):
    if not dtype_of(self).is_floating_point:
        self = aten._to_copy.default(self, dtype=dtypes.default_float_dtype())
    if eps is not None and eps >= 0:
        self = aten.clamp.default(self, *_logit_bounds(eps, dtype_of(self)))
    # in the tensor's own dtype, not opmath: ATen rounds float16 after each op here
    return aten.log.default(aten.div.Tensor(self, aten.add.Scalar(aten.neg.default(self), 1)))


_composite("logit(Tensor self, float? eps=None) -> Tensor", _unary("aten.logit.default", Promotion.INT_TO_FLOAT),
           _logit, _logit_decomposition)


# ---------------------------------------------------------------------------------------------
# VJP rules (torch's derivatives.yaml and FunctionsManual.cpp, written with kiln.ops handles; see register_vjp).
# A gradient is computed in the result's dtype and broadcast shape, then summed and cast to its argument
# (`sum_like`); integer and bool arguments get none. At a kink each rule takes torch's side (relu's 0 at 0,
# clamp's bounds pass the gradient, hardtanh's do not, ties of maximum/minimum split it evenly). Where ATen's CPU
# kernel treats a NaN input differently in its vector loop and in its scalar tail (elu, hardtanh), the rule follows
# the vector loop, which is what torch computes for all but the last few elements of a tensor.

from kiln.ir.ops._grad import cast, sum_like, zeros_like  # noqa: E402
from kiln.ir.registry import register_vjp  # noqa: E402


def _differentiable(value: Any) -> bool:
    """A floating (or complex) tensor argument; torch gives integer and bool tensors no gradient."""
    if value is None or not is_tensor(value):
        return False
    kind = dtype_of(value)
    return kind.is_floating_point or kind.is_complex


def _gradient(argument: Any, compute: Callable[[], Any]) -> Any:
    """`compute()` summed and cast to `argument`'s shape and dtype, or None (without computing it) when the
    argument takes no gradient."""
    return sum_like(compute(), argument) if _differentiable(argument) else None


def _masked(keep: Any, value: Any) -> Any:
    """`value` where `keep` holds, else 0 (torch's `where(keep, value, 0)`)."""
    return aten.where.self(keep, value, zeros_like(value))


def _zeroed(condition: Any, value: Any) -> Any:
    """0 where `condition` holds, else `value` (torch's `value.masked_fill(condition, 0)`)."""
    return aten.where.self(condition, zeros_like(value), value)


@register_vjp("aten.add.Tensor")
def _add_vjp(grad, out, self, other, *, alpha=1):
    return (_gradient(self, lambda: grad),
            _gradient(other, lambda: grad if alpha == 1 else aten.mul.Scalar(grad, alpha)))


@register_vjp("aten.sub.Tensor")
def _sub_vjp(grad, out, self, other, *, alpha=1):
    return _gradient(self, lambda: grad), _gradient(other, lambda: aten.mul.Scalar(grad, -alpha))


@register_vjp("aten.mul.Tensor")
def _mul_vjp(grad, out, self, other):
    return _gradient(self, lambda: aten.mul.Tensor(grad, other)), _gradient(other, lambda: aten.mul.Tensor(grad, self))


@register_vjp("aten.div.Tensor", "aten.div.Tensor_mode")
def _div_vjp(grad, out, self, other, *, rounding_mode=None):
    if rounding_mode is not None:  # a rounded quotient is piecewise constant: torch gives zeros
        return _gradient(self, lambda: zeros_like(self)), _gradient(other, lambda: zeros_like(other))
    return (_gradient(self, lambda: aten.div.Tensor(grad, other)),
            _gradient(other, lambda: aten.mul.Tensor(aten.neg.default(grad),
                                                     aten.div.Tensor(aten.div.Tensor(self, other), other))))


@register_vjp("aten.div.Scalar", "aten.div.Scalar_mode")
def _div_scalar_vjp(grad, out, self, other, *, rounding_mode=None):
    if rounding_mode is not None:
        return _gradient(self, lambda: zeros_like(self))
    return _gradient(self, lambda: aten.div.Scalar(grad, other))


@register_vjp("aten.mul.Scalar")
def _mul_scalar_vjp(grad, out, self, other):
    return _gradient(self, lambda: aten.mul.Scalar(grad, other))


# d/dself of self + c, self - c, fmod(self, c), remainder(self, c) and of copies is 1
@register_vjp("aten.add.Scalar", "aten.sub.Scalar", "aten.fmod.Scalar", "aten.remainder.Scalar",
              "aten.clone.default", "aten.alias.default")
def _pass_through_vjp(grad, out, self, *args, **kwargs):
    return _gradient(self, lambda: grad)


def _in_result_dtype(grad: Any, result: Any) -> Any:
    """`grad` rounded to the result's dtype first, as torch's engine does with every gradient it is given (kiln's
    leaves a cotangent passed to backward()/grad() in its own dtype, which matters where the result's dtype is
    narrower than the argument's)."""
    return cast(grad, dtype_of(result))


@register_vjp("aten._to_copy.default")
def _to_copy_vjp(grad, out, self, **kwargs):
    return _gradient(self, lambda: _in_result_dtype(grad, out))  # then back to self's dtype


# Piecewise constant: torch gives zeros (not None), so the gradient is defined even at the jumps
@register_vjp("aten.ceil.default", "aten.floor.default", "aten.round.default", "aten.trunc.default",
              "aten.sign.default", "aten.fill.Scalar")
def _zero_vjp(grad, out, self, *args):
    return _gradient(self, lambda: zeros_like(self))


@register_vjp("aten.copy.default")
def _copy_vjp(grad, out, self, src, non_blocking=False):
    """torch's CopyBackwards: self is overwritten (zeros), src's gradient is summed over the broadcast."""
    return _gradient(self, lambda: zeros_like(self)), _gradient(src, lambda: grad)


def _remainder_vjp(rounding_mode: str) -> Callable[..., Any]:
    """fmod / remainder: self - other * div(self, other, rounding_mode), the quotient being constant."""
    def rule(grad, out, self, other):
        def other_gradient():
            quotient = aten.div.Tensor_mode(self, other, rounding_mode=rounding_mode)
            return aten.mul.Tensor(aten.neg.default(grad), quotient)
        return _gradient(self, lambda: grad), _gradient(other, other_gradient)
    return rule


register_vjp("aten.fmod.Tensor")(_remainder_vjp("trunc"))
register_vjp("aten.remainder.Tensor")(_remainder_vjp("floor"))


@register_vjp("aten.pow.Tensor_Scalar")
def _pow_tensor_scalar_vjp(grad, out, self, exponent):
    if exponent == 0 and not isinstance(exponent, bool):  # c10's Scalar::equal(0.0) is false for a bool
        return _gradient(self, lambda: zeros_like(self))
    power = float(exponent) if _is_number(exponent) else exponent  # torch reads the exponent as a double
    return _gradient(self, lambda: aten.mul.Tensor(
        grad, aten.mul.Scalar(aten.pow.Tensor_Scalar(self, power - 1), power)))


@register_vjp("aten.pow.Tensor_Tensor")
def _pow_vjp(grad, out, self, exponent):
    def self_gradient():
        power = aten.pow.Tensor_Tensor(self, aten.sub.Scalar(exponent, 1))
        return _zeroed(aten.eq.Scalar(exponent, 0), aten.mul.Tensor(grad, aten.mul.Tensor(exponent, power)))
    return _gradient(self, self_gradient), _pow_exponent_gradient(grad, out, self, exponent)


def _pow_exponent_gradient(grad: Any, out: Any, self: Any, exponent: Any) -> Any:
    """torch's pow_backward_exponent: grad * out * log(self), 0 where self == 0 and exponent >= 0."""
    def compute():
        log_base = aten.log.default(cast(self, _common_dtype(self, exponent)))
        at_zero = aten.logical_and.default(aten.eq.Scalar(self, 0), aten.ge.Scalar(exponent, 0))
        return aten.mul.Tensor(grad, _zeroed(at_zero, aten.mul.Tensor(out, log_base)))
    return _gradient(exponent, compute)


def _scalar_log(value: Any) -> float:
    """c10's Scalar::log, std::log on a double: -inf at 0 and NaN below, where Python's math.log raises."""
    value = float(value)
    if value > 0 or math.isnan(value):
        return math.log(value)
    return -math.inf if value == 0 else math.nan


@register_vjp("aten.pow.Scalar")
def _pow_scalar_vjp(grad, out, self, exponent):
    def compute():
        log_term = aten.mul.Scalar(out, _scalar_log(self))
        if self == 0 and not isinstance(self, bool):  # 0 ** exponent is flat (0) for exponent >= 0
            log_term = _zeroed(aten.ge.Scalar(exponent, 0), log_term)
        return aten.mul.Tensor(grad, log_term)
    return _gradient(exponent, compute)


def _atan2_gradients(grad: Any, self: Any, other: Any) -> tuple[Any, Any]:
    """(other, -self) / (self² + other²); torch gives 0 where the denominator is 0 (at the origin, or underflowed)."""
    denominator = aten.add.Tensor(aten.mul.Tensor(self, self), aten.mul.Tensor(other, other))
    reciprocal = _zeroed(aten.eq.Scalar(denominator, 0), aten.reciprocal.default(denominator))
    return (_gradient(self, lambda: aten.mul.Tensor(aten.mul.Tensor(grad, other), reciprocal)),
            _gradient(other, lambda: aten.mul.Tensor(aten.mul.Tensor(aten.neg.default(grad), self), reciprocal)))


@register_vjp("aten.atan2.default")
def _atan2_vjp(grad, out, self, other):
    return _atan2_gradients(grad, self, other)


@register_vjp("aten.atan2.out")
def _atan2_out_vjp(grad, result, self, other, *, out):
    return (*_atan2_gradients(_in_result_dtype(grad, result), self, other), None)  # `out` is only written to


def _extremum_vjp(self_loses: Any, other_loses: Any) -> Callable[..., Any]:
    """maximum / minimum: the gradient goes to the winner, and is split evenly on ties (NaN gives it to both)."""
    def rule(grad, out, self, other):
        split = aten.where.self(aten.eq.Tensor(self, other), aten.div.Scalar(grad, 2), grad)
        return (_gradient(self, lambda: _zeroed(self_loses(self, other), split)),
                _gradient(other, lambda: _zeroed(other_loses(self, other), split)))
    return rule


register_vjp("aten.maximum.default")(_extremum_vjp(aten.lt.Tensor, aten.gt.Tensor))
register_vjp("aten.minimum.default")(_extremum_vjp(aten.gt.Tensor, aten.lt.Tensor))


def _within(self: Any, lower: Any, upper: Any, at_least: Any, at_most: Any) -> Any:
    """lower <= self <= upper, either bound optional (None when both are); the bounds themselves count."""
    if lower is None:
        return None if upper is None else at_most(self, upper)
    if upper is None:
        return at_least(self, lower)
    return aten.logical_and.default(at_least(self, lower), at_most(self, upper))


@register_vjp("aten.clamp.default")
def _clamp_vjp(grad, out, self, min=None, max=None):
    inside = _within(self, min, max, aten.ge.Scalar, aten.le.Scalar)
    return _gradient(self, lambda: grad if inside is None else _masked(inside, grad))


@register_vjp("aten.clamp.Tensor")
def _clamp_tensor_vjp(grad, out, self, min=None, max=None):
    """torch's clamp_backward and clamp_backward_min_max: a bound gets the gradient where it is the result,
    max winning where min > max."""
    def self_gradient():
        inside = _within(self, min, max, aten.ge.Tensor, aten.le.Tensor)
        return grad if inside is None else _masked(inside, grad)

    def min_gradient():
        below = aten.lt.Tensor(self, min)
        if max is not None:
            below = aten.logical_and.default(below, aten.lt.Tensor(min, max))
        return _masked(below, grad)

    def max_gradient():
        above = aten.gt.Tensor(self, max)
        if min is not None:
            above = aten.logical_or.default(above, aten.lt.Tensor(max, min))
        return _masked(above, grad)

    return _gradient(self, self_gradient), _gradient(min, min_gradient), _gradient(max, max_gradient)


@register_vjp("aten.hardtanh.default")
def _hardtanh_vjp(grad, out, self, min_val=-1, max_val=1):
    """hardtanh_backward: only the open interval passes the gradient (clamp's bounds do pass it); 0 at NaN, as in
    ATen's vector loop (its scalar tail passes the gradient there)."""
    return _gradient(self, lambda: _masked(
        aten.logical_and.default(aten.gt.Scalar(self, min_val), aten.lt.Scalar(self, max_val)), grad))


@register_vjp("aten.where.self")
def _where_vjp(grad, out, condition, self, other):
    return (None, _gradient(self, lambda: _masked(condition, grad)),
            _gradient(other, lambda: _zeroed(condition, grad)))


@register_vjp("aten.leaky_relu.default")
def _leaky_relu_vjp(grad, out, self, negative_slope=0.01):
    return _gradient(self, lambda: aten.where.self(aten.gt.Scalar(self, 0), grad,
                                                   aten.mul.Scalar(grad, negative_slope)))


@register_vjp("aten.elu.default")
def _elu_vjp(grad, out, self, alpha=1, scale=1, input_scale=1):
    """elu_backward: a NaN input takes the negative branch (NaN), as in ATen's vector loop (its scalar tail gives
    grad * scale there)."""
    def compute():
        negative = aten.mul.Tensor(aten.mul.Scalar(aten.mul.Scalar(grad, input_scale), alpha * scale),
                                   aten.exp.default(aten.mul.Scalar(self, input_scale)))
        return aten.where.self(aten.gt.Scalar(self, 0), aten.mul.Scalar(grad, scale), negative)
    return _gradient(self, compute)


@register_vjp("aten.gelu.default")
def _gelu_vjp(grad, out, self, *, approximate="none"):
    """ATen's GeluBackwardKernelImpl, step by step."""
    def exact():
        cdf = aten.mul.Scalar(aten.add.Scalar(aten.erf.default(aten.mul.Scalar(self, math.sqrt(0.5))), 1), 0.5)
        pdf_scale = 2 / math.sqrt(math.pi) * math.sqrt(0.5) * 0.5  # 1 / sqrt(2 pi)
        pdf = aten.mul.Scalar(aten.exp.default(aten.mul.Scalar(aten.mul.Tensor(self, self), -0.5)), pdf_scale)
        return aten.mul.Tensor(grad, aten.add.Tensor(cdf, aten.mul.Tensor(self, pdf)))

    def tanh_form():
        square = aten.mul.Tensor(self, self)
        inner = aten.mul.Scalar(aten.add.Tensor(self, aten.mul.Scalar(aten.mul.Tensor(square, self), _GELU_TANH_KAPPA)),
                                _GELU_TANH_BETA)
        tanh_inner = aten.tanh.default(inner)
        left_derivative = aten.mul.Scalar(aten.add.Scalar(tanh_inner, 1), 0.5)
        tanh_derivative = aten.add.Scalar(aten.neg.default(aten.mul.Tensor(tanh_inner, tanh_inner)), 1)
        inner_derivative = aten.mul.Scalar(aten.add.Scalar(aten.mul.Scalar(square, 3 * _GELU_TANH_KAPPA), 1),
                                           _GELU_TANH_BETA)
        right_derivative = aten.mul.Tensor(aten.mul.Tensor(aten.mul.Scalar(self, 0.5), tanh_derivative),
                                           inner_derivative)
        return aten.mul.Tensor(grad, aten.add.Tensor(left_derivative, right_derivative))

    return _gradient(self, tanh_form if approximate == "tanh" else exact)


def _one_minus_tensor(value: Any) -> Any:
    return aten.add.Scalar(aten.neg.default(value), 1)


# Unary ops: d(op)/dself as a function of (grad, out, self), in the result's dtype, as derivatives.yaml writes it
_UNARY_DERIVATIVES: dict[str, Callable[[Any, Any, Any], Any]] = {
    "abs": lambda grad, out, x: aten.mul.Tensor(grad, aten.sign.default(x)),
    "acos": lambda grad, out, x: aten.mul.Tensor(
        grad, aten.neg.default(aten.rsqrt.default(_one_minus_tensor(aten.mul.Tensor(x, x))))),
    "acosh": lambda grad, out, x: aten.mul.Tensor(grad, aten.rsqrt.default(aten.sub.Scalar(aten.mul.Tensor(x, x), 1))),
    "asin": lambda grad, out, x: aten.mul.Tensor(grad, aten.rsqrt.default(_one_minus_tensor(aten.mul.Tensor(x, x)))),
    "asinh": lambda grad, out, x: aten.mul.Tensor(
        grad, aten.rsqrt.default(aten.add.Scalar(aten.pow.Tensor_Scalar(x, 2), 1))),
    "atan": lambda grad, out, x: aten.div.Tensor(grad, aten.add.Scalar(aten.mul.Tensor(x, x), 1)),
    "atanh": lambda grad, out, x: aten.div.Tensor(grad, _one_minus_tensor(aten.pow.Tensor_Scalar(x, 2))),
    "cos": lambda grad, out, x: aten.mul.Tensor(grad, aten.neg.default(aten.sin.default(x))),
    "cosh": lambda grad, out, x: aten.mul.Tensor(grad, aten.sinh.default(x)),
    "erf": lambda grad, out, x: aten.mul.Tensor(
        aten.mul.Scalar(aten.exp.default(aten.neg.default(aten.pow.Tensor_Scalar(x, 2))), 2 / math.sqrt(math.pi)),
        grad),
    "exp": lambda grad, out, x: aten.mul.Tensor(grad, out),
    "expm1": lambda grad, out, x: aten.mul.Tensor(grad, aten.add.Scalar(out, 1)),
    "log": lambda grad, out, x: aten.div.Tensor(grad, x),
    "log10": lambda grad, out, x: aten.div.Tensor(grad, aten.mul.Scalar(x, 2.3025850929940456)),
    "log1p": lambda grad, out, x: aten.div.Tensor(grad, aten.add.Scalar(x, 1)),
    "log2": lambda grad, out, x: aten.div.Tensor(grad, aten.mul.Scalar(x, 0.6931471805599453)),
    "neg": lambda grad, out, x: aten.neg.default(grad),
    "reciprocal": lambda grad, out, x: aten.mul.Tensor(aten.neg.default(grad), aten.mul.Tensor(out, out)),
    "relu": lambda grad, out, x: _zeroed(aten.le.Scalar(out, 0), grad),  # threshold_backward: NaN passes grad
    "rsqrt": lambda grad, out, x: aten.mul.Tensor(aten.mul.Scalar(grad, -0.5), aten.pow.Tensor_Scalar(out, 3)),
    "sigmoid": lambda grad, out, x: aten.mul.Tensor(aten.mul.Tensor(grad, _one_minus_tensor(out)), out),
    "sin": lambda grad, out, x: aten.mul.Tensor(grad, aten.cos.default(x)),
    "sinh": lambda grad, out, x: aten.mul.Tensor(grad, aten.cosh.default(x)),
    "sqrt": lambda grad, out, x: aten.div.Tensor(grad, aten.mul.Scalar(out, 2)),
    "tan": lambda grad, out, x: aten.mul.Tensor(grad, aten.add.Scalar(aten.pow.Tensor_Scalar(out, 2), 1)),
    "tanh": lambda grad, out, x: aten.mul.Tensor(grad, _one_minus_tensor(aten.mul.Tensor(out, out))),
}


def _unary_vjp(derivative: Callable[[Any, Any, Any], Any]) -> Callable[..., Any]:
    return lambda grad, out, self: _gradient(self, lambda: derivative(grad, out, self))


for _name, _derivative in _UNARY_DERIVATIVES.items():
    register_vjp(f"aten.{_name}.default")(_unary_vjp(_derivative))
