"""Samples for kiln/ir/ops/shape.py."""

from __future__ import annotations

import numpy as np  # noqa: F401

from tests.ir.samples import Sample, positive, rand, samples  # noqa: F401



@samples("aten.view.default")
def _view(rng):
    yield Sample((rand(rng, 3, 4), [12]))
    yield Sample((rand(rng, 3, 4), [-1, 2]))
    yield Sample((rand(rng, 2, 3, 4, dtype="int32"), [4, -1]))
    yield Sample((rand(rng), [1, 1]), note="0-d")
    yield Sample((rand(rng, 0, 4), [-1, 2]), note="empty")
