"""A comparison fused into a GEMM or convolution epilogue (conv_transpose2d, then gt): the C renderer declared the
accumulated value with the output's type, bool, so every nonzero sum compared as 1. acc_value takes the
accumulator's dtype now (kiln/codegen/c/render.py, accumulator_type), whichever kernel (direct or im2col
convolution, GEMM tiles, small matmuls) computes it."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten

CASES = {
    "conv_transpose2d": ([[2, 3, 4, 5], [3, 2, 3, 3], [2]], lambda x, w, b: aten.conv_transpose2d.input(x, w, b)),
    "conv2d": ([[2, 3, 6, 6], [4, 3, 3, 3], [4]], lambda x, w, b: aten.conv2d.default(x, w, b)),
    "conv2d_wide": ([[1, 16, 12, 12], [32, 16, 3, 3], [32]], lambda x, w, b: aten.conv2d.default(x, w, b)),
    "addmm": ([[5], [4, 6], [6, 5]], lambda b, x, w: aten.addmm.default(b, x, w)),
    "linear": ([[70, 64], [48, 64], [48]], lambda x, w, b: aten.linear.default(x, w, b)),
}


@pytest.mark.parametrize("name", CASES)
def test_a_comparison_after_a_gemm_or_convolution(name):
    shapes, op = CASES[name]
    builder = GraphBuilder()
    values = [builder.add_input(f'x{i}', TensorType.of(shape, kiln.float32)) for i, shape in enumerate(shapes)]
    with builder:
        y = aten.gt.Scalar(op(*values), -2)
    program = builder.build([y])
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(shape).astype(np.float32) for shape in shapes]
    result = program(*inputs)
    assert result.dtype == np.bool_ and 0 < result.sum() < result.size  # both answers occur
    check_program(program, inputs, backends=("c",))
