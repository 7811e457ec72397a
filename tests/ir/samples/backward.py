"""Samples for kiln/ir/ops/backward.py."""

from __future__ import annotations

import numpy as np  # noqa: F401

from tests.ir.samples import Sample, positive, rand, samples  # noqa: F401

