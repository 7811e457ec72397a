"""A size sympy leaves with a fractional coefficient: view(-1, 2) of a [5, 8, s0 + 3, s1 + 3] tensor infers
`(40*s0 + 120)*(s1 + 3)/2`, which the .pt2 writer refused ("cannot write symbolic expression 1/2 for torch"). It is
now written with integer coefficients, factored or as a floor division (kiln/ir/serde/symexpr.py integral_form).
Found by the differential fuzzer (seed 900)."""

import numpy as np
import pytest
import sympy

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.serde.symexpr import integral_form
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


def test_inferred_view_size_round_trips():
    builder = GraphBuilder()
    s0 = builder.shape_env.create_symbol(2, name='s0', min=0, max=16)
    s1 = builder.shape_env.create_symbol(2, name='s1', min=1, max=16)
    x0 = builder.add_input('x0', TensorType.of([5, 5, s0, s1], kiln.float32))
    with builder:
        padded = aten.replication_pad3d.default(x0, [1, 2, 3, 0, 2, 1])
        pairs = aten.view.default(padded, [-1, 2])
        ones = aten.full.default([pairs.type.shape[0], 2], 1.0)  # the size as an argument: SymInt arithmetic
        total = aten.add.Tensor(pairs, ones)
    program = builder.build([pairs, total])
    x = np.random.default_rng(0).standard_normal((5, 5, 2, 1)).astype(np.float32)
    check_program(program, [x], backends=("pt2", "torch"))


@pytest.mark.parametrize("text", ["(40*s0 + 120)*(s1 + 3)/2", "s0*(s0 + 1)/2", "s0/2 + s1/2 + 1"])
def test_integral_form_keeps_the_value(text):
    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    expr = sympy.sympify(text, locals={"s0": s0, "s1": s1})
    written = integral_form(expr)
    # integer coefficients, or a floor division (which the writer spells as torch's FloorDiv)
    assert isinstance(written, sympy.floor) or all(c.is_Integer for c in sympy.Poly(written, s0, s1).coeffs())
    for a in range(0, 7):
        for b in range(0, 7, 2):
            if (value := expr.subs({s0: a, s1: b})).is_Integer:
                assert written.subs({s0: a, s1: b}) == value
