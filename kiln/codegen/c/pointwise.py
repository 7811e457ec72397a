"""The C backend's pointwise rules: one entry per aten op fused into pointwise kernels and GEMM epilogues.

Each rule maps an op to (operand cast, rule): "result" casts tensor operands to the result's compute type (double
for floating results), "promote" to the operands' promoted compute type (comparisons), "where" is rendered as a
select call. A rule gets the operands as C strings and the op's non-tensor arguments (rendered literals, '' for
None) by schema position, and returns a C expression; the renderer rounds it to the op's dtype. FLOAT32_RULES
override a rule when the result is float32, with kiln_math.h's vectorizable float functions.
Like tinygrad's cstyle renderer: adding an op is one line here plus its name in schedule.POINTWISE_OPS.
"""

from __future__ import annotations

import re

from typing import Callable

# Pointwise rules: op name -> (operand cast, rule). "result": operands cast to the result's compute type;
# "promote": to the operands' promoted compute type (comparisons). Rules get operand strings and the
# op's non-tensor arguments by schema position.

def _scaled(a: list[str]) -> str:
    return a[1] if a[2] in ("1", "INT64_C(1)") else f"({a[2]} * {a[1]})"


def _batch_norm(a: list[str]) -> str:
    """ATen's x * alpha + (bias - mean * alpha), alpha = weight / sqrt(var + eps): an infinite weight gives NaN
    (inf - inf) where (x - mean) * alpha + bias would give an infinity, and a zero is +0."""
    alpha = f"(1.0 / sqrt({a[4]} + {a[6]}))" + (f" * {a[1]}" if a[1] else "")
    return f"{a[0]} * ({alpha}) + ({a[2] or '0.0'} - {a[3]} * ({alpha}))"


def _never_nan(operand: str) -> bool:
    """Whether a rendered operand is a literal number or infinity (ctext.literal writes NaN as NAN)."""
    return re.fullmatch(r"[()]*(\((double|float|int64_t|int32_t|int16_t|int8_t|uint8_t)\))*[()]*-?"
                        r"(INFINITY|INT64_C\(-?\d+\)|\d+(\.\d*)?(e[-+]?\d+)?)\)*", operand) is not None


def _clamp(a: list[str]) -> str:
    """min(max(x, lo), hi) with NaN propagation (so lo > hi gives hi, and a NaN bound gives NaN); '' = no bound.
    A literal bound takes the one-select form (kiln_max_bound), which vectorizes without mask shuffling."""
    lower = "kiln_max_bound" if _never_nan(a[1]) else "kiln_max"
    upper = "kiln_min_bound" if _never_nan(a[2]) else "kiln_min"
    value = f"{lower}({a[0]}, {a[1]})" if a[1] else a[0]
    return f"{upper}({value}, {a[2]})" if a[2] else value


def _divide(a: list[str]) -> str:
    """div with rounding_mode None, 'trunc' or 'floor' (kiln_math.h picks the integer or floating form)."""
    if a[2] == "trunc":
        return f"kiln_div_trunc({a[0]}, {a[1]})"
    return f"kiln_div_floor({a[0]}, {a[1]})" if a[2] == "floor" else f"{a[0]} / {a[1]}"


def _elu(a: list[str]) -> str:
    return f"{a[0]} > 0 ? {a[0]} * {a[2]} : expm1({a[0]} * {a[3]}) * ({a[1]} * {a[2]})"


