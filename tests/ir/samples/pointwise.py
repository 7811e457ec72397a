"""Samples for kiln/ir/ops/pointwise.py.

Every dtype an op accepts, promotion across dtypes, 0-d tensors and Python scalars, broadcasting, empty
tensors, and the values where ATen's semantics are subtle: NaN/inf/signed zeros, integer wrap-around,
rounding modes, Python- vs C-signed remainders. Integer divisors are never zero (ATen raises).
"""

from __future__ import annotations

import numpy as np

from kiln.ir import dtypes
from tests.ir.samples import Sample, positive, rand, samples

FLOATS = ("float32", "float64", "float16", "bfloat16")
INTS = ("int64", "int32", "int16", "int8", "uint8")
ALL = FLOATS + INTS + ("bool",)

NAN, INF = float("nan"), float("inf")
# Values that exercise NaN propagation, infinities, signed zeros and rounding ties.
SPECIAL = [NAN, INF, -INF, 0.0, -0.0, 0.5, -0.5, 1.5, -2.5, 1.0, -1.0, 3.0, -7.25, 1e-3]


def arr(values, dtype: str = "float32") -> np.ndarray:
    """An array of a kiln dtype from Python values (through float32 for bfloat16)."""
    dt = dtypes.dtype(dtype)
    if dt is dtypes.bfloat16:
        return np.asarray(values, np.float32).astype(dt.numpy)
    return np.asarray(values).astype(dt.numpy)


def nonzero(rng, *shape, dtype="int32", low=-9, high=10) -> np.ndarray:
    """Integers without zeros (ATen raises on integer division by zero)."""
    values = rand(rng, *shape, dtype=dtype, low=low, high=high)
    return np.where(values == 0, np.ones((), values.dtype), values)


# ---------------------------------------------------------------------------------------------
# Binary ops


TENSOR_PAIRS = [("float32", "float32"), ("float64", "float64"), ("float16", "float16"), ("bfloat16", "bfloat16"),
                ("int32", "int32"), ("int64", "int8"), ("uint8", "int8"), ("int32", "float16"),
                ("bfloat16", "float16"), ("float64", "int32"), ("bool", "bool"), ("bool", "float32"),
                ("uint8", "uint8")]


def tensor_pairs(rng, pairs=TENSOR_PAIRS, low=-3, high=3, divisor=False):
    """Broadcast pairs across dtypes, 0-d promotion, both-sides broadcasting and empty tensors."""
    def second(*shape, dtype):
        if divisor and not dtypes.dtype(dtype).is_floating_point:
            return nonzero(rng, *shape, dtype=dtype, low=low, high=high)
        return rand(rng, *shape, dtype=dtype, low=low, high=high)

    for left, right in pairs:
        yield Sample((rand(rng, 3, 4, dtype=left, low=low, high=high), second(4, dtype=right)),
                     note=f"{left}/{right} broadcast")
    present = {d for pair in pairs for d in pair}
    if "int32" in present and "float64" in present:
        yield Sample((rand(rng, 3, dtype="int32", low=low, high=high), second(dtype="float64")),
                     note="0-d float64 raises int32 to the default float32, not float64")
    if "int8" in present and "int64" in present:
        yield Sample((rand(rng, 3, dtype="int8", low=low, high=high), second(dtype="int64")),
                     note="0-d int64 does not widen int8")
    if "float16" in present:
        yield Sample((rand(rng, 2, 3, dtype="float16", low=low, high=high), second(dtype="float64")),
                     note="0-d float64 does not widen float16")
    yield Sample((rand(rng, 2, 1, 5, low=low, high=high), second(3, 1, dtype="float32")), note="both broadcast")
    yield Sample((rand(rng, low=low, high=high), second(dtype="float32")), note="0-d with 0-d")
    yield Sample((rand(rng, 0, 3, low=low, high=high), second(3, dtype="float32")), note="empty")


def scalar_cases(rng, tensor_dtypes=ALL, values=(2, 1.5, -3, True), low=-3, high=3):
    """Each dtype with Python int/float/bool scalars (wrapped numbers: they raise only the category)."""
    for dtype in tensor_dtypes:
        for value in values:
            yield Sample((rand(rng, 3, 4, dtype=dtype, low=low, high=high), value), note=f"{dtype} with {value!r}")
    yield Sample((rand(rng, dtype="int32", low=low, high=high), 2.5), note="0-d int with float scalar")
    yield Sample((rand(rng, 0, 2, low=low, high=high), 2), note="empty")


def add_mul_tensor_cases(rng):
    yield from tensor_pairs(rng)
    yield Sample((arr(SPECIAL), arr(SPECIAL[::-1])), note="nan/inf/signed zeros")
    yield Sample((arr([100, -100, 127], "int8"), arr(100, "int64")), note="int8 wraps around")
    yield Sample((arr([0.5, -3.0, 1e-3], "float16"), arr(70000, "int64")),
                 note="0-d int64 second operand beyond float16's range")
    yield Sample((arr([0.5, 2.0], "float16"), arr([0.1], "float64")), note="one-element float64 second operand")


def add_mul_scalar_cases(rng):
    yield from scalar_cases(rng)
    yield Sample((arr([1, 2, -128], "int8"), 1000), note="1000 wraps to int8 -24")
    yield Sample((arr([0.5, -10000.0, 1e-3], "float16"), 70000),
                 note="float16 with a scalar beyond its range (mul reads it in float32)")
    yield Sample((arr([0.25, 3.0], "float16"), 0.1), note="float16 with an inexact scalar")
    yield Sample((arr(SPECIAL), -0.0), note="nan/inf/signed zeros")


@samples("aten.mul.Tensor", "aten.multiply.Tensor")
def _mul_tensor(rng):
    yield from add_mul_tensor_cases(rng)


@samples("aten.mul.Scalar", "aten.multiply.Scalar")
def _mul_scalar(rng):
    yield from add_mul_scalar_cases(rng)


@samples("aten.add.Tensor")
def _add_tensor(rng):
    yield from add_mul_tensor_cases(rng)
    yield Sample((rand(rng, 2, 3), rand(rng, 2, 3)), {"alpha": 2.5}, note="float alpha")
    yield Sample((rand(rng, 2, 3, dtype="int32"), rand(rng, 3, dtype="int32")), {"alpha": -3}, note="int alpha")
    yield Sample((rand(rng, 2, 3, dtype="float16"), rand(rng, 3, dtype="float16")), {"alpha": 0.1},
                 note="float16 with inexact alpha")
    yield Sample((rand(rng, 4, dtype="bool"), rand(rng, 4, dtype="bool")), {"alpha": 2}, note="bool: alpha is true")
    yield Sample((rand(rng, 4, dtype="bool"), rand(rng, 4, dtype="bool")), {"alpha": 0}, note="bool: alpha is false")
    yield Sample((rand(rng, 4, dtype="bool"), rand(rng, 4, dtype="bool")), {"alpha": True}, note="bool alpha")
    yield Sample((arr([100, -100], "int8"), arr([3, 7], "int8")), {"alpha": 50}, note="int8 alpha * other wraps")


