"""Triton: bool + bool wrapped around in int1 (True + True was False; ATen's is True), and a row kernel over a 0-d
input (argmax of a scalar) crashed in Triton's interpreter, which cannot `&` a block mask with a scalar. Bool sums
now count in int8 (render.BOOLEAN_SUMS), and a row kernel's loaded value is always a block. Found by the fuzzer's
new Triton backend."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("op", ["add", "mul"])
def test_bool_arithmetic_is_logical(op):
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of([3, 4], kiln.bool))
    x1 = builder.add_input('x1', TensorType.of([4], kiln.bool))
    with builder:
        v0 = getattr(aten, op).Tensor(x0, x1)
        v1 = getattr(aten, op).Scalar(v0, True)
    program = builder.build([v0, v1])
    inputs = [np.array([[True, True, True, False], [True, False, True, True], [False, False, True, True]]),
              np.array([False, True, True, False])]
    check_program(program, inputs)


@pytest.mark.parametrize("op", ["argmax", "argmin", "amax", "sum"])
def test_row_kernels_over_a_scalar(op):
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of([], kiln.float32))
    with builder:
        if op in ("argmax", "argmin"):
            v0 = getattr(aten, op).default(x0, -1)
        elif op == "amax":
            v0 = aten.amax.default(x0, [-1])
        else:
            v0 = aten.sum.dim_IntList(x0, [-1])
    program = builder.build([v0])
    check_program(program, [np.array(-1.6809463500976562, np.float32)])
