"""Samples for kiln/ir/ops/misc.py."""

from __future__ import annotations

import numpy as np  # noqa: F401

from tests.ir.samples import Sample, positive, rand, samples  # noqa: F401


@samples("aten._local_scalar_dense.default")
def _local_scalar_dense(rng):
    yield Sample((rand(rng, 1),), note="float32 → float")
    yield Sample((np.array([[-7]], np.int64),), note="int64 → int")
    yield Sample((np.array([-3], np.int8),), note="int8 → int")
    yield Sample((np.array([200], np.uint8),), note="uint8 → int")
    yield Sample((np.array([True]),), note="bool → bool")
    yield Sample((rand(rng, 1, 1, dtype="bfloat16"),), note="bfloat16 → float")
    yield Sample((rand(rng, 1, dtype="float16"),), note="float16 → float")
    yield Sample((np.array([0.1], np.float64),), note="float64 keeps its precision")
    yield Sample((np.array([np.nan], np.float32),), note="nan")
    yield Sample((rand(rng),), note="0-d")
