"""A pool whose kernel is far larger than its input: Hugging Face EfficientNet pools its last 7x7 features with
AvgPool2d(1280, ceil_mode=True). The reference interpreter padded the input out to the kernel's size (1280 x 1280 per
channel, 16 GB for EfficientNet-B0's 1280 channels in float64), and one forward took 6 s. Taps that no window can
place inside the input are now dropped first; the results are ATen's."""

import tracemalloc

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.torch_oracle import requires_torch, torch

aten = ops.aten
CASES = [  # (op, kernel, stride, padding, ceil_mode, the rest of the op's arguments)
    ("avg_pool2d", [1280, 1280], [1280, 1280], [0, 0], True, [True]),
    ("avg_pool2d", [1280, 1280], [1280, 1280], [0, 0], True, [False]),
    ("avg_pool2d", [640, 3], [640, 2], [1, 1], True, [False]),
    ("max_pool2d", [1280, 1280], [1280, 1280], [0, 0], True, []),
    ("max_pool2d_with_indices", [900, 900], [900, 900], [1, 1], True, []),
]


@requires_torch
@pytest.mark.parametrize("name,kernel,stride,padding,ceil_mode,rest", CASES)
def test_pool_with_a_kernel_larger_than_its_input(name, kernel, stride, padding, ceil_mode, rest):
    x = np.random.default_rng(0).standard_normal((1, 8, 7, 7)).astype(np.float32)
    builder = GraphBuilder()
    value = builder.add_input("x", TensorType.of(list(x.shape), kiln.float32))
    op = getattr(aten, name).default
    with builder:
        if name.startswith("max"):
            results = op(value, kernel, stride, padding, [1, 1], ceil_mode)
        else:
            results = op(value, kernel, stride, padding, ceil_mode, *rest)
    results = list(results) if isinstance(results, (tuple, list)) else [results]
    program = builder.build(results)
    tracemalloc.start()
    try:
        got = program(x)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"the interpreter allocated {peak >> 20} MB for a 1.5 kB input"
    torch_op = getattr(torch.ops.aten, name).default
    args = (kernel, stride, padding, [1, 1], ceil_mode) if name.startswith("max") else (
        kernel, stride, padding, ceil_mode, *rest)
    expected = torch_op(torch.from_numpy(x), *args)
    expected = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    got = list(got) if isinstance(got, (tuple, list)) else [got]
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(torch.from_numpy(np.asarray(g)), e)
