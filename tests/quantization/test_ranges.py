"""kiln/passes/quant/ranges.py: the range an integer tensor's values are proven to lie in, from its producers.

A range the analysis proves lets a backend run saturating instructions (AVX2's vpmaddubsw on 7-bit activations), so
each case checks the proof against the values the reference interpreter computes, and that nothing is claimed where
the program does not guarantee it.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.ir import dtypes
from kiln.ir.program import GraphBuilder
from kiln.ir.types import TensorType
from kiln.passes.quant.ranges import integer_range

aten, quantized = kiln.ops.aten, kiln.ops.quantized_decomposed


def _quantize(x, low=0, high=127, dtype=dtypes.uint8):
    return quantized.quantize_per_tensor.default(x, 0.05, (low + high + 1) // 2, low, high, dtype)


# name -> (the value's computation from a float [2, 3, 8, 8] input, the range expected)
CASES = {
    "quantize 0..127": (lambda x: _quantize(x), (0, 127)),
    "quantize int8 -64..63": (lambda x: _quantize(x, -64, 63, dtypes.int8), (-64, 63)),
    "full uint8": (lambda x: _quantize(x, 0, 255), (0, 255)),
    "view and permute": (lambda x: aten.permute.default(aten.view.default(_quantize(x), [2, 3, 64]), [0, 2, 1]),
                         (0, 127)),
    "max pool": (lambda x: aten.max_pool2d_with_indices.default(_quantize(x), [2, 2])[0], (0, 127)),
    "clamp then cast": (lambda x: aten._to_copy.default(aten.clamp.default(x, 0, 100), dtype=dtypes.uint8),
                        (0, 100)),
    "clamp to fractions": (lambda x: aten._to_copy.default(aten.clamp.default(x, 0.5, 9.5), dtype=dtypes.uint8),
                           (0, 10)),
    # a cast of values that do not fit wraps: nothing is proven beyond the dtype
    "cast that wraps": (lambda x: aten._to_copy.default(aten.clamp.default(x, -5, 5), dtype=dtypes.uint8),
                        (0, 255)),
    "unclamped cast": (lambda x: aten._to_copy.default(x, dtype=dtypes.uint8), (0, 255)),
    # arithmetic is not followed: an add can leave the range
    "add": (lambda x: aten.add.Tensor(_quantize(x), _quantize(x)), (0, 255)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_proven_range_holds_and_is_not_overclaimed(case):
    compute, expected = CASES[case]
    builder = GraphBuilder()
    x = builder.add_input("x", TensorType.of([2, 3, 8, 8], dtypes.float32))
    with builder:
        value = compute(x)
    assert integer_range(value) == expected
    values = np.asarray(builder.build([value])(np.random.default_rng(0).uniform(-20, 20, (2, 3, 8, 8))
                                                 .astype(np.float32)))
    assert expected[0] <= values.min() and values.max() <= expected[1]


def test_integer_layers_prove_their_output_range():
    """A lowered layer's output lies in its output_quant_min..max, and its readers see that range."""
    builder = GraphBuilder()
    x = builder.add_input("x", TensorType.of([4, 8], dtypes.uint8))
    weight = builder.add_input("w", TensorType.of([6, 8], dtypes.int8))
    scales = builder.add_input("s", TensorType.of([6], dtypes.float32))
    with builder:
        layer = kiln.ops.quant.qlinear_pointwise.default(x, 0.1, 3, weight, scales, None, 0.2, 5, 2, 120,
                                                         dtypes.uint8, "relu")
        flat = aten.view.default(layer, [24])
    assert integer_range(x) == (0, 255)  # an input: nothing beyond its dtype
    assert integer_range(layer) == (2, 120) and integer_range(flat) == (2, 120)
