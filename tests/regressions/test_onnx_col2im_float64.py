"""ONNX col2im of float64: onnxruntime's Col2Im has no float64 kernel, and the lowering computed in float32, so a
float64 result kept float32's digits (-3.1284656524658203 where ATen gives -3.128465235233307). It now adds each
kernel tap's block, spread to its stride and shifted into place, in float64 (as float64 convolutions and average
pools already were). Found by the differential fuzzer (seed 10100)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten

# (batch or None, channels, output size, kernel, dilation, padding, stride): the fuzzer's case, then no padding,
# strides and padding, uneven dilation, a non-square kernel, unbatched input
CASES = [(1, 2, [6, 6], [2, 2], [2, 2], [1, 1], [2, 2]),
         (2, 3, [4, 5], [2, 2], [1, 1], [0, 0], [1, 1]),
         (1, 2, [5, 5], [3, 3], [1, 1], [1, 1], [2, 2]),
         (3, 2, [5, 7], [2, 2], [2, 1], [0, 1], [2, 2]),
         (None, 2, [4, 6], [2, 3], [1, 1], [0, 0], [1, 2])]


def _blocks(size, kernel, dilation, padding, stride):
    return int(np.prod([(n + 2 * p - d * (k - 1) - 1) // s + 1
                        for n, k, d, p, s in zip(size, kernel, dilation, padding, stride)]))


@pytest.mark.parametrize("batch, channels, size, kernel, dilation, padding, stride", CASES)
def test_onnx_col2im_keeps_float64(batch, channels, size, kernel, dilation, padding, stride):
    shape = [channels * int(np.prod(kernel)), _blocks(size, kernel, dilation, padding, stride)]
    shape = shape if batch is None else [batch, *shape]
    builder = GraphBuilder()
    x = builder.add_input("x", TensorType.of(list(shape), kiln.float64))
    with builder:
        folded = aten.col2im.default(x, size, kernel, dilation, padding, stride)
    program = builder.build([folded])
    values = np.random.default_rng(len(shape)).standard_normal(shape) * (1 + 1e-9)
    check_program(program, [values], backends=["onnx"])


def test_overlapping_taps_keep_float64_digits():
    """Two taps meet in the middle output: 4 + 2e-7 and -4 leave 2e-7, which float32 rounds away (4 + 2e-7 is 4)."""
    builder = GraphBuilder()
    x = builder.add_input("x", TensorType.of([1, 2, 2], kiln.float64))
    with builder:
        folded = aten.col2im.default(x, [3, 1], [2, 1], [1, 1], [0, 0], [1, 1])
    program = builder.build([folded])
    check_program(program, [np.array([[[0.5, 4 + 2e-7], [-4.0, 0.25]]])], backends=["onnx"])