Rule = Callable[[list[str]], str]
POINTWISE_RULES: dict[str, tuple[str, Rule]] = {
    "aten.add.Tensor": ("result", lambda a: f"{a[0]} + {_scaled(a)}"),
    "aten.add.Scalar": ("result", lambda a: f"{a[0]} + {_scaled(a)}"),
    "aten.sub.Tensor": ("result", lambda a: f"{a[0]} - {_scaled(a)}"),
    "aten.sub.Scalar": ("result", lambda a: f"{a[0]} - {_scaled(a)}"),
    "aten.mul.Tensor": ("result", lambda a: f"{a[0]} * {a[1]}"),
    "aten.mul.Scalar": ("result", lambda a: f"{a[0]} * {a[1]}"),
    "aten.div.Tensor": ("result", lambda a: f"{a[0]} / {a[1]}"),
    "aten.div.Scalar": ("result", lambda a: f"{a[0]} / {a[1]}"),
    "aten.neg.default": ("result", lambda a: f"-{a[0]}"),
    "aten.relu.default": ("result", lambda a: f"kiln_relu({a[0]})"),
    "aten.exp.default": ("result", lambda a: f"exp({a[0]})"),
    "aten.log.default": ("result", lambda a: f"log({a[0]})"),
    "aten.tanh.default": ("result", lambda a: f"tanh({a[0]})"),
    "aten.sigmoid.default": ("result", lambda a: f"1.0 / (1.0 + exp(-{a[0]}))"),
    "aten.sqrt.default": ("result", lambda a: f"sqrt({a[0]})"),
    "aten.rsqrt.default": ("result", lambda a: f"1.0 / sqrt({a[0]})"),
    "aten.abs.default": ("result", lambda a: f"fabs({a[0]})"),
    "aten.erf.default": ("result", lambda a: f"erf({a[0]})"),
    "aten.gelu.default": ("result", lambda a: f"kiln_gelu_tanh({a[0]})" if a[1] == "tanh" else f"kiln_gelu({a[0]})"),
    "aten.maximum.default": ("result", lambda a: f"kiln_max({a[0]}, {a[1]})"),
    "aten.minimum.default": ("result", lambda a: f"kiln_min({a[0]}, {a[1]})"),
    "aten._to_copy.default": ("result", lambda a: a[0]),
    "aten.clone.default": ("result", lambda a: a[0]),
    "aten.copy.default": ("result", lambda a: a[1]),  # src broadcast to self's shape, in self's dtype
    "aten.where.self": ("where", lambda a: ""),  # rendered as a kiln_where_<type> call, see _Exprs.render
    # batch norm (eval), operands: x, weight?, bias?, running_mean, running_var, momentum, eps
    "aten._native_batch_norm_legit_no_training.default": ("result", lambda a: _batch_norm(a)),
    **{f"aten.{name}.{kind}": ("promote", lambda a, op=op: f"{a[0]} {op} {a[1]}")
       for name, op in (("eq", "=="), ("ne", "!="), ("lt", "<"), ("le", "<="), ("gt", ">"), ("ge", ">="))
       for kind in ("Tensor", "Scalar")},
    "aten.isnan.default": ("promote", lambda a: f"{a[0]} != {a[0]}"),  # integers: never
    "aten.isinf.default": ("promote", lambda a: f"{a[0]} == INFINITY || {a[0]} == -INFINITY"),
    # logical ops judge each operand's nonzero-ness: the "result" cast to bool does that (NaN is true)
    "aten.logical_and.default": ("result", lambda a: f"{a[0]} && {a[1]}"),
    "aten.logical_or.default": ("result", lambda a: f"{a[0]} || {a[1]}"),
    "aten.logical_xor.default": ("result", lambda a: f"{a[0]} != {a[1]}"),
    "aten.logical_not.default": ("result", lambda a: f"!{a[0]}"),
    **{f"aten.bitwise_{name}.{kind}": ("result", lambda a, op=op: f"{a[0]} {op} {a[1]}")
       for name, op in (("and", "&"), ("or", "|"), ("xor", "^")) for kind in ("Tensor", "Scalar")},
    "aten.bitwise_not.default": ("result", lambda a: f"kiln_bitwise_not({a[0]})"),
    # floating math; integer inputs promote to a floating result, so the operands arrive as double
    **{f"aten.{fn}.default": ("result", lambda a, fn=fn: f"{fn}({a[0]})")  # libm's function of the same name
       for fn in ("acos", "acosh", "asin", "asinh", "atan", "atanh", "cos", "cosh", "sin", "sinh", "tan", "expm1",
                  "log10", "log1p", "log2")},
    "aten.atan2.default": ("result", lambda a: f"atan2({a[0]}, {a[1]})"),
    "aten.reciprocal.default": ("result", lambda a: f"1.0 / {a[0]}"),
    # ceil/floor/round/trunc are the identity on integers; round is half to even
    **{f"aten.{name}.default": ("result", lambda a, name=name: f"kiln_{name}({a[0]})")
       for name in ("ceil", "floor", "round", "trunc")},
    "aten.sign.default": ("result", lambda a: f"({a[0]} > 0) - ({a[0]} < 0)"),  # sign(NaN) is 0, like ATen
    "aten.clamp.default": ("result", _clamp),
    "aten.clamp.Tensor": ("result", _clamp),
    "aten.hardtanh.default": ("result", _clamp),
    "aten.leaky_relu.default": ("result", lambda a: f"{a[0]} > 0 ? {a[0]} : {a[0]} * {a[1]}"),
    "aten.elu.default": ("result", _elu),
    "aten.div.Tensor_mode": ("result", _divide),
    "aten.div.Scalar_mode": ("result", _divide),
    # fmod takes the dividend's sign (C's fmod), remainder the divisor's (Python's %)
    **{f"aten.{name}.{kind}": ("result", lambda a, name=name: f"kiln_{name}({a[0]}, {a[1]})")
       for name in ("fmod", "remainder") for kind in ("Tensor", "Scalar")},
    **{f"aten.pow.{kind}": ("result", lambda a: f"kiln_pow({a[0]}, {a[1]})") for kind in ("Scalar", "Tensor_Tensor")},
    "aten.pow.Tensor_Scalar": ("result", lambda a: f"kiln_pow_scalar({a[0]}, {a[1]})"),
}


