"""SymInt: what `x.shape[0]` returns while tracing with a dynamic dim, like torch.SymInt.

Arithmetic builds sympy expressions; comparisons and conversions to a Python int/bool are decided with
the example value and recorded as guards in the ShapeEnv, with the user's source line.
"""

from __future__ import annotations

from typing import Any

import sympy

from kiln.ir.symbolic import ShapeEnv, SymInt as DimExpr, as_dim


class SymInt:
    """A symbolic integer bound to a ShapeEnv."""

    __slots__ = ("expr", "env")

    def __init__(self, expr: sympy.Expr, env: ShapeEnv):
        self.expr, self.env = expr, env

    # -- construction helpers
    @staticmethod
    def wrap(value: DimExpr, env: ShapeEnv | None) -> "int | SymInt":
        value = as_dim(value)
        if isinstance(value, int) or env is None:
            return value  # type: ignore[return-value]
        return SymInt(value, env)

    def _binary(self, other: Any, fn: Any) -> Any:
        other_expr = other.expr if isinstance(other, SymInt) else other
        if not isinstance(other_expr, (int, sympy.Expr)) or isinstance(other_expr, bool):
            return NotImplemented
        return SymInt.wrap(fn(self.expr, other_expr), self.env)

    def __add__(self, other: Any) -> Any:
        return self._binary(other, lambda a, b: a + b)

    def __radd__(self, other: Any) -> Any:
        return self._binary(other, lambda a, b: b + a)

    def __sub__(self, other: Any) -> Any:
        return self._binary(other, lambda a, b: a - b)

    def __rsub__(self, other: Any) -> Any:
        return self._binary(other, lambda a, b: b - a)

    def __mul__(self, other: Any) -> Any:
        return self._binary(other, lambda a, b: a * b)

    def __rmul__(self, other: Any) -> Any:
        return self._binary(other, lambda a, b: b * a)

    def __floordiv__(self, other: Any) -> Any:
        return self._binary(other, lambda a, b: sympy.floor(a / b))

    def __rfloordiv__(self, other: Any) -> Any:
        return self._binary(other, lambda a, b: sympy.floor(b / a))

    def __mod__(self, other: Any) -> Any:
        return self._binary(other, lambda a, b: sympy.Mod(a, b))

    def __neg__(self) -> Any:
        return SymInt.wrap(-self.expr, self.env)

    def __truediv__(self, other: Any) -> float:
        return float(self) / float(other)

    def __rtruediv__(self, other: Any) -> float:
        return float(other) / float(self)

    # -- decisions: guarded with the example value
    def _decide(self, relation: Any, other: Any) -> bool:
        from kiln.frontend.tracing import user_source_line
        other_expr = other.expr if isinstance(other, SymInt) else other
        return self.env.evaluate(relation(self.expr, other_expr), source=user_source_line() or "")

    def __eq__(self, other: object) -> bool:  # type: ignore[override]
        if not isinstance(other, (int, SymInt)) or isinstance(other, bool):
            return NotImplemented
        return self._decide(sympy.Eq, other)

    def __ne__(self, other: object) -> bool:  # type: ignore[override]
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    def __lt__(self, other: Any) -> bool:
        return self._decide(sympy.Lt, other)

    def __le__(self, other: Any) -> bool:
        return self._decide(sympy.Le, other)

    def __gt__(self, other: Any) -> bool:
        return self._decide(sympy.Gt, other)

    def __ge__(self, other: Any) -> bool:
        return self._decide(sympy.Ge, other)

    def __int__(self) -> int:
        """Specialize: the program is only valid for the example value from here on."""
        hint = self.env.hint(self.expr)
        if hint is None:
            from kiln.ir.errors import GuardError
            raise GuardError(f"cannot convert the data-dependent size {self.expr} to a Python int")
        self._decide(sympy.Eq, hint)
        return hint

    __index__ = __int__

    def __float__(self) -> float:
        return float(int(self))

    def __bool__(self) -> bool:
        return self._decide(sympy.Ne, 0)

    def __hash__(self) -> int:
        return hash(self.expr)

    def __repr__(self) -> str:
        return str(self.expr)

    def node_hint(self) -> int | None:
        return self.env.hint(self.expr)


def to_expr(value: Any) -> Any:
    """SymInts to their expressions, recursively through lists and tuples; everything else unchanged."""
    if isinstance(value, SymInt):
        return value.expr
    if isinstance(value, (list, tuple)):
        return type(value)(to_expr(v) for v in value)
    return value
