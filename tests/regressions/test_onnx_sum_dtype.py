"""sum with `dtype=` converts the input to that dtype first (torch.sum's docs): sum(x, dtype=bool) of [-0.26, 0.17]
is any(x != 0), True. kiln's ONNX converted the floats to int64 (truncating both to 0), summed, and gave False.
Fixed in kiln/codegen/onnx/lowerings.py (_sum_like): the input goes to `dtype` first."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("dtype", [kiln.bool, kiln.int32, kiln.int64, kiln.float64])
def test_sum_converts_to_its_dtype_first(dtype):
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of([3, 2], kiln.float32))
    with builder:
        v0 = aten.sum.dim_IntList(x0, [0], dtype=dtype)
        v1 = aten.sum.dim_IntList(x0, [0, 1], True, dtype=dtype)
    program = builder.build([v0, v1])
    x = np.array([[-0.26, 0.17], [0.0, -0.0], [2.75, -1.5]], np.float32)
    check_program(program, [x], backends=("onnx", "torch"))  # (C refuses dtype=)
