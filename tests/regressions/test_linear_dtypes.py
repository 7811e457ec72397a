"""linear with operands of different dtypes, or a bias that does not fit: ATen refuses it ("mat1 and mat2 must have the
same dtype"), kiln's meta rule accepted it, so the program failed in torch (through the .pt2) and in the C backend's
decomposition (fixed in kiln/ir/ops/composite.py: the meta rule requires one dtype)."""

import numpy as np
import pytest

from kiln.ir.errors import DTypeError
from kiln.ir.registry import ops

aten = ops.aten


@pytest.mark.parametrize("weight, bias", [("float64", None), ("float32", "float64"), ("float16", "float16")])
def test_linear_refuses_mixed_dtypes(weight, bias):
    x = np.ones((2, 3), np.float32)
    w = np.ones((4, 3), weight)
    b = None if bias is None else np.ones(4, bias)
    with pytest.raises(DTypeError, match="same dtype"):
        aten.linear.default(x, w, b)


def test_linear_of_one_dtype():
    out = aten.linear.default(np.ones((2, 3), np.float16), np.ones((4, 3), np.float16), np.ones(4, np.float16))
    assert out.dtype == np.float16 and out.shape == (2, 4)


@pytest.mark.parametrize("bias", [(3, 2), (2, 3, 3)])
def test_linear_refuses_a_bias_that_does_not_fit(bias):
    """A [3, 2] bias for a [3, 3] result: kiln's meta rule took it and the reference kernel failed to broadcast (ATen
    refuses it; fixed in kiln/ir/ops/composite.py)."""
    from kiln.ir.errors import ShapeError
    with pytest.raises(ShapeError):
        aten.linear.default(np.ones((3, 2), np.float32), np.ones((3, 2), np.float32), np.ones(bias, np.float32))


def test_linear_takes_a_bias_that_broadcasts():
    out = aten.linear.default(np.ones((2, 3, 2), np.float32), np.ones((3, 2), np.float32), np.ones((3, 3), np.float32))
    assert out.shape == (2, 3, 3)
