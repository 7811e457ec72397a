"""Symbolic dims: sympy expressions over program-level symbols, value ranges, and the ShapeEnv.

A dim is a Python int or a sympy expression over integer symbols (`s0`, `s0 + 1`, `2*s0`, `s0//2`).
The ShapeEnv owns the symbols of one trace or program: their inclusive ranges, their example values
("hints"), the guards recorded when a comparison on symbols was decided, and unbacked symbols (`u0`)
whose value is only known at run time (the size of `nonzero`). Meta rules ask questions through
`sym_eq` / `guard_bool`, which use the active ShapeEnv if there is one.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import re
from dataclasses import dataclass, field
from typing import Callable, Iterator, Union

import sympy

from kiln.ir.errors import GuardError, ParseError

SymInt = Union[int, sympy.Expr]
INF = math.inf

_SYMBOLS: dict[str, sympy.Symbol] = {}


def symbol(name: str) -> sympy.Symbol:
    """The unique integer symbol called `name` (the same object every time, so parsing round-trips)."""
    found = _SYMBOLS.get(name)
    if found is None:
        found = _SYMBOLS[name] = sympy.Symbol(name, integer=True)
    return found


def _flatten_floors(expr: sympy.Expr) -> sympy.Expr:
    """Rewrite floor(floor(y)/n) as floor(y/n) (n a positive integer; true for every real y), so that sizes torch
    writes in two forms (a stride-5 then stride-2 conv's floor(floor(s/5)/2) beside floor(s/10)) cancel."""
    def nested(e: sympy.Basic) -> bool:
        if not isinstance(e, sympy.floor):
            return False
        coefficient, rest = e.args[0].as_coeff_Mul()
        return (isinstance(rest, sympy.floor) and coefficient.is_Rational and coefficient.p == 1
                and coefficient.q > 0)

    def flattened(e: sympy.floor) -> sympy.Expr:
        coefficient, rest = e.args[0].as_coeff_Mul()
        return sympy.floor(rest.args[0] * coefficient)
    if not isinstance(expr, sympy.Basic) or not expr.has(sympy.floor):
        return expr
    rewritten = expr.replace(nested, flattened)
    if rewritten == expr:
        return expr
    # the two forms now share a factor: cancel it inside each floor and outside ((4*f - 4)/(f - 1) -> 4)
    rewritten = rewritten.replace(lambda e: isinstance(e, sympy.floor), lambda e: sympy.floor(sympy.cancel(e.args[0])))
    return sympy.cancel(rewritten)


def as_dim(value: SymInt) -> SymInt:
    """Normalize a dim: sympy integers become Python ints, expressions stay sympy."""
    if isinstance(value, bool):
        raise ParseError(f"a dimension must be an integer, got bool {value}")
    if isinstance(value, int):
        return value
    if isinstance(value, sympy.Expr):
        value = _flatten_floors(value)
        if value.is_Integer:
            return int(value)
        return value
    if hasattr(value, "__index__"):
        return int(value)
    raise ParseError(f"a dimension must be an int or symbolic expression, got {type(value).__name__}")


def floor_div(a: SymInt, b: SymInt) -> SymInt:
    """a // b for dims: Python's for ints, else floor(a / b)."""
    if isinstance(a, int) and isinstance(b, int):
        return a // b
    return as_dim(sympy.floor(sympy.sympify(a) / b))


def is_static(value: object) -> bool:
    return isinstance(value, int) or (isinstance(value, sympy.Expr) and value.is_Integer)


def free_symbols(value: SymInt) -> set[sympy.Symbol]:
    return set() if isinstance(value, int) else value.free_symbols


# ---------------------------------------------------------------------------------------------
# Text form. sympy's own printer produces it; a small safe parser (never `eval`) reads it back.

def format_dim(value: SymInt) -> str:
    return str(value)


_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_]*)|(\*\*|//|[-+*/%(),]))")
_FUNCTIONS = {
    "floor": sympy.floor, "ceiling": sympy.ceiling, "Max": sympy.Max, "Min": sympy.Min,
    "Mod": sympy.Mod, "Abs": sympy.Abs,
}


def parse_dim(text: str) -> SymInt:
    """Parse `s0 + 1`, `2*s0`, `floor(s0/2)`, `s0//2`, `Max(s0, s1)` ... into a dim."""
    tokens: list[str] = []
    position = 0
    text = text.strip()
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None or match.end() == position:
            raise ParseError(f"cannot parse symbolic dim {text!r} at column {position}")
        tokens.append(match.group(match.lastindex or 0))
        position = match.end()
    parser = _ExprParser(tokens, text)
    result = parser.expression()
    if parser.index != len(tokens):
        raise ParseError(f"unexpected {tokens[parser.index]!r} in symbolic dim {text!r}")
    return as_dim(result)


class _ExprParser:
    def __init__(self, tokens: list[str], text: str):
        self.tokens, self.text, self.index = tokens, text, 0

    def peek(self) -> str | None:
        return self.tokens[self.index] if self.index < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise ParseError(f"expected {expected or 'more input'} in symbolic dim {self.text!r}")
        self.index += 1
        return token

    def expression(self) -> sympy.Expr:
        value = self.term()
        while self.peek() in ("+", "-"):
            value = value + self.term() if self.take() == "+" else value - self.term()
        return value

    def term(self) -> sympy.Expr:
        value = self.unary()
        while self.peek() in ("*", "/", "//", "%"):
            op = self.take()
            rhs = self.unary()
            if op == "*":
                value = value * rhs
            elif op == "/":
                value = value / rhs
            elif op == "//":
                value = sympy.floor(value / rhs)
            else:
                value = sympy.Mod(value, rhs)
        return value

    def unary(self) -> sympy.Expr:
        if self.peek() == "-":
            self.take()
            return -self.unary()
        base = self.atom()
        if self.peek() == "**":
            self.take()
            return base ** self.unary()
        return base

    def atom(self) -> sympy.Expr:
        token = self.take()
        if token == "(":
            value = self.expression()
            self.take(")")
            return value
        if token.isdigit():
            return sympy.Integer(int(token))
        if token in _FUNCTIONS and self.peek() == "(":
            self.take("(")
            args = [self.expression()]
            while self.peek() == ",":
                self.take()
                args.append(self.expression())
            self.take(")")
            return _FUNCTIONS[token](*args)
        if token[0].isalpha() or token[0] == "_":
            return symbol(token)
        raise ParseError(f"unexpected {token!r} in symbolic dim {self.text!r}")


# ---------------------------------------------------------------------------------------------
# Value ranges

@dataclass(frozen=True)
class ValueRange:
    """An inclusive integer range; `upper` may be math.inf (unbounded)."""

    lower: float
    upper: float

    def __contains__(self, value: int) -> bool:
        return self.lower <= value <= self.upper

    def __str__(self) -> str:
        def show(bound: float) -> str:
            return "int_oo" if bound == INF else "-int_oo" if bound == -INF else str(int(bound))
        return f"VR[{show(self.lower)}, {show(self.upper)}]"

    __repr__ = __str__

    def intersect(self, other: "ValueRange") -> "ValueRange":
        return ValueRange(max(self.lower, other.lower), min(self.upper, other.upper))

    @property
    def is_singleton(self) -> bool:
        return self.lower == self.upper


UNBOUNDED = ValueRange(-INF, INF)


def _mul_bounds(a: ValueRange, b: ValueRange) -> ValueRange:
    products = []
    for x in (a.lower, a.upper):
        for y in (b.lower, b.upper):
            if (x == 0 and abs(y) == INF) or (y == 0 and abs(x) == INF):
                products.append(0)
            else:
                products.append(x * y)
    return ValueRange(min(products), max(products))


def bound_expr(expr: SymInt, ranges: dict[sympy.Symbol, ValueRange]) -> ValueRange:
    """Interval arithmetic: a range guaranteed to contain every value of expr (maybe a loose one)."""
    if isinstance(expr, int):
        return ValueRange(expr, expr)
    if expr.is_Integer:
        return ValueRange(int(expr), int(expr))
    if expr.is_Rational:
        return ValueRange(float(expr), float(expr))
    if expr.is_Symbol:
        return ranges.get(expr, UNBOUNDED)
    if expr.is_Add:
        lower = upper = 0.0
        for arg in expr.args:
            r = bound_expr(arg, ranges)
            lower, upper = lower + r.lower, upper + r.upper
        return ValueRange(lower, upper)
    if expr.is_Mul:
        result = ValueRange(1, 1)
        for arg in expr.args:
            result = _mul_bounds(result, bound_expr(arg, ranges))
        return result
    if expr.is_Pow and expr.exp.is_Integer and int(expr.exp) >= 0:
        result = ValueRange(1, 1)
        base = bound_expr(expr.base, ranges)
        for _ in range(int(expr.exp)):
            result = _mul_bounds(result, base)
        if int(expr.exp) % 2 == 0:
            result = ValueRange(max(0, result.lower), result.upper)
        return result
    if isinstance(expr, sympy.floor):
        inner = bound_expr(expr.args[0], ranges)
        return ValueRange(math.floor(inner.lower) if inner.lower != -INF else -INF,
                          math.floor(inner.upper) if inner.upper != INF else INF)
    if isinstance(expr, sympy.ceiling):
        inner = bound_expr(expr.args[0], ranges)
        return ValueRange(math.ceil(inner.lower) if inner.lower != -INF else -INF,
                          math.ceil(inner.upper) if inner.upper != INF else INF)
    if isinstance(expr, (sympy.Max, sympy.Min)):
        bounds = [bound_expr(arg, ranges) for arg in expr.args]
        pick = max if isinstance(expr, sympy.Max) else min
        return ValueRange(pick(b.lower for b in bounds), pick(b.upper for b in bounds))
    return UNBOUNDED


def known_under(op: str, diff: sympy.Expr, ranges: dict[sympy.Symbol, ValueRange], splits: int = 6) -> bool | None:
    """Whether `diff <op> 0` holds (True) or fails (False) for every value of the symbols in `ranges`; None if it
    depends on them. Interval bounds decide most questions. Min/Max terms (slice clamping writes them, e.g.
    `s + Min(1, s)`) are first resolved where one argument wins over the whole ranges; the rest are decided by cases:
    the range of a symbol is split where two arguments of a Min/Max cross (`Min(1, s)`: s <= 0 and s >= 1), and
    the question is asked again on each piece, at most `splits` times deep."""
    diff = _resolve_extrema(diff, ranges)
    if diff.is_Integer or diff.is_Rational:
        r = ValueRange(float(diff), float(diff))
    else:
        r = bound_expr(diff, ranges)
    checks = {
        "==": (r.lower == r.upper == 0, r.lower > 0 or r.upper < 0),
        "!=": (r.lower > 0 or r.upper < 0, r.lower == r.upper == 0),
        ">": (r.lower > 0, r.upper <= 0), ">=": (r.lower >= 0, r.upper < 0),
        "<": (r.upper < 0, r.lower >= 0), "<=": (r.upper <= 0, r.lower > 0),
    }
    always, never = checks[op]
    if always or never:
        return bool(always)
    if splits == 0:
        return None
    for piece_ranges in _split_at_crossing(diff, ranges):
        answers = {known_under(op, diff, piece, splits - 1) for piece in piece_ranges}
        return answers.pop() if len(answers) == 1 else None
    return None


def _resolve_extrema(expr: sympy.Expr, ranges: dict[sympy.Symbol, ValueRange]) -> sympy.Expr:
    """expr with each Min/Max (innermost first) reduced to the arguments that can win within the ranges."""
    def reduce(node: sympy.Basic) -> sympy.Basic:
        smaller_wins = isinstance(node, sympy.Min)
        kept: list[sympy.Expr] = []
        for arg in node.args:
            def beats(a: sympy.Expr, b: sympy.Expr) -> bool:  # a wins over b for every value in range
                r = bound_expr(sympy.expand(a - b), ranges)
                return r.upper <= 0 if smaller_wins else r.lower >= 0
            if any(beats(k, arg) for k in kept):
                continue
            kept = [k for k in kept if not beats(arg, k)] + [arg]
        return kept[0] if len(kept) == 1 else node.func(*kept)
    if not expr.has(sympy.Min, sympy.Max):
        return expr
    return sympy.expand(expr.replace(lambda e: isinstance(e, (sympy.Min, sympy.Max)), reduce))


def _split_at_crossing(expr: sympy.Expr, ranges: dict[sympy.Symbol, ValueRange]
                       ) -> Iterator[list[dict[sympy.Symbol, ValueRange]]]:
    """For a Min/Max in expr with two arguments whose difference is linear in one symbol: that symbol's range cut
    where they cross, as the list of the pieces' ranges."""
    for extremum in expr.atoms(sympy.Min, sympy.Max):
        for first, second in zip(extremum.args, extremum.args[1:]):
            difference = sympy.expand(first - second)
            if len(difference.free_symbols) != 1:
                continue
            (sym,) = difference.free_symbols
            slope, offset = difference.coeff(sym, 1), difference.coeff(sym, 0)
            if not (slope.is_Integer and offset.is_Rational and slope != 0) or sympy.expand(
                    difference - slope * sym - offset) != 0:
                continue
            cut = math.floor(-offset / slope)  # the difference changes sign between cut and cut + 1
            whole = ranges.get(sym, UNBOUNDED)
            pieces = [whole.intersect(ValueRange(-INF, cut)), whole.intersect(ValueRange(cut + 1, INF))]
            if all(piece.lower <= piece.upper for piece in pieces):
                yield [{**ranges, sym: piece} for piece in pieces]


# ---------------------------------------------------------------------------------------------
# ShapeEnv

@dataclass
class SymbolInfo:
    symbol: sympy.Symbol
    range: ValueRange
    hint: int | None  # example value; None for unbacked symbols
    source: str = ""  # where the symbol came from, e.g. "x.size()[0]"

    @property
    def unbacked(self) -> bool:
        return self.hint is None


@dataclass
class Guard:
    expr: sympy.Basic  # a relational (or its negation) that held on the example inputs
    source: str = ""


@dataclass
class ShapeEnv:
    """Symbols with ranges and hints; decides comparisons, recording guards when it used a hint."""

    symbols: dict[sympy.Symbol, SymbolInfo] = field(default_factory=dict)
    guards: list[Guard] = field(default_factory=list)
    # Relations assumed to hold (torch's runtime assertions, `u0 <= s0`): they decide questions that the ranges
    # alone leave open, and whoever runs the program checks them.
    facts: list[sympy.Basic] = field(default_factory=list)
    meta_cache: dict = field(default_factory=dict, repr=False)  # registry.run_meta's memo for this env
    _next_backed: int = 0
    _next_unbacked: int = 0

    # -- creating symbols
    def create_symbol(self, hint: int | None = None, *, name: str | None = None, min: float = 0,
                      max: float = INF, source: str = "") -> sympy.Symbol:
        if name is None:
            while f"s{self._next_backed}" in _SYMBOLS and symbol(f"s{self._next_backed}") in self.symbols:
                self._next_backed += 1
            name = f"s{self._next_backed}"
            self._next_backed += 1
        sym = symbol(name)
        self.symbols[sym] = SymbolInfo(sym, ValueRange(min, max), hint, source)
        return sym

    def create_unbacked_symbol(self, *, min: float = 0, max: float = INF, source: str = "") -> sympy.Symbol:
        while symbol(f"u{self._next_unbacked}") in self.symbols:
            self._next_unbacked += 1
        sym = symbol(f"u{self._next_unbacked}")
        self._next_unbacked += 1
        self.symbols[sym] = SymbolInfo(sym, ValueRange(min, max), None, source)
        return sym

    # -- facts
    def ranges(self) -> dict[sympy.Symbol, ValueRange]:
        return {sym: info.range for sym, info in self.symbols.items()}

    def bound(self, expr: SymInt) -> ValueRange:
        return bound_expr(expr, self.ranges())

    def hint(self, expr: SymInt) -> int | None:
        """The example value of expr, or None if it depends on an unbacked symbol."""
        if isinstance(expr, int):
            return expr
        values = {}
        for sym in expr.free_symbols:
            info = self.symbols.get(sym)
            if info is None or info.hint is None:
                return None
            values[sym] = info.hint
        value = expr.subs(values)
        return int(value) if value.is_Integer else None

    def simplify(self, expr: SymInt) -> SymInt:
        """expr with every Min/Max that the ranges decide replaced by the argument it picks. torch writes slice
        bounds such as `Max(0, 1 - s0)` even where s0 >= 2; as a dim, `1 - Max(0, 1 - s0)` is then 1 for every
        size, but only a range check can tell (a backend broadcasting it reads it as a size like any other)."""
        if isinstance(expr, int):
            return expr
        return as_dim(_resolve_extrema(expr, self.ranges()))

    def statically_known(self, condition: sympy.Basic | bool) -> bool | None:
        """True/False when the condition holds/fails for every value in range; None if it depends."""
        condition = _to_relational(condition)
        if condition in (sympy.true, sympy.false):
            return bool(condition)
        if isinstance(condition, sympy.Not):
            inner = self.statically_known(condition.args[0])
            return None if inner is None else not inner
        if not isinstance(condition, sympy.core.relational.Relational):
            return None
        if condition in self.facts:
            return True
        if _negate(condition) in self.facts:
            return False
        difference = sympy.expand(_flatten_floors(condition.lhs - condition.rhs))
        ranges = self.ranges()
        known = known_under(condition.rel_op, difference, ranges)
        for substitution, slack in _fact_substitutions(self.facts, ranges):
            if known is not None:
                break
            known = known_under(condition.rel_op, sympy.expand(difference.xreplace(substitution)), {**ranges, **slack})
        return known

    def assume(self, condition: sympy.Basic) -> bool:
        """Take `condition` as a fact (a runtime assertion the program carries); narrows a symbol's range where it
        bounds one. Returns False when it was known already, so there is nothing to check at run time."""
        condition = _to_relational(condition)
        if self.statically_known(condition) is True:
            return False
        self._refine(condition)
        self.facts.append(condition)
        return True

    def evaluate(self, condition: sympy.Basic | bool, source: str = "") -> bool:
        """Decide a condition; if it depends on the symbols' values, use the hints and record a guard."""
        source = source or _GUARD_SOURCE.get()
        known = self.statically_known(condition)
        if known is not None:
            return known
        condition = _to_relational(condition)
        hints = {}
        for sym in condition.free_symbols:
            info = self.symbols.get(sym)
            if info is None or info.hint is None:
                raise GuardError(
                    f"cannot decide `{condition}`: it depends on the data-dependent or unknown symbol {sym}",
                    source=source or None,
                    fix="avoid branching on data-dependent sizes, or constrain them (e.g. check the size first)",
                )
            hints[sym] = info.hint
        outcome = bool(condition.subs(hints))
        guard = condition if outcome else _negate(condition)
        self.guards.append(Guard(guard, source))
        self._refine(guard)
        return outcome

    def _refine(self, guard: sympy.Basic) -> None:
        """Narrow a symbol's range from a guard of the form `symbol <op> constant`."""
        if not isinstance(guard, sympy.core.relational.Relational):
            return
        lhs, rhs, op = guard.lhs, guard.rhs, guard.rel_op
        if rhs.is_Symbol and lhs.is_Integer:
            lhs, rhs = rhs, lhs
            op = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}.get(op, op)
        if not (lhs.is_Symbol and rhs.is_Integer and lhs in self.symbols):
            return
        info = self.symbols[lhs]
        value = int(rhs)
        if op == "!=":  # only narrows when it excludes an end of the range
            if value == info.range.lower:
                info.range = ValueRange(value + 1, info.range.upper)
            elif value == info.range.upper:
                info.range = ValueRange(info.range.lower, value - 1)
            return
        narrowed = {
            "==": ValueRange(value, value), ">": ValueRange(value + 1, INF), ">=": ValueRange(value, INF),
            "<": ValueRange(-INF, value - 1), "<=": ValueRange(-INF, value),
        }.get(op)
        if narrowed is not None:
            info.range = info.range.intersect(narrowed)


