"""linear with a 1-D weight (ATen computes input.matmul(weight.t()), one value per row): kiln's decomposition
permuted the weight as if it were 2-D and the C backend and ONNX export crashed with a ShapeError. Fixed in
kiln/ir/ops/composite.py (_linear_decomposition)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("input_shape", [[2], [3, 2], [2, 3, 2]])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_with_a_vector_weight(input_shape, with_bias):
    if len(input_shape) == 2 and with_bias:  # ATen's addmm path refuses it, and so does kiln
        with pytest.raises(kiln.KilnError, match="mat2 must be a matrix"):
            aten.linear.default(np.ones((3, 2), np.float32), np.ones(2, np.float32), np.float32(0.5))
        return
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of(input_shape, kiln.float32))
    x1 = builder.add_input('x1', TensorType.of([2], kiln.float32))
    x2 = builder.add_input('x2', TensorType.of([], kiln.float32))
    with builder:
        v0 = aten.linear.default(x0, x1, x2 if with_bias else None)
    program = builder.build([v0])
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(input_shape).astype(np.float32), rng.standard_normal(2).astype(np.float32),
              np.array(0.5, np.float32)]
    check_program(program, inputs, backends=("onnx", "c[AVX2]", "torch"))
