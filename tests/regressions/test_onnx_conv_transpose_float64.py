"""ONNX float64 transposed convolution: onnxruntime's ConvTranspose has no float64 kernel, and the lowering computed
in float32 (the same class as float64 col2im, found by the fuzzer in seed 10100). It now computes each group's
columns W^T x with an Einsum in float64 and folds them with the float64 col2im, as ATen's slow path does, in 1, 2
and 3 spatial dims."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten

# (input shape, weight shape, stride, padding, dilation, output padding, groups, bias)
CASES = [((1, 3, 4, 5), (3, 2, 3, 3), [1, 1], [0, 0], [1, 1], [0, 0], 1, True),
         ((2, 4, 3, 3), (4, 3, 2, 3), [2, 1], [1, 0], [1, 2], [1, 0], 2, False),
         ((1, 2, 5, 2), (2, 1, 3, 1), [3, 2], [1, 0], [2, 1], [2, 1], 2, True),
         ((2, 4, 5), (4, 3, 3), [2], [1], [1], [1], 2, True),  # 1-d and 3-d: the same columns and col2im
         ((1, 3, 1, 5), (3, 2, 1, 4), [1, 3], [0, 1], [1, 1], [0, 2], 1, False),
         ((1, 2, 3, 2, 4), (2, 2, 2, 1, 3), [1, 2, 2], [0, 0, 1], [1, 1, 2], [0, 1, 1], 1, True)]


@pytest.mark.parametrize("x_shape, w_shape, stride, padding, dilation, output_padding, groups, bias", CASES)
def test_matches_the_interpreter(x_shape, w_shape, stride, padding, dilation, output_padding, groups, bias):
    builder = GraphBuilder()
    x = builder.add_input("x", TensorType.of(list(x_shape), kiln.float64))
    w = builder.add_input("w", TensorType.of(list(w_shape), kiln.float64))
    b = builder.add_input("b", TensorType.of([w_shape[1] * groups], kiln.float64)) if bias else None
    with builder:
        y = aten.convolution.default(x, w, b, stride, padding, dilation, True, output_padding, groups)
    rng = np.random.default_rng(groups)
    inputs = [rng.standard_normal(x_shape), rng.standard_normal(w_shape)] + \
        ([rng.standard_normal(w_shape[1] * groups)] if bias else [])
    check_program(builder.build([y]), inputs, backends=["onnx"])


def test_overlapping_taps_keep_float64_digits():
    """Two taps meet in the middle output: (4 + 2e-7) - 4 leaves 2e-7, which float32 rounds away."""
    builder = GraphBuilder()
    x = builder.add_input("x", TensorType.of([1, 1, 2, 1], kiln.float64))
    w = builder.add_input("w", TensorType.of([1, 1, 2, 1], kiln.float64))
    with builder:
        y = aten.convolution.default(x, w, None, [1, 1], [0, 0], [1, 1], True, [0, 0], 1)
    check_program(builder.build([y]), [np.ones((1, 1, 2, 1)), np.array([[[[-4.0], [4 + 2e-7]]]])], backends=["onnx"])