def _fact_substitutions(facts: list[sympy.Basic], ranges: dict[sympy.Symbol, ValueRange]
                        ) -> Iterator[tuple[dict[sympy.Symbol, sympy.Expr], dict[sympy.Symbol, ValueRange]]]:
    """Ways to write the facts into a question: a linear fact `a <= b` becomes `b = a + d` for a fresh slack d >= 0
    (an equality, `b = a`), eliminating a symbol with coefficient one. The eliminated symbol's own range is
    forgotten, so an answer under the substitution is sound, if sometimes weaker."""
    for index, fact in enumerate(facts):
        if not isinstance(fact, sympy.core.relational.Relational) or fact.rel_op == "!=":
            continue
        gap = sympy.expand(fact.lhs - fact.rhs if fact.rel_op in (">=", ">") else fact.rhs - fact.lhs)  # >= 0
        lowest = {">=": 0, "<=": 0, ">": 1, "<": 1, "==": 0}[fact.rel_op]
        for sym in sorted(gap.free_symbols, key=str):
            coefficient = gap.coeff(sym, 1)
            if coefficient not in (1, -1) or sym in (gap - coefficient * sym).free_symbols or sym not in ranges:
                continue
            slack = sympy.Integer(0) if fact.rel_op == "==" else symbol(f"kiln_slack{index}")
            # gap = coefficient*sym + rest = slack  =>  sym = (slack - rest) / coefficient
            solved = sympy.expand((slack - (gap - coefficient * sym)) / coefficient)
            yield {sym: solved}, ({} if fact.rel_op == "==" else {slack: ValueRange(lowest, INF)})


