"""max_pool over a window holding NaN: ATen returns NaN, onnxruntime's MaxPool skipped it (a window of [NaN, 3.0] gave
3.0) when only the values were used. Fixed in kiln/codegen/onnx/lowerings.py (max_pool_values): a second MaxPool of
the NaN marks puts NaN back."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("dilation, ceil_mode", [(1, False), (2, True)])
def test_max_pool_values_keep_nan(dilation, ceil_mode):
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of([1, 2, 5, 7], kiln.float32))
    with builder:
        v0 = aten.max_pool2d.default(x0, [2, 2], [2, 1], [1, 0], [dilation, dilation], ceil_mode)
    program = builder.build([v0])
    x = np.random.default_rng(0).standard_normal((1, 2, 5, 7)).astype(np.float32)
    x[0, 0, 2, 2], x[0, 1, 0, 6], x[0, 1, 4, 0] = np.nan, np.nan, -np.inf
    x[0, 0, 3, 3] = np.inf
    check_program(program, [x], backends=("onnx", "torch"))
