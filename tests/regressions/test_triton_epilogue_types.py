"""Triton: a GEMM epilogue whose result has another dtype than the product (isinf(addmm(...)) writes bools)
converted the product to the output's dtype before the epilogue ran, so isinf saw a bool; and arange in bfloat16
reinterpreted its integers' bits. The epilogue now reads the product in its own dtype (render.accumulator_type), and
Iota converts as every cast does (render.Exprs.cast). Found by the fuzzer."""

import numpy as np

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


def test_an_epilogue_that_changes_the_dtype():
    builder = GraphBuilder()
    x1 = builder.add_input('x1', TensorType.of([4, 2], kiln.float32))
    x2 = builder.add_input('x2', TensorType.of([2], kiln.float32))
    x3 = builder.add_input('x3', TensorType.of([], kiln.float64))
    x4 = builder.add_input('x4', TensorType.of([3, 4], kiln.float32))
    with builder:
        v1 = aten.addmm.default(x2, x4, x1)
        v2 = aten.isinf.default(v1)
        v3 = aten.mul.Tensor(v2, x3)
        v4 = aten.gt.Scalar(aten.mm.default(x4, x1), 0)
    program = builder.build([v2, v3, v4])
    inputs = [np.array([[5.29, 3.56], [3.89, -0.557], [2.52, -0.0189], [1.80, 3.04]], np.float32),
              np.array([-0.90, -3.18], np.float32), np.array(-1.27, np.float64),
              np.array([[-np.inf] * 4, [1.0, 2.0, -1.0, 0.5], [0.25, -3.0, 2.0, 1.0]], np.float32)]
    check_program(program, inputs)


def test_arange_in_half_precision():
    builder = GraphBuilder()
    with builder:
        v0 = aten.arange.default(6, dtype=kiln.bfloat16)
        v1 = aten.arange.start_step(-3, 300, 7, dtype=kiln.float16)
    program = builder.build([v0, v1])
    check_program(program, [], backends=("triton", "onnx", "torch"))
