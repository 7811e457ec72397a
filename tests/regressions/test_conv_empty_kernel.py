"""A convolution whose kernel has a 0-size dim: ATen refuses it ("kernel size should be greater than zero"), and
oneDNN and onnxruntime's ConvTranspose failed on it, while kiln's interpreter computed zeros. kiln's meta rule now
refuses it too. Found by the differential fuzzer (seed 1300)."""

import pytest
import torch

import kiln
from kiln.ir.errors import ShapeError
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType

aten = ops.aten


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("weight_shape", [[4, 1, 5, 0], [4, 1, 0, 2]])
def test_a_kernel_with_an_empty_dim_is_refused(transposed, weight_shape):
    x_shape = [1, 4, 6, 6] if transposed else [1, 1, 6, 6]
    with pytest.raises(RuntimeError, match="kernel size should be greater than zero"):
        with torch.backends.mkldnn.flags(enabled=False):
            torch.ops.aten.convolution(torch.zeros(x_shape), torch.zeros(weight_shape), None, [1, 1], [0, 0],
                                       [1, 1], transposed, [0, 0], 1)
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of(x_shape, kiln.float32))
    w0 = builder.add_input('w0', TensorType.of(weight_shape, kiln.float32))
    with pytest.raises(ShapeError, match="kernel size should be greater than zero"), builder:
        aten.convolution.default(x0, w0, None, [1, 1], [0, 0], [1, 1], transposed, [0, 0], 1)


def test_zero_input_channels_are_refused():
    """ATen's convolution over 0 input channels returns [N, 0, ...] (not zeros plus bias of [N, out, ...]); kiln
    refuses it instead of computing another shape. Found by the differential fuzzer (seed 1500)."""
    with torch.backends.mkldnn.flags(enabled=False):
        result = torch.ops.aten.convolution(torch.zeros(2, 0, 4, 4), torch.zeros(3, 0, 3, 3), None, [1, 1], [0, 0],
                                            [1, 1], False, [0, 0], 1)
    assert list(result.shape) == [2, 0, 2, 2]
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of([2, 0, 4, 4], kiln.float32))
    w0 = builder.add_input('w0', TensorType.of([3, 0, 3, 3], kiln.float32))
    with pytest.raises(ShapeError, match="0 input channels"), builder:
        aten.convolution.default(x0, w0, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
