"""Symbolic dims, value ranges and the ShapeEnv: guards, refinement, unbacked symbols, parsing."""

from __future__ import annotations

import math

import pytest
import sympy

from kiln.ir.errors import GuardError, ParseError
from kiln.ir.meta import broadcast_shapes
from kiln.ir.symbolic import (
    ShapeEnv, ValueRange, active_shape_env, evaluate_dim, format_dim, parse_dim, sym_eq, symbol,
)


def test_parse_and_format_round_trip():
    s0, s1 = symbol("s0"), symbol("s1")
    for expr in [s0, s0 + 1, 2 * s0, sympy.floor(s0 / 2), s0 * s1, sympy.Max(s0, s1), s0 - 1, 64 * s0 + 3,
                 sympy.Mod(s0, 4), sympy.ceiling(s0 / 3)]:
        assert parse_dim(format_dim(expr)) == expr
    assert parse_dim("s0//2") == sympy.floor(s0 / 2)
    assert parse_dim("7") == 7 and isinstance(parse_dim("7"), int)


@pytest.mark.parametrize("text", ["s0 +", "__import__('os')", "s0; 1", "s0 ^ 2", "(s0"])
def test_parse_refuses_malformed_or_hostile_text(text):
    with pytest.raises(ParseError):
        parse_dim(text)


def test_statically_known_uses_ranges():
    env = ShapeEnv()
    s0 = env.create_symbol(4, min=2, max=10)
    assert env.statically_known(sympy.Gt(s0, 1)) is True
    assert env.statically_known(sympy.Eq(s0, 1)) is False
    assert env.statically_known(sympy.Gt(s0, 5)) is None
    assert env.statically_known(sympy.Le(2 * s0 + 1, 21)) is True
    assert env.guards == []  # nothing was guarded


def test_slice_clamping_min_max_is_decided_by_cases():
    """torch's diff decomposition on a dim whose min is 0 (torch.export.Dim's default) gives this length; it is s for
    every s >= 0, which only a case split at s = 0 / s >= 1 shows."""
    env = ShapeEnv()
    s = env.create_symbol(None, min=0, max=64)
    clamped = s + sympy.Min(1, s)
    assert env.statically_known(sympy.Eq(-sympy.Min(1, clamped) + sympy.Min(clamped, sympy.Max(1, s + 1)), s))
    assert env.statically_known(sympy.Eq(clamped - sympy.Min(1, clamped), sympy.Max(0, clamped - 1))) is True
    assert env.statically_known(sympy.Ge(sympy.Min(3, s) + 1, 1)) is True
    assert env.statically_known(sympy.Eq(sympy.Min(1, s), 1)) is None  # false at s = 0, true above
    assert env.statically_known(sympy.Ne(sympy.Max(s, 2) - sympy.Min(s, 1), 0)) is True
    assert env.statically_known(sympy.Lt(sympy.Max(s, 2), 2)) is False
    unbounded = ShapeEnv()
    t = unbounded.create_symbol(None, min=2)
    assert unbounded.statically_known(sympy.Eq(sympy.Min(t, 1), 1)) is True  # resolved by the range, no split
    assert env.guards == [] and unbounded.guards == []


def test_facts_decide_what_ranges_leave_open():
    """torch's runtime assertion `u0 <= s` (from `torch._check(k <= x.shape[0])`) is what makes `x[:k] + x[-k:]`
    broadcast: the two slice lengths are equal only under it."""
    env = ShapeEnv()
    s = env.create_symbol(8, name="s", min=2, max=64)
    u = env.create_unbacked_symbol(min=2, max=64)
    same_length = sympy.Eq(sympy.Min(s, u), s - sympy.Min(s, sympy.Max(0, s - u)))
    assert env.statically_known(same_length) is None
    assert env.assume(sympy.Le(u, s)) is True
    assert env.statically_known(same_length) is True
    assert env.statically_known(sympy.Gt(u, s)) is False and env.statically_known(sympy.Le(u, s + 3)) is True
    assert env.statically_known(sympy.Lt(u, s)) is None  # u == s is allowed
    assert env.assume(sympy.Ge(u, 2)) is False  # implied by the range: nothing to check at run time
    assert env.assume(sympy.Le(u, 10)) is True and env.symbols[u].range == ValueRange(2, 10)  # narrows the range
    equal = ShapeEnv()
    a, b = equal.create_symbol(4, name="a"), equal.create_symbol(4, name="b")
    equal.assume(sympy.Eq(a, b + 1))
    assert equal.statically_known(sympy.Eq(sympy.Max(a, b), a)) is True
    assert env.guards == [] and equal.guards == []


def test_evaluate_records_guard_and_refines_range():
    env = ShapeEnv()
    s0 = env.create_symbol(7, min=2, max=100, source="x.size()[0]")
    assert env.evaluate(sympy.Gt(s0, 5)) is True
    assert [str(g.expr) for g in env.guards] == ["s0 > 5"]
    assert env.symbols[s0].range == ValueRange(6, 100)
    assert env.evaluate(sympy.Gt(s0, 5)) is True and len(env.guards) == 1  # now static, no new guard
    assert env.evaluate(sympy.Lt(s0, 7)) is False
    assert env.symbols[s0].range == ValueRange(7, 100)


def test_unbounded_ranges_print_like_torch():
    env = ShapeEnv()
    s0 = env.create_symbol(3, min=2)
    assert str(env.symbols[s0].range) == "VR[2, int_oo]"
    assert env.symbols[s0].range.upper == math.inf


def test_unbacked_symbols_cannot_be_guarded():
    env = ShapeEnv()
    u0 = env.create_unbacked_symbol()
    assert str(u0) == "u0" and env.symbols[u0].unbacked
    assert env.statically_known(sympy.Ge(u0, 0)) is True  # range says so
    with pytest.raises(GuardError, match="data-dependent"):
        env.evaluate(sympy.Gt(u0, 3))


def test_broadcast_guards_through_active_env():
    env = ShapeEnv()
    s0, s1 = env.create_symbol(5, min=2), env.create_symbol(5, min=2)
    with active_shape_env(env):
        assert broadcast_shapes("add", (s0, 3), (s1, 1)) == (s0, 3)
        assert sym_eq(s0 + 1, 1 + s0)
    assert [str(g.expr) for g in env.guards] == ["Eq(s0, s1)"]


def test_undecidable_without_env_raises_guard_error():
    with pytest.raises(GuardError):
        broadcast_shapes("add", (symbol("s0"),), (symbol("s1"),))


def test_evaluate_dim():
    s0 = symbol("s0")
    assert evaluate_dim(sympy.floor(s0 / 2) + 1, {s0: 9}) == 5
    with pytest.raises(GuardError):
        evaluate_dim(s0 + symbol("s9"), {s0: 1})