@samples("aten.add.Scalar")
def _add_scalar(rng):
    yield from add_mul_scalar_cases(rng)
    yield Sample((rand(rng, 2, 3), 1.5, 2.5), note="float alpha")
    yield Sample((rand(rng, 2, 3, dtype="int64"), 4, -2), note="int alpha")
    yield Sample((rand(rng, 2, 3, dtype="bool"), True, 3), note="bool with bool scalar and int alpha")


SUB_PAIRS = [p for p in TENSOR_PAIRS if "bool" not in p]


@samples("aten.sub.Tensor", "aten.rsub.Tensor")
def _sub_tensor(rng):
    yield from tensor_pairs(rng, SUB_PAIRS)
    yield Sample((arr(SPECIAL), arr(SPECIAL[::-1])), note="nan/inf/signed zeros")
    yield Sample((arr([3, 0, 255], "uint8"), arr([5, 1, 255], "uint8")), note="uint8 wraps around")
    yield Sample((rand(rng, 2, 3), rand(rng, 3)), {"alpha": 0.5}, note="float alpha")
    yield Sample((rand(rng, 2, 3, dtype="int16"), rand(rng, 3, dtype="int16")), {"alpha": 3}, note="int alpha")
    yield Sample((rand(rng, 2, 3, dtype="uint8"), rand(rng, 3, dtype="uint8")), {"alpha": 2}, note="uint8 alpha")


@samples("aten.sub.Scalar", "aten.rsub.Scalar")
def _sub_scalar(rng):
    yield from scalar_cases(rng, FLOATS + INTS, values=(2, 1.5, -3))
    yield Sample((arr([1, 2, -128], "int8"), 1000), note="1000 wraps to int8 -24")
    yield Sample((arr([60000.0, -1.0], "float16"), -70000), note="float16 with a scalar beyond its range")
    yield Sample((rand(rng, 2, 3), 1.5, 2.5), note="float alpha")
    yield Sample((rand(rng, 2, 3, dtype="int32"), 4, -2), note="int alpha")
    yield Sample((rand(rng, 2, 3, dtype="uint8"), 4, 2), note="uint8 alpha")


DIV_PAIRS = [p for p in TENSOR_PAIRS if p != ("bool", "bool") and p != ("bool", "float32")] + [("bool", "int32")]


@samples("aten.div.Tensor")
def _div_tensor(rng):
    yield from tensor_pairs(rng, TENSOR_PAIRS)
    yield Sample((arr(SPECIAL), arr(SPECIAL[::-1])), note="nan/inf, division by ±0")
    yield Sample((arr([7, -7, 0], "int32"), arr([0, 0, 0], "int32")), note="true division of ints by zero is inf/nan")
    yield Sample((arr([1.0, 60000.0], "float16"), arr(70000, "int64")),
                 note="0-d int64 divisor beyond float16's range (read in float32)")


@samples("aten.div.Scalar")
def _div_scalar(rng):
    yield from scalar_cases(rng, values=(2, 1.5, -3, True, 0.0))
    yield Sample((arr([1.0, 60000.0, -3.0], "float16"), 70000), note="float16 / scalar beyond its range")
    yield Sample((arr([1.0, 60000.0], "float16"), 1e-5), note="float16 / tiny scalar")


def _div_mode_tensor_cases(rng):
    yield from tensor_pairs(rng, DIV_PAIRS, divisor=True)
    yield Sample((arr([7, -7, 7, -7, 0, -128], "int8"), arr([2, 2, -2, -2, 3, 3], "int8")), note="signs")
    yield Sample((arr([7, 200, 255], "uint8"), arr([2, 3, 255], "uint8")), note="uint8")
    yield Sample((arr(SPECIAL), arr(SPECIAL[::-1])), note="nan/inf, division by ±0")
    yield Sample((arr([5.0, -5.0, -0.5, 0.0, 7.5, -7.5], "float64"), arr([0.0, 0.0, 3.0, -3.0, 2.5, 2.5], "float64")),
                 note="exact and inexact quotients, signed zero results")
    yield Sample((arr([1.0, -60000.0], "float16"), arr(70000, "int64")), note="0-d divisor beyond float16's range")


@samples("aten.div.Tensor_mode")
def _div_tensor_mode(rng):
    for mode in ("trunc", "floor", None):
        for sample in _div_mode_tensor_cases(rng):
            yield Sample(sample.args, {"rounding_mode": mode}, note=f"{mode}: {sample.note}")


@samples("aten.div.Scalar_mode")
def _div_scalar_mode(rng):
    for mode in ("trunc", "floor", None):
        for sample in scalar_cases(rng, FLOATS + INTS, values=(2, -3, 2.5, -0.75)):
            yield Sample(sample.args, {"rounding_mode": mode}, note=f"{mode}: {sample.note}")
        yield Sample((arr(SPECIAL), 0.0), {"rounding_mode": mode}, note=f"{mode}: by zero")
        yield Sample((arr(SPECIAL), -3), {"rounding_mode": mode}, note=f"{mode}: specials")
        yield Sample((arr([1.0, -60000.0], "float16"), 70000), {"rounding_mode": mode},
                     note=f"{mode}: scalar beyond float16's range")


@samples("aten.floor_divide.default")
def _floor_divide(rng):
    yield from _div_mode_tensor_cases(rng)


@samples("aten.floor_divide.Scalar")
def _floor_divide_scalar(rng):
    yield from scalar_cases(rng, FLOATS + INTS, values=(2, -3, 2.5, -0.75))
    yield Sample((arr(SPECIAL), 0.0), note="by zero")


@samples("aten.remainder.Tensor", "aten.fmod.Tensor")
def _remainder_tensor(rng):
    yield from tensor_pairs(rng, DIV_PAIRS, divisor=True)
    yield Sample((arr([7, -7, 7, -7, 0, -128], "int8"), arr([3, 3, -3, -3, 3, -1], "int8")), note="signs")
    yield Sample((arr([5.0, -5.0, 3.0, -0.0, 0.0, 5.5, INF, NAN]), arr([INF, INF, -INF, -3.0, -3.0, 0.0, 2.0, 1.0])),
                 note="infinite divisors, signed zeros, zero divisor, inf dividend")
    yield Sample((rand(rng, 3, 4, dtype="float16"), arr([-1.5, 2.25, -0.75, 3.0], "float16")), note="float16")


