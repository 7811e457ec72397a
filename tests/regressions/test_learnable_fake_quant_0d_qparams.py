"""_fake_quantize_learnable_per_tensor_affine with a 0-d scale or zero point: ATen's kernel reads scale[0] and
refuses a 0-d tensor ("select() cannot be applied to a 0-dim tensor"), while kiln's meta rule (shared with the
tensor_qparams op, which does take 0-d qparams) accepted it. The learnable op has its own check now
(kiln/ir/ops/quant.py)."""

import numpy as np
import pytest

import kiln
from kiln.ir.errors import OpArgumentError
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("scale_shape,zero_point_shape", [([], [1]), ([1], []), ([], [])])
def test_0d_qparams_are_refused(scale_shape, zero_point_shape):
    builder = GraphBuilder()
    x = builder.add_input('x', TensorType.of([4], kiln.float32))
    scale = builder.add_input('scale', TensorType.of(scale_shape, kiln.float32))
    zero_point = builder.add_input('zero_point', TensorType.of(zero_point_shape, kiln.float32))
    with builder, pytest.raises(OpArgumentError, match="1-D one-element"):
        aten._fake_quantize_learnable_per_tensor_affine.default(x, scale, zero_point, 0, 255)


def test_1d_qparams_agree_with_torch():
    builder = GraphBuilder()
    x = builder.add_input('x', TensorType.of([4], kiln.float32))
    scale = builder.add_input('scale', TensorType.of([1], kiln.float32))
    zero_point = builder.add_input('zero_point', TensorType.of([1], kiln.float32))
    with builder:
        y = aten._fake_quantize_learnable_per_tensor_affine.default(x, scale, zero_point, 0, 255)
    program = builder.build([y])
    inputs = [np.array([-1.0, 0.26, 3.0, 30.0], np.float32), np.array([0.1], np.float32), np.array([2.4], np.float32)]
    np.testing.assert_allclose(program(*inputs), [-0.2, 0.3, 3.0, 25.3], rtol=1.3e-6, atol=1e-5)
    check_program(program, inputs, backends=("c", "onnx", "torch"))
