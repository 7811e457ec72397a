"""The C backend's pointwise rules: one entry per aten op fused into pointwise kernels and GEMM epilogues.

Each rule maps an op to (operand cast, rule): "result" casts tensor operands to the result's compute type (double
for floating results), "promote" to the operands' promoted compute type (comparisons), "where" is rendered as a
select call. A rule gets the operands as C strings and the op's non-tensor arguments (rendered literals, '' for
None) by schema position, and returns a C expression; the renderer rounds it to the op's dtype. FLOAT32_RULES
override a rule when the result is float32, with kiln_math.h's vectorizable float functions.
Like tinygrad's cstyle renderer: adding an op is one line here plus its name in schedule.POINTWISE_OPS.
"""

from __future__ import annotations

from typing import Callable

# Pointwise rules: op name -> (operand cast, rule). "result": operands cast to the result's compute type;
# "promote": to the operands' promoted compute type (comparisons). Rules get operand strings and the
# op's non-tensor arguments by schema position.

def _scaled(a: list[str]) -> str:
    return a[1] if a[2] in ("1", "INT64_C(1)") else f"({a[2]} * {a[1]})"


def _batch_norm(a: list[str]) -> str:
    value = f"({a[0]} - {a[3]}) * (1.0 / sqrt({a[4]} + {a[6]}))"
    value = f"{value} * {a[1]}" if a[1] else value
    return f"{value} + {a[2]}" if a[2] else value


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
    "aten.where.self": ("where", lambda a: ""),  # rendered as a kiln_where_<type> call, see _Exprs.render
    # batch norm (eval), operands: x, weight?, bias?, running_mean, running_var, momentum, eps
    "aten._native_batch_norm_legit_no_training.default": ("result", lambda a: _batch_norm(a)),
    **{f"aten.{name}.{kind}": ("promote", lambda a, op=op: f"{a[0]} {op} {a[1]}")
       for name, op in (("eq", "=="), ("ne", "!="), ("lt", "<"), ("le", "<="), ("gt", ">"), ("ge", ">="))
       for kind in ("Tensor", "Scalar")},
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