@samples("aten.remainder.Scalar", "aten.fmod.Scalar")
def _remainder_scalar(rng):
    yield from scalar_cases(rng, FLOATS + INTS, values=(2, -3, 2.5, -0.75))
    yield Sample((arr([5.0, -5.0, -0.0, 0.0]), -3), note="signed zeros")
    yield Sample((arr([5.0, -5.0]), 0), note="float by zero is nan")


# pow


@samples("aten.pow.Tensor_Tensor")
def _pow_tensor(rng):
    for left, right in [("float32", "float32"), ("float64", "float64"), ("float16", "float16"),
                        ("bfloat16", "bfloat16"), ("float32", "int64"), ("int64", "float32")]:
        yield Sample((positive(rng, 3, 4, dtype=left), rand(rng, 4, dtype=right)), note=f"{left}/{right}")
    yield Sample((rand(rng, 3, 4), arr([0.0, 1.0, 2.0, 3.0])), note="negative bases, integral exponents")
    yield Sample((rand(rng, 3, 4), arr([0.5, -1.5, 2.5, 0.25])), note="negative bases, fractional exponents (nan)")
    yield Sample((rand(rng, 3, 4, dtype="int32", low=-3, high=4), rand(rng, 4, dtype="int32", low=0, high=6)),
                 note="int32")
    yield Sample((arr([-1, 1, 0, 2, -2, -1, 0], "int64"), arr([-3, -5, 0, -1, -2, -2, 3], "int64")),
                 note="integers to negative powers: 1, ±1 or 0")
    yield Sample((arr([2, 3, -3, 7], "int8"), arr([7, 9, 5, 3], "int8")), note="int8 wraps around")
    yield Sample((arr([2, 3], "uint8"), arr(9, "int64")), note="uint8 with 0-d int64 exponent")
    yield Sample((arr([NAN, INF, -INF, 0.0, -0.0, 1.0, -1.0]), arr([0.0, -1.0, 3.0, -1.0, -1.0, NAN, INF])),
                 note="special values")
    yield Sample((rand(rng, 2, 1, 3, dtype="float64"), rand(rng, 4, 1, dtype="int32", low=0, high=4)),
                 note="both broadcast")
    yield Sample((positive(rng, 0, 3), rand(rng, 3)), note="empty")


@samples("aten.pow.Tensor_Scalar")
def _pow_tensor_scalar(rng):
    for exponent in (2, 3, 0.5, -0.5, -1, -2, 0, 1, 2.5, -1.5, True, 1.0):
        yield Sample((rand(rng, 3, 4), exponent), note=f"float32 ** {exponent!r}")
    for dtype in ("float64", "float16", "bfloat16"):
        yield Sample((positive(rng, 3, 4, dtype=dtype), 0.1), note=f"{dtype} ** inexact")
        yield Sample((rand(rng, 3, 4, dtype=dtype), 3), note=f"{dtype} cubed")
    for dtype in INTS:
        yield Sample((rand(rng, 3, 4, dtype=dtype, low=-4, high=5), 3), note=f"{dtype} cubed")
        yield Sample((rand(rng, 3, 4, dtype=dtype, low=-4, high=5), 0), note=f"{dtype} ** 0")
    yield Sample((arr([2, 3, -3], "int8"), 9), note="int8 wraps around")
    yield Sample((rand(rng, 3, 4, dtype="int64", low=1, high=5), -1.0), note="int ** negative float: float32")
    yield Sample((rand(rng, 3, 4, dtype="int32", low=0, high=5), 0.5), note="int ** float: float32")
    yield Sample((rand(rng, 3, 4, dtype="bool"), 2), note="bool ** int: int64")
    yield Sample((rand(rng, 3, 4, dtype="bool"), 2.0), note="bool ** float: float32")
    yield Sample((rand(rng, 3, 4, dtype="bool"), False), note="bool ** False: ones (ATen skips the kernel)")
    yield Sample((rand(rng, 3, 4, dtype="bool"), True), note="bool ** True: a copy")
    yield Sample((arr([NAN, INF, -INF, 0.0, -0.0, 1.0, -1.0]), -1), note="specials ** -1")
    yield Sample((arr([NAN, INF, -INF, 0.0, -0.0, 1.0, -1.0]), 0), note="nan ** 0 is 1")
    yield Sample((arr([0.0, 2.0, -1.5]), False), note="float ** False: ones (torch's gradient is nan at 0)")
    yield Sample((rand(rng), 2), note="0-d")


@samples("aten.pow.Scalar")
def _pow_scalar(rng):
    yield Sample((2, rand(rng, 3, 4)), note="int base, float exponent")
    yield Sample((2.5, rand(rng, 3, 4, dtype="float64")), note="float base, float64 exponent")
    yield Sample((-8.0, arr([1 / 3, 2.0, 0.5])), note="negative base")
    yield Sample((2, rand(rng, 3, 4, dtype="int8", low=0, high=9)), note="int base, int8 exponent: int8, wraps")
    yield Sample((2, arr([-1, 2, -3, 0], "int64")), note="int base, negative int exponents")
    yield Sample((-1, arr([-1, 2, -3, 0], "int64")), note="-1 to negative int powers")
    yield Sample((2.0, rand(rng, 3, 4, dtype="int32", low=0, high=5)), note="float base, int exponent: float32")
    yield Sample((1, arr([NAN, INF, -3.0])), note="one to any power")
    yield Sample((0, arr([-1.0, 0.0, 0.5, 2.0])), note="zero base: flat (no gradient) for exponents >= 0")
    yield Sample((1, rand(rng, 4, dtype="bool")), note="int base, bool exponent: int64")
    yield Sample((0.5, rand(rng, 2, 3, dtype="float16")), note="float16 exponent")
    yield Sample((3, rand(rng, 0, 2)), note="empty")


# atan2, maximum, minimum

@samples("aten.atan2.default")
def _atan2(rng):
    yield from tensor_pairs(rng)
    yield Sample((arr([0.0, -0.0, 0.0, -0.0, INF, -INF, INF, NAN, 1.0]),
                  arr([0.0, 0.0, -0.0, -0.0, INF, INF, 2.0, 1.0, NAN])), note="signed zeros, infinities, nan")


