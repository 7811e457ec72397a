"""Samples of the complex ops: rotary angles, products, and the views between pairs and complex values."""

from __future__ import annotations

import numpy as np

from tests.ir.samples import Sample, rand, samples


@samples("aten.polar.default")
def _polar(rng):
    yield Sample((np.abs(rand(rng, 3, 4)), rand(rng, 3, 4)))
    yield Sample((np.ones((1, 4), np.float64), rand(rng, 5, 1, dtype="float64")), note="broadcast, float64")
    yield Sample((np.array(2.0, np.float32), np.array([0.0, np.pi / 2, np.inf], np.float32)),
                 note="0-d modulus, inf angle")


@samples("aten.view_as_complex.default")
def _view_as_complex(rng):
    yield Sample((rand(rng, 3, 4, 2),))
    yield Sample((rand(rng, 2, dtype="float64"),), note="to 0-d")
    yield Sample((np.transpose(rand(rng, 2, 3, 2), (1, 0, 2)),), note="non-contiguous")


@samples("aten.view_as_real.default")
def _view_as_real(rng):
    yield Sample(((rand(rng, 3, 4) + 1j * rand(rng, 3, 4)).astype(np.complex64),))
    yield Sample((np.array(1.5 - 2j, np.complex128),), note="0-d, complex128")
