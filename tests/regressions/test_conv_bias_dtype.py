"""A convolution whose bias has another dtype than its input (a bool bias on float32, from the fuzzer): ATen's
convolutions refuse it ("Input type (float) and bias type (bool) should be the same"), kiln's meta rule took it and
torch failed on the .pt2 (fixed in kiln/ir/ops/nn.py: the convolution meta rule requires the input's dtype)."""

import numpy as np
import pytest

from kiln.ir.errors import DTypeError
from kiln.ir.registry import ops

aten = ops.aten


@pytest.mark.parametrize("op, weight", [(aten.conv1d.default, (3, 2, 2)), (aten.conv_transpose1d.default, (2, 3, 2))])
@pytest.mark.parametrize("bias_dtype", [np.bool_, np.float64])
def test_convolution_refuses_a_bias_of_another_dtype(op, weight, bias_dtype):
    x = np.ones((1, 2, 5), np.float32)
    with pytest.raises(DTypeError, match="bias"):
        op(x, np.ones(weight, np.float32), np.ones(3, bias_dtype))
