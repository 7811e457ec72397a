"""ATen's sums start from +0, so the sum (or mean) of a lone -0 is +0; onnxruntime's ReduceSum of one -0 is -0,
and 1 / mean(x / 0.001) of x = [-0] came out -inf where ATen gives +inf. The ONNX sums add +0 to their result.
Found by the differential fuzzer (seed 10000, 6 programs)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program
from tests.torch_oracle import requires_torch, torch

aten = ops.aten


@requires_torch
@pytest.mark.parametrize("dtype", [kiln.float16, kiln.float32, kiln.float64])
def test_sums_of_negative_zeros_are_positive_zero(dtype):
    builder = GraphBuilder()
    x = builder.add_input('x', TensorType.of([1], dtype))
    y = builder.add_input('y', TensorType.of([3, 2], dtype))
    with builder:
        outputs = [aten.reciprocal.default(aten.mean.dim(x, [0], True)),
                   aten.reciprocal.default(aten.sum.dim_IntList(x, [0])),
                   aten.reciprocal.default(aten.sum.dim_IntList(y, [1])),
                   aten.reciprocal.default(aten.mean.dim(y, [0]))]
    program = builder.build(outputs)
    inputs = [np.array([-0.0], np.dtype(dtype.numpy)), np.full((3, 2), -0.0, np.dtype(dtype.numpy))]
    tx, ty = (torch.from_numpy(a) for a in inputs)
    expected = [1 / tx.mean(0, keepdim=True), 1 / tx.sum(0), 1 / ty.sum(1), 1 / ty.mean(0)]
    for got, want in zip(program(*inputs), expected):
        np.testing.assert_array_equal(got, want.numpy())
    check_program(program, inputs, backends=("onnx",))
