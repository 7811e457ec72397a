"""Triton: kernels over a 0-d tensor read it as a 0-d value, and Triton's interpreter cannot combine a 0-d float
comparison with anything (pow with a fractional exponent tests the base's sign), nor mask a load through a scalar
pointer (constant_pad_nd of a 0-d tensor with no padding). A 0-d pointwise or pad kernel now reads its element as a
block (render.pointwise_kernel / pad_kernel). Found by the fuzzer."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("value", [1.1278924942016602, -5.588025093078613, 0.0])
def test_0d_pointwise_and_pad(value):
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of([], kiln.float32))
    with builder:
        v0 = aten.div.Tensor(aten.pow.Tensor_Scalar(x0, -2.5), x0)
        v1 = aten.silu.default(aten.constant_pad_nd.default(x0, []))
        v2 = aten.logical_and.default(aten.gt.Scalar(x0, 0), aten.lt.Scalar(x0, 2))
    program = builder.build([v0, v1, v2])
    check_program(program, [np.array(value, np.float32)])