@samples("aten.atan2.out")
def _atan2_out(rng):
    yield Sample((rand(rng, 3, 4), rand(rng, 4)), {"out": np.zeros((3, 4), np.float32)}, note="float32")
    yield Sample((rand(rng, 3, 4, dtype="float64"), rand(rng, 4)), {"out": np.zeros((3, 4), np.float16)},
                 note="float64 result written to float16")
    yield Sample((rand(rng, 3, dtype="int32"), rand(rng, 3, dtype="int64")), {"out": np.zeros(3, np.float64)},
                 note="ints into float64")
    yield Sample((rand(rng, 2, 1), rand(rng, 3)), {"out": np.zeros((2, 3), np.float32)}, note="broadcast")


@samples("aten.maximum.default", "aten.minimum.default", "aten.max.other", "aten.min.other")
def _extremum(rng):
    yield from tensor_pairs(rng)
    yield Sample((arr(SPECIAL), arr(SPECIAL[::-1])), note="nan propagates")
    yield Sample((arr([1, 5, -3], "int8"), arr(1000, "int64")), note="0-d int64 wraps into int8")
    yield Sample((arr([1.0, -2.0, 0.5, 3.0]), arr([1.0, 0.5, 0.5, -3.0])), note="ties (the gradient is split)")


# comparisons, logical, bitwise

COMPARISONS = [f"aten.{name}.{{}}" for name in ("eq", "ne", "lt", "le", "gt", "ge")]


@samples(*[c.format("Tensor") for c in COMPARISONS])
def _compare_tensor(rng):
    yield from tensor_pairs(rng, low=-2, high=2)
    yield Sample((arr(SPECIAL), arr(SPECIAL[::-1])), note="nan compares false except ne")
    yield Sample((arr([-24, 100], "int8"), arr(1000, "int64")), note="0-d int64 wraps into int8")
    yield Sample((arr([2**24 + 1, 3], "int64"), arr([2**24, 3], "float32")), note="compared in float32")


@samples(*[c.format("Scalar") for c in COMPARISONS])
def _compare_scalar(rng):
    yield from scalar_cases(rng, values=(1, 0.5, -2, True), low=-2, high=2)
    yield Sample((arr([-24, 100, 127], "int8"), 1000), note="1000 wraps to int8 -24")
    yield Sample((arr([65504.0, 1.0], "float16"), 65519), note="65519 rounds to float16 65504")
    yield Sample((arr([65504.0, INF], "float16"), 70000), note="70000 is inf in float16")
    yield Sample((arr(SPECIAL), NAN), note="nan scalar")
    yield Sample((arr(SPECIAL), -0.0), note="-0.0 equals 0.0")


@samples("aten.logical_and.default", "aten.logical_or.default", "aten.logical_xor.default")
def _logical(rng):
    yield from tensor_pairs(rng, low=-1, high=2)
    yield Sample((arr([NAN, 0.0, -0.0, INF, 0.5]), arr([1.0, NAN, 1.0, 0.0, -0.0])), note="nan is true, -0.0 false")


@samples("aten.logical_not.default")
def _logical_not(rng):
    for dtype in ALL:
        yield Sample((rand(rng, 3, 4, dtype=dtype, low=-1, high=2),), note=dtype)
    yield Sample((arr([NAN, 0.0, -0.0, INF]),), note="nan is true, -0.0 false")
    yield Sample((rand(rng, 0, 2),), note="empty")


INTEGRAL_PAIRS = [("int32", "int32"), ("int64", "int8"), ("uint8", "int8"), ("bool", "bool"), ("bool", "int16"),
                  ("uint8", "uint8")]


@samples("aten.bitwise_and.Tensor", "aten.bitwise_or.Tensor", "aten.bitwise_xor.Tensor")
def _bitwise_tensor(rng):
    for left, right in INTEGRAL_PAIRS:
        yield Sample((rand(rng, 3, 4, dtype=left, low=-100, high=100), rand(rng, 4, dtype=right, low=-100, high=100)),
                     note=f"{left}/{right}")
    yield Sample((rand(rng, 3, dtype="int8", low=-100, high=100), arr(1000, "int64")), note="0-d int64 wraps into int8")
    yield Sample((rand(rng, 0, 3, dtype="int32"), rand(rng, 3, dtype="int32")), note="empty")


@samples("aten.__and__.Tensor", "aten.__or__.Tensor", "aten.__xor__.Tensor")
def _dunder_bitwise_tensor(rng):
    yield from _bitwise_tensor(rng)
    yield Sample((rand(rng, 2, 1, 4, dtype="bool"), rand(rng, 3, 1, dtype="bool")), note="bool masks broadcast")


@samples("aten.__and__.Scalar", "aten.__or__.Scalar", "aten.__xor__.Scalar")
def _dunder_bitwise_scalar(rng):
    yield from _bitwise_scalar(rng)


@samples("aten.bitwise_and.Scalar", "aten.bitwise_or.Scalar", "aten.bitwise_xor.Scalar")
def _bitwise_scalar(rng):
    for dtype in INTS + ("bool",):
        for value in (5, -1, True):
            yield Sample((rand(rng, 3, 4, dtype=dtype, low=-100, high=100), value), note=f"{dtype} with {value!r}")
    yield Sample((arr([1, 2, -3], "int8"), 1000), note="1000 wraps to int8")
    yield Sample((arr([1, 200], "uint8"), -2), note="-2 wraps to uint8 254")


@samples("aten.bitwise_not.default")
def _bitwise_not(rng):
    for dtype in INTS + ("bool",):
        yield Sample((rand(rng, 3, 4, dtype=dtype, low=-100, high=100),), note=dtype)
    yield Sample((arr(5, "int64"),), note="0-d")


# ---------------------------------------------------------------------------------------------
# Unary ops


def unary_cases(rng, accepted=ALL, low=-3.0, high=3.0, special=SPECIAL):
    for dtype in accepted:
        yield Sample((rand(rng, 3, 5, dtype=dtype, low=low, high=high),), note=dtype)
    floating = [d for d in accepted if dtypes.dtype(d).is_floating_point]
    if floating:
        yield Sample((arr(special, floating[0]),), note="special values")
        if "float16" in floating:
            yield Sample((arr(special, "float16"),), note="float16 special values")
    yield Sample((rand(rng, dtype=accepted[0], low=low, high=high),), note="0-d")
    yield Sample((rand(rng, 0, 2, dtype=accepted[0], low=low, high=high),), note="empty")


