"""log_softmax in float64 over a row holding +inf: ATen gives NaN across the row, onnxruntime's float64 LogSoftmax
gave -inf beside the +inf (its float32 kernel agrees with ATen), and over a leading dim of a 4-D tensor it gave
finite numbers (46.05) beside a NaN. Fixed in kiln/codegen/onnx/lowerings.py (_softmax_like): the float64 lowering
adds NaN to the rows that hold a NaN or a +inf."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("dtype", [kiln.float64, kiln.float32])
@pytest.mark.parametrize("dim", [0, 1])
def test_log_softmax_over_infinities(dtype, dim):
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of([4, 3], dtype))
    with builder:
        v0 = aten._log_softmax.default(x0, dim, False)
        v1 = aten._softmax.default(x0, dim, False)
    program = builder.build([v0, v1])
    x = np.array([[np.inf, 1, 2], [-np.inf, 1, 2], [np.nan, 1, 2], [0.5, -3, 2]], dtype.numpy)
    check_program(program, [x], backends=("onnx", "torch"))


def test_float64_log_softmax_over_a_leading_dim_with_nan():
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of([2, 2, 4, 4], kiln.float32))
    with builder:
        v0 = aten.log_softmax.int(x0, 0, kiln.float64)
    program = builder.build([v0])
    x = np.random.default_rng(0).standard_normal((2, 2, 4, 4)).astype(np.float32)
    x[0, 0, 0, 3] = x[1, 1, 2, 1] = np.nan
    x[0, 1, 1, 0] = x[1, 1, 3, 2] = -np.inf
    x[1, 0, 2, 2] = np.inf
    check_program(program, [x], backends=("onnx", "torch"))
