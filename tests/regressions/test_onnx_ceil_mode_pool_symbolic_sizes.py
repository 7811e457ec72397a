"""Ceil-mode pooling in ONNX with a symbolic height: ATen drops a last window that would start in the right
padding, ONNX keeps it. With static sizes the lowering picks the ONNX rounding that gives ATen's size; with
symbolic ones it kept ceil_mode, so the result had one row too many (3 x 3 where ATen's is 2 x 2 for a 3 x 3 input,
kernel 2, stride 2, padding 1) in onnxruntime's shape inference, and a masked_fill by a mask of ATen's width after
it failed to load ("Incompatible dimensions"). The result is now cut to ATen's size. Found by the differential
fuzzer (seed 9100)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("pool", ["avg", "max", "max_with_indices"])
@pytest.mark.parametrize("height", [3, 4, 7])
def test_ceil_mode_pool_of_a_symbolic_height(pool, height):
    builder = GraphBuilder()
    s0 = builder.shape_env.create_symbol(height, name="s0", min=2, max=16)
    x0 = builder.add_input("x0", TensorType.of([2, 1, s0, 3], kiln.float32))
    mask = builder.add_input("mask", TensorType.of([2], kiln.bool))  # ATen's output width
    with builder:
        if pool == "avg":
            outputs = [aten.avg_pool2d.default(x0, [2, 2], [2, 2], [1, 1], True, False)]
        elif pool == "max":
            outputs = [aten.max_pool2d.default(x0, [2, 2], [2, 2], [1, 1], [1, 1], True)]
        else:
            values, indices = aten.max_pool2d_with_indices.default(x0, [2, 2], [2, 2], [1, 1], [1, 1], True)
            outputs = [values, indices]
        outputs[0] = aten.masked_fill.Scalar(outputs[0], mask, 7.0)
    program = builder.build(outputs)
    x = np.random.default_rng(height).standard_normal((2, 1, height, 3)).astype(np.float32)
    check_program(program, [x, np.array([True, False])], backends=("onnx", "torch"))
