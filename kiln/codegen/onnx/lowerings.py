"""The ONNX lowering table: one entry per kiln op name, each a small function emitting standard ONNX nodes.

Simple ops come from tables (`_UNARY`, `_BINARY`, ...); the rest are `@lowers(...)` functions. Ops missing
here are decomposed before lowering (see `export.py`); `UNSUPPORTED` lists the ops no ONNX graph can express.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import sympy

from kiln.ir import dtypes
from kiln.ir.dialect import bound_arguments
from kiln.ir.errors import UnsupportedError
from kiln.ir.ops.nn import conv_output_size, linear_taps, nearest_source  # ATen's rules, defined with the ops

from kiln.codegen.onnx.context import Lowering, LoweringContext, normalize_axes, normalize_axis
from kiln.codegen.onnx.graph import INT64_MAX, INT64_MIN, Value, onnx_dtype

LOWERING_TABLE: dict[str, Lowering] = {}

# Ops that have no ONNX translation, with the reason shown to users.
COMPLEX_VALUES = ("complex values: onnxruntime has no complex tensors, and kiln runs these as real pairs only "
                  "between real program inputs and outputs")
UNSUPPORTED: dict[str, str] = {
    # Between real inputs and outputs the lower-complex pass runs these as (real, imaginary) pairs (Llama 4's
    # rotary embedding, FNet's FFTs as DFT matrix products); a program that takes or returns a complex value keeps
    # them, and they have no ONNX form (ONNX's DFT takes and returns real [..., 2] tensors).
    **dict.fromkeys(("aten.polar.default", "aten.view_as_complex.default", "aten.view_as_real.default",
                     "aten._fft_r2c.default", "aten._fft_c2r.default", "aten._fft_c2c.default"), COMPLEX_VALUES),
    # ONNX has sparse initializers but no sparse runtime values: sparse weights are written densified (see
    # docs/sparsity.md); ops that compute on sparse values have nothing to lower to.
    **{name: "ONNX has no sparse runtime values; densify with .to_dense() before exporting, or keep the sparse "
             "tensor a weight (written densified)"
       for name in ("aten._sparse_log_softmax.int", "aten._sparse_mm.default", "aten._sparse_softmax.int",
                    "aten._sparse_sum.default", "aten._sparse_sum.dim", "aten._to_dense.default",
                    "aten._to_sparse.default", "aten._to_sparse.sparse_dim", "aten._to_sparse_bsc.default",
                    "aten._to_sparse_bsr.default", "aten._to_sparse_csc.default", "aten._to_sparse_csr.default",
                    "aten.sparse_sampled_addmm.default")},
}


def lowers(*names: str) -> Callable[[Lowering], Lowering]:
    def register(fn: Lowering) -> Lowering:
        for name in names:
            LOWERING_TABLE[name] = fn
        return fn
    return register


_LOW_PRECISION = dtypes.REDUCED_FLOATS


def _compute_dtype(dtype: dtypes.DType) -> dtypes.DType:
    """onnxruntime's CPU kernels cover float32/float64; reduced floats compute in float32 like ATen's opmath."""
    return dtypes.float32 if dtype in _LOW_PRECISION else dtype


# ---------------------------------------------------------------------------------------------
# Pointwise


def _unary(build: Callable[[LoweringContext, str, dtypes.DType], str], float_only: bool = True) -> Lowering:
    def lower(ctx: LoweringContext, x: Value, *_: Any) -> str:
        out = ctx.out_dtype
        compute = _compute_dtype(out if float_only or out.is_floating_point else out)
        if not compute.is_floating_point and float_only:
            compute = dtypes.float32
        result = build(ctx, ctx.as_dtype(x, compute), compute)
        return ctx.graph.cast(result, compute, out)
    return lower


def _simple(op_type: str) -> Callable[[LoweringContext, str, dtypes.DType], str]:
    return lambda ctx, x, dtype: ctx.node(op_type, [x])


def _float32_kernel(op_type: str, double: Callable[[LoweringContext, str, dtypes.DType], str]) -> Callable[..., str]:
    """onnxruntime implements `op_type` for float32 only (or, for float64, too inexactly: Sigmoid): float64 uses an
    equivalent double-precision formula."""
    def build(ctx: LoweringContext, x: str, t: dtypes.DType) -> str:
        return double(ctx, x, t) if t is dtypes.float64 else ctx.node(op_type, [x])
    return build


def _log1p(ctx: LoweringContext, x: str, t: dtypes.DType) -> str:
    # Goldberg's trick: log(u) * x / (u - 1) with u = 1 + x cancels u's rounding error; exact x where u == 1.
    u = ctx.node("Add", [x, ctx.const(1, t)])
    u_minus_one = ctx.node("Sub", [u, ctx.const(1, t)])
    ratio = ctx.node("Div", [ctx.node("Mul", [ctx.node("Log", [u]), x]), u_minus_one])
    ratio = ctx.node("Where", [ctx.node("IsInf", [x], detect_negative=0), x, ratio])
    return ctx.node("Where", [ctx.node("Equal", [u_minus_one, ctx.const(0, t)]), x, ratio])


def _expm1(ctx: LoweringContext, x: str, t: dtypes.DType) -> str:
    # Kahan's trick: (u - 1) * x / log(u) with u = exp(x); exact x where u == 1, -1 where u - 1 == -1.
    u = ctx.node("Exp", [x])
    u_minus_one = ctx.node("Sub", [u, ctx.const(1, t)])
    ratio = ctx.node("Div", [ctx.node("Mul", [u_minus_one, x]), ctx.node("Log", [u])])
    ratio = ctx.node("Where", [ctx.node("Equal", [u_minus_one, ctx.const(-1, t)]), u_minus_one, ratio])
    ratio = ctx.node("Where", [ctx.node("IsInf", [u]), u, ratio])
    return ctx.node("Where", [ctx.node("Equal", [u_minus_one, ctx.const(0, t)]), x, ratio])


def _series(ctx: LoweringContext, x: str, t: dtypes.DType, coefficient: Callable[[int], float], terms: int,
            step: str) -> str:
    """sum_k coefficient(k) * x * step^k (Horner form)."""
    total = ctx.const(coefficient(terms - 1), t)
    for k in range(terms - 2, -1, -1):
        total = ctx.node("Add", [ctx.node("Mul", [total, step]), ctx.const(coefficient(k), t)])
    return ctx.node("Mul", [total, x])


def _atan64(ctx: LoweringContext, x: str, t: dtypes.DType) -> str:
    magnitude = ctx.node("Abs", [x])
    one = ctx.const(1, t)
    inverted = ctx.node("Greater", [magnitude, one])
    value = ctx.node("Where", [inverted, ctx.node("Reciprocal", [magnitude]), magnitude])
    for _ in range(2):  # atan(v) = 2 atan(v / (1 + sqrt(1 + v^2))): |v| <= tan(pi/16) after two halvings
        root = ctx.node("Sqrt", [ctx.node("Add", [one, ctx.node("Mul", [value, value])])])
        value = ctx.node("Div", [value, ctx.node("Add", [one, root])])
    squared = ctx.node("Neg", [ctx.node("Mul", [value, value])])
    result = ctx.node("Mul", [_series(ctx, value, t, lambda k: 1 / (2 * k + 1), 14, squared), ctx.const(4, t)])
    result = ctx.node("Where", [inverted, ctx.node("Sub", [ctx.const(math.pi / 2, t), result]), result])
    return ctx.node("Mul", [result, ctx.node("Sign", [x])])


def _asin64(ctx: LoweringContext, x: str, t: dtypes.DType) -> str:
    root = ctx.node("Sqrt", [ctx.node("Sub", [ctx.const(1, t), ctx.node("Mul", [x, x])])])
    return _atan64(ctx, ctx.node("Div", [x, root]), t)


def _acos64(ctx: LoweringContext, x: str, t: dtypes.DType) -> str:
    one = ctx.const(1, t)
    ratio = ctx.node("Div", [ctx.node("Sub", [one, x]), ctx.node("Add", [one, x])])
    return ctx.node("Mul", [_atan64(ctx, ctx.node("Sqrt", [ratio]), t), ctx.const(2, t)])


def _sinh64(ctx: LoweringContext, x: str, t: dtypes.DType) -> str:
    exp_x, exp_minus = ctx.node("Exp", [x]), ctx.node("Exp", [ctx.node("Neg", [x])])
    large = ctx.node("Mul", [ctx.node("Sub", [exp_x, exp_minus]), ctx.const(0.5, t)])
    small = _series(ctx, x, t, lambda k: 1 / math.factorial(2 * k + 1), 9, ctx.node("Mul", [x, x]))
    return ctx.node("Where", [ctx.node("Less", [ctx.node("Abs", [x]), ctx.const(1, t)]), small, large])


def _cosh64(ctx: LoweringContext, x: str, t: dtypes.DType) -> str:
    total = ctx.node("Add", [ctx.node("Exp", [x]), ctx.node("Exp", [ctx.node("Neg", [x])])])
    return ctx.node("Mul", [total, ctx.const(0.5, t)])


# Above this, a^2 + 1 is a^2 in float64 (and a^2 overflows past 1e154): asinh(a) and acosh(a) are log(2a).
_HYPERBOLIC_LARGE = 2.0 ** 28


def _log_of_double(ctx: LoweringContext, magnitude: str, t: dtypes.DType) -> str:
    return ctx.node("Add", [ctx.node("Log", [magnitude]), ctx.const(math.log(2), t)])


def _asinh64(ctx: LoweringContext, x: str, t: dtypes.DType) -> str:
    magnitude = ctx.node("Abs", [x])
    squared = ctx.node("Mul", [magnitude, magnitude])
    root = ctx.node("Sqrt", [ctx.node("Add", [squared, ctx.const(1, t)])])
    # asinh(a) = log1p(a + a^2 / (1 + sqrt(1 + a^2))), accurate for small a
    argument = ctx.node("Add", [magnitude, ctx.node("Div", [squared, ctx.node("Add", [root, ctx.const(1, t)])])])
    large = ctx.node("Greater", [magnitude, ctx.const(_HYPERBOLIC_LARGE, t)])
    result = ctx.node("Where", [large, _log_of_double(ctx, magnitude, t), _log1p(ctx, argument, t)])
    signed = ctx.node("Where", [ctx.node("Less", [x, ctx.const(0, t)]), ctx.node("Neg", [result]), result])  # odd
    # a zero is x itself, so asinh(-0) is -0: from Where's false branch (its true branch turns -0 into +0)
    return ctx.node("Where", [ctx.node("Greater", [magnitude, ctx.const(0, t)]), signed, x])


def _acosh64(ctx: LoweringContext, x: str, t: dtypes.DType) -> str:
    one = ctx.const(1, t)  # sqrt(x - 1) sqrt(x + 1): NaN below 1 (x^2 - 1 is not), and no overflow
    root = ctx.node("Mul", [ctx.node("Sqrt", [ctx.node("Sub", [x, one])]),
                            ctx.node("Sqrt", [ctx.node("Add", [x, one])])])
    large = ctx.node("Greater", [x, ctx.const(_HYPERBOLIC_LARGE, t)])
    return ctx.node("Where", [large, _log_of_double(ctx, x, t), ctx.node("Log", [ctx.node("Add", [x, root])])])


def _atanh64(ctx: LoweringContext, x: str, t: dtypes.DType) -> str:
    ratio = ctx.node("Div", [ctx.node("Mul", [x, ctx.const(2, t)]), ctx.node("Sub", [ctx.const(1, t), x])])
    return ctx.node("Mul", [_log1p(ctx, ratio, t), ctx.const(0.5, t)])


def _erf64(ctx: LoweringContext, x: str, t: dtypes.DType) -> str:
    """Taylor series below |x| = 2.5, the erfc continued fraction above (both within 1e-14 of libm)."""
    magnitude = ctx.node("Abs", [x])
    clipped = ctx.node("Min", [magnitude, ctx.const(2.5, t)])
    series = _series(ctx, clipped, t, lambda k: 2 / math.sqrt(math.pi) * (-1) ** k / (math.factorial(k) * (2 * k + 1)),
                     44, ctx.node("Mul", [clipped, clipped]))
    far = ctx.node("Max", [magnitude, ctx.const(2.5, t)])
    fraction = far
    for k in range(60, 0, -1):
        fraction = ctx.node("Add", [far, ctx.node("Div", [ctx.const(k / 2, t), fraction])])
    erfc = ctx.node("Div", [ctx.node("Exp", [ctx.node("Neg", [ctx.node("Mul", [far, far])])]),
                            ctx.node("Mul", [fraction, ctx.const(math.sqrt(math.pi), t)])])
    tail = ctx.node("Sub", [ctx.const(1, t), erfc])
    result = ctx.node("Where", [ctx.node("Less", [magnitude, ctx.const(2.5, t)]), series, tail])
    return ctx.node("Mul", [result, ctx.node("Sign", [x])])


def _sigmoid64(ctx: LoweringContext, x: str, t: dtypes.DType) -> str:
    """1 / (1 + exp(-x)): onnxruntime's float64 Sigmoid (1.32) loses the tail (relative error 3.6e-8 at -20, 4% at
    -36) and is 0 below -36.7, where ATen's is 8.5e-17 at -37 and 2.7e-261 at -600."""
    exp = ctx.node("Exp", [ctx.node("Neg", [x])])
    return ctx.node("Reciprocal", [ctx.node("Add", [exp, ctx.const(1, t)])])


def _erf(ctx: LoweringContext, x: str, t: dtypes.DType) -> str:
    return _erf64(ctx, x, t) if t is dtypes.float64 else ctx.node("Erf", [x])


_UNARY: dict[str, Callable[[LoweringContext, str, dtypes.DType], str]] = {
    "acos": _float32_kernel("Acos", _acos64), "acosh": _float32_kernel("Acosh", _acosh64),
    "asin": _float32_kernel("Asin", _asin64), "asinh": _float32_kernel("Asinh", _asinh64),
    "atan": _float32_kernel("Atan", _atan64), "atanh": _float32_kernel("Atanh", _atanh64),
    "cos": _simple("Cos"), "cosh": _float32_kernel("Cosh", _cosh64), "erf": _erf, "exp": _simple("Exp"),
    "log": _simple("Log"), "sin": _simple("Sin"), "sinh": _float32_kernel("Sinh", _sinh64),
    "sqrt": _simple("Sqrt"), "tanh": _simple("Tanh"),
    "tan": _float32_kernel("Tan", lambda ctx, x, t: ctx.node("Div", [ctx.node("Sin", [x]), ctx.node("Cos", [x])])),
    "sigmoid": _float32_kernel("Sigmoid", _sigmoid64), "reciprocal": _simple("Reciprocal"),
    "expm1": _expm1, "log1p": _log1p,
    "log2": lambda ctx, x, t: ctx.node("Div", [ctx.node("Log", [x]), ctx.const(math.log(2), t)]),
    "log10": lambda ctx, x, t: ctx.node("Div", [ctx.node("Log", [x]), ctx.const(math.log(10), t)]),
    "rsqrt": lambda ctx, x, t: ctx.node("Reciprocal", [ctx.node("Sqrt", [x])]),
}
for _name, _build in _UNARY.items():
    LOWERING_TABLE[f"aten.{_name}.default"] = _unary(_build)

# Ops that keep integer dtypes (no float conversion).
_ROUNDING = {"ceil": "Ceil", "floor": "Floor", "round": "Round"}


def _rounding_toward_zero(ctx: LoweringContext, value: str, t: dtypes.DType) -> str:
    """trunc: Floor above 0, else Ceil. The Ceil (whose result may be -0: trunc(-0.4)) is Where's false branch,
    since onnxruntime's Where turns a -0 it takes from its true branch into +0 (docs/onnx.md)."""
    positive = ctx.node("Greater", [value, ctx.const(0, t)])
    return ctx.node("Where", [positive, ctx.node("Floor", [value]), ctx.node("Ceil", [value])])


@lowers(*(f"aten.{n}.default" for n in _ROUNDING), "aten.trunc.default")
def _rounding(ctx: LoweringContext, x: Value) -> str:
    if not x.dtype.is_floating_point:
        return ctx.node("Identity", [x.name])
    compute = _compute_dtype(x.dtype)
    value = ctx.as_dtype(x, compute)
    name = ctx.op.name.split(".")[1]
    if name == "trunc":
        result = _rounding_toward_zero(ctx, value, compute)
    else:
        result = ctx.node(_ROUNDING[name], [value])
    return ctx.graph.cast(result, compute, x.dtype)


def _same_dtype_unary(onnx_op: str, bool_op: str | None = None) -> Lowering:
    def lower(ctx: LoweringContext, x: Value) -> str:
        if x.dtype.is_bool and bool_op:
            return ctx.node(bool_op, [x.name])
        compute = _compute_dtype(x.dtype)
        if x.dtype in (dtypes.int8, dtypes.int16, dtypes.uint8):
            compute = dtypes.int32
        return ctx.graph.cast(ctx.node(onnx_op, [ctx.as_dtype(x, compute)]), compute, ctx.out_dtype)
    return lower


LOWERING_TABLE["aten.abs.default"] = _same_dtype_unary("Abs", "Identity")
LOWERING_TABLE["aten.neg.default"] = _same_dtype_unary("Neg")
@lowers("aten.sign.default")
def _sign(ctx: LoweringContext, x: Value) -> str:
    result = _same_dtype_unary("Sign", "Identity")(ctx, x)
    if not x.dtype.is_floating_point:
        return result
    return ctx.node("Where", [ctx.node("IsNaN", [x.name]), ctx.const(0, x.dtype), result])  # ATen: sign(NaN) = 0
LOWERING_TABLE["aten.bitwise_not.default"] = _same_dtype_unary("BitwiseNot", "Not")


@lowers("aten.logical_not.default")
def _logical_not(ctx: LoweringContext, x: Value) -> str:
    return ctx.graph.cast(ctx.node("Not", [_truthy(ctx, x)]), dtypes.bool_, ctx.out_dtype)


def _truthy(ctx: LoweringContext, x: Value) -> str:
    if x.dtype.is_bool:
        return x.name
    if not x.dtype.is_floating_point and not x.dtype.is_complex:  # Cast is `!= 0` there; for floats NaN needs care
        return ctx.node("Cast", [x.name], to=onnx_dtype(dtypes.bool_))
    return ctx.node("Not", [ctx.node("Equal", [x.name, ctx.const(0, x.dtype)])])


@lowers("aten.isnan.default")
def _isnan(ctx: LoweringContext, x: Value) -> str:
    if not x.dtype.is_floating_point:
        return ctx.node("ConstantOfShape", [ctx.shape(x)], value=_scalar_tensor(False, dtypes.bool_))
    return ctx.node("IsNaN", [ctx.as_dtype(x, _compute_dtype(x.dtype))])


@lowers("aten.isinf.default")
def _isinf(ctx: LoweringContext, x: Value) -> str:
    if not x.dtype.is_floating_point:
        return ctx.node("ConstantOfShape", [ctx.shape(x)], value=_scalar_tensor(False, dtypes.bool_))
    return ctx.node("IsInf", [ctx.as_dtype(x, _compute_dtype(x.dtype))])