# (name, low, high) of the inputs each function is defined on; special values cover the rest
FLOAT_MATH = [("acos", -1, 1), ("asin", -1, 1), ("atanh", -1, 1), ("acosh", 1, 4), ("asinh", -3, 3),
              ("atan", -3, 3), ("cos", -3, 3), ("cosh", -3, 3), ("erf", -3, 3), ("exp", -3, 3), ("expm1", -3, 3),
              ("log", 0, 4), ("log10", 0, 4), ("log1p", -1, 4), ("log2", 0, 4), ("reciprocal", -3, 3),
              ("rsqrt", 0, 4), ("sigmoid", -8, 8), ("sin", -3, 3), ("sinh", -3, 3), ("sqrt", 0, 4),
              ("tan", -1.5, 1.5), ("tanh", -3, 3)]


def _register_float_math(name: str, low: float, high: float) -> None:
    @samples(f"aten.{name}.default")
    def generate(rng):
        yield from unary_cases(rng, low=low, high=high)
        if name == "erf":
            yield Sample((arr([-30, -6, -5.9, -2.857, -1.25, -0.84375, -1e-300, 1e-10, 0.84, 1.2, 2.8, 2.9, 5.99, 6.0,
                               27.0], "float64"),), note="every branch of the rational approximation")
        if name == "sigmoid":
            yield Sample((arr([-100.0, -20.0, 20.0, 100.0], "float16"),), note="saturation in float16")


for _name, _low, _high in FLOAT_MATH:
    _register_float_math(_name, _low, _high)


@samples("aten.ceil.default", "aten.floor.default", "aten.round.default", "aten.trunc.default")
def _rounding(rng):
    yield from unary_cases(rng, FLOATS + INTS)
    yield Sample((arr([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 1e20, -0.2, 4.4999]),), note="ties round half to even")
    yield Sample((arr([0.5, 1.5, 2.5, -0.5, 1000.5], "float16"),), note="float16 ties")


@samples("aten.abs.default")
def _abs(rng):
    yield from unary_cases(rng, FLOATS + INTS)
    yield Sample((arr([-128, 127, 0], "int8"),), note="abs(-128) wraps in int8")


@samples("aten.neg.default")
def _neg(rng):
    yield from unary_cases(rng, FLOATS + INTS)
    yield Sample((arr([-128, 127, 0], "int8"),), note="-(-128) wraps in int8")
    yield Sample((arr([0, 3, 255], "uint8"),), note="uint8 wraps")


@samples("aten.sign.default")
def _sign(rng):
    yield from unary_cases(rng, ALL)
    yield Sample((arr([NAN] * 20 + [-0.0, 1.0]),), note="sign(nan) is 0")


@samples("aten.isnan.default", "aten.isinf.default")
def _nan_inf(rng):
    yield from unary_cases(rng, ALL)


@samples("aten.relu.default")
def _relu(rng):
    yield from unary_cases(rng, FLOATS + INTS)


@samples("aten.leaky_relu.default")
def _leaky_relu(rng):
    yield from unary_cases(rng, FLOATS)
    yield Sample((rand(rng, 3, 4), 0.2), note="slope 0.2")
    yield Sample((rand(rng, 3, 4, dtype="float64"), -1.5), note="negative slope")
    yield Sample((rand(rng, 3, 4, dtype="float16"), 3), note="float16, int slope")


@samples("aten.elu.default")
def _elu(rng):
    # 16 special values: torch's elu_backward gives NaN at a NaN input in its vector loop but grad * scale in its
    # scalar tail; kiln follows the vector loop, which this length keeps the backward in
    yield from unary_cases(rng, FLOATS, special=SPECIAL + [2.0, -2.0])
    yield Sample((rand(rng, 3, 4), 2.0, 3.0, 0.5), note="alpha, scale, input_scale")
    yield Sample((rand(rng, 3, 4, dtype="bfloat16"), 1.6732632423543772, 1.0507009873554805), note="selu constants")
    yield Sample((rand(rng, 3, 4, dtype="float64"), 0.5, 2, 3), note="float64")


# No infinities: ATen's vectorized erf/tanh give NaN there, its scalar tail the limits.
FINITE_SPECIAL = [v for v in SPECIAL if abs(v) != INF]


@samples("aten.gelu.default")
def _gelu(rng):
    for approximate in ("none", "tanh"):
        for sample in unary_cases(rng, FLOATS, low=-5, high=5, special=FINITE_SPECIAL):
            yield Sample(sample.args, {"approximate": approximate}, note=f"{approximate}: {sample.note}")


@samples("aten.hardtanh.default")
def _hardtanh(rng):
    yield from unary_cases(rng, FLOATS + ("int64", "int32", "int16", "int8"))  # uint8 refuses the default -1
    yield Sample((rand(rng, 3, 4), -0.5, 2.0), note="custom bounds")
    yield Sample((rand(rng, 3, 4), 2.0, -1.0), note="min > max gives max")
    yield Sample((rand(rng, 3, 4, dtype="int32"), -1.5, 2.5), note="int: bounds truncate to -1, 2")
    yield Sample((rand(rng, 3, 4, dtype="uint8", high=9), 0, 5), note="uint8")
    # 16 elements: torch's hardtanh_backward gives 0 at a NaN (input or bound) in its vector loop but passes the
    # gradient in its scalar tail; kiln follows the vector loop, which this length keeps the backward in (the
    # special values above have their NaN first, inside the vector loop)
    yield Sample((arr(SPECIAL + [2.0, -2.0]), NAN, 1.0), note="nan bound: all nan")
    yield Sample((rand(rng, 3, 4, dtype="float16"), -1, 1000.5), note="float16")
    yield Sample((arr([-2.0, -1.0, 0.0, 1.0, 2.0]),), note="at the bounds (no gradient there)")


@samples("aten.clamp.default")
def _clamp(rng):
    for dtype in FLOATS + INTS:
        yield Sample((rand(rng, 3, 4, dtype=dtype), -1, 2), note=f"{dtype}")
    yield Sample((rand(rng, 3, 4), -0.5, None), note="min only")
    yield Sample((rand(rng, 3, 4), None, 0.5), note="max only")
    yield Sample((rand(rng, 3, 4), 2.0, -1.0), note="min > max gives max")
    yield Sample((arr([-2.0, -1.0, 0.0, 1.0, 2.0]), -1.0, 1.0), note="at the bounds (the gradient passes)")
    yield Sample((rand(rng, 3, 4, dtype="int32"), -1.5, 2.5), note="int with float bounds: float32")
    yield Sample((rand(rng, 3, 4, dtype="int8"), 2.5), note="int8 with float min: float32")
    yield Sample((rand(rng, 3, 4, dtype="bool"), 0, 0), note="bool with int bounds: int64")
    yield Sample((rand(rng, 3, 4, dtype="uint8"), -3), note="uint8 with -3: wraps to 253")
    yield Sample((arr(SPECIAL), -1.0, 1.0), note="nan input stays nan")
    yield Sample((arr(SPECIAL), NAN, 1.0), note="nan bound: all nan")
    yield Sample((arr(SPECIAL), NAN), note="nan min only: all nan")
    yield Sample((arr(SPECIAL, "float16"), NAN, 70000), note="nan bound: the other is never converted")
    yield Sample((rand(rng, 3, 4, dtype="float16"), 0.1, 0.7), note="float16 inexact bounds")
    yield Sample((rand(rng), 0.0, 1.0), note="0-d")
    yield Sample((rand(rng, 0, 3), 0.0, 1.0), note="empty")


