"""torch.export's symbolic expressions (`srepr` text, e.g. `Mul(Integer(2), Symbol('s77', ...))`) <-> kiln dims.

The reader is a small parser over a fixed table of functions: the text is never `eval`ed or `sympify`ed.
"""

from __future__ import annotations

import re
from typing import Callable

import sympy

from kiln.ir.serde.errors import SerdeError
from kiln.ir.symbolic import SymInt, as_dim, symbol

MAX_EXPR_CHARS = 10_000
MAX_EXPR_DEPTH = 64
_TOKEN = re.compile(r"\s*(?:(-?\d+)|([A-Za-z_][A-Za-z0-9_]*)|'([^'\\]*)'|([(),=]))")


def _floor_div(a: sympy.Expr, b: sympy.Expr) -> sympy.Expr:
    return sympy.floor(a / b)


def _product(*args: sympy.Expr) -> sympy.Expr:
    return sympy.Mul(*args)


_FUNCTIONS: dict[str, Callable[..., sympy.Expr]] = {
    "Add": lambda *a: sympy.Add(*a), "Mul": _product, "Pow": lambda a, b: sympy.Pow(a, b),
    "FloorDiv": _floor_div, "IntTrueDiv": lambda a, b: a / b, "CleanDiv": lambda a, b: a / b,
    "floor": sympy.floor, "FloorToInt": sympy.floor, "ceiling": sympy.ceiling, "CeilToInt": sympy.ceiling,
    "Mod": sympy.Mod, "PythonMod": sympy.Mod, "Max": sympy.Max, "Min": sympy.Min,
    "Rational": lambda p, q: sympy.Rational(p, q),
}
# Conditions, written for the SymBools of runtime assertions (kiln reads those back from their `_operator` nodes)
_CONDITIONS = {sympy.Eq: "Equality", sympy.Ne: "Unequality", sympy.Le: "LessThan", sympy.Lt: "StrictLessThan",
               sympy.Ge: "GreaterThan", sympy.Gt: "StrictGreaterThan", sympy.And: "And", sympy.Or: "Or",
               sympy.Not: "Not"}


def parse_srepr(text: str, rename: dict[str, str] | None = None) -> SymInt:
    """Parse torch's `srepr` form of a size expression into a kiln dim; `rename` maps symbol names."""
    value = _parse(text, rename or {}, conditions=False)
    if not isinstance(value, (int, sympy.Expr)):
        raise SerdeError(f"symbolic expression {text[:200]!r} is not a number or an expression")
    return as_dim(sympy.sympify(value) if isinstance(value, int) else value)


def parse_srepr_condition(text: str, rename: dict[str, str] | None = None) -> sympy.Basic:
    """Parse a condition on sizes (`LessThan(Symbol('u0'), Symbol('s0'))`), as `print_srepr` writes them."""
    value = _parse(text, rename or {}, conditions=True)
    if not isinstance(value, sympy.logic.boolalg.Boolean):
        raise SerdeError(f"symbolic condition {text[:200]!r} is not a condition")
    return value


def _parse(text: str, rename: dict[str, str], conditions: bool) -> object:
    if len(text) > MAX_EXPR_CHARS:
        raise SerdeError(f"symbolic expression of {len(text)} characters is too long")
    tokens: list[tuple[str, str]] = []
    position = 0
    while position < len(text.rstrip()):
        match = _TOKEN.match(text, position)
        if match is None or match.end() == position:
            raise SerdeError(f"cannot parse symbolic expression {text[:200]!r} at column {position}")
        kind = ("int", "name", "string", "punct")[match.lastindex - 1]  # type: ignore[operator]
        tokens.append((kind, match.group(match.lastindex or 0)))
        position = match.end()
    parser = _Parser(tokens, text, rename, {**_FUNCTIONS, **({v: k for k, v in _CONDITIONS.items()} if conditions
                                                             else {})})
    value = parser.value(0)
    if parser.index != len(tokens):
        raise SerdeError(f"unexpected text after symbolic expression {text[:200]!r}")
    return value