def _scalar_tensor(value: Any, dtype: dtypes.DType) -> Any:
    from onnx import numpy_helper
    array = np.asarray([value]).astype(dtype.numpy)
    if dtype is dtypes.bfloat16:
        from onnx import helper
        return helper.make_tensor("value", onnx_dtype(dtype), [1], array.view(np.uint16).tobytes(), raw=True)
    return numpy_helper.from_array(array, "value")


# -- binary arithmetic: inputs are cast to the result dtype (ATen computes in the promoted dtype)

def _arith(build: Callable[..., str], scalar_in_opmath: bool = False) -> Lowering:
    """`scalar_in_opmath`: ATen's mul/div read a float16/bfloat16 op's other operand in float32 (no rounding)."""
    def lower(ctx: LoweringContext, a: Any, b: Any, *rest: Any, **options: Any) -> str:
        out = ctx.out_dtype
        compute = _compute_dtype(out)
        if compute in (dtypes.int8, dtypes.int16, dtypes.uint8):
            compute = dtypes.int32
        semantic = ctx.declared_dtype
        if scalar_in_opmath and semantic in _LOW_PRECISION:
            semantic = compute
        left, right = ctx.operand(a, semantic, compute), ctx.operand(b, semantic, compute)
        return ctx.graph.cast(build(ctx, left, right, compute, *rest, **options), compute, out)
    return lower


def _with_alpha(op_type: str) -> Callable[..., str]:
    def build(ctx: LoweringContext, a: str, b: str, dtype: dtypes.DType, alpha: Any = 1) -> str:
        if dtype.is_bool:
            alpha = bool(alpha)
            if not alpha:  # `a`, broadcast with `b` as the sum would be
                return ctx.node("Expand", [a, ctx.dims(ctx.out.shape)])
        if alpha != 1:
            b = ctx.node("Mul", [b, ctx.as_dtype(alpha, dtype)])
        if dtype.is_bool:  # bool + bool is logical or in ATen
            return ctx.node({"Add": "Or", "Sub": "Xor"}[op_type], [a, b])
        return ctx.node(op_type, [a, b])
    return build


def _mul(ctx: LoweringContext, a: str, b: str, dtype: dtypes.DType) -> str:
    return ctx.node("And" if dtype.is_bool else "Mul", [a, b])


def _true_div(ctx: LoweringContext, a: str, b: str, dtype: dtypes.DType) -> str:
    return ctx.node("Div", [a, b])


def _signed_adjustment(ctx: LoweringContext, mod: str, b: str, dtype: dtypes.DType) -> str:
    """Where C's fmod and Python's % differ: a nonzero remainder whose sign differs from the divisor's."""
    zero = ctx.const(0, dtype)
    signs_differ = ctx.node("Xor", [ctx.node("Less", [b, zero]), ctx.node("Less", [mod, zero])])
    return ctx.node("And", [ctx.node("Not", [ctx.node("Equal", [mod, zero])]), signs_differ])


def _floor_div(ctx: LoweringContext, a: str, b: str, dtype: dtypes.DType) -> str:
    if not dtype.is_floating_point:
        remainder = ctx.node("Mod", [a, b], fmod=0)
        return ctx.node("Div", [ctx.node("Sub", [a, remainder]), b])
    # c10::div_floor_floating: exact for nan/inf and ±0 (Floor(a / b) is not: inf / inf, 5 // inf, -0 // 3).
    one = ctx.const(1, dtype)
    mod = ctx.node("Mod", [a, b], fmod=1)
    div = ctx.node("Div", [ctx.node("Sub", [a, mod]), b])
    div = ctx.node("Where", [_signed_adjustment(ctx, mod, b, dtype), ctx.node("Sub", [div, one]), div])
    floored = ctx.node("Floor", [div])
    round_up = ctx.node("Greater", [ctx.node("Sub", [div, floored]), ctx.const(0.5, dtype)])
    floored = ctx.node("Where", [round_up, ctx.node("Add", [floored, one]), floored])
    quotient = ctx.node("Div", [a, b])
    # a zero quotient keeps a / b's sign (|a / b| < 1 there, so multiplying by 0 cannot give NaN). onnxruntime's
    # Where turns a -0 it takes from its true branch into +0, so the signed zero goes in the false one, under a
    # condition its optimizer does not swap back (it rewrites Where(Not(c), x, y) as Where(c, y, x))
    signed_zero = ctx.node("Mul", [quotient, ctx.const(0, dtype)])
    nonzero = ctx.node("Greater", [ctx.node("Abs", [div]), ctx.const(0, dtype)])
    floored = ctx.node("Where", [nonzero, floored, signed_zero])
    return ctx.node("Where", [ctx.node("Equal", [b, ctx.const(0, dtype)]), quotient, floored])


def _trunc_div(ctx: LoweringContext, a: str, b: str, dtype: dtypes.DType) -> str:
    quotient = ctx.node("Div", [a, b])
    if not dtype.is_floating_point:
        return quotient  # ONNX integer Div truncates
    return _rounding_toward_zero(ctx, quotient, dtype)


def _integer_mod(ctx: LoweringContext, a: str, b: str, fmod: int) -> str:
    """Integer Mod. By a constant 0, ATen raises unless the operand is empty, while onnxruntime refuses the whole
    model when it creates the kernel ("Integer modulo by zero"): the empty result is a * 0 (fuzzing, seed 10000)."""
    divisor = ctx.graph.model.constant(b)
    if divisor is not None and not np.any(divisor):
        return ctx.node("Mul", [a, b])
    return ctx.node("Mod", [a, b], fmod=fmod)


def _fmod(ctx: LoweringContext, a: str, b: str, dtype: dtypes.DType) -> str:
    return ctx.node("Mod", [a, b], fmod=1) if dtype.is_floating_point else _integer_mod(ctx, a, b, 1)


def _remainder(ctx: LoweringContext, a: str, b: str, dtype: dtypes.DType) -> str:
    if not dtype.is_floating_point:
        return _integer_mod(ctx, a, b, 0)
    # fmod, moved to the divisor's sign (ATen's formula: exact for infinite divisors and signed zeros)
    mod = ctx.node("Mod", [a, b], fmod=1)
    return ctx.node("Where", [_signed_adjustment(ctx, mod, b, dtype), ctx.node("Add", [mod, b]), mod])


def _pow(ctx: LoweringContext, a: str, b: str, dtype: dtypes.DType) -> str:
    if dtype.is_bool:  # x ** y on bools: true unless x is false and y true
        return ctx.node("Or", [a, ctx.node("Not", [b])])
    if dtype.is_integral:
        return _integer_pow(ctx, a, b, dtype)
    return ctx.node("Pow", [a, b])


def _integer_pow(ctx: LoweringContext, a: str, b: str, dtype: dtypes.DType) -> str:
    """ATen's `powi`: square and multiply in the integer type, wrapping, and for a negative exponent 1 (base 1),
    ±1 (base -1, by the exponent's parity) or 0. onnxruntime's integer Pow goes through double, which rounds
    large powers and turns 0 ** -n into INT64_MIN.

    `dtype` (the kernel's) may be wider than the result's n-bit type, which keeps the same residues mod 2**n. Those
    depend on the exponent's low n - 2 bits for an odd base (its order mod 2**n divides 2**(n-2)), and an even base
    to the n-th power or more is 0, so n - 2 steps of the square-and-multiply suffice; a constant exponent takes
    only the steps its bits need."""
    bits = ctx.out_dtype.itemsize * 8
    zero, one = ctx.const(0, dtype), ctx.const(1, dtype)
    constant = ctx.graph.model.constant(b)
    exponent = int(constant.item()) if constant is not None and constant.size == 1 and constant.item() >= 0 else None
    steps = max(exponent.bit_length(), 1) if exponent is not None else bits - 2
    result, power = None, a
    for step in range(steps):
        if exponent is None or exponent >> step & 1:
            taken = power if result is None else ctx.node("Mul", [result, power])
            if exponent is None:  # the step's bit of each exponent
                bit = ctx.node("Equal", [ctx.node("BitwiseAnd", [b, ctx.const(1 << step, dtype)]), zero])
                taken = ctx.node("Where", [bit, one if result is None else result, taken])
            result = taken
        if step + 1 < steps:
            power = ctx.node("Mul", [power, power])
    result = one if result is None else result
    if exponent is not None:
        return result if exponent else ctx.node("Expand", [one, ctx.node("Shape", [a])])
    if bits > 2:
        even_base = ctx.node("Equal", [ctx.node("BitwiseAnd", [a, one]), zero])
        vanishes = ctx.node("And", [even_base, ctx.node("GreaterOrEqual", [b, ctx.const(bits, dtype)])])
        result = ctx.node("Where", [vanishes, zero, result])
    if not ctx.out_dtype.is_signed:
        return result
    minus_one = ctx.const(-1, dtype)
    odd_exponent = ctx.node("Not", [ctx.node("Equal", [ctx.node("BitwiseAnd", [b, one]), zero])])
    base_minus_one = ctx.node("Where", [odd_exponent, minus_one, one])
    negative = ctx.node("Where", [ctx.node("Equal", [a, one]), one,
                                  ctx.node("Where", [ctx.node("Equal", [a, minus_one]), base_minus_one, zero])])
    return ctx.node("Where", [ctx.node("Less", [b, zero]), negative, result])


def _sign_bit(ctx: LoweringContext, x: str, dtype: dtypes.DType) -> str:
    """True for negative values and -0 (1 / -0 is -inf)."""
    zero = ctx.const(0, dtype)
    return ctx.node("Or", [ctx.node("Less", [x, zero]), ctx.node("Less", [ctx.node("Reciprocal", [x]), zero])])


def _atan2(ctx: LoweringContext, y: str, x: str, dtype: dtypes.DType, **_: Any) -> str:
    """libm's atan2: the first-quadrant angle atan(|y| / |x|), reflected by the signs (signed zeros included)."""
    zero, inf = ctx.const(0, dtype), ctx.const(math.inf, dtype)
    magnitude_y, magnitude_x = ctx.node("Abs", [y]), ctx.node("Abs", [x])
    angle = _UNARY["atan"](ctx, ctx.node("Div", [magnitude_y, magnitude_x]), dtype)
    both_zero = ctx.node("And", [ctx.node("Equal", [magnitude_y, zero]), ctx.node("Equal", [magnitude_x, zero])])
    both_inf = ctx.node("And", [ctx.node("Equal", [magnitude_y, inf]), ctx.node("Equal", [magnitude_x, inf])])
    angle = ctx.node("Where", [both_zero, zero, angle])  # 0 / 0 and inf / inf are NaN
    angle = ctx.node("Where", [both_inf, ctx.const(math.pi / 4, dtype), angle])
    angle = ctx.node("Where", [_sign_bit(ctx, x, dtype), ctx.node("Sub", [ctx.const(math.pi, dtype), angle]), angle])
    return ctx.node("Where", [_sign_bit(ctx, y, dtype), ctx.node("Neg", [angle]), angle])


def _max_min(op_type: str) -> Callable[..., str]:
    def build(ctx: LoweringContext, a: str, b: str, dtype: dtypes.DType) -> str:
        if dtype.is_bool:
            return ctx.node("Or" if op_type == "Max" else "And", [a, b])
        result = ctx.node(op_type, [a, b])
        if dtype.is_floating_point:  # ATen propagates NaN from either side
            either_nan = ctx.node("Or", [ctx.node("IsNaN", [a]), ctx.node("IsNaN", [b])])
            result = ctx.node("Where", [either_nan, ctx.node("Add", [a, b]), result])
        return result
    return build


_ARITH: dict[str, Callable[..., str]] = {
    "aten.add.Tensor": _with_alpha("Add"), "aten.add.Scalar": _with_alpha("Add"),
    "aten.sub.Tensor": _with_alpha("Sub"), "aten.sub.Scalar": _with_alpha("Sub"),
    "aten.mul.Tensor": _mul, "aten.mul.Scalar": _mul,
    "aten.div.Tensor": _true_div, "aten.div.Scalar": _true_div,
    "aten.remainder.Tensor": _remainder, "aten.remainder.Scalar": _remainder,
    "aten.fmod.Tensor": _fmod, "aten.fmod.Scalar": _fmod,
    "aten.pow.Tensor_Tensor": _pow, "aten.pow.Scalar": _pow,
    "aten.atan2.default": _atan2, "aten.atan2.out": _atan2,
    "aten.maximum.default": _max_min("Max"), "aten.minimum.default": _max_min("Min"),
}
for _name, _build in _ARITH.items():
    LOWERING_TABLE[_name] = _arith(_build, scalar_in_opmath=_name.startswith(("aten.mul.", "aten.div.")))


@lowers("aten.pow.Tensor_Scalar")
def _pow_tensor_scalar(ctx: LoweringContext, a: Any, b: Any) -> str:
    """ATen computes float x ** 0.5 and x ** -0.5 as sqrt and rsqrt: (-inf) ** 0.5 is NaN, not Pow's inf, and
    (-0.0) ** -0.5 is -inf. Its float16 kernel calls pow (torch 2.13)."""
    if ctx.declared_dtype.is_floating_point and ctx.declared_dtype != dtypes.float16 and \
            isinstance(b, (int, float)) and not isinstance(b, bool) and b in (0.5, -0.5):
        compute = _compute_dtype(ctx.out_dtype)
        root = ctx.node("Sqrt", [ctx.operand(a, ctx.declared_dtype, compute)])
        if b == -0.5:
            root = ctx.node("Reciprocal", [root])
        return ctx.graph.cast(root, compute, ctx.out_dtype)
    return _arith(_pow)(ctx, a, b)


@lowers("aten.div.Tensor_mode", "aten.div.Scalar_mode")
def _div_mode(ctx: LoweringContext, a: Any, b: Any, rounding_mode: str | None = None) -> str:
    build = {None: _true_div, "floor": _floor_div, "trunc": _trunc_div}[rounding_mode]
    return _arith(build, scalar_in_opmath=True)(ctx, a, b)


_BITWISE = {"bitwise_and": ("BitwiseAnd", "And"), "bitwise_or": ("BitwiseOr", "Or"),
            "bitwise_xor": ("BitwiseXor", "Xor")}


def _bitwise(int_op: str, bool_op: str) -> Lowering:
    def lower(ctx: LoweringContext, a: Any, b: Any) -> str:
        out = ctx.out_dtype
        return ctx.node(bool_op if out.is_bool else int_op, [ctx.operand(a, out, out), ctx.operand(b, out, out)])
    return lower


for _name, (_int_op, _bool_op) in _BITWISE.items():
    LOWERING_TABLE[f"aten.{_name}.Tensor"] = LOWERING_TABLE[f"aten.{_name}.Scalar"] = _bitwise(_int_op, _bool_op)

_LOGICAL = {"logical_and": "And", "logical_or": "Or", "logical_xor": "Xor"}


def _logical(op_type: str) -> Lowering:
    def lower(ctx: LoweringContext, a: Value, b: Value) -> str:
        return ctx.graph.cast(ctx.node(op_type, [_truthy(ctx, a), _truthy(ctx, b)]), dtypes.bool_, ctx.out_dtype)
    return lower


for _name, _op in _LOGICAL.items():
    LOWERING_TABLE[f"aten.{_name}.default"] = _logical(_op)

# -- comparisons compute in the promoted dtype of their operands
_COMPARE = {"eq": ("Equal", False), "ne": ("Equal", True), "lt": ("Less", False), "le": ("LessOrEqual", False),
            "gt": ("Greater", False), "ge": ("GreaterOrEqual", False)}


def _compare(op_type: str, negate: bool) -> Lowering:
    def lower(ctx: LoweringContext, a: Value, b: Any) -> str:
        # (a size as the scalar, `counts == 256 * u1`, promotes as an int does)
        other = (b.type.with_dtype(ctx.original_dtype(b)) if isinstance(b, Value)
                 else (int(b) if b.is_number else 0) if isinstance(b, sympy.Expr) else b)
        semantic = dtypes.result_type(a.type.with_dtype(ctx.original_dtype(a)), other)
        compute = _compute_dtype(semantic)
        if compute.is_bool and op_type != "Equal":
            compute = dtypes.int32
        if compute in (dtypes.int8, dtypes.int16, dtypes.uint8):
            compute = dtypes.int32
        result = ctx.node(op_type, [ctx.operand(a, semantic, compute), ctx.operand(b, semantic, compute)])
        return ctx.node("Not", [result]) if negate else result
    return lower


for _name, (_op, _negate) in _COMPARE.items():
    LOWERING_TABLE[f"aten.{_name}.Tensor"] = LOWERING_TABLE[f"aten.{_name}.Scalar"] = _compare(_op, _negate)


@lowers("aten.where.self")
def _where(ctx: LoweringContext, condition: Value, a: Value, b: Value) -> str:
    out = ctx.out_dtype
    compute = _kernel_dtype(out)
    result = ctx.node("Where", [_truthy(ctx, condition), ctx.as_dtype(a, compute), ctx.as_dtype(b, compute)])
    return ctx.graph.cast(result, compute, out)


def _kernel_dtype(dtype: dtypes.DType) -> dtypes.DType:
    """A dtype onnxruntime's CPU kernels cover for data-selecting ops (no bool/8/16-bit Where, Max, ...)."""
    if dtype in (dtypes.bool_, dtypes.int8, dtypes.int16, dtypes.uint8):
        return dtypes.int32
    return _compute_dtype(dtype)


# -- activations

@lowers("aten.relu.default")
def _relu(ctx: LoweringContext, x: Value) -> str:
    if x.dtype.is_floating_point:
        compute = _compute_dtype(x.dtype)
        return ctx.graph.cast(ctx.node("Relu", [ctx.as_dtype(x, compute)]), compute, x.dtype)
    compute = _kernel_dtype(x.dtype)
    return ctx.graph.cast(ctx.node("Max", [ctx.as_dtype(x, compute), ctx.const(0, compute)]), compute, x.dtype)


@lowers("aten.leaky_relu.default")
def _leaky_relu(ctx: LoweringContext, x: Value, negative_slope: float = 0.01) -> str:
    compute = _compute_dtype(x.dtype)
    value = ctx.as_dtype(x, compute)
    # onnxruntime has float64 LeakyRelu only up to opset 15; and ATen multiplies a zero by the slope too (0 * NaN or
    # 0 * inf is NaN), where LeakyRelu passes it through
    if (compute is dtypes.float64 and ctx.opset >= 16) or not math.isfinite(negative_slope):
        result = ctx.node("Where", [ctx.node("Greater", [value, ctx.const(0, compute)]), value,
                                    ctx.node("Mul", [value, ctx.const(negative_slope, compute)])])
    else:
        result = ctx.node("LeakyRelu", [value], alpha=float(negative_slope))
    return ctx.graph.cast(result, compute, x.dtype)


@lowers("aten.elu.default")
def _elu(ctx: LoweringContext, x: Value, alpha: float = 1, scale: float = 1, input_scale: float = 1) -> str:
    t = _compute_dtype(x.dtype)
    value = ctx.as_dtype(x, t)
    negative = ctx.node("Mul", [ctx.const(alpha, t), ctx.node(
        "Sub", [ctx.node("Exp", [ctx.node("Mul", [value, ctx.const(input_scale, t)])]), ctx.const(1, t)])])
    result = ctx.node("Where", [ctx.node("Greater", [value, ctx.const(0, t)]), value, negative])
    return ctx.graph.cast(ctx.node("Mul", [result, ctx.const(scale, t)]), t, x.dtype)


