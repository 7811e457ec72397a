"""nonzero in ONNX of dtypes onnxruntime's NonZero has no kernel for ("Could not find an implementation for
NonZero(13)" on int8): kiln now takes the truth of the values first (NaN and -0.0 as ATen counts them). Found by
the differential fuzzer (seed 900)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("dtype", [kiln.int8, kiln.int16, kiln.int32, kiln.int64, kiln.uint8, kiln.float16,
                                   kiln.bfloat16, kiln.float32, kiln.float64, kiln.bool])
@pytest.mark.parametrize("shape", [[3, 4], []])
def test_nonzero_of_every_dtype(dtype, shape):
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of(shape, dtype))
    with builder:
        v0 = aten.nonzero.default(x0)
    program = builder.build([v0])
    values = np.array([0, 1, -0.0, 2, np.nan, 0, 3, 0, -1, 0, 0, 5][:int(np.prod(shape))]).reshape(shape)
    if not dtype.is_floating_point:
        values = np.nan_to_num(values, nan=7)
    check_program(program, [values.astype(dtype.numpy)], backends=("onnx", "torch"))