class _Parser:
    def __init__(self, tokens: list[tuple[str, str]], text: str, rename: dict[str, str],
                 functions: dict[str, Callable[..., sympy.Basic]]):
        self.tokens, self.text, self.rename, self.index = tokens, text, rename, 0
        self.functions = functions

    def take(self, expected: str | None = None) -> tuple[str, str]:
        if self.index >= len(self.tokens):
            raise SerdeError(f"symbolic expression {self.text[:200]!r} ends early")
        token = self.tokens[self.index]
        if expected is not None and token[1] != expected:
            raise SerdeError(f"expected {expected!r} in symbolic expression {self.text[:200]!r}")
        self.index += 1
        return token

    def peek(self) -> str | None:
        return self.tokens[self.index][1] if self.index < len(self.tokens) else None

    def value(self, depth: int) -> object:
        if depth > MAX_EXPR_DEPTH:
            raise SerdeError(f"symbolic expression {self.text[:100]!r}... nests too deeply")
        kind, token = self.take()
        if kind == "int":
            return int(token)
        if kind == "string":
            return token
        if kind != "name":
            raise SerdeError(f"unexpected {token!r} in symbolic expression {self.text[:200]!r}")
        if token in ("True", "False"):
            return token == "True"
        self.take("(")
        args: list[object] = []
        while self.peek() != ")":
            if self.index + 1 < len(self.tokens) and self.tokens[self.index + 1][1] == "=":
                self.take()
                self.take("=")
                self.value(depth + 1)  # assumptions (positive=True, integer=True): kiln's symbols are integers
            else:
                args.append(self.value(depth + 1))
            if self.peek() == ",":
                self.take(",")
        self.take(")")
        return self.call(token, args)

    def call(self, name: str, args: list[object]) -> sympy.Expr:
        if name == "Symbol":
            if len(args) != 1 or not isinstance(args[0], str) or not re.fullmatch(r"[A-Za-z_]\w*", args[0]):
                raise SerdeError(f"malformed Symbol in symbolic expression {self.text[:200]!r}")
            return symbol(self.rename.get(args[0], args[0]))
        if name == "Integer":
            if len(args) != 1 or not isinstance(args[0], int):
                raise SerdeError(f"malformed Integer in symbolic expression {self.text[:200]!r}")
            return sympy.Integer(args[0])
        function = self.functions.get(name)
        if function is None:
            raise SerdeError(f"unsupported function {name!r} in symbolic expression {self.text[:200]!r}",
                             fix="kiln reads Add, Mul, Pow, FloorDiv, Mod, Max, Min, floor and ceiling")
        if any(not isinstance(a, (int, sympy.Expr, sympy.logic.boolalg.Boolean)) for a in args):
            raise SerdeError(f"malformed arguments to {name} in symbolic expression {self.text[:200]!r}")
        try:
            return function(*[sympy.Integer(a) if isinstance(a, int) else a for a in args])
        except (TypeError, ValueError, ZeroDivisionError) as error:
            raise SerdeError(f"malformed {name} in symbolic expression {self.text[:200]!r}: {error}") from error


def _has_fraction(expr: sympy.Basic) -> bool:
    """A fractional coefficient outside floor/ceiling (which write their own division)."""
    if isinstance(expr, (sympy.floor, sympy.ceiling)):
        return False
    if isinstance(expr, sympy.Rational):
        return not expr.is_Integer
    return any(_has_fraction(arg) for arg in expr.args)


def integral_form(expr: SymInt) -> SymInt:
    """A size that sympy left with a fractional coefficient, `(40*s0 + 120)*(s1 + 3)/2` (a view's inferred dim),
    spelled in integers, as torch's SymInt arithmetic needs: factored, `20*(s0 + 3)*(s1 + 3)`, where that clears
    the fraction, else `floor(p / q)`, which is exact because a size is an integer."""
    if not isinstance(expr, sympy.Expr) or not _has_fraction(expr):
        return expr
    factored = sympy.factor_terms(expr)
    if not _has_fraction(factored):
        return factored
    numerator, denominator = sympy.fraction(sympy.together(expr))
    return sympy.floor(numerator / denominator, evaluate=False)


def print_srepr(expr: SymInt, rename: dict[sympy.Symbol, str]) -> str:
    """A kiln dim as torch's `srepr` text, with torch's integer functions (`FloorDiv`, not `floor(a/b)`)."""
    if isinstance(expr, int) or (isinstance(expr, sympy.Expr) and expr.is_Integer):
        return f"Integer({int(expr)})"
    expr = integral_form(expr)
    if isinstance(expr, sympy.Symbol):
        return f"Symbol('{rename.get(expr, str(expr))}', positive=True, integer=True)"
    if isinstance(expr, sympy.floor):
        numerator, denominator = expr.args[0].as_numer_denom()
        return f"FloorDiv({print_srepr(numerator, rename)}, {print_srepr(denominator, rename)})"
    if isinstance(expr, sympy.ceiling):
        numerator, denominator = expr.args[0].as_numer_denom()
        return f"CeilToInt(IntTrueDiv({print_srepr(numerator, rename)}, {print_srepr(denominator, rename)}))"
    names = {sympy.Add: "Add", sympy.Mul: "Mul", sympy.Pow: "Pow", sympy.Mod: "Mod", sympy.Max: "Max",
             sympy.Min: "Min", **_CONDITIONS}
    name = names.get(type(expr))
    if name is None or (isinstance(expr, sympy.Expr) and expr.is_Rational and not expr.is_Integer):
        raise SerdeError(f"cannot write symbolic expression {expr} for torch", fix="simplify the program's shapes")
    return f"{name}({', '.join(print_srepr(arg, rename) for arg in expr.args)})"