# float32 results of transcendental ops use kiln_math.h's vectorizable float functions (libm's are scalar calls
# that keep the loop from vectorizing); everything else computes in double and rounds once, as above.
FLOAT32_RULES: dict[str, Rule] = {
    "aten.exp.default": lambda a: f"kiln_expf((float)({a[0]}))",
    "aten.tanh.default": lambda a: f"kiln_tanhf((float)({a[0]}))",
    "aten.sigmoid.default": lambda a: f"kiln_sigmoidf((float)({a[0]}))",
    "aten.erf.default": lambda a: f"kiln_erff((float)({a[0]}))",
    "aten.gelu.default": lambda a: (f"kiln_gelu_tanhf((float)({a[0]}))" if a[1] == "tanh"
                                    else f"kiln_geluf((float)({a[0]}))"),
}

# Ops whose float32 rule above is a kiln_math.h function: straight-line code that only vectorized loops make fast.
VECTOR_MATH_OPS = frozenset(FLOAT32_RULES)


def _float32_operands(rule: Rule) -> Rule:
    """The rule on operands rounded to float32 first, as ATen reads them for a float32 result (integer tensors
    and Scalar parameters included). Then +, -, *, / and fmod in double, rounded once, equal float32's."""
    return lambda a: rule([f"(double)(float){x}" if x.startswith("(double)") else x for x in a])


def _divide_float32(a: list[str]) -> str:
    """trunc and floor of the float32 quotient, which can round up to an integer the double one falls short of."""
    if a[2] == "trunc":
        return f"trunc((float)({a[0]} / {a[1]}))"
    return f"kiln_div_floorf((float)({a[0]}), (float)({a[1]}))" if a[2] == "floor" else f"{a[0]} / {a[1]}"


FLOAT32_RULES.update({name: _float32_operands(POINTWISE_RULES[name][1]) for name in (
    "aten.acos.default", "aten.acosh.default", "aten.asin.default", "aten.asinh.default", "aten.atan.default",
    "aten.atanh.default", "aten.cos.default", "aten.cosh.default", "aten.sin.default", "aten.sinh.default",
    "aten.tan.default", "aten.expm1.default", "aten.log10.default", "aten.log1p.default", "aten.log2.default",
    "aten.atan2.default", "aten.reciprocal.default", "aten.clamp.default", "aten.clamp.Tensor",
    "aten.leaky_relu.default", "aten.elu.default", "aten.fmod.Tensor", "aten.fmod.Scalar",
    "aten.remainder.Tensor", "aten.remainder.Scalar", "aten.pow.Scalar", "aten.pow.Tensor_Scalar",
    "aten.pow.Tensor_Tensor")})
FLOAT32_RULES["aten.div.Tensor_mode"] = FLOAT32_RULES["aten.div.Scalar_mode"] = _float32_operands(_divide_float32)


def _pow_scalar_float32(a: list[str]) -> str:
    """x ** 2 and x ** 3 as ATen's pow_tensor_scalar computes them for float32: multiplications in float32 (gelu's
    tanh form cubes every element; libm's pow there is a scalar call per element). Other exponents call pow."""
    exponent = re.sub(r"\((?:double|float)\)", "", a[1]).strip("() ")
    x = f"(float)({a[0]})"
    if exponent in ("2", "2.0"):
        return f"({x} * {x})"
    if exponent in ("3", "3.0"):
        return f"(({x} * {x}) * {x})"
    return _float32_operands(POINTWISE_RULES["aten.pow.Tensor_Scalar"][1])(a)


FLOAT32_RULES["aten.pow.Tensor_Scalar"] = _pow_scalar_float32