@samples("aten.clamp.Tensor")
def _clamp_tensor(rng):
    yield Sample((rand(rng, 3, 4), rand(rng, 4, low=-2, high=0), rand(rng, 3, 1, low=0, high=2)), note="broadcast")
    yield Sample((rand(rng, 3, 4), rand(rng, 3, 4), None), note="min only")
    yield Sample((rand(rng, 3, 4, dtype="float64"), None, rand(rng, 4)), note="max only")
    yield Sample((rand(rng, 3, 4), arr(1.0), arr(-1.0)), note="min > max gives max")
    yield Sample((arr([-2.0, -1.0, 0.0, 1.0, 2.0]), arr(-1.0), arr([-1.0, 1.0, 1.0, 1.0, 1.0])),
                 note="at the bounds: self gets the gradient, the bound none; min == max")
    yield Sample((arr([1.0, 100.0, NAN]), arr([1000.0, NAN, 0.0]), arr(0.0)), note="nan bound or input: nan")
    yield Sample((rand(rng, 3, dtype="int32"), arr(1.5), None), note="0-d float min: float32")
    yield Sample((rand(rng, 3, dtype="int8"), arr(200, "int64"), None), note="0-d int64 min wraps into int8")
    yield Sample((rand(rng, 3, dtype="int8"), arr([1000], "int64"), None), note="1-d int64 min: int64")
    yield Sample((rand(rng, 4, dtype="bool"), rand(rng, 4, dtype="bool"), None), note="bool, min only")
    yield Sample((rand(rng, 4, dtype="bool"), None, arr(2, "int64")), note="bool, 0-d int max: int64")
    yield Sample((rand(rng, 2, 3, dtype="float16"), rand(rng, 3, dtype="float16"), rand(rng, 3, dtype="bfloat16")),
                 note="float16 with bfloat16 bound: float32")


@samples("aten.where.self")
def _where(rng):
    yield Sample((rand(rng, 3, 4, dtype="bool"), rand(rng, 3, 4), rand(rng, 4)))
    yield Sample((rand(rng, 4, dtype="bool"), rand(rng, 3, 4, dtype="int32"), rand(rng, 1, dtype="float16")),
                 note="int32/float16: float16")
    yield Sample((rand(rng, 3, 1, dtype="bool"), rand(rng, 4, dtype="int8"), arr(1000, "int64")),
                 note="0-d int64 wraps into int8")
    yield Sample((rand(rng, 3, dtype="bool"), arr(2.5, "float64"), rand(rng, 3, dtype="int64")),
                 note="0-d float64 with int64: float32")
    yield Sample((rand(rng, 2, 3, dtype="bool"), rand(rng, 2, 3, dtype="bool"), rand(rng, 3, dtype="uint8")),
                 note="bool/uint8")
    yield Sample((rand(rng, 0, 3, dtype="bool"), rand(rng, 3), rand(rng, 3)), note="empty")
    yield Sample((arr(True, "bool"), arr([NAN, 1.0]), arr(2.0)), note="0-d condition")


# ---------------------------------------------------------------------------------------------
# Copies and conversions


CONVERSIONS = [("float32", "int32"), ("float32", "uint8"), ("float64", "float16"), ("float32", "bfloat16"),
               ("bfloat16", "float16"), ("int64", "float32"), ("int32", "int8"), ("int64", "bool"),
               ("float32", "bool"), ("bool", "float32"), ("uint8", "int64"), ("float16", "float64")]


@samples("aten._to_copy.default")
def _to_copy(rng):
    for source, target in CONVERSIONS:
        yield Sample((rand(rng, 3, 4, dtype=source, low=-100, high=100),), {"dtype": dtypes.dtype(target)},
                     note=f"{source} to {target}")
    yield Sample((rand(rng, 3, 4),), note="no dtype: a copy")
    yield Sample((arr([NAN, INF, -0.0, 0.0, 1e-30]),), {"dtype": dtypes.bool_}, note="nan and inf are true")
    yield Sample((arr([-2.7, 2.7, -0.5, 127.9]),), {"dtype": dtypes.int8}, note="float to int truncates")
    yield Sample((arr([1e5, -1e5, 3.14159]),), {"dtype": dtypes.float16}, note="overflow to inf")
    yield Sample((arr([300, -1, 256], "int32"),), {"dtype": dtypes.uint8}, note="int to uint8 wraps")
    yield Sample((rand(rng, 2, 3),), {"dtype": dtypes.float64, "non_blocking": True}, note="non_blocking")
    yield Sample((rand(rng),), {"dtype": dtypes.int64}, note="0-d")


@samples("aten.clone.default", "aten.alias.default")
def _clone(rng):
    for dtype in ALL:
        yield Sample((rand(rng, 3, 4, dtype=dtype),), note=dtype)
    yield Sample((rand(rng),), note="0-d")
    yield Sample((rand(rng, 0, 4),), note="empty")


@samples("aten.copy.default")
def _copy(rng):
    yield Sample((np.zeros((2, 3), np.int32), arr([1.7, -1.7, 3.0])), note="broadcast and truncate")
    yield Sample((rand(rng, 3, 4), rand(rng, 3, 4, dtype="float64")), note="float64 into float32")
    yield Sample((rand(rng, 3, dtype="bool"), arr([0.5, 0.0, -2.0])), note="to bool")
    yield Sample((rand(rng, 2, 3, dtype="float16"), arr(5, "int64")), note="0-d source")
    yield Sample((rand(rng, 4, 1, 3, dtype="bfloat16"), rand(rng, 1, 3)), note="bfloat16")
    yield Sample((rand(rng, 0, 3), rand(rng, 3)), note="empty")


@samples("aten.zero.default")
def _zero(rng):
    for dtype in ALL:
        yield Sample((rand(rng, 3, 4, dtype=dtype),), note=dtype)
    yield Sample((rand(rng),), note="0-d")
    yield Sample((rand(rng, 0, 4),), note="empty")


