"""Samples for kiln/ir/ops/pointwise.py."""

from __future__ import annotations

import numpy as np  # noqa: F401

from tests.ir.samples import Sample, positive, rand, samples  # noqa: F401


BINARY_DTYPE_PAIRS = [("float32", "float32"), ("int32", "float16"), ("int64", "int8"), ("bool", "bool"),
                      ("uint8", "int8"), ("bfloat16", "float16"), ("float64", "int32")]


def binary_samples(rng, *, scalar_other: bool = False, alpha: bool = False, low: float = -3, high: float = 3):
    """Broadcasting, 0-d, empty and mixed-dtype pairs for an elementwise binary op."""
    for left, right in BINARY_DTYPE_PAIRS:
        if scalar_other:
            yield Sample((rand(rng, 3, 4, dtype=left, low=low, high=high), 2), note=f"{left} with int")
            yield Sample((rand(rng, 3, 4, dtype=left, low=low, high=high), 1.5), note=f"{left} with float")
        else:
            yield Sample((rand(rng, 3, 4, dtype=left, low=low, high=high),
                          rand(rng, 4, dtype=right, low=low, high=high)), note=f"{left}/{right} broadcast")
    if not scalar_other:
        yield Sample((rand(rng, 2, 1, 5, low=low, high=high), rand(rng, 3, 1, low=low, high=high)), note="both broadcast")
        yield Sample((rand(rng, 3, dtype="int32", low=low, high=high), rand(rng, dtype="float64", low=low, high=high)),
                     note="0-d float64 does not widen int32 to float64")
        yield Sample((rand(rng, 0, 3, low=low, high=high), rand(rng, 3, low=low, high=high)), note="empty")
        yield Sample((np.array([np.nan, np.inf, -np.inf], np.float32), np.array([1.0, np.inf, 2.0], np.float32)),
                     note="nan/inf")
    if alpha:
        yield Sample((rand(rng, 2, 3), rand(rng, 2, 3)) if not scalar_other else (rand(rng, 2, 3), 2.0),
                     {"alpha": 2} if not scalar_other else {}, note="alpha")


@samples("aten.add.Tensor", "aten.mul.Tensor", "aten.eq.Tensor")
def _binary(rng):
    yield from binary_samples(rng)


@samples("aten.add.Scalar", "aten.mul.Scalar", "aten.eq.Scalar")
def _binary_scalar(rng):
    yield from binary_samples(rng, scalar_other=True)


@samples("aten.relu.default", "aten.sin.default", "aten.exp.default")
def _unary(rng):
    for dtype in ("float32", "float64", "float16", "bfloat16", "int32", "int64"):
        yield Sample((rand(rng, 3, 5, dtype=dtype),), note=dtype)
    yield Sample((rand(rng),), note="0-d")
    yield Sample((rand(rng, 0, 2),), note="empty")
    yield Sample((np.array([np.nan, np.inf, -np.inf, 0.0], np.float32),), note="nan/inf")


@samples("aten.where.self")
def _where(rng):
    yield Sample((rand(rng, 3, 4, dtype="bool"), rand(rng, 3, 4), rand(rng, 4)))
    yield Sample((rand(rng, 4, dtype="bool"), rand(rng, 3, 4, dtype="int32"), rand(rng, 1, dtype="float16")))