def _to_relational(condition: sympy.Basic | bool) -> sympy.Basic:
    if isinstance(condition, bool):
        return sympy.true if condition else sympy.false
    return condition


def _negate(condition: sympy.Basic) -> sympy.Basic:
    if isinstance(condition, sympy.core.relational.Relational):
        return condition.negated
    return sympy.Not(condition)


# ---------------------------------------------------------------------------------------------
# The active ShapeEnv, used by meta rules.

_ACTIVE_ENV: contextvars.ContextVar[ShapeEnv | None] = contextvars.ContextVar("kiln_shape_env", default=None)
# The user's source line of the op being recorded, attached to guards its meta rule records.
_GUARD_SOURCE: contextvars.ContextVar[str] = contextvars.ContextVar("kiln_guard_source", default="")


@contextlib.contextmanager
def guard_source(source: str | None) -> Iterator[None]:
    token = _GUARD_SOURCE.set(source or "")
    try:
        yield
    finally:
        _GUARD_SOURCE.reset(token)


@contextlib.contextmanager
def active_shape_env(env: ShapeEnv | None) -> Iterator[ShapeEnv | None]:
    token = _ACTIVE_ENV.set(env)
    try:
        yield env
    finally:
        _ACTIVE_ENV.reset(token)


def current_shape_env() -> ShapeEnv | None:
    return _ACTIVE_ENV.get()


