"""Samples for kiln/ir/ops/symbolic.py."""

from __future__ import annotations

import numpy as np

from tests.ir.samples import TORCH_SKIPS, Sample, rand, samples

for _name in ("add", "sub", "mul", "floordiv", "mod"):
    TORCH_SKIPS[f"_operator.{_name}.default"] = (
        "a Python operator on SymInts, not a torch op: tests/serde/test_exportdb.py compares it with Python's")


@samples("_operator.add.default", "_operator.sub.default", "_operator.mul.default")
def _arithmetic(rng):
    yield Sample((-7, 2), note="negative")  # first: the MLIR round trip (`!kiln.symint<-5>`) takes three samples
    yield Sample((4, 3))
    yield Sample((0, 0))
    yield Sample((9, 2))


@samples("_operator.floordiv.default", "_operator.mod.default")
def _division(rng):
    yield Sample((-7, 2), note="rounds toward -inf, as Python does")
    yield Sample((7, -2), note="negative divisor")
    yield Sample((7, 2))
    yield Sample((6, 3), note="exact")
    yield Sample((0, 5))


@samples("aten.item.default")
def _item(rng):
    yield Sample((rand(rng, 1),), note="float32 → float")
    yield Sample((np.array([[-7]], np.int64),), note="int64 → int")
    yield Sample((np.array([True]),), note="bool → bool")
    yield Sample((rand(rng),), note="0-d")
