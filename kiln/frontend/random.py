"""kiln's random state: one numpy Generator shared by eager initializers and the random ops' kernels."""

from __future__ import annotations

import numpy as np

from kiln.ir.ops import factory


def manual_seed(seed: int) -> None:
    """Seed everything random in kiln (parameter init, rand/randn/randperm/dropout kernels)."""
    factory.manual_seed(int(seed))


def default_generator() -> np.random.Generator:
    return factory.generator()