def provably(condition: sympy.Basic | bool) -> bool | None:
    """True/False when a condition on dims holds/fails for every value of its symbols' ranges, without adding a
    guard; None when it depends on the values. Argument checks use it where torch export treats sizes
    size-obliviously, and rewrites to pick a form that is right for every value."""
    if isinstance(condition, bool):
        return condition
    return (current_shape_env() or ShapeEnv()).statically_known(condition)


def guard_bool(condition: sympy.Basic | bool, source: str = "") -> bool:
    """Decide a condition on dims: statically if possible, else through the active ShapeEnv."""
    if isinstance(condition, (bool, sympy.logic.boolalg.BooleanAtom)):
        return bool(condition)
    env = current_shape_env()
    if env is not None:
        return env.evaluate(condition, source)
    known = ShapeEnv().statically_known(condition)
    if known is None:
        raise GuardError(f"cannot decide `{condition}` without example values for its symbols",
                         fix="trace with example inputs, or declare the relation between the dims")
    return known


def sym_eq(a: SymInt, b: SymInt) -> bool:
    """a == b for dims, deciding symbolic cases with guards."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    diff = sympy.expand(sympy.sympify(a) - sympy.sympify(b))
    if diff.is_Integer:
        return diff == 0
    return guard_bool(sympy.Eq(a, b))


def sym_lt(a: SymInt, b: SymInt) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a < b
    return guard_bool(sympy.Lt(a, b))


def sym_le(a: SymInt, b: SymInt) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a <= b
    return guard_bool(sympy.Le(a, b))


def evaluate_dim(value: SymInt, bindings: dict[sympy.Symbol, int]) -> int:
    """The concrete value of a dim once every symbol is bound."""
    if isinstance(value, int):
        return value
    result = value.xreplace({s: sympy.Integer(v) for s, v in bindings.items()})
    if not result.is_Integer:
        missing = ", ".join(sorted(str(s) for s in result.free_symbols))
        raise GuardError(f"dim `{value}` needs values for {missing or 'its symbols'}")
    return int(result)


def dims_function(symbols: list[sympy.Symbol], dims: list[SymInt]) -> Callable[..., tuple[int, ...]]:
    """A fast function of the symbols' values giving `dims`, in exact integer arithmetic: floor(a/b) is a // b, not
    a float division rounded down (sympy.lambdify's floor(7/3 - 3/3 + 2/3) is 1, where the size is 2). Dims it cannot
    write that way are evaluated by `evaluate_dim`."""
    names = {s: f"a{k}" for k, s in enumerate(symbols)}
    try:
        body = ", ".join(_integer_python(sympy.sympify(d), names) for d in dims)
    except ValueError:
        return lambda *values: tuple(evaluate_dim(d, dict(zip(symbols, values))) for d in dims)
    return eval(f"lambda {', '.join(names.values())}: ({body}{',' if len(dims) == 1 else ''})")  # noqa: S307


def _integer_python(expr: sympy.Expr, names: dict[sympy.Symbol, str]) -> str:
    """`expr` as Python integer arithmetic over `names` (ValueError for what has no exact integer form)."""
    def write(e: sympy.Expr) -> str:
        if e.is_Integer:
            return str(int(e))
        if e.is_Symbol:
            if e not in names:
                raise ValueError(f"unbound symbol {e}")
            return names[e]
        if e.is_Add or (e.is_Mul and all(a.is_integer for a in e.args)):
            return "(" + (" + " if e.is_Add else " * ").join(write(a) for a in e.args) + ")"
        if e.is_Pow and e.exp.is_Integer and int(e.exp) > 0:
            return f"({write(e.base)} ** {int(e.exp)})"
        if isinstance(e, (sympy.floor, sympy.ceiling)):
            num, den = sympy.fraction(sympy.together(e.args[0]))
            if isinstance(e, sympy.floor):
                return f"({write(num)} // {write(den)})"
            return f"(-((-{write(num)}) // {write(den)}))"
        if isinstance(e, sympy.Mod):  # sympy's Mod floors, as Python's % does
            return f"({write(e.args[0])} % {write(e.args[1])})"
        if isinstance(e, (sympy.Min, sympy.Max)):
            return f"{'min' if isinstance(e, sympy.Min) else 'max'}({', '.join(write(a) for a in e.args)})"
        raise ValueError(f"no integer form for {e}")
    return write(expr)
