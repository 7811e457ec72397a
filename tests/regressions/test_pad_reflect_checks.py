"""pad(mode="reflect") of a [0, 4] input: ATen runs reflection_pad1d, which refuses empty non-batch dims; kiln's pad
meta rule accepted it, so the interpreter ran it and ONNX export and the C backend (whose decomposition calls
reflection_pad1d) crashed with a ShapeError. pad's meta rule now applies reflection_pad's checks
(kiln/ir/ops/shape.py)."""

import numpy as np
import pytest

from kiln.ir.errors import KilnError
from kiln.ir.registry import ops
from tests.torch_oracle import to_torch

aten = ops.aten


@pytest.mark.parametrize("shape, pad, refused", [
    ((0, 4), [1, 2], True), ((2, 0, 4), [1, 2], True), ((0, 2, 4), [1, 2], False), ((3, 4), [1, 2], False),
    ((1, 0, 5, 5), [1, 1, 1, 1], True)])
def test_reflect_pad_refuses_what_reflection_pad_refuses(shape, pad, refused):
    import torch
    x = np.ones(shape, np.float32)
    if refused:
        with pytest.raises(RuntimeError):
            torch.nn.functional.pad(to_torch(x), pad, mode="reflect")
        with pytest.raises(KilnError, match="non-zero dimensions"):
            aten.pad.default(x, pad, "reflect")
    else:
        expected = torch.nn.functional.pad(to_torch(x), pad, mode="reflect").numpy()
        np.testing.assert_array_equal(aten.pad.default(x, pad, "reflect"), expected)
