"""addmm (and the other alpha/beta ops) on integer tensors with beta=-inf: ATen refuses ("value cannot be converted
to type int64_t without overflow"); kiln's interpreter crashed with a raw OverflowError. It is an OpArgumentError
now (kiln/ir/ops/linalg.py, _scalar_for)."""

import numpy as np
import pytest

from kiln.ir.errors import OpArgumentError
from kiln.ir.registry import ops
from tests.torch_oracle import to_torch

aten = ops.aten


@pytest.mark.parametrize("scalars", [{"beta": -float("inf")}, {"alpha": float("nan")}, {"alpha": float("inf")}])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_non_finite_alpha_beta_on_integers_is_refused(scalars, dtype):
    import torch
    operands = [np.ones((2, 3), dtype), np.ones((2, 4), dtype), np.ones((4, 3), dtype)]
    with pytest.raises(RuntimeError, match="without overflow"):  # the oracle refuses it too
        torch.addmm(*(to_torch(a) for a in operands), **scalars)
    with pytest.raises(OpArgumentError, match="without overflow"):
        aten.addmm.default(*operands, **scalars)
