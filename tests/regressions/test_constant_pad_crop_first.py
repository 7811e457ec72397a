"""constant_pad_nd with a negative pad larger than the dim on one side and a positive pad on the other
(size 1, pad (1, -2)): ATen crops before it pads, so the crop fails ("narrow(): length must be non-negative"), while
kiln checked only the final size (0) and computed a result torch eager refused. The meta rule checks the crops
alone now (kiln/ir/ops/shape.py)."""

import numpy as np
import pytest
import torch

import kiln
from kiln.ir.errors import ShapeError
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType

aten = ops.aten


@pytest.mark.parametrize("pad", [[1, -2], [-2, 1], [2, -2], [3, -2], [0, -1], [-1, 1], [1, -1, 0, 0]])
def test_pads_crop_first_as_aten_does(pad):
    x = np.arange(3, dtype=np.float32).reshape(3, 1)
    try:
        expected = torch.ops.aten.constant_pad_nd(torch.from_numpy(x), pad, -7).numpy()
    except RuntimeError:
        expected = None
    builder = GraphBuilder()
    value = builder.add_input('x', TensorType.of([3, 1], kiln.float32))
    if expected is None:
        with builder, pytest.raises(ShapeError, match="negative padding"):
            aten.constant_pad_nd.default(value, pad, -7)
        return
    with builder:
        y = aten.constant_pad_nd.default(value, pad, -7)
    np.testing.assert_array_equal(builder.build([y])(x), expected)
