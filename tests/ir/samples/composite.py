"""Samples for kiln/ir/ops/composite.py."""

from __future__ import annotations

import numpy as np  # noqa: F401

from tests.ir.samples import Sample, positive, rand, samples  # noqa: F401



@samples("aten.linear.default")
def _linear(rng):
    yield Sample((rand(rng, 3, 4), rand(rng, 5, 4), rand(rng, 5)))
    yield Sample((rand(rng, 2, 3, 4), rand(rng, 5, 4)), note="batched, no bias")
    yield Sample((rand(rng, 4, dtype="float64"), rand(rng, 5, 4, dtype="float64"), rand(rng, 5, dtype="float64")),
                 note="1-D input")
