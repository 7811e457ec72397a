"""A dilated (or ceil-mode) max pool over padding whose window holds padding only: ATen's window scan leaves its
-inf start there, onnxruntime's MaxPool gave the lowest finite float (-3.4e38), and a matmul of it then gave 0
where ATen's -inf x 0 is NaN. The ONNX lowering now pools ones to find the windows that see an input and sets
the others to -inf. Found by the differential fuzzer (seed 10100, 23 programs)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program
from tests.torch_oracle import requires_torch, torch

aten = ops.aten
CASES = [  # (input shape, kernel, stride, padding, dilation, ceil_mode)
    ((5, 5, 1, 1, 1), [3, 2, 3], [2, 1, 2], [1, 1, 1], [1, 2, 1], True),
    ((2, 3, 1, 2), [2, 2], [1, 1], [1, 1], [2, 2], False),
    ((1, 2, 3, 3), [3, 3], [2, 2], [1, 1], [1, 1], True),
]


@requires_torch
@pytest.mark.parametrize("shape,kernel,stride,padding,dilation,ceil_mode", CASES)
def test_windows_of_padding_only_are_minus_inf(shape, kernel, stride, padding, dilation, ceil_mode):
    builder = GraphBuilder()
    x = builder.add_input('x', TensorType.of(list(shape), kiln.float32))
    pool = aten.max_pool3d.default if len(shape) == 5 else aten.max_pool2d.default
    with_indices = aten.max_pool3d_with_indices.default if len(shape) == 5 else aten.max_pool2d_with_indices.default
    with builder:
        values = pool(x, kernel, stride, padding, dilation, ceil_mode)
        indexed, _ = with_indices(x, kernel, stride, padding, dilation, ceil_mode)
    program = builder.build([values, indexed])
    inputs = [np.random.default_rng(0).standard_normal(shape).astype(np.float32)]
    torch_pool = torch.nn.functional.max_pool3d if len(shape) == 5 else torch.nn.functional.max_pool2d
    expected = torch_pool(torch.from_numpy(inputs[0]), kernel, stride, padding, dilation, ceil_mode).numpy()
    for got in program(*inputs):
        np.testing.assert_array_equal(got, expected)
    check_program(program, inputs, backends=("onnx",))
