"""GELU recognition: the tanh approximation written out in elementary ops becomes one `aten.gelu(approximate="tanh")`.

Hugging Face's GPT-2 family (`NewGELUActivation`, "gelu_new") computes 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x +
0.044715 * x ** 3))) in eight ops; as one op, backends fuse it where they fuse activations (an integer layer's
epilogue, a GEMM's). The formula is aten.gelu's own, so the program computes the same function; its float32 rounding
is the gelu kernel's instead of the eight ops', as a compiler's fusion would make it.
"""

from __future__ import annotations

import math
from typing import Any

from kiln.ir.registry import ops
from kiln.passes.base import register_pass
from kiln.passes.rewrite import RewritePass, pattern, producer

aten = ops.aten


def _number(arg: Any) -> float | None:
    """A number operand: a Python number, or a 0-d aten.scalar_tensor of one (how `0.5 * x` traces)."""
    if isinstance(arg, (int, float)) and not isinstance(arg, bool):
        return float(arg)
    found = producer(arg, aten.scalar_tensor.default)
    return _number(found.args[0]) if found is not None else None


def _with_number(value: Any, *ops: Any) -> list[tuple[Any, float]]:
    """(tensor operand, number operand) pairs of `value`'s producer when it is one of `ops` with a number."""
    found = producer(value, *ops)
    if found is None or found.kwargs.get("alpha", 1) != 1:
        return []
    pairs = ((found.args[0], found.args[1]), (found.args[1], found.args[0]))
    return [(tensor, number) for tensor, arg in pairs
            if (number := _number(arg)) is not None and hasattr(tensor, "type") and tensor.type.shape]


def _scaled(value: Any, factor: float) -> Any:
    """x when `value` is x * factor (aten.mul.Scalar, or aten.mul.Tensor in either operand order)."""
    return next((tensor for tensor, number in _with_number(value, aten.mul.Scalar, aten.mul.Tensor)
                 if math.isclose(number, factor, rel_tol=1e-6)), None)


def _plus_one(value: Any) -> Any:
    """y when `value` is y + 1 (aten.add.Scalar, or aten.add.Tensor in either operand order)."""
    return next((tensor for tensor, number in _with_number(value, aten.add.Scalar, aten.add.Tensor) if number == 1),
                None)


def _cubic_term_of(value: Any, x: Any) -> bool:
    """Whether `value` is x + 0.044715 * x ** 3 (in either order)."""
    add = producer(value, aten.add.Tensor)
    if add is None or add.kwargs.get("alpha", 1) != 1:
        return False
    for first, second in ((add.args[0], add.args[1]), (add.args[1], add.args[0])):
        cube = producer(_scaled(second, 0.044715), aten.pow.Tensor_Scalar)
        if first is x and cube is not None and cube.args[0] is x and cube.args[1] == 3:
            return True
    return False


@register_pass
class RecognizeGelu(RewritePass):
    """Rewrite 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3))) into aten.gelu(x, approximate="tanh")."""

    name = "recognize-gelu"

    @pattern(aten.mul.Tensor)
    def tanh_gelu(self, a: Any, b: Any) -> Any:
        for half, rest in ((a, b), (b, a)):
            x = _scaled(half, 0.5)
            tanh = producer(_plus_one(rest), aten.tanh.default)
            if x is None or tanh is None or not x.type.dtype.is_floating_point:
                continue
            if _cubic_term_of(_scaled(tanh.args[0], math.sqrt(2 / math.pi)), x):
                return aten.gelu.default(x, approximate="tanh")
        return None