@samples("aten.fill.Scalar")
def _fill(rng):
    yield Sample((rand(rng, 3, 4), 2.5), note="float32")
    yield Sample((rand(rng, 3, 4, dtype="int32"), 2.7), note="float into int truncates")
    yield Sample((rand(rng, 3, 4, dtype="int32"), -2.7), note="truncates toward zero")
    yield Sample((rand(rng, 3, dtype="uint8"), -3), note="-3 wraps into uint8")
    yield Sample((rand(rng, 3, dtype="bool"), 2), note="nonzero is true")
    yield Sample((rand(rng, 3, dtype="bool"), NAN), note="nan is true")
    yield Sample((rand(rng, 2, 2, dtype="float16"), INF), note="inf")
    yield Sample((rand(rng, 2, 2, dtype="bfloat16"), 0.1), note="bfloat16")
    yield Sample((rand(rng, 2, dtype="float64"), True), note="bool value")
    yield Sample((rand(rng), 7), note="0-d")
    yield Sample((rand(rng, 1, dtype="float16"), 70000), note="one-element float16: unchecked, inf")
    yield Sample((rand(rng, 0, 3, dtype="int8"), 7), note="empty")


@samples("aten.fill.Tensor")
def _fill_tensor(rng):
    yield Sample((rand(rng, 3, 4), rand(rng)), note="float32")
    yield Sample((rand(rng, 3, 4, dtype="int64"), arr(2.7)), note="float into int truncates")
    yield Sample((rand(rng, 2, 3), arr(5, "int64")), note="int into float")
    yield Sample((rand(rng, 3, dtype="bool"), arr(2.0)), note="nonzero is true")
    yield Sample((rand(rng), rand(rng, dtype="float64")), note="0-d")


# ---------------------------------------------------------------------------------------------
# Composite ops

ACTIVATION_SPECIAL = [NAN, INF, -INF, 0.0, -0.0, -3.0, 3.0, -2.9, 6.0, 25.0, -25.0, 100.0, -100.0]


@samples("aten.silu.default", "aten.hardswish.default", "aten.hardsigmoid.default", "aten.mish.default",
         "aten.log_sigmoid.default")
def _float_activation(rng):
    yield from unary_cases(rng, FLOATS, low=-5, high=5, special=ACTIVATION_SPECIAL)


@samples("aten.softplus.default")
def _softplus(rng):
    yield from unary_cases(rng, FLOATS, low=-5, high=5, special=ACTIVATION_SPECIAL)
    yield Sample((rand(rng, 3, 4, low=-3, high=3), 2, 1), note="beta 2, threshold 1")
    yield Sample((rand(rng, 3, 4, dtype="float16"), 0.5, 1.5), note="float16")
    yield Sample((arr([19.9, 20.1, 10.0, 10.1], "float64"), 2, 20.0), note="around the threshold")


@samples("aten.relu6.default")
def _relu6(rng):
    yield from unary_cases(rng, FLOATS + INTS, low=-10, high=10, special=ACTIVATION_SPECIAL)


@samples("aten.square.default")
def _square(rng):
    yield from unary_cases(rng, ALL, low=-20, high=20)
    yield Sample((arr([16, -12], "int8"),), note="int8 wraps")


@samples("aten.masked_fill.Scalar")
def _masked_fill_scalar(rng):
    yield Sample((rand(rng, 3, 4), rand(rng, 3, 4, dtype="bool"), -1.5), note="float32")
    yield Sample((rand(rng, 3, 4, dtype="int8"), rand(rng, 4, dtype="bool"), 2.7), note="float value truncates")
    yield Sample((rand(rng, 4), rand(rng, 2, 4, dtype="bool"), NAN), note="mask broadcasts self")
    yield Sample((rand(rng, 3, dtype="bool"), rand(rng, 3, dtype="bool"), True), note="bool")
    yield Sample((rand(rng, 3, dtype="float16"), arr(True, "bool"), 1e4), note="0-d mask")
    yield Sample((rand(rng, 0, 3, dtype="int64"), rand(rng, 3, dtype="bool"), 7), note="empty")


@samples("aten.masked_fill.Tensor")
def _masked_fill_tensor(rng):
    yield Sample((rand(rng, 3, 4), rand(rng, 3, 4, dtype="bool"), arr(-1.5)), note="float32")
    yield Sample((rand(rng, 3, 4, dtype="int32"), rand(rng, 4, dtype="bool"), arr(3.7)), note="float into int")
    yield Sample((rand(rng, 4, dtype="float16"), rand(rng, 2, 4, dtype="bool"), arr(0.1, "float64")),
                 note="float64 value into float16, mask broadcasts self")
    yield Sample((rand(rng, 3, dtype="bfloat16"), rand(rng, 3, dtype="bool"), arr(NAN)), note="nan")


@samples("aten.clamp_min.default", "aten.clamp_max.default")
def _clamp_one_side(rng):
    for dtype in FLOATS + INTS:
        yield Sample((rand(rng, 3, 4, dtype=dtype), 1), note=dtype)
    yield Sample((rand(rng, 3, 4, dtype="int32"), 0.5), note="int with float bound: float32")
    yield Sample((rand(rng, 3, 4, dtype="bool"), 0), note="bool with int bound: int64")
    yield Sample((arr(SPECIAL), -1.0), note="nan input stays nan")
    yield Sample((arr(SPECIAL), NAN), note="nan bound: all nan")


@samples("aten.clamp_min.Tensor", "aten.clamp_max.Tensor")
def _clamp_one_side_tensor(rng):
    yield Sample((rand(rng, 3, 4), rand(rng, 4)), note="broadcast")
    yield Sample((rand(rng, 3, dtype="int32"), arr(0.5)), note="0-d float bound: float32")
    yield Sample((rand(rng, 4, dtype="bool"), rand(rng, 4, dtype="bool")), note="bool")
    yield Sample((arr([1.0, NAN, 3.0]), arr([NAN, 0.0, 2.0])), note="nan propagates")


@samples("aten.where.ScalarSelf")
def _where_scalar_self(rng):
    yield Sample((rand(rng, 3, 4, dtype="bool"), 2.5, rand(rng, 4)), note="float32")
    yield Sample((rand(rng, 3, dtype="bool"), 2.5, rand(rng, 3, dtype="int8")), note="float scalar, int8: float32")
    yield Sample((rand(rng, 3, dtype="bool"), 7, rand(rng, 2, 3, dtype="int16")), note="int16")
    yield Sample((rand(rng, 3, dtype="bool"), True, rand(rng, 3, dtype="float16")), note="bool scalar")


