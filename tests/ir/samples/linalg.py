"""Samples for kiln/ir/ops/linalg.py."""

from __future__ import annotations

import numpy as np  # noqa: F401

from tests.ir.samples import Sample, positive, rand, samples  # noqa: F401



@samples("aten.mm.default")
def _mm(rng):
    yield Sample((rand(rng, 3, 4), rand(rng, 4, 5)))
    yield Sample((rand(rng, 3, 4, dtype="float64"), rand(rng, 4, 2, dtype="float64")))
    yield Sample((rand(rng, 2, 3, dtype="int64"), rand(rng, 3, 2, dtype="int64")))
    yield Sample((rand(rng, 0, 4), rand(rng, 4, 5)), note="empty")