@lowers("aten.gelu.default")
def _gelu(ctx: LoweringContext, x: Value, approximate: str = "none") -> str:
    t = _compute_dtype(x.dtype)
    value = ctx.as_dtype(x, t)
    if ctx.opset >= 20 and t is dtypes.float32:
        return ctx.graph.cast(ctx.node("Gelu", [value], approximate=approximate), t, x.dtype)
    if approximate == "tanh":
        cube = ctx.node("Mul", [ctx.node("Mul", [value, value]), value])
        inner = ctx.node("Mul", [ctx.const(math.sqrt(2 / math.pi), t),
                                 ctx.node("Add", [value, ctx.node("Mul", [cube, ctx.const(0.044715, t)])])])
        gate = ctx.node("Add", [ctx.const(1, t), ctx.node("Tanh", [inner])])
    else:
        gate = ctx.node("Add", [ctx.const(1, t), _erf(ctx, ctx.node("Mul", [value, ctx.const(
            1 / math.sqrt(2), t)]), t)])
    result = ctx.node("Mul", [ctx.node("Mul", [value, ctx.const(0.5, t)]), gate])
    return ctx.graph.cast(result, t, x.dtype)


def _clamp_bounds(ctx: LoweringContext, x: Value, low: Any, high: Any) -> str:
    out = ctx.out_dtype
    compute = _compute_dtype(out)
    if compute in (dtypes.int8, dtypes.int16, dtypes.uint8, dtypes.bool_):
        compute = dtypes.int32
    semantic = ctx.declared_dtype
    result = ctx.operand(x, semantic, compute)
    bounds = [bound for bound in (low, high) if bound is not None]
    if compute.is_floating_point and bounds and all(isinstance(b, (int, float)) and not math.isnan(b) for b in bounds):
        # Constant bounds: one Clip, which keeps a NaN in x (onnxruntime's kernels do; tests/codegen's NaN samples
        # check it) and which onnxruntime fuses into the convolution before it (ReLU6). The Max/Min form below
        # guards each side against NaN with four more nodes, and a MobileNetV2 ran 10x slower in onnxruntime. A
        # missing bound is an infinity: onnxruntime's default is the type's finite extreme, which clips infinities.
        limits = [ctx.const(default if bound is None else bound, compute)
                  for bound, default in ((low, -math.inf), (high, math.inf))]
        return ctx.graph.cast(ctx.node("Clip", [result, *limits]), compute, out)
    # ATen applies min first, then max: clamp(x, lo, hi) = min(max(x, lo), hi), NaN in x propagates.
    if low is not None:
        result = _max_min("Max")(ctx, result, ctx.operand(low, semantic, compute), compute)
    if high is not None:
        result = _max_min("Min")(ctx, result, ctx.operand(high, semantic, compute), compute)
    return ctx.graph.cast(result, compute, out)


@lowers("aten.clamp.default", "aten.clamp.Tensor")
def _clamp(ctx: LoweringContext, x: Value, min: Any = None, max: Any = None) -> str:  # noqa: A002
    return _clamp_bounds(ctx, x, min, max)


@lowers("aten.hardtanh.default")
def _hardtanh(ctx: LoweringContext, x: Value, min_val: float = -1, max_val: float = 1) -> str:
    return _clamp_bounds(ctx, x, min_val, max_val)


# -- copies and dtype conversion

@lowers("aten._to_copy.default")
def _to_copy(ctx: LoweringContext, x: Value, *_: Any, **__: Any) -> str:
    if ctx.out_dtype is x.dtype:
        return ctx.node("Identity", [x.name])
    if ctx.out_dtype.is_bool:  # Cast to bool is `!= 0`, which ONNX Cast matches, but NaN must be true
        return _truthy(ctx, x)
    return ctx.node("Cast", [x.name], to=onnx_dtype(ctx.out_dtype))


@lowers("aten._local_scalar_dense.default")
def _local_scalar_dense(ctx: LoweringContext, x: Value) -> str:
    return ctx.node("Reshape", [ctx.as_dtype(x, ctx.out_dtype), ctx.ints([])])


@lowers("aten.clone.default", "aten.alias.default")
def _identity(ctx: LoweringContext, x: Value, *_: Any, **__: Any) -> str:
    return ctx.node("Identity", [x.name])


@lowers("aten.copy.default")
def _copy(ctx: LoweringContext, x: Value, src: Value, non_blocking: bool = False) -> str:
    return ctx.node("Expand", [ctx.as_dtype(src, x.dtype), ctx.shape(x)])


@lowers("aten.fill.Scalar")
def _fill(ctx: LoweringContext, x: Value, value: Any) -> str:
    return ctx.node("Expand", [ctx.as_dtype(value, x.dtype), ctx.shape(x)])


# ---------------------------------------------------------------------------------------------
# Reductions

def _reduce(ctx: LoweringContext, op_type: str, x: str, axes: list[int], keepdim: bool) -> str:
    if not axes:
        return ctx.node("Identity", [x])
    return ctx.node(op_type, [x, ctx.ints(axes)], keepdims=int(keepdim))