@samples("aten.where.ScalarOther")
def _where_scalar_other(rng):
    yield Sample((rand(rng, 3, 4, dtype="bool"), rand(rng, 4), -1.5), note="float32")
    yield Sample((rand(rng, 3, dtype="bool"), rand(rng, 3, dtype="int64"), 0.5), note="int64 with float: float32")
    yield Sample((rand(rng, 2, 3, dtype="bool"), rand(rng, 3, dtype="uint8"), 9), note="uint8")
    yield Sample((rand(rng, 3, dtype="bool"), rand(rng, 3, dtype="float16"), 70000), note="float16: unchecked, inf")


@samples("aten.where.Scalar")
def _where_scalar(rng):
    yield Sample((rand(rng, 3, 4, dtype="bool"), 2.5, 1), note="float and int: float32")
    yield Sample((rand(rng, 3, dtype="bool"), 3, -4), note="ints: int64")
    yield Sample((rand(rng, 2, dtype="bool"), True, False), note="bools")


@samples("aten.to.dtype")
def _to_dtype(rng):
    for source, target in CONVERSIONS[:6]:
        yield Sample((rand(rng, 3, 4, dtype=source, low=-100, high=100), dtypes.dtype(target)),
                     note=f"{source} to {target}")
    yield Sample((rand(rng, 3, 4), dtypes.float32), note="same dtype")
    yield Sample((rand(rng, 3, 4), dtypes.float32, False, True), note="same dtype, copy=True")


@samples("aten.to.dtype_layout")
def _to_dtype_layout(rng):
    for source, target in CONVERSIONS[:6]:
        yield Sample((rand(rng, 3, 4, dtype=source, low=-100, high=100),), {"dtype": dtypes.dtype(target)},
                     note=f"{source} to {target}")
    yield Sample((rand(rng, 3, 4),), {"dtype": dtypes.float32, "layout": 0, "device": "cpu"},
                 note="same dtype, strided, cpu: an alias")
    yield Sample((rand(rng, 2, 3),), {"device": "cpu"}, note="device only")
    yield Sample((rand(rng, 2, 3),), {"dtype": dtypes.float32, "copy": True}, note="same dtype, copy=True")


@samples("aten.to.device")
def _to_device(rng):
    for source, target in CONVERSIONS[:4]:
        yield Sample((rand(rng, 3, 4, dtype=source, low=-100, high=100), "cpu", dtypes.dtype(target)),
                     note=f"{source} to {target}")
    yield Sample((rand(rng, 3, 4), "cpu", dtypes.float32), note="same dtype: an alias")


@samples("aten.to.other")
def _to_other(rng):
    yield Sample((rand(rng, 3, 4), rand(rng, 2, dtype="int32", low=0, high=5)), note="float32 like an int32 tensor")
    yield Sample((rand(rng, 3, dtype="int64", low=-9, high=9), rand(rng, 1, dtype="float16")), note="to float16")
    yield Sample((rand(rng, 3), rand(rng, 1)), note="same dtype")


@samples("aten.type_as.default")
def _type_as(rng):
    yield Sample((rand(rng, 3, 4), rand(rng, 2, dtype="int32", low=0, high=5)), note="float32 like an int32 tensor")
    yield Sample((rand(rng, 3, dtype="int64", low=-9, high=9), rand(rng, 1, dtype="float16")), note="to float16")
    yield Sample((rand(rng, 2, 3, dtype="bool"), rand(rng, 1, dtype="float64")), note="bool to float64")
    yield Sample((rand(rng, 3), rand(rng, 1)), note="same dtype")


@samples("aten.lerp.Scalar")
def _lerp_scalar(rng):
    for dtype in FLOATS:
        for weight in (0.25, 0.75):
            yield Sample((rand(rng, 3, 4, dtype=dtype), rand(rng, 4, dtype=dtype), weight), note=f"{dtype} {weight}")
    yield Sample((rand(rng, 3), rand(rng, 2, 3), -1.5), note="extrapolation, broadcast")
    yield Sample((arr([NAN, INF, 1.0]), arr([0.0, 1.0, INF]), 0.5), note="special values")


@samples("aten.lerp.Tensor")
def _lerp_tensor(rng):
    for dtype in FLOATS:
        yield Sample((rand(rng, 3, 4, dtype=dtype), rand(rng, 4, dtype=dtype), rand(rng, 3, 1, dtype=dtype, low=-1,
                                                                                   high=2)), note=dtype)
    yield Sample((arr([NAN, INF, 1.0]), arr([0.0, 1.0, INF]), arr([0.5, 0.2, 0.7])), note="special values")


def addc_cases(rng):
    for dtype in FLOATS:
        yield Sample((rand(rng, 3, 4, dtype=dtype), rand(rng, 4, dtype=dtype), positive(rng, 3, 1, dtype=dtype)),
                     {"value": 0.5}, note=dtype)
    yield Sample((rand(rng, 3, 4), rand(rng, 4), positive(rng, 3, 4)), note="default value")
    yield Sample((rand(rng, 3, dtype="int32"), rand(rng, 3), positive(rng, 3, dtype="float64")), {"value": 2},
                 note="mixed dtypes")
    yield Sample((rand(rng, 3, dtype="float16"), rand(rng, 3, dtype="float16"), arr([0.0, 1.0, -2.0], "float16")),
                 {"value": -1}, note="division by zero")


@samples("aten.addcmul.default")
def _addcmul(rng):
    yield from addc_cases(rng)
    yield Sample((rand(rng, 3, dtype="int64"), rand(rng, 3, dtype="int64"), rand(rng, 3, dtype="int8")), {"value": 2.5},
                 note="integers: value truncates to 2")
    yield Sample((arr([100], "int8"), arr([50], "int8"), arr([3], "int8")), {"value": 2}, note="int8 wraps")


@samples("aten.addcdiv.default")
def _addcdiv(rng):
    yield from addc_cases(rng)


@samples("aten.logit.default")
def _logit(rng):
    yield from unary_cases(rng, FLOATS, low=0.01, high=0.99)
    for eps in (0.1, 0.0, 0.25):
        yield Sample((rand(rng, 3, 4, low=-0.5, high=1.5), eps), note=f"eps {eps}")
    yield Sample((rand(rng, 3, 4, dtype="float16", low=0, high=1), 0.01), note="float16 eps")
    yield Sample((rand(rng, 3, dtype="int32", low=0, high=2),), note="int: float32")
    yield Sample((arr([NAN, 0.0, 1.0, 0.5]), 0.2), note="nan with eps")
