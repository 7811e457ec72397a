"""The sign of a zero that a weighted norm gives: ATen computes (x * rstd - mean * rstd) * weight + (bias or 0), so
a constant row times a negative weight is +0, where the interpreter and onnxruntime gave -0; rsqrt then gave -inf
where torch and kiln's C gave inf. The interpreter and the ONNX lowerings now add the zero bias too. Found by the
differential fuzzer (seed 1000)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("dtype", [kiln.float32, kiln.float64])
@pytest.mark.parametrize("norm", ["layer", "group", "batch"])
def test_a_zero_from_a_negative_weight_is_positive(norm, dtype):
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of([2, 2, 3], dtype))
    w = builder.add_input('w', TensorType.of([2] if norm != "layer" else [3], dtype))
    with builder:
        if norm == "layer":
            v0 = aten.layer_norm.default(x0, [3], w)
        elif norm == "group":
            v0 = aten.group_norm.default(x0, 2, w)
        else:
            v0 = aten.batch_norm.default(x0, w, None, None, None, True, 0.1, 1e-5, True)
        v1 = aten.reciprocal.default(v0)
    program = builder.build([v0, v1])
    # constant rows, groups and channels, so every normalized value is 0; zeros, since for other constants torch's
    # fused multiply-add leaves x * rstd's rounding error (|x| * 316 * 2**-24 at eps 1e-5)
    x = np.zeros((2, 2, 3), dtype.numpy)
    check_program(program, [x, -np.ones(2 if norm != "layer" else 3, dtype.numpy)],
                  backends=("onnx", "c[AVX2]", "torch"))
