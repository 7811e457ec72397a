"""flatten of a 0-d tensor with start_dim=1: ATen's dims for a 0-d tensor are 0 and -1 and it refuses 1, kiln
flattened it to [1] anyway, and torch then failed on the .pt2 (fixed in kiln/ir/ops/shape.py: the dims are checked
before the 0-d case)."""

import numpy as np
import pytest

from kiln.ir.errors import ShapeError
from kiln.ir.registry import ops

aten = ops.aten


def test_flatten_0d():
    x = np.array(1.0, np.float32)
    assert aten.flatten.using_ints(x, 0, -1).shape == (1,)
    with pytest.raises(ShapeError, match=r"\[-1, 0\]"):
        aten.flatten.using_ints(x, 1, 2)
