"""floor_divide of 0 by a negative number is -0.0 in ATen (rsqrt of it is -inf); kiln's ONNX lowering computed the
signed zero but selected it through the true branch of a Where, and onnxruntime's Where gives +0 for a -0 taken
from its true branch (seen in onnxruntime 1.32, float32 and float64). The signed zero now goes through the false
branch. Found by the differential fuzzer (seed 1400)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("dividend, divisor", [(kiln.bool, kiln.float16), (kiln.float32, kiln.float32),
                                               (kiln.float64, kiln.float64)])
def test_a_zero_quotient_keeps_its_sign(dividend, divisor):
    builder = GraphBuilder()
    a = builder.add_input('a', TensorType.of([8], dividend))
    b = builder.add_input('b', TensorType.of([8], divisor))
    with builder:
        quotient = aten.floor_divide.default(a, b)
        v0 = aten.rsqrt.default(quotient)
    program = builder.build([quotient, v0])
    inputs = [np.array([0, 0, 0, 0, -0.0, 1, -0.5, 0.5]).astype(dividend.numpy),  # -0.5 // 3: (a - fmod) / b is +0
              np.array([-2.4, 0.05, -1.5, 1.4, 3.0, -7.0, 3.0, -3.0]).astype(divisor.numpy)]
    check_program(program, inputs, backends=("onnx", "c[AVX2]", "torch") if divisor is not kiln.float16
                  else ("onnx", "torch"))