def _sum_like(op_type: str) -> Lowering:
    def lower(ctx: LoweringContext, x: Value, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> str:
        if isinstance(dim, int):
            dim = [dim]
        out = ctx.out_dtype
        compute = _compute_dtype(out)
        if compute in (dtypes.int8, dtypes.int16, dtypes.uint8, dtypes.bool_, dtypes.int32) and op_type != "ReduceSum":
            compute = dtypes.int64
        if compute.is_bool or compute in (dtypes.int8, dtypes.int16, dtypes.uint8):
            compute = dtypes.int64
        axes = normalize_axes(dim, x.rank) if x.rank else []
        if dtype is not None and out is not x.dtype:  # ATen converts the input to `dtype` first (to bool: != 0)
            value = ctx.graph.cast(_truthy(ctx, x) if out.is_bool else ctx.as_dtype(x, out), out, compute)
        else:
            value = ctx.as_dtype(x, compute)
        if op_type == "ReduceProd" and compute is dtypes.int64 and all(isinstance(d, int) for d in x.shape):
            return _wrapping_product(ctx, value, x, axes, keepdim)
        reduced = _reduce(ctx, op_type, value, axes, keepdim)
        if op_type == "ReduceSum" and compute.is_floating_point:
            reduced = _from_positive_zero(ctx, reduced, compute)
        return ctx.graph.cast(reduced, compute, out)
    return lower


def _from_positive_zero(ctx: LoweringContext, total: str, t: dtypes.DType) -> str:
    """ATen's sums start from +0, so a sum of -0s (one -0, or none) is +0; onnxruntime's ReduceSum of a lone -0 is
    -0, and 1 / sum then flips sign. A zero becomes +0 (a Where: onnxruntime's optimizer drops an Add of 0)."""
    zero = ctx.const(0, t)
    return ctx.node("Where", [ctx.node("Equal", [total, zero]), zero, total])


def _wrapping_product(ctx: LoweringContext, value: str, x: Value, axes: list[int], keepdim: bool) -> str:
    """int64 product that wraps like ATen's (onnxruntime's ReduceProd does not): a tree of pairwise Muls over the
    reduced elements, moved to the front and flattened (static shapes)."""
    kept = [a for a in range(x.rank) if a not in axes]
    count = int(np.prod([x.shape[a] for a in axes]))
    rest = [x.shape[a] for a in kept]
    if x.rank:
        value = ctx.node("Transpose", [value], perm=axes + kept)
    value = ctx.node("Reshape", [value, ctx.ints([count] + rest)], allowzero=1)
    one = ctx.const(1, dtypes.int64)
    if count == 0:  # no elements: the product is 1
        value, count = ctx.node("Expand", [one, ctx.ints([1] + rest)]), 1
    while count != 1:
        if count % 2:  # pad with the identity to an even count
            value = ctx.node("Concat", [value, ctx.node("Expand", [one, ctx.ints([1] + rest)])], axis=0)
            count += 1
        half = count // 2
        pairs = ctx.node("Reshape", [value, ctx.ints([2, half] + rest)], allowzero=1)
        first, second = (ctx.node("Gather", [pairs, ctx.const(np.int64(i))], axis=0) for i in (0, 1))
        value, count = ctx.node("Mul", [first, second]), half
    shape = [1 if a in axes else x.shape[a] for a in range(x.rank)] if keepdim else rest
    return ctx.node("Reshape", [value, ctx.ints(shape)], allowzero=1)


LOWERING_TABLE["aten.sum.dim_IntList"] = _sum_like("ReduceSum")
LOWERING_TABLE["aten.mean.dim"] = _sum_like("ReduceMean")


def _mean(ctx: LoweringContext, x: Value, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> str:
    """sum / count, so an empty reduction gives NaN as in ATen (onnxruntime's ReduceMean gives 0)."""
    if isinstance(dim, int):
        dim = [dim]
    t = _compute_dtype(ctx.out_dtype)
    axes = normalize_axes(dim, x.rank) if x.rank else []
    total = _from_positive_zero(ctx, _reduce(ctx, "ReduceSum", ctx.as_dtype(x, t), axes, keepdim), t)
    return ctx.graph.cast(ctx.node("Div", [total, ctx.as_dtype(ctx.sizes(x, axes), t)]), t, ctx.out_dtype)


LOWERING_TABLE["aten.mean.dim"] = _mean
LOWERING_TABLE["aten.prod.dim_int"] = _sum_like("ReduceProd")


@lowers("aten.prod.default", "aten.mean.default")
def _reduce_all(ctx: LoweringContext, x: Value, *, dtype: Any = None) -> str:
    if ctx.op.name.startswith("aten.mean"):
        return _mean(ctx, x, None, False)
    return _sum_like("ReduceProd")(ctx, x, None, False)


def _variance(ctx: LoweringContext, x: Value, dim: Any, correction: float, keepdim: bool) -> str:
    t = _compute_dtype(ctx.out_dtype)
    value = ctx.as_dtype(x, t)
    axes = normalize_axes(dim, x.rank) if x.rank else []
    if not axes:
        zero = ctx.node("Sub", [value, value])
        return ctx.graph.cast(ctx.node("Div", [zero, ctx.const(max(1 - correction, 0), t)]), t, ctx.out_dtype)
    count = ctx.as_dtype(ctx.sizes(x, axes), t)
    mean = ctx.node("Div", [ctx.node("ReduceSum", [value, ctx.ints(axes)], keepdims=1), count])
    centered = ctx.node("Sub", [value, mean])
    squares = ctx.node("ReduceSum", [ctx.node("Mul", [centered, centered]), ctx.ints(axes)], keepdims=int(keepdim))
    divisor = ctx.node("Max", [ctx.node("Sub", [count, ctx.const(correction, t)]), ctx.const(0, t)])
    return ctx.graph.cast(ctx.node("Div", [squares, divisor]), t, ctx.out_dtype)


@lowers("aten.var.correction")
def _var_correction(ctx: LoweringContext, x: Value, dim: Any = None, *, correction: Any = None,
                    keepdim: bool = False) -> str:
    return _variance(ctx, x, dim, 1 if correction is None else correction, keepdim)


@lowers("aten.var.dim")
def _var_dim(ctx: LoweringContext, x: Value, dim: Any, unbiased: bool = True, keepdim: bool = False) -> str:
    return _variance(ctx, x, dim, 1 if unbiased else 0, keepdim)


def _nan_reduce(ctx: LoweringContext, op_type: str, value: str, compute: dtypes.DType, axes: list[int],
                keepdim: bool) -> str:
    """ReduceMax/ReduceMin where a NaN anywhere in the window wins, as in ATen."""
    result = _reduce(ctx, op_type, value, axes, keepdim)
    if not compute.is_floating_point or not axes:
        return result
    has_nan = _any_flag(ctx, _nan_flags(ctx, value), axes, keepdim)
    return ctx.node("Where", [has_nan, ctx.const(float("nan"), compute), result])


def _nan_flags(ctx: LoweringContext, value: str) -> str:
    """1 where `value` is NaN, else 0, as int32 (onnxruntime's ReduceMax and ArgMax have no bool kernels)."""
    return ctx.node("Cast", [ctx.node("IsNaN", [value])], to=onnx_dtype(dtypes.int32))


def _any_flag(ctx: LoweringContext, flags: str, axes: list[int], keepdim: bool) -> str:
    """Whether any int32 0/1 flag over `axes` is set, as bool. The flags' maximum is compared with 0, not cast: the
    ReduceMax of no flags is INT32_MIN, which a cast makes true (logsumexp over a symbolic dim that is 0 gave NaN)."""
    return ctx.node("Greater", [_reduce(ctx, "ReduceMax", flags, axes, keepdim), ctx.const(0, dtypes.int32)])


def _ordered_compute_dtype(dtype: dtypes.DType) -> dtypes.DType:
    """The dtype onnxruntime's ReduceMax/ReduceMin and ArgMax/ArgMin compute `dtype` in: they have no bool or int16
    kernels, and int32 orders those values the same."""
    return dtypes.int32 if dtype.is_bool or dtype is dtypes.int16 else _compute_dtype(dtype)


def _extreme(op_type: str) -> Lowering:
    def lower(ctx: LoweringContext, x: Value, dim: Any = (), keepdim: bool = False) -> str:
        compute = _ordered_compute_dtype(x.dtype)
        axes = normalize_axes(dim, x.rank) if x.rank else []
        return ctx.graph.cast(_nan_reduce(ctx, op_type, ctx.as_dtype(x, compute), compute, axes, keepdim),
                              compute, x.dtype)
    return lower


def _nan_arg(ctx: LoweringContext, op_type: str, value: str, compute: dtypes.DType, **attributes: Any) -> str:
    """ArgMax/ArgMin where the first NaN wins, as in ATen."""
    index = ctx.node(op_type, [value], **attributes)
    if not compute.is_floating_point:
        return index
    is_nan = _nan_flags(ctx, value)
    first_nan = ctx.node("ArgMax", [is_nan], **attributes)
    any_nan = _any_flag(ctx, is_nan, [attributes["axis"]], bool(attributes["keepdims"]))
    return ctx.node("Where", [any_nan, first_nan, index])


LOWERING_TABLE["aten.amax.default"] = _extreme("ReduceMax")
LOWERING_TABLE["aten.amin.default"] = _extreme("ReduceMin")


def _arg_extreme(op_type: str) -> Lowering:
    def lower(ctx: LoweringContext, x: Value, dim: int | None = None, keepdim: bool = False) -> str:
        compute = _ordered_compute_dtype(x.dtype)
        value = ctx.as_dtype(x, compute)
        if dim is None or x.rank == 0:
            flat = ctx.node("Reshape", [value, ctx.ints([-1])])
            index = _nan_arg(ctx, op_type, flat, compute, axis=0, keepdims=0)
            return ctx.node("Reshape", [index, ctx.dims(ctx.out.shape)])
        return _nan_arg(ctx, op_type, value, compute, axis=normalize_axis(dim, x.rank), keepdims=int(keepdim))
    return lower


LOWERING_TABLE["aten.argmax.default"] = _arg_extreme("ArgMax")
LOWERING_TABLE["aten.argmin.default"] = _arg_extreme("ArgMin")


def _value_and_index(reduce_op: str, arg_op: str) -> Lowering:
    def lower(ctx: LoweringContext, x: Value, dim: int, keepdim: bool = False) -> list[str]:
        if x.rank == 0:
            return [ctx.node("Identity", [x.name]), ctx.const(np.asarray(0, dtype=np.int64))]
        compute = _ordered_compute_dtype(x.dtype)
        value = ctx.as_dtype(x, compute)
        axis = normalize_axis(dim, x.rank)
        values = _nan_reduce(ctx, reduce_op, value, compute, [axis], keepdim)
        indices = _nan_arg(ctx, arg_op, value, compute, axis=axis, keepdims=int(keepdim))
        return [ctx.graph.cast(values, compute, x.dtype), indices]
    return lower


LOWERING_TABLE["aten.max.dim"] = _value_and_index("ReduceMax", "ArgMax")
LOWERING_TABLE["aten.min.dim"] = _value_and_index("ReduceMin", "ArgMin")


@lowers("aten.any.default", "aten.any.dim", "aten.any.dims")
def _any(ctx: LoweringContext, x: Value, dim: Any = None, keepdim: bool = False) -> str:
    if isinstance(dim, int):
        dim = [dim]
    truth = ctx.node("Cast", [_truthy(ctx, x)], to=onnx_dtype(dtypes.int64))
    if ctx.op.name == "aten.any.dims" and dim is not None and len(dim) == 0:
        axes: list[int] = []  # any.dims(dim=[]) reduces nothing, unlike sum(dim=[])
    else:
        axes = normalize_axes(dim, x.rank) if x.rank else []
    reduced = _reduce(ctx, "ReduceSum", truth, axes, keepdim)
    return ctx.graph.cast(ctx.node("Cast", [reduced], to=onnx_dtype(dtypes.bool_)), dtypes.bool_, ctx.out_dtype)


@lowers("aten.cumsum.default")
def _cumsum(ctx: LoweringContext, x: Value, dim: int, *, dtype: Any = None) -> str:
    out = ctx.out_dtype
    compute = _compute_dtype(out)
    if compute in (dtypes.int8, dtypes.int16, dtypes.uint8, dtypes.bool_):
        compute = dtypes.int64
    value = ctx.operand(x, dtype, compute) if dtype is not None else ctx.as_dtype(x, compute)
    if x.rank == 0:
        return ctx.graph.cast(value, compute, out)
    result = ctx.node("CumSum", [value, ctx.const(np.asarray(normalize_axis(dim, x.rank), dtype=np.int64))])
    return ctx.graph.cast(result, compute, out)


def _top(ctx: LoweringContext, x: Value, k: Any, dim: int, largest: bool) -> list[str]:
    compute = dtypes.int32 if x.dtype.is_bool else _compute_dtype(x.dtype)
    if x.rank == 0:
        return [ctx.node("Identity", [x.name]), ctx.const(np.asarray(0, dtype=np.int64))]
    values, indices = ctx.node("TopK", [ctx.as_dtype(x, compute), ctx.dim(k)], outputs=2,
                               axis=normalize_axis(dim, x.rank), largest=int(largest), sorted=1)
    return [ctx.graph.cast(values, compute, x.dtype), indices]


@lowers("aten.sort.default")
def _sort(ctx: LoweringContext, x: Value, dim: int = -1, descending: bool = False) -> list[str]:
    size = x.shape[normalize_axis(dim, x.rank)] if x.rank else 1
    return _top(ctx, x, size, dim, descending)


@lowers("aten.topk.default")
def _topk(ctx: LoweringContext, x: Value, k: Any, dim: int = -1, largest: bool = True,
          sorted: bool = True) -> list[str]:  # noqa: A002
    return _top(ctx, x, k, dim, largest)


def _softmax_like(op_type: str) -> Lowering:
    def lower(ctx: LoweringContext, x: Value, dim: int, half_to_float: bool = False) -> str:
        compute = _compute_dtype(ctx.out_dtype)
        if x.rank == 0:  # one element: ATen's x - max is +0 (NaN at an infinity or a NaN), softmax its exp
            value = ctx.as_dtype(x, compute)
            # (not x * 0 + 0: onnxruntime's optimizer drops an Add of 0, leaving -0 for a negative x, fuzzing)
            shifted = ctx.node("Sub", [value, value])
            result = shifted if op_type == "LogSoftmax" else ctx.node("Exp", [shifted])
            return ctx.graph.cast(result, compute, ctx.out_dtype)
        axis = normalize_axis(dim, x.rank)
        if op_type == "LogSoftmax" and ctx.declared_dtype in _LOW_PRECISION and axis == x.rank - 1:
            return ctx.graph.cast(_reduced_log_softmax(ctx, ctx.as_dtype(x, compute), axis), compute, ctx.out_dtype)
        value = ctx.as_dtype(x, compute)
        result = ctx.node(op_type, [value], axis=axis)
        if op_type == "LogSoftmax" and compute is dtypes.float64:
            # onnxruntime's float64 kernel gives -inf, not NaN, beside a +inf, and finite numbers beside a NaN (its
            # float32 one agrees with ATen): adding NaN to the rows holding either puts ATen's NaN back (fuzzing)
            poisoned = ctx.node("Or", [ctx.node("IsNaN", [value]), ctx.node("IsInf", [value], detect_negative=0)])
            poison = ctx.node("Where", [poisoned, ctx.const(float("nan"), compute), ctx.const(0, compute)])
            result = ctx.node("Add", [result, ctx.node("ReduceSum", [poison, ctx.ints([axis])], keepdims=1)])
        return ctx.graph.cast(result, compute, ctx.out_dtype)
    return lower


def _reduced_log_softmax(ctx: LoweringContext, value: str, axis: int) -> str:
    """ATen's CPU kernel over the last dim of float16/bfloat16 keeps the exp-sum and its log in the input dtype:
    (x - max) - round(log(round(sum(exp(x - max))))), with float32 arithmetic in between."""
    t, dtype = dtypes.float32, ctx.declared_dtype

    def rounded(v: str) -> str:
        return ctx.node("Cast", [ctx.node("Cast", [v], to=onnx_dtype(dtype))], to=onnx_dtype(t))

    axes = ctx.ints([axis])
    shifted = ctx.node("Sub", [value, ctx.node("ReduceMax", [value, axes], keepdims=1)])
    total = ctx.node("ReduceSum", [ctx.node("Exp", [shifted]), axes], keepdims=1)
    return ctx.node("Sub", [shifted, rounded(ctx.node("Log", [rounded(total)]))])


LOWERING_TABLE["aten._softmax.default"] = _softmax_like("Softmax")
LOWERING_TABLE["aten._log_softmax.default"] = _softmax_like("LogSoftmax")

# ---------------------------------------------------------------------------------------------
# Shapes and views (kiln values are contiguous, so every view is a copy here)


def _reshape_to_result(ctx: LoweringContext, x: str) -> str:
    shape = list(ctx.out.shape)
    if shape == list(ctx.op.operands[0].type.shape):  # already that shape (the graph cleanup drops the Identity)
        return ctx.node("Identity", [x])
    # allowzero (OnnxGraph.node's default): a symbolic dim that is 0 at run time is an empty dim, not "copy the
    # input's dim" (a flatten of [0, 3, 4, 0] gave [0, 3, 4])
    return ctx.node("Reshape", [x, ctx.dims(shape)])


@lowers("aten.view.default")
def _view(ctx: LoweringContext, x: Value, size: Any) -> str:
    return _reshape_to_result(ctx, x.name)


@lowers("aten.squeeze.dim", "aten.squeeze.dims")
def _squeeze(ctx: LoweringContext, x: Value, dim: Any) -> str:
    return _reshape_to_result(ctx, x.name)


@lowers("aten.unsqueeze.default")
def _unsqueeze(ctx: LoweringContext, x: Value, dim: int) -> str:
    return ctx.node("Unsqueeze", [x.name, ctx.ints([normalize_axis(dim, x.rank + 1)])])


@lowers("aten.permute.default")
def _permute(ctx: LoweringContext, x: Value, dims: list[int]) -> str:
    if x.rank == 0:
        return ctx.node("Identity", [x.name])
    return ctx.node("Transpose", [x.name], perm=[normalize_axis(d, x.rank) for d in dims])


@lowers("aten.expand.default")
def _expand(ctx: LoweringContext, x: Value, size: Any, *, implicit: bool = False) -> str:
    if any(isinstance(d, int) and d == 0 for d in ctx.out.shape):  # onnxruntime's Expand keeps a 1 against a 0
        return ctx.node("ConstantOfShape", [ctx.dims(ctx.out.shape)], value=_scalar_tensor(0, x.dtype))
    return ctx.node("Expand", [x.name, ctx.dims(ctx.out.shape)])


@lowers("aten.repeat.default")
def _repeat(ctx: LoweringContext, x: Value, repeats: list[Any]) -> str:
    value = x.name
    extra = len(repeats) - x.rank
    if extra > 0:
        value = ctx.node("Reshape", [value, ctx.dims([1] * extra + list(x.shape))])
    return ctx.node("Tile", [value, ctx.dims(repeats)])


@lowers("aten.as_strided.default")
def _as_strided(ctx: LoweringContext, x: Value, size: list[Any], stride: list[Any], storage_offset: Any = None) -> str:
    values = list(size) + list(stride) + [storage_offset or 0]
    if not all(isinstance(v, int) for v in values):
        raise UnsupportedError("as_strided with symbolic sizes or strides has no ONNX translation",
                               fix="express the view with reshape/slice/permute in the model")
    index = np.full(tuple(size), storage_offset or 0, dtype=np.int64)
    for axis, (count, step) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[axis] = count
        index = index + (np.arange(count, dtype=np.int64) * step).reshape(shape)
    flat = ctx.node("Reshape", [x.name, ctx.ints([-1])])
    return ctx.node("Gather", [flat, ctx.const(index)], axis=0)


@lowers("aten.select.int")
def _select(ctx: LoweringContext, x: Value, dim: int, index: Any) -> str:
    return ctx.node("Gather", [x.name, ctx.scalar(index)], axis=normalize_axis(dim, x.rank))


def _slice_start(start: Any, size: Any) -> Any:
    if start is None:
        return 0
    if isinstance(start, int) and start < 0:
        return start + size
    return start


@lowers("aten.slice.Tensor")
def _slice(ctx: LoweringContext, x: Value, dim: int = 0, start: Any = None, end: Any = None, step: Any = 1) -> str:
    if x.rank == 0:
        return ctx.node("Identity", [x.name])
    axis = normalize_axis(dim, x.rank)
    start = 0 if start is None else start
    end = INT64_MAX if end is None else end
    return ctx.node("Slice", [x.name, ctx.dim(start), ctx.dim(end), ctx.ints([axis]), ctx.dim(step)])


def _scatter_along(ctx: LoweringContext, x: Value, src: str, src_shape: list[Any], axis: int, positions: str) -> str:
    """Write `src` into `x` at `positions` (1-D indices) along `axis`, with ScatterElements."""
    shape = [1] * len(src_shape)
    shape[axis] = -1
    index = ctx.node("Expand", [ctx.node("Reshape", [positions, ctx.ints(shape)]), ctx.dims(src_shape)])
    return ctx.node("ScatterElements", [x.name, index, src], axis=axis)


@lowers("aten.slice_scatter.default")
def _slice_scatter(ctx: LoweringContext, x: Value, src: Value, dim: int = 0, start: Any = None, end: Any = None,
                   step: Any = 1) -> str:
    axis = normalize_axis(dim, x.rank)
    if any(d == 0 for d in src.shape):
        return ctx.node("Identity", [x.name])
    count = src.shape[axis]
    first = _slice_start(start, x.shape[axis])
    if isinstance(first, int) and isinstance(x.shape[axis], int):
        first = min(max(first, 0), x.shape[axis])
    positions = ctx.node("Range", [ctx.scalar(first), ctx.scalar(sympy.sympify(first) + count * step),
                                   ctx.scalar(step)])
    if isinstance(first, int) and isinstance(count, int):
        positions = ctx.const(np.arange(first, first + count * step, step, dtype=np.int64))
    return _scatter_along(ctx, x, ctx.as_dtype(src, x.dtype), list(src.shape), axis, positions)


@lowers("aten.select_scatter.default")
def _select_scatter(ctx: LoweringContext, x: Value, src: Value, dim: int, index: Any) -> str:
    axis = normalize_axis(dim, x.rank)
    if any(d == 0 for d in src.shape):
        return ctx.node("Identity", [x.name])
    position = _slice_start(index, x.shape[axis])
    expanded = ctx.node("Unsqueeze", [ctx.as_dtype(src, x.dtype), ctx.ints([axis])])
    shape = list(src.shape)
    shape.insert(axis, 1)
    return _scatter_along(ctx, x, expanded, shape, axis, ctx.dim(position))


@lowers("aten.diagonal.default")
def _diagonal(ctx: LoweringContext, x: Value, offset: int = 0, dim1: int = 0, dim2: int = 1) -> str:
    first, second = normalize_axis(dim1, x.rank), normalize_axis(dim2, x.rank)
    rest = [a for a in range(x.rank) if a not in (first, second)]
    moved = ctx.node("Transpose", [x.name], perm=rest + [first, second])
    rows, columns = x.shape[first], x.shape[second]
    flat = ctx.node("Reshape", [moved, ctx.dims([x.shape[a] for a in rest] + [rows * columns])])
    length = ctx.out.shape[-1]
    start = offset if offset >= 0 else -offset * columns
    step = columns + 1
    if all(isinstance(v, int) for v in (length, start, step)):
        positions = ctx.const(np.arange(length, dtype=np.int64) * step + start)
    else:
        positions = ctx.node("Range", [ctx.scalar(start), ctx.scalar(sympy.sympify(start) + length * step),
                                       ctx.scalar(step)])
    return ctx.node("Gather", [flat, positions], axis=len(rest))


@lowers("aten.flip.default")
def _flip(ctx: LoweringContext, x: Value, dims: list[int]) -> str:
    axes = normalize_axes(dims, x.rank) if dims else []
    if not axes or x.rank == 0:
        return ctx.node("Identity", [x.name])
    count = len(axes)
    return ctx.node("Slice", [x.name, ctx.ints([-1] * count), ctx.ints([INT64_MIN] * count), ctx.ints(axes),
                              ctx.ints([-1] * count)])


@lowers("aten.cat.default")
def _cat(ctx: LoweringContext, tensors: list[Value], dim: int = 0) -> str:
    out = ctx.out_dtype
    rank = ctx.out.ndim
    # ATen skips 1-D empty tensors (legacy behaviour); ONNX Concat needs equal ranks.
    kept = [t for t in tensors if not (t.rank == 1 and t.shape[0] == 0 and rank != 1)]
    if not kept or ctx.out.shape == (0,):
        return ctx.const(np.zeros([0], dtype=out.numpy))
    return ctx.node("Concat", [ctx.as_dtype(t, out) for t in kept], axis=normalize_axis(dim, rank))


@lowers("aten.split_with_sizes.default")
def _split(ctx: LoweringContext, x: Value, split_sizes: list[Any], dim: int = 0) -> list[str]:
    axis = normalize_axis(dim, x.rank)
    if len(split_sizes) == 1:
        return [ctx.node("Identity", [x.name])]
    return ctx.node("Split", [x.name, ctx.dims(split_sizes)], outputs=len(split_sizes), axis=axis)


@lowers("aten.constant_pad_nd.default")
def _constant_pad(ctx: LoweringContext, x: Value, pad: list[Any], value: Any = 0) -> str:
    if x.rank == 0 or not any(pad):
        return ctx.node("Identity", [x.name])
    return ctx.node("Pad", [x.name, _pads(ctx, pad, x.rank), ctx.as_dtype(value, x.dtype)], mode="constant")


def _pads(ctx: LoweringContext, pad: list[Any], rank: int) -> str:
    """ATen's (last-dim-first begin/end pairs) → ONNX's (all begins, then all ends)."""
    begins, ends = [0] * rank, [0] * rank
    for index in range(len(pad) // 2):
        axis = rank - 1 - index
        begins[axis], ends[axis] = pad[2 * index], pad[2 * index + 1]
    return ctx.dims(begins + ends)


def _spatial_pad(mode: str) -> Lowering:
    def lower(ctx: LoweringContext, x: Value, padding: list[Any]) -> str:
        if all(isinstance(p, int) and p >= 0 for p in padding):
            return ctx.node("Pad", [x.name, _pads(ctx, padding, x.rank)], mode=mode)
        # ONNX's Pad crops a negative pad first and refuses to replicate or reflect an extent cropped to nothing;
        # ATen reads every output from the uncropped input: gather its positions along each padded axis
        result = x.name
        for index in range(len(padding) // 2):
            axis, left = x.rank - 1 - index, padding[2 * index]
            if left != 0 or padding[2 * index + 1] != 0:
                positions = _padded_positions(ctx, x.shape[axis], ctx.out.shape[axis], left, mode)
                result = ctx.node("Gather", [result, positions], axis=axis)
        return result
    return lower


def _padded_positions(ctx: LoweringContext, size: Any, out: Any, left: Any, mode: str) -> str:
    """The input position ATen's reflection / replication pad reads for each output position j along one axis:
    i = j - left, clamped into [0, size) (edge) or mirrored at both ends (reflect: size - 1 - |size - 1 - |i||)."""
    if all(isinstance(v, int) for v in (size, out, left)):
        shifted = np.arange(out, dtype=np.int64) - left
        last = size - 1
        return ctx.const(np.clip(shifted, 0, last) if mode == "edge" else last - np.abs(last - np.abs(shifted)))
    shifted = ctx.node("Sub", [ctx.node("Range", [ctx.scalar(0), ctx.scalar(out), ctx.scalar(1)]), ctx.scalar(left)])
    last = ctx.scalar(sympy.sympify(size) - 1)
    if mode == "edge":
        return ctx.node("Max", [ctx.node("Min", [shifted, last]), ctx.scalar(0)])
    return ctx.node("Sub", [last, ctx.node("Abs", [ctx.node("Sub", [last, ctx.node("Abs", [shifted])])])])


for _name in ("reflection_pad1d", "reflection_pad2d", "reflection_pad3d"):
    LOWERING_TABLE[f"aten.{_name}.default"] = _spatial_pad("reflect")
for _name in ("replication_pad2d", "replication_pad3d"):
    LOWERING_TABLE[f"aten.{_name}.default"] = _spatial_pad("edge")


@lowers("aten.sym_size.int")
def _sym_size(ctx: LoweringContext, x: Value, dim: int) -> str:
    return ctx.node("Identity", [ctx.scalar(x.shape[normalize_axis(dim, x.rank)])])


@lowers("_operator.add.default", "_operator.sub.default", "_operator.mul.default", "_operator.floordiv.default",
        "_operator.mod.default")
def _symint_arithmetic(ctx: LoweringContext, a: Any, b: Any) -> str:
    """SymInt arithmetic a program returns as a value: its expression (the meta rule's) computed from input shapes."""
    return ctx.node("Identity", [ctx.scalar(ctx.out.expr)])


@lowers("aten.sym_numel.default")
def _sym_numel(ctx: LoweringContext, x: Value) -> str:
    return ctx.node("Size", [x.name])


@lowers("aten.sym_stride.int")
def _sym_stride(ctx: LoweringContext, x: Value, dim: int) -> str:
    return ctx.node("Identity", [ctx.scalar(ctx.sizes(x, range(normalize_axis(dim, x.rank) + 1, x.rank)))])


@lowers("aten.sym_storage_offset.default")
def _sym_storage_offset(ctx: LoweringContext, x: Value) -> str:
    return ctx.node("Identity", [ctx.scalar(0)])


# ---------------------------------------------------------------------------------------------
# Indexing

def _index64(ctx: LoweringContext, index: Value) -> str:
    return ctx.as_dtype(index, dtypes.int64)


@lowers("aten.gather.default")
def _gather(ctx: LoweringContext, x: Value, dim: int, index: Value, *, sparse_grad: bool = False) -> str:
    if x.rank == 0:
        return ctx.node("Expand", [x.name, ctx.shape(index)])
    if _no_indices(index):  # onnxruntime's GatherElements refuses empty indices (of any rank, in ATen)
        return ctx.node("Expand", [ctx.const(0, x.dtype), ctx.dims(ctx.out.shape)])
    if index.rank == 0:  # ATen takes a 0-d index for a 1-d self (as a 1-element one); GatherElements wants ranks equal
        return ctx.node("Reshape", [ctx.node("GatherElements", [x.name, _as_vector(ctx, _index64(ctx, index))],
                                             axis=0), ctx.ints([])])
    return ctx.node("GatherElements", [x.name, _index64(ctx, index)], axis=normalize_axis(dim, x.rank))


def _as_vector(ctx: LoweringContext, name: str) -> str:
    """A 0-d value as a 1-element vector: ATen counts a 0-d operand of scatter and gather as 1-d."""
    return ctx.node("Reshape", [name, ctx.ints([1])])


def _no_indices(index: Value) -> bool:
    """An index with no elements (statically): scatter writes nothing. ATen then skips its checks, so the index's
    rank may differ from self's, which ScatterElements refuses."""
    return any(d == 0 for d in index.shape)


def _scatter_elements(ctx: LoweringContext, x: Value, dim: int, index: Value, src: str, reduction: str) -> str:
    if _no_indices(index):
        return ctx.node("Identity", [x.name])
    if x.rank == 0:  # every index is 0: scatter into a 1-element view
        flat = ctx.node("Reshape", [x.name, ctx.ints([1])])
        positions = ctx.node("Reshape", [_index64(ctx, index), ctx.ints([-1])])
        updates = ctx.node("Reshape", [src, ctx.ints([-1])])
        result = ctx.node("ScatterElements", [flat, positions, updates], axis=0, reduction=reduction)
        return ctx.node("Reshape", [result, ctx.ints([])])
    if index.rank == 0:  # a 1-d self: one element written, as through 1-element index and src
        return ctx.node("ScatterElements", [x.name, _as_vector(ctx, _index64(ctx, index)), _as_vector(ctx, src)],
                        axis=0, reduction=reduction)
    return ctx.node("ScatterElements", [x.name, _index64(ctx, index), src], axis=normalize_axis(dim, x.rank),
                    reduction=reduction)


def _fit_to_index(ctx: LoweringContext, src: Value, index: Value, dtype: Any) -> str:
    """ATen reads only the leading `index.shape` block of `src`."""
    value = ctx.as_dtype(src, dtype)
    if list(src.shape) == list(index.shape):
        return value
    if index.rank == 0:  # a 0-d index reads src's first element
        first = ctx.node("Slice", [ctx.node("Reshape", [value, ctx.ints([-1])]), ctx.ints([0]), ctx.ints([1])])
        return ctx.node("Reshape", [first, ctx.ints([])])
    if src.rank == 0:  # ATen counts a 0-d src as 1-d: its one element, the index's one element
        return ctx.node("Reshape", [value, ctx.ints([1] * index.rank)])
    return ctx.node("Slice", [value, ctx.ints([0] * index.rank), ctx.shape(index), ctx.ints(range(index.rank))])


@lowers("aten.scatter.src")
def _scatter_src(ctx: LoweringContext, x: Value, dim: int, index: Value, src: Value) -> str:
    return _scatter_elements(ctx, x, dim, index, _fit_to_index(ctx, src, index, x.dtype), "none")


@lowers("aten.scatter.value")
def _scatter_value(ctx: LoweringContext, x: Value, dim: int, index: Value, value: Any) -> str:
    src = ctx.node("Expand", [ctx.as_dtype(value, x.dtype), ctx.shape(index)])
    return _scatter_elements(ctx, x, dim, index, src, "none")


@lowers("aten.scatter_add.default")
def _scatter_add(ctx: LoweringContext, x: Value, dim: int, index: Value, src: Value) -> str:
    return _scatter_elements(ctx, x, dim, index, _fit_to_index(ctx, src, index, x.dtype), "add")


_SCATTER_REDUCTIONS = {"sum": ("add", 0), "prod": ("mul", 1), "amax": ("max", -math.inf), "amin": ("min", math.inf)}


@lowers("aten.scatter_reduce.two")
def _scatter_reduce(ctx: LoweringContext, x: Value, dim: int, index: Value, src: Value, reduce: str, *,
                    include_self: bool = True) -> str:
    if _no_indices(index):
        return ctx.node("Identity", [x.name])
    if x.dtype.is_bool:  # onnxruntime has no bool ScatterElements reductions; max/min/sum on 0/1 agree with ATen's
        compute = dtypes.int32
        wide = _scatter_reduce(ctx, Value(ctx.as_dtype(x, compute), x.type.with_dtype(compute)), dim, index,
                               Value(ctx.as_dtype(src, compute), src.type.with_dtype(compute)), reduce,
                               include_self=include_self)
        return _truthy(ctx, Value(wide, x.type.with_dtype(compute)))
    source = _fit_to_index(ctx, src, index, x.dtype)
    if reduce == "mean":
        total = _scatter_reduce(ctx, x, dim, index, src, "sum", include_self=include_self)
        ones = ctx.node("Expand", [ctx.const(1, x.dtype), ctx.shape(index)])
        base = ctx.node("Expand", [ctx.const(1 if include_self else 0, x.dtype), ctx.shape(x)])
        count = _scatter_elements(ctx, Value(base, x.type), dim, index, ones, "add")
        safe = ctx.node("Max", [count, ctx.const(1, x.dtype)])
        if x.dtype.is_floating_point:
            return ctx.node("Div", [total, safe])
        return _floor_div(ctx, total, safe, x.dtype)
    reduction, identity = _SCATTER_REDUCTIONS[reduce]
    base = x
    if not include_self:
        if not x.dtype.is_floating_point and math.isinf(identity):
            info = np.iinfo(x.dtype.numpy)
            identity = info.min if identity < 0 else info.max
        fill = ctx.node("Expand", [ctx.as_dtype(identity, x.dtype), ctx.shape(index)])
        base = Value(_scatter_elements(ctx, x, dim, index, fill, "none"), x.type)
    result = _scatter_elements(ctx, base, dim, index, source, reduction)
    if reduction in ("max", "min") and x.dtype.is_floating_point:
        # ATen's max/min propagate NaN, onnxruntime's skip it: scatter a NaN flag with max and put the NaN back.
        flags = Value(ctx.graph.cast(ctx.node("IsNaN", [base.name]), dtypes.bool_, x.dtype), x.type)
        source_nan = ctx.graph.cast(ctx.node("IsNaN", [source]), dtypes.bool_, x.dtype)
        any_nan = ctx.node("Greater", [_scatter_elements(ctx, flags, dim, index, source_nan, "max"),
                                       ctx.const(0, x.dtype)])
        result = ctx.node("Where", [any_nan, ctx.const(math.nan, x.dtype), result])
    return result


@lowers("aten.index_select.default")
def _index_select(ctx: LoweringContext, x: Value, dim: int, index: Value) -> str:
    if x.rank == 0:
        return ctx.node("Reshape", [x.name, ctx.dims(ctx.out.shape)])
    positions = _index64(ctx, index)
    if index.rank == 0:
        positions = ctx.node("Reshape", [positions, ctx.ints([1])])
    return ctx.node("Gather", [x.name, positions], axis=normalize_axis(dim, x.rank))


def _expand_bool_indices(ctx: LoweringContext, indices: list[Any]) -> list[Any]:
    """Boolean masks become one int64 index per masked dimension (what ATen does with nonzero)."""
    result: list[Any] = []
    for index in indices:
        if isinstance(index, Value) and (index.dtype.is_bool or index.dtype is dtypes.uint8):  # uint8: legacy mask
            positions = ctx.node("NonZero", [index.name])  # [rank, n]
            for axis in range(index.rank):
                row = ctx.node("Gather", [positions, ctx.const(np.asarray(axis, dtype=np.int64))], axis=0)
                result.append(Value(row, None))
        else:
            result.append(index)
    return result


def _broadcast_indices(ctx: LoweringContext, indices: list[Any]) -> tuple[list[int], str]:
    """The indexed axes and their index tensors broadcast together and stacked along a new last axis."""
    axes = [axis for axis, index in enumerate(indices) if index is not None]
    names = [ctx.as_dtype(indices[a], dtypes.int64) if indices[a].type is not None else indices[a].name
             for a in axes]
    shape = ctx.node("Shape", [names[0]])
    for name in names[1:]:  # the broadcast shape: Expand of a ones-tensor by every index shape
        shape = ctx.node("Shape", [ctx.node("Expand", [ctx.node("Expand", [ctx.ints([1]), shape]),
                                                          ctx.node("Shape", [name])])])
    stacked = ctx.node("Concat", [ctx.node("Unsqueeze", [ctx.node("Expand", [n, shape]), ctx.ints([-1])])
                                  for n in names], axis=-1)
    return axes, stacked


def _index_layout(axes: list[int], rank: int) -> tuple[list[int], bool]:
    """Indexed axes first (for GatherND/ScatterND), and whether ATen keeps the result dims in place."""
    rest = [a for a in range(rank) if a not in axes]
    adjacent = axes == list(range(axes[0], axes[0] + len(axes)))
    return axes + rest, adjacent


@lowers("aten.index.Tensor")
def _index(ctx: LoweringContext, x: Value, indices: list[Any]) -> str:
    indices = _expand_bool_indices(ctx, list(indices))
    indices += [None] * (x.rank - len(indices))
    axes, stacked = _broadcast_indices(ctx, indices)
    perm, adjacent = _index_layout(axes, x.rank)
    moved = ctx.node("Transpose", [x.name], perm=perm) if perm != list(range(x.rank)) else x.name
    gathered = ctx.node("GatherND", [moved, stacked])
    out_rank = ctx.out.ndim
    batch_rank = out_rank - (x.rank - len(axes))
    if adjacent and axes[0] > 0:  # ATen puts the broadcast dims where the indexed dims were
        rest = list(range(batch_rank, out_rank))
        order = rest[:axes[0]] + list(range(batch_rank)) + rest[axes[0]:]
        gathered = ctx.node("Transpose", [gathered], perm=order)
    return gathered


@lowers("aten.index_put.default")
def _index_put(ctx: LoweringContext, x: Value, indices: list[Any], values: Value, accumulate: bool = False) -> str:
    batch_rank = max(1 if (i.type is None or i.dtype.is_bool or i.dtype is dtypes.uint8) else i.rank
                     for i in indices if i is not None) if any(i is not None for i in indices) else 0
    indices = _expand_bool_indices(ctx, list(indices))
    indices += [None] * (x.rank - len(indices))
    axes, stacked = _broadcast_indices(ctx, indices)
    perm, adjacent = _index_layout(axes, x.rank)
    identity = perm == list(range(x.rank))
    compute = _kernel_dtype(x.dtype)
    moved = ctx.as_dtype(x, compute) if identity else ctx.node("Transpose", [ctx.as_dtype(x, compute)], perm=perm)
    # `values` broadcasts against what `x[indices]` returns; ScatterND wants it in the moved layout.
    batch_shape = ctx.node("Shape", [stacked], end=-1)
    rest = perm[len(axes):]
    pre = [a for a in rest if a < axes[0]] if adjacent else []
    post = [a for a in rest if a not in pre]
    target = ctx.node("Concat", [ctx.dims([x.shape[a] for a in pre]), batch_shape,
                                 ctx.dims([x.shape[a] for a in post])], axis=0)
    updates = ctx.node("Expand", [ctx.as_dtype(values, compute), target])
    if pre:
        order = list(range(len(pre), len(pre) + batch_rank)) + list(range(len(pre))) + list(
            range(len(pre) + batch_rank, len(pre) + batch_rank + len(post)))
        updates = ctx.node("Transpose", [updates], perm=order)
    result = ctx.node("ScatterND", [moved, stacked, updates], reduction="add" if accumulate else "none")
    if not identity:
        result = ctx.node("Transpose", [result], perm=[perm.index(a) for a in range(x.rank)])
    return ctx.graph.cast(result, compute, x.dtype)


@lowers("aten.masked_scatter.default")
def _masked_scatter(ctx: LoweringContext, x: Value, mask: Value, source: Value) -> str:
    shape = ctx.dims(ctx.out.shape)  # self and mask broadcast together
    flat_mask = ctx.node("Reshape", [ctx.node("Expand", [_truthy(ctx, mask), shape]), ctx.ints([-1])])
    counts = ctx.node("CumSum", [ctx.node("Cast", [flat_mask], to=onnx_dtype(dtypes.int64)),
                                 ctx.const(np.asarray(0, dtype=np.int64))])
    positions = ctx.node("Max", [ctx.node("Sub", [counts, ctx.ints([1])]), ctx.ints([0])])
    compute = _kernel_dtype(x.dtype)
    flat_source = ctx.node("Reshape", [ctx.as_dtype(source, compute), ctx.ints([-1])])
    # one element past the source's: the masked-out positions' gather reads a valid index even where the source is
    # empty (onnxruntime refused index -1 of an empty source, whose values Where drops anyway)
    padded = ctx.node("Concat", [flat_source, ctx.const(np.zeros(1, dtype=compute.numpy))], axis=0)
    picked = ctx.node("Gather", [padded, ctx.node("Min", [positions, ctx.node("Shape", [flat_source])])], axis=0)
    flat_x = ctx.node("Reshape", [ctx.node("Expand", [ctx.as_dtype(x, compute), shape]), ctx.ints([-1])])
    merged = ctx.node("Where", [flat_mask, picked, flat_x])
    return ctx.graph.cast(ctx.node("Reshape", [merged, shape]), compute, x.dtype)


@lowers("aten.nonzero.default")
def _nonzero(ctx: LoweringContext, x: Value) -> str:
    truth = _truthy(ctx, x)  # onnxruntime's NonZero has kernels for a few dtypes only (not int8, int16, float64)
    if x.rank == 0:  # [n, 0]: the rows of a 1-element view, with no columns
        rows = ctx.node("Transpose", [ctx.node("NonZero", [ctx.node("Reshape", [truth, ctx.ints([1])])])],
                        perm=[1, 0])
        return ctx.node("Slice", [rows, ctx.ints([0]), ctx.ints([0]), ctx.ints([1])])
    return ctx.node("Transpose", [ctx.node("NonZero", [truth])], perm=[1, 0])


@lowers("aten.embedding.default")
def _embedding(ctx: LoweringContext, weight: Value, indices: Value, *_: Any) -> str:
    return ctx.node("Gather", [weight.name, _index64(ctx, indices)], axis=0)


# ---------------------------------------------------------------------------------------------
# Linear algebra

def _matmul_dtype(dtype: dtypes.DType) -> dtypes.DType:
    if dtype.is_floating_point:
        return _compute_dtype(dtype)
    return dtypes.int64 if dtype is dtypes.int64 else dtypes.int32 if not dtype.is_bool else dtypes.int32


@lowers("aten.mm.default", "aten.bmm.default")
def _matmul(ctx: LoweringContext, a: Value, b: Value) -> str:
    t = _matmul_dtype(ctx.out_dtype)
    result = ctx.node("MatMul", [ctx.as_dtype(a, t), ctx.as_dtype(b, t)])
    if ctx.out_dtype.is_bool:
        return ctx.node("Not", [ctx.node("Equal", [result, ctx.const(0, t)])])
    return ctx.graph.cast(result, t, ctx.out_dtype)


@lowers("aten.addmm.default")
def _addmm(ctx: LoweringContext, bias: Value, a: Value, b: Value, *, beta: Any = 1, alpha: Any = 1) -> str:
    t = _matmul_dtype(ctx.out_dtype)
    if alpha == 0 and ctx.declared_dtype in (dtypes.float32, dtypes.float64):
        # BLAS skips the product (NaN in it does not propagate), and the bias too when beta is 0; ATen's own
        # float16/bfloat16 kernel multiplies the product by 0, which the general path below does
        offset = ctx.node("Mul", [ctx.as_dtype(bias, t), ctx.as_dtype(beta, t)]) if beta != 0 else ctx.const(0, t)
        return ctx.graph.cast(ctx.node("Expand", [offset, ctx.dims(ctx.out.shape)]), t, ctx.out_dtype)
    if beta != 0 and t in (dtypes.float32, dtypes.float64) and a.rank == 2 and b.rank == 2 and bias.rank <= 2:
        # one Gemm: alpha * a @ b + beta * bias (bias broadcast to the product, as addmm's is)
        inputs = [ctx.as_dtype(a, t), ctx.as_dtype(b, t), ctx.as_dtype(bias, t)]
        return ctx.graph.cast(ctx.node("Gemm", inputs, alpha=float(alpha), beta=float(beta)), t, ctx.out_dtype)
    product = ctx.node("MatMul", [ctx.as_dtype(a, t), ctx.as_dtype(b, t)])
    if alpha != 1:
        product = ctx.node("Mul", [product, ctx.as_dtype(alpha, t)])
    if beta == 0:  # ATen ignores `self` (even NaN) when beta is 0
        return ctx.graph.cast(product, t, ctx.out_dtype)
    offset = ctx.as_dtype(bias, t)
    if beta != 1:
        offset = ctx.node("Mul", [offset, ctx.as_dtype(beta, t)])
    return ctx.graph.cast(ctx.node("Add", [product, offset]), t, ctx.out_dtype)


def _p_norm(ctx: LoweringContext, difference: str, p: float, t: dtypes.DType, nan_ignoring_max: bool = False) -> str:
    magnitude = ctx.node("Abs", [difference])
    axis = ctx.ints([-1])
    if p == 0:  # the number of differing coordinates; a NaN difference gives NaN
        differs = ctx.node("Min", [ctx.node("Ceil", [magnitude]), ctx.const(1, t)])
        differs = ctx.node("Where", [ctx.node("IsNaN", [magnitude]), magnitude, differs])
        return ctx.node("ReduceSum", [differs, axis], keepdims=0)
    if math.isinf(p):
        if nan_ignoring_max:  # cdist's scalar loop uses std::max, which never picks a NaN
            magnitude = ctx.node("Where", [ctx.node("IsNaN", [magnitude]), ctx.const(0, t), magnitude])
        return ctx.node("ReduceMax", [magnitude, axis], keepdims=0)
    if p == 1:
        return ctx.node("ReduceSum", [magnitude, axis], keepdims=0)
    if p == 2:
        return ctx.node("Sqrt", [ctx.node("ReduceSum", [ctx.node("Mul", [magnitude, magnitude]), axis], keepdims=0)])
    powered = ctx.node("Pow", [magnitude, ctx.const(p, t)])
    return ctx.node("Pow", [ctx.node("ReduceSum", [powered, axis], keepdims=0), ctx.const(1 / p, t)])


def _euclidean_by_matmul(ctx: LoweringContext, x1: Value, x2: Value) -> str:
    """ATen's _euclidean_dist, sqrt(max(|a|^2 + |b|^2 - 2 a.b, 0)) in float64: reproduced, not the direct
    difference, because inf/NaN inputs differ (inf - inf is NaN here)."""
    t = dtypes.float64
    a, b = ctx.as_dtype(x1, t), ctx.as_dtype(x2, t)
    a_norm = ctx.node("ReduceSum", [ctx.node("Mul", [a, a]), ctx.ints([-1])], keepdims=1)
    b_norm = ctx.node("ReduceSum", [ctx.node("Mul", [b, b]), ctx.ints([-1])], keepdims=0)
    b_norm = ctx.node("Unsqueeze", [b_norm, ctx.ints([-2])])
    perm = list(range(x2.rank - 2)) + [x2.rank - 1, x2.rank - 2]
    product = ctx.node("MatMul", [a, ctx.node("Transpose", [b], perm=perm)])
    squared = ctx.node("Sub", [ctx.node("Add", [a_norm, b_norm]), ctx.node("Mul", [product, ctx.const(2, t)])])
    squared = ctx.node("Where", [ctx.node("Less", [squared, ctx.const(0, t)]), ctx.const(0, t), squared])
    return ctx.node("Sqrt", [squared])


@lowers("aten._cdist_forward.default")
def _cdist(ctx: LoweringContext, x1: Value, x2: Value, p: float, compute_mode: Any = None) -> str:
    rows = [x1.shape[-2], x2.shape[-2]]
    large = all(isinstance(r, int) for r in rows) and max(rows) > 25  # (symbolic rows: the direct formula)
    if p == 2 and (compute_mode == 1 or (compute_mode in (None, 0) and large)):
        return ctx.graph.cast(_euclidean_by_matmul(ctx, x1, x2), dtypes.float64, ctx.out_dtype)
    t = _compute_dtype(ctx.out_dtype)
    left = ctx.node("Unsqueeze", [ctx.as_dtype(x1, t), ctx.ints([-2])])
    right = ctx.node("Unsqueeze", [ctx.as_dtype(x2, t), ctx.ints([-3])])
    distance = _p_norm(ctx, ctx.node("Sub", [left, right]), p, t, nan_ignoring_max=True)
    return ctx.graph.cast(distance, t, ctx.out_dtype)


@lowers("aten._pdist_forward.default")
def _pdist(ctx: LoweringContext, x: Value, p: float = 2.0) -> str:
    rows = x.shape[0]
    if not isinstance(rows, int):
        raise UnsupportedError("pdist over a symbolic number of rows has no ONNX lowering",
                               fix="use cdist(x, x) and take the upper triangle")
    t = _compute_dtype(ctx.out_dtype)
    first, second = np.triu_indices(rows, k=1)
    value = ctx.as_dtype(x, t)
    left = ctx.node("Gather", [value, ctx.const(first.astype(np.int64))], axis=0)
    right = ctx.node("Gather", [value, ctx.const(second.astype(np.int64))], axis=0)
    return ctx.graph.cast(_p_norm(ctx, ctx.node("Sub", [left, right]), p, t), t, ctx.out_dtype)


# ---------------------------------------------------------------------------------------------
# Neural-network ops

def _float32_only(dtype: dtypes.DType) -> dtypes.DType:
    """onnxruntime's CPU Conv, ConvTranspose, AveragePool and Col2Im have no float64 kernels: compute in float32
    (integers too: exact while sums stay below 2**24)."""
    return dtypes.float32 if dtype is dtypes.float64 or not dtype.is_floating_point else _compute_dtype(dtype)


def _static_ints(values: list[Any], what: str) -> list[int]:
    if not all(isinstance(v, int) for v in values):
        raise UnsupportedError(f"symbolic {what} {values} has no ONNX attribute form",
                               fix=f"export with a static {what}")
    return [int(v) for v in values]


@lowers("aten.convolution.default")
def _convolution(ctx: LoweringContext, x: Value, weight: Value, bias: Value | None, stride: list[Any],
                 padding: list[Any], dilation: list[Any], transposed: bool, output_padding: list[Any],
                 groups: Any) -> str:
    spatial = x.rank - 2
    t = _float32_only(ctx.out_dtype)
    inputs = [ctx.as_dtype(x, t), ctx.as_dtype(weight, t)] + ([ctx.as_dtype(bias, t)] if bias is not None else [])
    pads = _static_ints(list(padding), "padding")
    pads = (pads * spatial)[:spatial] if len(pads) < spatial else pads
    attributes = dict(strides=_repeat_to(_static_ints(list(stride), "stride"), spatial),
                      dilations=_repeat_to(_static_ints(list(dilation), "dilation"), spatial),
                      pads=pads + pads, group=int(groups))
    if (ctx.out_dtype is dtypes.float64 or not ctx.out_dtype.is_floating_point) and not transposed:
        return ctx.graph.cast(_convolution64(ctx, x, weight, bias, attributes), dtypes.float64, ctx.out_dtype)
    if transposed and ctx.out_dtype is dtypes.float64 and all(
            isinstance(d, int) for d in [*x.shape[1:], *weight.shape, *ctx.out.shape[2:]]):
        return _conv_transpose64(ctx, x, weight, bias, attributes)
    if transposed:
        result = ctx.node("ConvTranspose", inputs, output_padding=_repeat_to(
            _static_ints(list(output_padding), "output_padding"), spatial), **attributes)
    else:
        result = ctx.node("Conv", inputs, **attributes)
    return ctx.graph.cast(result, t, ctx.out_dtype)


def _convolution64(ctx: LoweringContext, x: Value, weight: Value, bias: Value | None,
                   attributes: dict[str, Any]) -> str:
    """float64 convolution without a float64 Conv kernel: one strided window per kernel tap, contracted with
    that tap's weights by Einsum (which onnxruntime runs in float64), summed."""
    spatial = x.rank - 2
    t = dtypes.float64
    value = ctx.as_dtype(x, t)
    pads = attributes["pads"]
    if any(pads):
        value = ctx.node("Pad", [value, ctx.ints([0, 0] + pads[:spatial] + [0, 0] + pads[spatial:])])
    groups = attributes["group"]
    out_shape = list(ctx.out.shape)
    kernel = _static_ints(list(weight.shape[2:]), "kernel size")
    letters = "xyz"[:spatial]
    grouped_input = [x.shape[0], groups, -1] + out_shape[2:]
    total = None
    for tap in np.ndindex(*kernel):
        starts = [k * d for k, d in zip(tap, attributes["dilations"])]
        ends = [start + (size - 1) * stride + 1
                for start, size, stride in zip(starts, out_shape[2:], attributes["strides"])]
        window = ctx.node("Slice", [value, ctx.dims(starts), ctx.dims(ends), ctx.ints(range(2, 2 + spatial)),
                                    ctx.ints(attributes["strides"])])
        window = ctx.node("Reshape", [window, ctx.dims(grouped_input)])
        tap_weight = ctx.node("Reshape", [_tap(ctx, weight, t, tap), ctx.dims([groups, -1, weight.shape[1]])])
        term = ctx.node("Einsum", [window, tap_weight], equation=f"ngc{letters},goc->ngo{letters}")
        total = term if total is None else ctx.node("Add", [total, term])
    result = ctx.node("Reshape", [total, ctx.dims(out_shape)])
    if bias is not None:
        result = ctx.node("Add", [result, ctx.node("Reshape", [ctx.as_dtype(bias, t),
                                                               ctx.dims([1, -1] + [1] * spatial)])])
    return result


def _conv_transpose64(ctx: LoweringContext, x: Value, weight: Value, bias: Value | None,
                      attributes: dict[str, Any]) -> str:
    """float64 transposed convolution (1-, 2- or 3-d) without a float64 ConvTranspose kernel, as ATen's slow path
    computes it: each group's columns W^T x (an Einsum, which onnxruntime runs in float64), then col2im into the
    output."""
    t = dtypes.float64
    batch, channels_in, *sizes = x.shape
    spatial = len(sizes)
    groups = attributes["group"]
    kernel = list(weight.shape[2:])
    per_group_out, pixels, taps = weight.shape[1], math.prod(sizes), math.prod(kernel)
    value = ctx.node("Reshape", [ctx.as_dtype(x, t), ctx.dims([batch, groups, channels_in // groups, pixels])])
    matrix = ctx.node("Reshape", [ctx.as_dtype(weight, t), ctx.dims([groups, channels_in // groups,
                                                                    per_group_out * taps])])
    columns = ctx.node("Einsum", [value, matrix], equation="ngcl,gco->ngol")
    columns = ctx.node("Reshape", [columns, ctx.dims([batch, groups * per_group_out * taps, pixels])])
    params = [kernel, attributes["dilations"], attributes["pads"][:spatial], attributes["strides"]]
    result = _col2im64(ctx, columns, batch, groups * per_group_out, sizes, list(ctx.out.shape[2:]), params)
    if bias is not None:
        result = ctx.node("Add", [result, ctx.node("Reshape", [ctx.as_dtype(bias, t),
                                                               ctx.dims([1, -1] + [1] * spatial)])])
    return result


def _tap(ctx: LoweringContext, weight: Value, t: dtypes.DType, tap: tuple[int, ...]) -> str:
    """weight[:, :, *tap] as an [O, C/groups] matrix."""
    spatial = len(tap)
    window = ctx.node("Slice", [ctx.as_dtype(weight, t), ctx.ints(list(tap)), ctx.ints([k + 1 for k in tap]),
                                ctx.ints(range(2, 2 + spatial))])
    return ctx.node("Reshape", [window, ctx.dims([weight.shape[0], weight.shape[1]])])


def _repeat_to(values: list[int], count: int) -> list[int]:
    return values * count if len(values) == 1 else values


def _pool_attributes(kernel_size: list[int], stride: list[int], padding: Any, spatial: int) -> dict[str, Any]:
    kernel = _repeat_to(list(kernel_size), spatial)
    strides = _repeat_to(list(stride), spatial) if stride else kernel
    pads = _repeat_to(list(padding) if isinstance(padding, (list, tuple)) else [padding], spatial)
    return dict(kernel_shape=kernel, strides=strides, pads=pads + pads)


def _ceil_mode(ctx: LoweringContext, x: Value, attributes: dict[str, Any], ceil_mode: bool,
               dilations: list[int] | None = None) -> int:
    """ATen drops a last ceil-mode window that would start in the right padding, ONNX keeps it: choose the ONNX
    rounding that gives ATen's output size (the result type holds it)."""
    spatial = len(attributes["kernel_shape"])
    sizes = list(x.shape[-spatial:])
    if not ceil_mode or not all(isinstance(v, int) for v in sizes + list(ctx.out.shape[-spatial:])):
        return int(ceil_mode)
    floor_sizes = []
    for axis, size in enumerate(sizes):
        extent = (attributes["kernel_shape"][axis] - 1) * (dilations[axis] if dilations else 1) + 1
        padded = size + attributes["pads"][axis] + attributes["pads"][axis + spatial]
        floor_sizes.append((padded - extent) // attributes["strides"][axis] + 1)
    return 0 if floor_sizes == list(ctx.out.shape[-spatial:]) else 1


def _cropped(ctx: LoweringContext, x: Value, pooled: str, spatial: int, ceil_mode: bool) -> str:
    """A ceil-mode pool's result cut to ATen's size where the sizes are symbolic: `_ceil_mode` cannot choose a
    rounding there, so ONNX keeps a last window that starts in the right padding, which ATen drops (the windows
    before it are the same). Uncut, the extra row of padding-only windows shifted every later shape."""
    if not ceil_mode or all(isinstance(v, int) for v in [*x.shape[-spatial:], *ctx.out.shape[-spatial:]]):
        return pooled
    return ctx.node("Slice", [pooled, ctx.ints([0] * spatial), ctx.dims(list(ctx.out.shape[-spatial:])),
                              ctx.ints(list(range(-spatial, 0)))])


def _batched(ctx: LoweringContext, x: Value, spatial: int, t: dtypes.DType) -> tuple[str, bool]:
    """ONNX pools need a batch dim; ATen also accepts unbatched (C, *spatial) inputs."""
    value = ctx.as_dtype(x, t)
    if x.rank == spatial + 1:
        return ctx.node("Unsqueeze", [value, ctx.ints([0])]), True
    return value, False


def _unbatch(ctx: LoweringContext, value: str, unbatched: bool) -> str:
    return ctx.node("Squeeze", [value, ctx.ints([0])]) if unbatched else value


@lowers("aten.avg_pool2d.default", "aten.avg_pool3d.default")
def _avg_pool(ctx: LoweringContext, x: Value, kernel_size: list[int], stride: list[int] = (), padding: Any = 0,
              ceil_mode: bool = False, count_include_pad: bool = True, divisor_override: int | None = None) -> str:
    t = _float32_only(x.dtype)
    spatial = 2 if "2d" in ctx.op.name else 3
    attributes = _pool_attributes(kernel_size, list(stride), padding, spatial)
    sizes = [*x.shape[-spatial:], *ctx.out.shape[-spatial:]]
    if x.dtype is dtypes.float64 and all(isinstance(d, int) for d in sizes):
        return _avg_pool64(ctx, x, attributes, count_include_pad, divisor_override)
    value, unbatched = _batched(ctx, x, spatial, t)
    result = ctx.node("AveragePool", [value], ceil_mode=_ceil_mode(ctx, x, attributes, ceil_mode),
                      count_include_pad=int(count_include_pad or divisor_override is not None), **attributes)
    result = _cropped(ctx, x, result, spatial, ceil_mode)
    if divisor_override is not None:
        window = int(np.prod(attributes["kernel_shape"]))
        result = ctx.node("Mul", [result, ctx.const(window / divisor_override, t)])
    if not x.dtype.is_floating_point:  # ATen divides integers with truncation
        result = _rounding_toward_zero(ctx, result, t)
    return ctx.graph.cast(_unbatch(ctx, result, unbatched), t, x.dtype)


def _avg_pool64(ctx: LoweringContext, x: Value, attributes: dict[str, Any], count_include_pad: bool,
                divisor_override: int | None) -> str:
    """float64 average pooling without a float64 AveragePool kernel: each window's sum is one strided slice per
    kernel tap of the zero-padded input, added in ATen's tap order, then divided as ATen divides it (the override,
    the window's part inside the padded input, or its part inside the input), the divisors pooled from ones the
    same way (static spatial sizes: they fold to a constant)."""
    kernel, strides = attributes["kernel_shape"], attributes["strides"]
    spatial = len(kernel)
    pads = attributes["pads"][:spatial]
    sizes, out_sizes = list(x.shape[-spatial:]), list(ctx.out.shape[-spatial:])
    # ceil_mode's last window may reach past the right padding: zeros there, counted by no divisor
    beyond = [max(0, (o - 1) * s + k - (n + 2 * p)) for o, s, k, n, p in zip(out_sizes, strides, kernel, sizes, pads)]

    def padded(value: str, rank: int, fill: float) -> str:
        lead = [0] * (rank - spatial)
        if any(pads):
            value = ctx.node("Pad", [value, ctx.ints(lead + pads + lead + pads), ctx.const(fill, dtypes.float64)])
        if any(beyond):
            value = ctx.node("Pad", [value, ctx.ints(lead + [0] * spatial + lead + beyond)])
        return value

    def window_sums(value: str, rank: int) -> str:
        axes = list(range(rank - spatial, rank))
        total = None
        for tap in np.ndindex(*kernel):
            ends = [k + (o - 1) * s + 1 for k, o, s in zip(tap, out_sizes, strides)]
            window = ctx.node("Slice", [value, ctx.ints(list(tap)), ctx.ints(ends), ctx.ints(axes), ctx.ints(strides)])
            total = window if total is None else ctx.node("Add", [total, window])
        return total

    sums = window_sums(padded(ctx.as_dtype(x, dtypes.float64), x.rank, 0.0), x.rank)
    if divisor_override is not None:
        return ctx.node("Div", [sums, ctx.const(float(divisor_override), dtypes.float64)])
    ones = ctx.const(np.ones(sizes), dtypes.float64)
    counts = window_sums(padded(ones, spatial, 1.0 if count_include_pad else 0.0), spatial)
    return ctx.node("Div", [sums, counts])


def max_pool_input(ctx: LoweringContext, x: Value, kernel_size: list[int], stride: list[int], padding: Any,
                   dilation: Any, ceil_mode: bool, spatial: int) -> tuple[str, dtypes.DType, bool, dict[str, Any]]:
    """What MaxPool takes: the input batched and in a dtype onnxruntime pools, that dtype, whether the batch dim
    was added, and the node's attributes."""
    t = _compute_dtype(x.dtype) if x.dtype.is_floating_point else dtypes.float64  # no integer MaxPool kernels
    attributes = _pool_attributes(kernel_size, list(stride), padding, spatial)
    dilations = _repeat_to(list(dilation) if isinstance(dilation, (list, tuple)) else [dilation], spatial)
    value, unbatched = _batched(ctx, x, spatial, t)
    attributes.update(dilations=dilations, ceil_mode=_ceil_mode(ctx, x, attributes, ceil_mode, dilations))
    return value, t, unbatched, attributes


# Ops whose float results are never -inf, and the clamps whose lower bound (argument 1) keeps them from it.
_NEVER_MINUS_INF = {f"aten.{name}.default" for name in (
    "relu", "relu6", "sigmoid", "abs", "exp", "hardsigmoid", "softplus")}
_LOWER_BOUNDED = {"aten.clamp.default", "aten.clamp_min.default", "aten.hardtanh.default"}


def _never_minus_inf(operand: Any) -> bool:
    """Whether the producer of `operand` (a kiln SSA value) rules out -inf: a CNN's pooled activations follow a
    relu."""
    producer = getattr(operand, "owner", None)
    name = getattr(producer, "name", "")
    if name in _NEVER_MINUS_INF:
        return True
    if name in _LOWER_BOUNDED:
        lower = bound_arguments(producer)[1]
        return isinstance(lower, (int, float)) and not isinstance(lower, bool) and lower > -math.inf
    return False


def _empty_windows_minus_inf(ctx: LoweringContext, x: Value, values: str, attributes: dict[str, Any],
                             t: dtypes.DType, value: str | None) -> str:
    """A window whose inputs are all -inf, or that holds padding only (a padded, dilated or ceil-mode pool): ATen's
    scan leaves its -inf start there, onnxruntime's MaxPool without indices gives the lowest finite float. Pooling
    a mark of `value`'s inputs other than -inf finds those windows; where x cannot be -inf, or `value` is None
    (onnxruntime's MaxPool with indices keeps an all -inf window's -inf), pooling ones over one plane is enough,
    and only the pools named above need it."""
    if not t.is_floating_point or not x.dtype.is_floating_point:
        return values
    padding_only = any(attributes["pads"]) and (
        any(d != 1 for d in attributes["dilations"]) or attributes["ceil_mode"])
    if value is None or _never_minus_inf(ctx.op.operands[0]):
        if not padding_only:
            return values
        spatial = len(attributes["kernel_shape"])
        marks = ctx.node("ConstantOfShape", [ctx.dims([1, 1] + list(x.shape[-spatial:]))],
                         value=_scalar_tensor(1, t))
    else:
        marks = ctx.graph.cast(ctx.node("Not", [ctx.node("Equal", [value, ctx.const(-math.inf, t)])]),
                               dtypes.bool_, t)
    seen = ctx.node("Greater", [ctx.node("MaxPool", [marks], **attributes), ctx.const(0, t)])
    return ctx.node("Where", [seen, values, ctx.const(-math.inf, t)])


def max_pool_values(ctx: LoweringContext, x: Value, *pool: Any, spatial: int) -> str:
    """The pooled values alone: one MaxPool without its indices output. onnxruntime's MaxPool may skip a NaN that
    ATen's returns (torch.onnx's files do the same); with the indices used, `_max_pool` keeps ATen's NaN rule."""
    value, t, unbatched, attributes = max_pool_input(ctx, x, *pool, spatial)
    values = _empty_windows_minus_inf(ctx, x, ctx.node("MaxPool", [value], **attributes), attributes, t, value)
    values = _cropped(ctx, x, values, spatial, pool[4])
    return ctx.graph.cast(_unbatch(ctx, values, unbatched), t, x.dtype)


@lowers("aten.max_pool2d_with_indices.default", "aten.max_pool3d_with_indices.default")
def _max_pool(ctx: LoweringContext, x: Value, kernel_size: list[int], stride: list[int] = (), padding: Any = 0,
              dilation: Any = 1, ceil_mode: bool = False) -> list[str]:
    spatial = 2 if "2d" in ctx.op.name else 3
    pool = (kernel_size, stride, padding, dilation, ceil_mode)
    if not ctx.op.results[1].uses:
        return [max_pool_values(ctx, x, *pool, spatial=spatial), ctx.const(0, dtypes.int64)]  # unused: dropped
    value, t, unbatched, attributes = max_pool_input(ctx, x, *pool, spatial)
    values, indices = ctx.node("MaxPool", [value], outputs=2, **attributes)
    # ONNX indices count over the whole tensor; ATen's count within each (batch, channel) plane.
    plane = ctx.sizes(x, range(x.rank - spatial, x.rank))
    indices = ctx.node("Mod", [indices, ctx.dim(plane)])
    if t.is_floating_point and x.dtype.is_floating_point:
        values = _empty_windows_minus_inf(ctx, x, values, attributes, t, None)
        values, indices = _max_pool_specials(ctx, x, value, values, indices, attributes, t)
    values, indices = (_cropped(ctx, x, v, spatial, ceil_mode) for v in (values, indices))
    return [ctx.graph.cast(_unbatch(ctx, values, unbatched), t, x.dtype), _unbatch(ctx, indices, unbatched)]


def _max_pool_specials(ctx: LoweringContext, x: Value, value: str, values: str, indices: str,
                       attributes: dict[str, Any], t: dtypes.DType) -> tuple[str, str]:
    """ATen's window scan takes `v > max || isnan(v)`, starting from -inf at the window's first tap: a NaN wins
    (the last one), and a window of -inf inputs or of padding only points at its first tap (`_window_starts`).
    onnxruntime's MaxPool skips NaN, so the last NaN comes from pooling the in-plane positions (exact in float32
    below 2**24 per plane). Call it with the values of empty windows already -inf."""
    spatial = len(attributes["kernel_shape"])
    shape = list(x.shape[-spatial:])
    plane = ctx.sizes(x, range(x.rank - spatial, x.rank))
    positions = ctx.node("Range", [ctx.const(0, t), ctx.as_dtype(plane, t), ctx.const(1, t)])
    positions = ctx.node("Reshape", [positions, ctx.dims([1, 1] + shape)])
    is_nan = ctx.node("IsNaN", [value])
    # position + 1 where NaN, else 0: the window's maximum is its last NaN's position + 1
    nan_marks = ctx.node("Where", [is_nan, ctx.node("Add", [positions, ctx.const(1, t)]), ctx.const(0, t)])
    last_nan = ctx.node("MaxPool", [nan_marks], **attributes)
    has_nan = ctx.node("Greater", [last_nan, ctx.const(0, t)])
    all_minus_inf = ctx.node("Equal", [values, ctx.const(-math.inf, t)])
    to_index = lambda position: ctx.graph.cast(position, t, dtypes.int64)  # noqa: E731
    starts = ctx.node("Expand", [_window_starts(ctx, x, values, attributes), ctx.node("Shape", [indices])])
    indices = ctx.node("Where", [all_minus_inf, starts, indices])
    indices = ctx.node("Where", [has_nan, to_index(ctx.node("Sub", [last_nan, ctx.const(1, t)])), indices])
    values = ctx.node("Where", [has_nan, ctx.const(math.nan, t), values])
    return values, indices


def _window_starts(ctx: LoweringContext, x: Value, pooled: str, attributes: dict[str, Any]) -> str:
    """Each window's first tap in its plane, as ATen's scan starts it: along each spatial dim o * stride - pad,
    moved on by dilations past the leading padding (and past the image's end, for a window of padding only, as
    ATen's index does), flattened row-major over the plane's sizes; int64, broadcasting over `pooled`."""
    spatial = len(attributes["kernel_shape"])
    rank = spatial + 2
    flat, step = None, 1
    for k in reversed(range(spatial)):
        stride, pad = attributes["strides"][k], attributes["pads"][k]
        dilation = attributes["dilations"][k]
        count = ctx.node("Squeeze", [ctx.node("Shape", [pooled], start=2 + k, end=3 + k), ctx.ints([0])])
        start = ctx.node("Sub", [ctx.node("Mul", [ctx.node("Range", [ctx.const(0, dtypes.int64), count,
                                                                     ctx.const(1, dtypes.int64)]),
                                                  ctx.const(stride, dtypes.int64)]), ctx.const(pad, dtypes.int64)])
        # a negative start moves on by ceil(-start / dilation) dilations
        behind = ctx.node("Max", [ctx.node("Neg", [start]), ctx.const(0, dtypes.int64)])
        hops = ctx.node("Div", [ctx.node("Add", [behind, ctx.const(dilation - 1, dtypes.int64)]),
                                ctx.const(dilation, dtypes.int64)])
        start = ctx.node("Add", [start, ctx.node("Mul", [hops, ctx.const(dilation, dtypes.int64)])])
        start = ctx.node("Reshape", [start, ctx.ints([-1 if axis == 2 + k else 1 for axis in range(rank)])])
        term = ctx.node("Mul", [start, ctx.as_dtype(step, dtypes.int64)]) if step != 1 else start
        flat = term if flat is None else ctx.node("Add", [flat, term])
        step = step * x.shape[x.rank - spatial + k]
    return flat


def _adaptive_avg_pool(ctx: LoweringContext, x: Value, output_size: list[Any]) -> str:
    spatial = len(output_size)
    if any(d == 0 for d in x.shape[:-spatial]):  # nothing to average; onnxruntime's blocked pools refuse 0 channels
        return ctx.node("ConstantOfShape", [ctx.dims(ctx.out.shape)], value=_scalar_tensor(0, x.dtype))
    t = _compute_dtype(x.dtype)
    inputs = list(x.shape[-spatial:])
    folded = not isinstance(x.shape[-spatial - 1], int)
    if folded:  # channels that may be 0 at run time, which onnxruntime's pools refuse (only N may be 0): each
        # channel is pooled alone, so they fold into the batch
        value, unbatched = ctx.node("Reshape", [ctx.as_dtype(x, t), ctx.dims([-1, 1, *inputs])]), False
    else:
        value, unbatched = _batched(ctx, x, spatial, t)

    def finish(result: str) -> str:
        result = ctx.node("Reshape", [result, ctx.dims(ctx.out.shape)]) if folded else _unbatch(ctx, result, unbatched)
        return ctx.graph.cast(result, t, x.dtype)
    if all(o == 1 for o in output_size):
        if t is dtypes.float64:  # onnxruntime's GlobalAveragePool has no float64 kernel for every rank
            return finish(ctx.node("ReduceMean", [value, ctx.ints(range(2, spatial + 2))], keepdims=1))
        return finish(ctx.node("GlobalAveragePool", [value]))
    if not all(isinstance(v, int) for v in inputs + list(output_size)):
        raise UnsupportedError("adaptive_avg_pool with symbolic spatial sizes has no ONNX lowering",
                               fix="export with static spatial sizes, or use an output size of 1")
    if all(i % o == 0 for i, o in zip(inputs, output_size)) and t is not dtypes.float64:
        kernel = [i // o for i, o in zip(inputs, output_size)]
        return finish(ctx.node("AveragePool", [value], kernel_shape=kernel, strides=kernel))
    # Uneven windows (and float64): average each window separately (ATen's start = floor(i*in/out), end =
    # ceil((i+1)*in/out)).
    result = value
    rank = spatial + 2
    for offset, (size_in, size_out) in enumerate(zip(inputs, output_size)):
        axis = rank - spatial + offset
        pieces = []
        for i in range(size_out):
            start, end = (i * size_in) // size_out, -((-(i + 1) * size_in) // size_out)
            window = ctx.node("Slice", [result, ctx.ints([start]), ctx.ints([end]), ctx.ints([axis])])
            pieces.append(ctx.node("ReduceMean", [window, ctx.ints([axis])], keepdims=1))
        result = ctx.node("Concat", pieces, axis=axis)
    return finish(result)


LOWERING_TABLE["aten._adaptive_avg_pool2d.default"] = _adaptive_avg_pool
LOWERING_TABLE["aten._adaptive_avg_pool3d.default"] = _adaptive_avg_pool


def _channel_shape(x: Value) -> list[Any]:
    return [1, x.shape[1]] + [1] * (x.rank - 2)


def _scaled_and_shifted(ctx: LoweringContext, value: str, mean: str, rstd: str, x: Value, weight: Value | None,
                        bias: Value | None, t: dtypes.DType) -> str:
    """ATen's batch and group norm: x * alpha + (bias - mean * alpha), alpha = rstd * weight, with per-channel
    `mean` and `rstd` (an infinite weight gives inf - inf = NaN there, and a zero comes out +0)."""
    def channel(vector: Value) -> str:
        return ctx.node("Reshape", [ctx.as_dtype(vector, t), ctx.dims(_channel_shape(x))])
    alpha = rstd if weight is None else ctx.node("Mul", [rstd, channel(weight)])
    shift = ctx.node("Sub", [ctx.const(0, t) if bias is None else channel(bias), ctx.node("Mul", [mean, alpha])])
    return ctx.node("Add", [ctx.node("Mul", [value, alpha]), shift])


def _batch_norm(ctx: LoweringContext, x: Value, weight: Value | None, bias: Value | None, mean: Value | None,
                var: Value | None, training: bool, eps: float) -> list[str]:
    t = _compute_dtype(x.dtype)
    value = ctx.as_dtype(x, t)
    axes = [0] + list(range(2, x.rank))
    if training or mean is None:
        batch_mean = ctx.node("ReduceMean", [value, ctx.ints(axes)], keepdims=1)
        centered = ctx.node("Sub", [value, batch_mean])
        batch_var = ctx.node("ReduceMean", [ctx.node("Mul", [centered, centered]), ctx.ints(axes)], keepdims=1)
        rstd = ctx.node("Reciprocal", [ctx.node("Sqrt", [ctx.node("Add", [batch_var, ctx.const(eps, t)])])])
        out = _scaled_and_shifted(ctx, value, batch_mean, rstd, x, weight, bias, t)
        save_mean = ctx.node("Reshape", [batch_mean, ctx.ints([-1])])
        save_rstd = ctx.node("Reshape", [rstd, ctx.ints([-1])])
        return [ctx.graph.cast(out, t, x.dtype), ctx.graph.cast(save_mean, t, ctx.result_types[1].dtype),
                ctx.graph.cast(save_rstd, t, ctx.result_types[2].dtype)]
    shape = ctx.dims(_channel_shape(x))
    running_mean = ctx.node("Reshape", [ctx.as_dtype(mean, t), shape])
    running_var = ctx.node("Reshape", [ctx.as_dtype(var, t), shape])  # type: ignore[arg-type]
    rstd = ctx.node("Reciprocal", [ctx.node("Sqrt", [ctx.node("Add", [running_var, ctx.const(eps, t)])])])
    out = _scaled_and_shifted(ctx, value, running_mean, rstd, x, weight, bias, t)
    empty = [ctx.const(np.zeros([d if isinstance(d, int) else 0 for d in r.shape], dtype=r.dtype.numpy))
             for r in ctx.result_types[1:]]
    return [ctx.graph.cast(out, t, x.dtype)] + empty


@lowers("aten._native_batch_norm_legit_no_training.default")
def _bn_inference(ctx: LoweringContext, x: Value, weight: Any, bias: Any, running_mean: Value, running_var: Value,
                  momentum: float, eps: float) -> list[str]:
    return _batch_norm(ctx, x, weight, bias, running_mean, running_var, False, eps)


@lowers("aten._native_batch_norm_legit.default")
def _bn_legit(ctx: LoweringContext, x: Value, weight: Any, bias: Any, running_mean: Value, running_var: Value,
              training: bool, momentum: float, eps: float) -> list[str]:
    return _batch_norm(ctx, x, weight, bias, running_mean, running_var, training, eps)


@lowers("aten._native_batch_norm_legit.no_stats")
def _bn_no_stats(ctx: LoweringContext, x: Value, weight: Any, bias: Any, training: bool, momentum: float,
                 eps: float) -> list[str]:
    return _batch_norm(ctx, x, weight, bias, None, None, True, eps)


@lowers("aten.native_layer_norm.default")
def _layer_norm(ctx: LoweringContext, x: Value, normalized_shape: list[Any], weight: Value | None,
                bias: Value | None, eps: float) -> list[str]:
    t = _compute_dtype(x.dtype)
    axis = x.rank - len(normalized_shape)
    if t is dtypes.float64 or not all(isinstance(d, int) and d > 0 for d in normalized_shape):
        # onnxruntime's LayerNormalization has no float64 statistics and refuses an empty normalized shape (which a
        # symbolic dim may be at run time): the reductions, in float64
        return _layer_norm64(ctx, x, axis, weight, bias, eps)
    statistics = len(ctx.result_types) > 1 and any(result.uses for result in ctx.op.results[1:])
    scale = (ctx.as_dtype(weight, t) if weight is not None
             else ctx.node("Expand", [ctx.const(1, t), ctx.dims(normalized_shape)]))
    shift = ctx.as_dtype(bias, t) if bias is not None else None
    if shift is None and weight is not None:  # ATen adds the bias or 0: a negative weight times +0 gives +0, not -0
        shift = ctx.node("Expand", [ctx.const(0, t), ctx.dims(normalized_shape)])
    inputs = [ctx.as_dtype(x, t), scale] + ([shift] if shift is not None else [])
    if not statistics:  # layer_norm, or the mean and rstd unused: the one-output form
        out = ctx.node("LayerNormalization", inputs, axis=axis, epsilon=float(eps), stash_type=onnx_dtype(t))
        return [ctx.graph.cast(out, t, x.dtype)] + [ctx.const(0, dtypes.float32)] * (len(ctx.result_types) - 1)
    out, mean, rstd = ctx.node("LayerNormalization", inputs, outputs=3, axis=axis, epsilon=float(eps),
                               stash_type=onnx_dtype(t))
    return [ctx.graph.cast(out, t, x.dtype), ctx.graph.cast(mean, t, ctx.result_types[1].dtype),
            ctx.graph.cast(rstd, t, ctx.result_types[2].dtype)]


def _layer_norm64(ctx: LoweringContext, x: Value, axis: int, weight: Value | None, bias: Value | None,
                  eps: float) -> list[str]:
    t = dtypes.float64
    value = ctx.as_dtype(x, t)
    axes = ctx.ints(range(axis, x.rank))
    mean = ctx.node("ReduceMean", [value, axes], keepdims=1)
    centered = ctx.node("Sub", [value, mean])
    var = ctx.node("ReduceMean", [ctx.node("Mul", [centered, centered]), axes], keepdims=1)
    rstd = ctx.node("Reciprocal", [ctx.node("Sqrt", [ctx.node("Add", [var, ctx.const(eps, t)])])])
    out = ctx.node("Mul", [centered, rstd])
    if weight is not None:
        out = ctx.node("Mul", [out, ctx.as_dtype(weight, t)])
    if bias is not None:
        out = ctx.node("Add", [out, ctx.as_dtype(bias, t)])
    elif weight is not None:  # ATen adds the bias or 0: a negative weight times +0 gives +0, not -0
        out = ctx.node("Add", [out, ctx.const(0, t)])
    statistics = [ctx.graph.cast(value, t, result.dtype) for value, result in zip((mean, rstd), ctx.result_types[1:])]
    return [ctx.graph.cast(out, t, x.dtype)] + statistics


@lowers("aten.native_group_norm.default")
def _group_norm(ctx: LoweringContext, x: Value, weight: Value | None, bias: Value | None, n: Any, c: Any, hxw: Any,
                group: int, eps: float) -> list[str]:
    t = _compute_dtype(x.dtype)
    per_group = sympy.sympify(c) * hxw // group
    grouped = ctx.node("Reshape", [ctx.as_dtype(x, t), ctx.dims([n, group, int(per_group) if per_group.is_Integer
                                                                 else per_group])], allowzero=1)
    axes = ctx.ints([2])
    mean = ctx.node("ReduceMean", [grouped, axes], keepdims=1)
    centered = ctx.node("Sub", [grouped, mean])
    var = ctx.node("ReduceMean", [ctx.node("Mul", [centered, centered]), axes], keepdims=1)
    rstd = ctx.node("Reciprocal", [ctx.node("Sqrt", [ctx.node("Add", [var, ctx.const(eps, t)])])])

    def per_channel(statistic: str) -> str:  # [n, group, 1] -> [n, C, 1, ...]
        spread = ctx.node("Expand", [statistic, ctx.dims([n, group, sympy.sympify(c) // group])])
        return ctx.node("Reshape", [spread, ctx.dims([n, c] + [1] * (x.rank - 2))], allowzero=1)
    out = _scaled_and_shifted(ctx, ctx.as_dtype(x, t), per_channel(mean), per_channel(rstd), x, weight, bias, t)
    stats = ctx.dims([n, group])
    return [ctx.graph.cast(out, t, x.dtype),
            ctx.graph.cast(ctx.node("Reshape", [mean, stats]), t, ctx.result_types[1].dtype),
            ctx.graph.cast(ctx.node("Reshape", [rstd, stats]), t, ctx.result_types[2].dtype)]


@lowers("aten.native_dropout.default")
def _native_dropout(ctx: LoweringContext, x: Value, p: float, train: bool | None) -> list[str]:
    if train is False or p == 0:
        mask = ctx.node("ConstantOfShape", [ctx.shape(x)], value=_scalar_tensor(True, dtypes.bool_))
        return [ctx.node("Identity", [x.name]), mask]
    if p >= 1:  # onnxruntime refuses ratio 1; ATen drops everything
        mask = ctx.node("ConstantOfShape", [ctx.shape(x)], value=_scalar_tensor(False, dtypes.bool_))
        return [ctx.node("Mul", [x.name, ctx.const(0, x.dtype)]), mask]
    t = _compute_dtype(x.dtype)
    out, mask = ctx.node("Dropout", [ctx.as_dtype(x, t), ctx.const(np.asarray(p, dtype=t.numpy)),
                                     ctx.const(np.asarray(True))], outputs=2)
    return [ctx.graph.cast(out, t, x.dtype), mask]


# The dtypes onnxruntime's CPU Resize has kernels for (float16 and bfloat16 compute in float32 here)
_RESIZE_DTYPES = (dtypes.float32, dtypes.int32, dtypes.int8, dtypes.uint8)


@lowers("aten.upsample_nearest2d.vec", "aten.upsample_bilinear2d.vec")
def _upsample(ctx: LoweringContext, x: Value, output_size: list[Any] | None, *rest: Any) -> str:
    bilinear = "bilinear" in ctx.op.name
    align_corners, scale_factors = (rest[0], rest[1]) if bilinear else (False, rest[0])
    t = _compute_dtype(x.dtype)
    sizes_in, sizes_out = list(x.shape[-2:]), list(ctx.out.shape[-2:])
    if t not in _RESIZE_DTYPES:  # float64, and for nearest int64, int16, bool...: taps gathered, exact
        if not all(isinstance(d, int) for d in sizes_in + sizes_out):
            raise UnsupportedError(f"{ctx.op.name.split('.')[1]} of a {t.name} image with symbolic height or width "
                                   f"has no ONNX form onnxruntime runs (its Resize has no {t.name} kernel, and kiln "
                                   "gathers ATen's taps for static sizes only)",
                                   fix="export with a static image size, or upsample in float32")
        return _resample_gathered(ctx, ctx.as_dtype(x, t), sizes_in, sizes_out, scale_factors or [None, None],
                                  bilinear, align_corners)
    attributes: dict[str, Any] = {"mode": "linear" if bilinear else "nearest"}
    if bilinear:
        attributes["coordinate_transformation_mode"] = "align_corners" if align_corners else "pytorch_half_pixel"
    else:
        attributes.update(coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    if scale_factors is not None and output_size is None:
        # ATen maps output to input coordinates with the given scale, not the size ratio.
        scales = ctx.const(np.asarray([1.0, 1.0] + list(scale_factors), dtype=np.float32))
        if bilinear and not align_corners:
            attributes["coordinate_transformation_mode"] = "half_pixel"
        result = ctx.node("Resize", [ctx.as_dtype(x, t), "", scales], **attributes)
    else:
        sizes = ctx.dims(list(ctx.out.shape))
        result = ctx.node("Resize", [ctx.as_dtype(x, t), "", "", sizes], **attributes)
    return ctx.graph.cast(result, t, x.dtype)


def _resample_gathered(ctx: LoweringContext, x: str, sizes_in: list[int], sizes_out: list[int], scales: list[Any],
                       bilinear: bool, align_corners: bool) -> str:
    """Resampling where onnxruntime's Resize has no kernel for the dtype (float64; int64, int16 and bool for nearest):
    gather ATen's taps along each axis and weigh them in ATen's order (columns, then rows). A dense interpolation
    matrix would also multiply an infinity by the zero weights of its row and spread NaN over every output of the
    row."""
    if not bilinear:
        rows, columns = (nearest_source(size_in, size_out, scale)
                         for size_in, size_out, scale in zip(sizes_in, sizes_out, scales))
        return ctx.node("Gather", [ctx.node("Gather", [x, ctx.const(rows)], axis=-2), ctx.const(columns)], axis=-1)
    (top, bottom, w_top, w_bottom), (left, right, w_left, w_right) = (
        linear_taps(size_in, size_out, align_corners, scale, np.dtype(np.float64))
        for size_in, size_out, scale in zip(sizes_in, sizes_out, scales))

    def across_columns(rows: str) -> str:
        return ctx.node("Add", [ctx.node("Mul", [ctx.node("Gather", [rows, ctx.const(left)], axis=-1),
                                                 ctx.const(w_left)]),
                                ctx.node("Mul", [ctx.node("Gather", [rows, ctx.const(right)], axis=-1),
                                                 ctx.const(w_right)])])
    upper = across_columns(ctx.node("Gather", [x, ctx.const(top)], axis=-2))
    lower = across_columns(ctx.node("Gather", [x, ctx.const(bottom)], axis=-2))
    return ctx.node("Add", [ctx.node("Mul", [upper, ctx.const(w_top[:, None])]),
                            ctx.node("Mul", [lower, ctx.const(w_bottom[:, None])])])


_GRID_MODES = {0: "bilinear", 1: "nearest", 2: "bicubic"}
_GRID_MODES_20 = {0: "linear", 1: "nearest", 2: "cubic"}
_GRID_PADDING = {0: "zeros", 1: "border", 2: "reflection"}


@lowers("aten.grid_sampler_2d.default")
def _grid_sampler(ctx: LoweringContext, x: Value, grid: Value, interpolation_mode: int, padding_mode: int,
                  align_corners: bool) -> str:
    t = _compute_dtype(x.dtype)
    static = all(isinstance(d, int) for d in x.shape[2:])
    if t is dtypes.float64 and interpolation_mode != 2 and static:
        return _grid_sampler64(ctx, x, grid, interpolation_mode, padding_mode, align_corners)
    if ctx.declared_dtype in _LOW_PRECISION and static:
        return _grid_sampler_reduced(ctx, x, grid, interpolation_mode, padding_mode, align_corners)
    modes = _GRID_MODES_20 if ctx.opset >= 20 else _GRID_MODES
    result = ctx.node("GridSample", [ctx.as_dtype(x, t), ctx.as_dtype(grid, t)], mode=modes[interpolation_mode],
                      padding_mode=_GRID_PADDING[padding_mode], align_corners=int(align_corners))
    return ctx.graph.cast(result, t, x.dtype)


def _grid_sampler64(ctx: LoweringContext, x: Value, grid: Value, interpolation_mode: int, padding_mode: int,
                    align_corners: bool) -> str:
    """float64 bilinear/nearest grid_sampler (onnxruntime's GridSample computes in float32): ATen's vectorized
    kernel, unnormalize and pad each coordinate, then gather the corners of each point from the flattened plane."""
    t = dtypes.float64
    height, width = x.shape[2:]
    value = ctx.as_dtype(grid, t)
    c = lambda v: ctx.const(v, t)  # noqa: E731

    def coordinate(axis: int, size: int) -> str:
        raw = ctx.node("Gather", [value, ctx.const(np.int64(axis))], axis=-1)
        if align_corners:
            raw = ctx.node("Mul", [ctx.node("Add", [raw, c(1)]), c((size - 1) / 2)])
        else:
            raw = ctx.node("Sub", [ctx.node("Mul", [ctx.node("Add", [raw, c(1)]), c(size / 2)]), c(0.5)])
        if padding_mode == 2:  # reflection, then clip
            low, twice_span = (0.0, 2.0 * (size - 1)) if align_corners else (-0.5, 2.0 * size)
            if twice_span <= 0:
                raw = ctx.node("Mul", [raw, c(0)])
            else:
                distance = ctx.node("Abs", [ctx.node("Sub", [raw, c(low)])])
                spans = ctx.node("Floor", [ctx.node("Div", [distance, c(twice_span)])])
                extra = ctx.node("Sub", [distance, ctx.node("Mul", [spans, c(twice_span)])])
                raw = ctx.node("Add", [ctx.node("Min", [extra, ctx.node("Sub", [c(twice_span), extra])]), c(low)])
        if padding_mode in (1, 2):
            raw = ctx.node("Min", [c(size - 1), ctx.node("Max", [raw, c(0)])])
        return raw

    gx, gy = coordinate(0, width), coordinate(1, height)
    tap = _grid_taps(ctx, x, t)
    if interpolation_mode == 1:  # nearest: round half to even, like std::nearbyint
        return ctx.graph.cast(tap(ctx.node("Round", [gy]), ctx.node("Round", [gx])), t, ctx.out_dtype)
    west, north = ctx.node("Floor", [gx]), ctx.node("Floor", [gy])
    w, n = ctx.node("Sub", [gx, west]), ctx.node("Sub", [gy, north])
    e, s = ctx.node("Sub", [c(1), w]), ctx.node("Sub", [c(1), n])
    east, south = ctx.node("Add", [west, c(1)]), ctx.node("Add", [north, c(1)])
    weight = lambda a, b: ctx.node("Unsqueeze", [ctx.node("Mul", [a, b]), ctx.ints([1])])  # noqa: E731
    out = ctx.node("Mul", [tap(north, west), weight(s, e)])
    for rows, cols, a, b in ((north, east, s, w), (south, west, n, e), (south, east, n, w)):
        out = ctx.node("Add", [out, ctx.node("Mul", [tap(rows, cols), weight(a, b)])])
    return ctx.graph.cast(out, t, ctx.out_dtype)


def _grid_taps(ctx: LoweringContext, x: Value, t: dtypes.DType) -> Callable[[str, str], str]:
    """tap(rows, cols): x at integer (rows, cols) (as `t` values) per grid point, zero outside the input."""
    height, width = x.shape[2:]
    batch, channels, out_h, out_w = ctx.out.shape
    plane = ctx.node("Reshape", [ctx.as_dtype(x, t), ctx.dims([batch, channels, height * width])], allowzero=1)
    c = lambda v: ctx.const(v, t)  # noqa: E731

    def tap(rows: str, cols: str) -> str:
        inside = ctx.node("And", [
            ctx.node("And", [ctx.node("GreaterOrEqual", [rows, c(0)]), ctx.node("Less", [rows, c(height)])]),
            ctx.node("And", [ctx.node("GreaterOrEqual", [cols, c(0)]), ctx.node("Less", [cols, c(width)])])])
        safe_rows = ctx.node("Min", [c(height - 1), ctx.node("Max", [rows, c(0)])])
        safe_cols = ctx.node("Min", [c(width - 1), ctx.node("Max", [cols, c(0)])])
        flat = ctx.node("Add", [ctx.node("Mul", [safe_rows, c(width)]), safe_cols])
        index = ctx.graph.cast(ctx.node("Where", [inside, flat, c(0)]), t, dtypes.int64)
        index = ctx.node("Reshape", [index, ctx.dims([batch, 1, out_h * out_w])], allowzero=1)
        index = ctx.node("Expand", [index, ctx.dims([batch, channels, out_h * out_w])])
        values = ctx.node("Reshape", [ctx.node("GatherElements", [plane, index], axis=2),
                                      ctx.dims([batch, channels, out_h, out_w])], allowzero=1)
        return ctx.node("Where", [ctx.node("Unsqueeze", [inside, ctx.ints([1])]), values, c(0)])
    return tap


def _grid_sampler_reduced(ctx: LoweringContext, x: Value, grid: Value, interpolation_mode: int, padding_mode: int,
                          align_corners: bool) -> str:
    """float16/bfloat16 grid_sampler as ATen's scalar fallback computes it: in the reduced dtype, rounding after
    every operation (here float32 arithmetic, each result rounded through the dtype)."""
    t, dtype = dtypes.float32, ctx.declared_dtype
    height, width = x.shape[2:]
    c = lambda v: ctx.const(np.asarray(v, dtype.numpy).astype(np.float32))  # noqa: E731  (a dtype constant)

    def op(op_type: str, *inputs: str) -> str:
        return ctx.node("Cast", [ctx.node("Cast", [ctx.node(op_type, list(inputs))], to=onnx_dtype(dtype))],
                        to=onnx_dtype(t))

    def unnormalize(value: str, size: int) -> str:
        if align_corners:
            return op("Mul", op("Div", op("Add", value, c(1)), c(2)), c(size - 1))
        return op("Div", op("Sub", op("Mul", op("Add", value, c(1)), c(size)), c(1)), c(2))

    def clip(value: str, size: int) -> str:
        return ctx.node("Min", [c(size - 1), ctx.node("Max", [value, c(0)])])

    def reflect(value: str, twice_low: int, twice_high: int) -> str:
        if twice_low == twice_high:
            return ctx.node("Mul", [value, c(0)])
        low, span = op("Div", c(twice_low), c(2)), op("Div", c(twice_high - twice_low), c(2))
        distance = ctx.node("Abs", [op("Sub", value, low)])
        extra = ctx.node("Cast", [ctx.node("Cast", [ctx.node("Mod", [distance, span], fmod=1)],
                                           to=onnx_dtype(dtype))], to=onnx_dtype(t))
        flips = ctx.node("Floor", [op("Div", distance, span)])
        even = ctx.node("Equal", [ctx.node("Mod", [flips, c(2)], fmod=1), c(0)])
        return ctx.node("Where", [even, op("Add", extra, low), op("Add", op("Sub", span, extra), low)])

    def pad(value: str, size: int) -> str:
        if padding_mode == 1:
            return clip(value, size)
        if padding_mode == 2:
            twice = (0, 2 * (size - 1)) if align_corners else (-1, 2 * size - 1)
            return clip(reflect(value, *twice), size)
        return value

    raw = ctx.as_dtype(grid, t)
    gx, gy = (ctx.node("Gather", [raw, ctx.const(np.int64(axis))], axis=-1) for axis in (0, 1))
    tap = _grid_taps(ctx, x, t)

    def weighted_sum(terms: list[tuple[str, str]]) -> str:
        total = None
        for value, weight in terms:
            term = op("Mul", value, ctx.node("Unsqueeze", [weight, ctx.ints([1])]))
            total = term if total is None else op("Add", total, term)
        return total

    if interpolation_mode == 2:  # bicubic: pad each of the 16 taps, not the sampling point
        ix, iy = unnormalize(gx, width), unnormalize(gy, height)
        ix_nw, iy_nw = ctx.node("Floor", [ix]), ctx.node("Floor", [iy])
        tx, ty = op("Sub", ix, ix_nw), op("Sub", iy, iy_nw)
        a = c(-0.75)

        def near(v: str) -> str:  # ((a + 2) * v - (a + 3)) * v * v + 1
            inner = op("Sub", op("Mul", op("Add", a, c(2)), v), op("Add", a, c(3)))
            return op("Add", op("Mul", op("Mul", inner, v), v), c(1))

        def far(v: str) -> str:  # ((a * v - 5a) * v + 8a) * v - 4a
            inner = op("Add", op("Mul", op("Sub", op("Mul", a, v), op("Mul", a, c(5))), v), op("Mul", a, c(8)))
            return op("Sub", op("Mul", inner, v), op("Mul", a, c(4)))

        def coefficients(v: str) -> list[str]:
            opposite = op("Sub", c(1), v)
            return [far(op("Add", v, c(1))), near(v), near(opposite), far(op("Add", opposite, c(1)))]

        wx, wy = coefficients(tx), coefficients(ty)
        rows = [weighted_sum([(tap(pad(op("Add", iy_nw, c(i - 1)), height), pad(op("Add", ix_nw, c(j - 1)), width)),
                               wx[j]) for j in range(4)]) for i in range(4)]
        out = weighted_sum(list(zip(rows, wy)))
    else:
        ix, iy = pad(unnormalize(gx, width), width), pad(unnormalize(gy, height), height)
        if interpolation_mode == 1:
            out = tap(ctx.node("Round", [iy]), ctx.node("Round", [ix]))
        else:
            west, north = ctx.node("Floor", [ix]), ctx.node("Floor", [iy])
            east, south = op("Add", west, c(1)), op("Add", north, c(1))
            weights = [op("Mul", op("Sub", east, ix), op("Sub", south, iy)),
                       op("Mul", op("Sub", ix, west), op("Sub", south, iy)),
                       op("Mul", op("Sub", east, ix), op("Sub", iy, north)),
                       op("Mul", op("Sub", ix, west), op("Sub", iy, north))]
            corners = [(north, west), (north, east), (south, west), (south, east)]
            out = weighted_sum([(tap(r, col), w) for (r, col), w in zip(corners, weights)])
    return ctx.graph.cast(out, t, ctx.out_dtype)


@lowers("aten.col2im.default")
def _col2im(ctx: LoweringContext, x: Value, output_size: list[Any], kernel_size: list[int], dilation: list[int],
            padding: list[int], stride: list[int]) -> str:
    # float64 keeps its digits through _col2im64 (onnxruntime's Col2Im has no float64 kernel)
    t = dtypes.float64 if x.dtype is dtypes.float64 else _float32_only(x.dtype)
    value = ctx.as_dtype(x, t)
    unbatched = x.rank == 2
    if unbatched:
        value = ctx.node("Unsqueeze", [value, ctx.ints([0])])
    kernel, dilation, padding, stride = (_repeat_to(list(v), 2) for v in (kernel_size, dilation, padding, stride))
    if t is dtypes.float64:
        size = _static_ints(list(output_size), "col2im output size")
        blocks = [conv_output_size(*args) for args in zip(size, kernel, stride, padding, dilation)]
        channels = _static_ints([x.shape[-2]], "col2im channels")[0] // (kernel[0] * kernel[1])
        result = _col2im64(ctx, value, x.shape[0] if x.rank == 3 else 1, channels, blocks, size,
                           [kernel, dilation, padding, stride])
    else:
        result = ctx.node("Col2Im", [value, ctx.dims(output_size), ctx.ints(kernel)], dilations=dilation,
                          pads=padding + padding, strides=stride)
    if unbatched:
        result = ctx.node("Squeeze", [result, ctx.ints([0])])
    return ctx.graph.cast(result, t, x.dtype)


def _col2im64(ctx: LoweringContext, value: str, batch: Any, channels: int, blocks: list[int],
              output_size: list[int], params: list[list[int]]) -> str:
    """float64 col2im of `value` [N, C * prod(kernel), prod(blocks)] over any number of spatial dims, without a
    float64 Col2Im kernel: each kernel tap's block [N, C, *blocks] spread to its stride (zeros between), shifted to the
    tap's place in the zero-padded output, and added in ATen's tap order; then the padding cropped. Result
    [N, C, *output_size]."""
    kernel, dilation, padding, stride = params
    spatial = len(kernel)
    axes = list(range(2, 2 + spatial))
    value = ctx.node("Reshape", [value, ctx.dims([batch, channels, *kernel, *blocks])])
    padded = [size + 2 * pad for size, pad in zip(output_size, padding)]
    spans = [(count - 1) * step + 1 for count, step in zip(blocks, stride)]
    interleaved = [d for count in blocks for d in (count, 1)]  # [b0, 1, b1, 1, ...]: room for each stride's zeros
    gaps = [d for step in stride for d in (0, step - 1)]  # then step - 1 zeros after each element
    total = None
    for tap in np.ndindex(*kernel):
        block = ctx.node("Slice", [value, ctx.ints(list(tap)), ctx.ints([k + 1 for k in tap]), ctx.ints(axes)])
        block = ctx.node("Reshape", [block, ctx.dims([batch, channels, *interleaved])])
        spread = ctx.node("Pad", [block, ctx.ints([0] * (2 + 2 * spatial) + [0, 0, *gaps])])
        spread = ctx.node("Reshape", [spread, ctx.dims([batch, channels, *[count * step for count, step in
                                                                            zip(blocks, stride)]])])
        spread = ctx.node("Slice", [spread, ctx.ints([0] * spatial), ctx.ints(spans), ctx.ints(axes)])
        before = [k * d for k, d in zip(tap, dilation)]
        after = [full - first - span for full, first, span in zip(padded, before, spans)]
        placed = ctx.node("Pad", [spread, ctx.ints([0, 0, *before, 0, 0, *after])])
        total = placed if total is None else ctx.node("Add", [total, placed])
    return ctx.node("Slice", [total, ctx.ints(list(padding)), ctx.ints([p + size for p, size in
                                                                         zip(padding, output_size)]),
                              ctx.ints(axes)])


# ---------------------------------------------------------------------------------------------
# Factories

@lowers("aten.full.default", "aten.empty.memory_format", "aten.empty_strided.default")
def _full(ctx: LoweringContext, size: list[Any], *rest: Any, **_: Any) -> str:
    value = rest[0] if ctx.op.name == "aten.full.default" else 0
    return ctx.node("Expand", [ctx.as_dtype(value, ctx.out_dtype), ctx.dims(ctx.out.shape)])


@lowers("aten.full_like.default")
def _full_like(ctx: LoweringContext, x: Value, fill_value: Any, **_: Any) -> str:
    return ctx.node("Expand", [ctx.as_dtype(fill_value, ctx.out_dtype), ctx.shape(x)])


@lowers("aten.scalar_tensor.default")
def _scalar_tensor_op(ctx: LoweringContext, s: Any, **_: Any) -> str:
    return ctx.node("Identity", [ctx.as_dtype(s, ctx.out_dtype)])


@lowers("aten.arange.start_step")
def _arange(ctx: LoweringContext, start: Any, end: Any, step: Any = 1, **_: Any) -> str:
    out = ctx.out_dtype
    length = ctx.out.shape[0]
    if isinstance(length, int) and all(isinstance(v, (int, float)) for v in (start, end, step)):
        if out.is_floating_point:
            return ctx.const((np.asarray(start, dtype=np.float64) + np.arange(length) * step).astype(out.numpy))
        # integer dtypes: the length comes from the doubles, the values from the truncated start and step
        return ctx.const((int(start) + np.arange(length, dtype=np.int64) * int(step)).astype(out.numpy))
    integral = all(isinstance(v, (int, sympy.Expr)) for v in (start, end, step))
    compute = dtypes.int64 if integral else dtypes.float64
    result = ctx.node("Range", [ctx.as_dtype(start, compute), ctx.as_dtype(end, compute), ctx.as_dtype(step, compute)])
    return ctx.graph.cast(result, compute, out)


def _random(op_type: str) -> Lowering:
    def lower(ctx: LoweringContext, size: list[Any], **_: Any) -> str:
        t = _compute_dtype(ctx.out_dtype)
        template = ctx.node("ConstantOfShape", [ctx.dims(ctx.out.shape)], value=_scalar_tensor(0, t))
        return ctx.graph.cast(ctx.node(op_type, [template], dtype=onnx_dtype(t)), t, ctx.out_dtype)
    return lower


LOWERING_TABLE["aten.rand.default"] = _random("RandomUniformLike")
LOWERING_TABLE["aten.randn.default"] = _random("RandomNormalLike")


@lowers("aten.randperm.default")
def _randperm(ctx: LoweringContext, n: Any, **_: Any) -> str:
    # A random permutation is the argsort of n uniform samples.
    template = ctx.node("ConstantOfShape", [ctx.dim(n)], value=_scalar_tensor(0, dtypes.float32))
    keys = ctx.node("RandomUniformLike", [template], dtype=onnx_dtype(dtypes.float32))
    _, order = ctx.node("TopK", [keys, ctx.dim(n)], outputs=2, axis=0, largest=1, sorted=1)
    return ctx.graph.cast(order, dtypes.int64, ctx.out_dtype)


# The backward ops and _embedding_bag live in their own module (it registers into LOWERING_TABLE on import).
from kiln.codegen.onnx import training as _training  # noqa: E402,F401

__all__ = ["LOWERING_TABLE", "UNSUPPORTED", "lowers"]
