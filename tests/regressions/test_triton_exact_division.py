"""Triton: floor division, fmod and remainder of floats divided the operands first (floor(a / b)), so 5 // 0.001
gave 5000 where ATen's fmod-based c10::div_floor_floating gives 4999 (0.001 is a little more than a thousandth); and a
float16 log_softmax over the last dim did not round the sum and its log to float16 as ATen's CPU kernel does (5
float16 ulps off). Both now follow ATen (render.kiln_div_floor / kiln_fmod / kiln_remainder, rows_kernel). Found by
the fuzzer."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("op", ["floor_divide", "fmod", "remainder"])
@pytest.mark.parametrize("dtype", [kiln.float32, kiln.float64])
def test_float_division_is_exact(op, dtype):
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of([12], dtype))
    with builder:
        scalar = {"floor_divide": aten.floor_divide.Scalar, "fmod": aten.fmod.Scalar,
                  "remainder": aten.remainder.Scalar}[op]
        v0 = scalar(x0, 0.001)
        v1 = scalar(x0, -0.7)
    program = builder.build([v0, v1])
    x = np.array([-1, 3, 5, -4, 5, 4, -2, 7, -11, 0.0, -0.0, 1e-3], dtype.numpy)
    check_program(program, [x])


def test_float16_log_softmax_rounds_its_sum_as_aten():
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of([2, 6], kiln.float16))
    with builder:
        v0 = aten.log_softmax.int(x0, 1)
    program = builder.build([v0])
    x = np.array([[-1.1845703125, -0.50830078125, -1.6982421875, 2.857421875, -0.336181640625, 5.171875],
                  [3.875, 1.427734375, 1.0263671875, -1.6005859375, -0.54248046875, 1.513671875]], np.float16)
    check_program(program, [x], backends=("onnx", "triton", "torch"))
