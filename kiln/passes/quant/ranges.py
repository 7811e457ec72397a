"""Proven value ranges of integer tensors: what a backend may assume about quantized activations.

A uint8 tensor quantized with reduce_range holds 0..127, which lets an AVX2 integer kernel use vpmaddubsw without
saturating. Its dtype says 0..255, so the range is proven from the ops that computed it instead: the clamp of a
(decomposed) quantize before its cast, an integer op's output range, and the ops that only move or select values.
Anything else gets its dtype's full range, so the proof never claims more than the program guarantees.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kiln.ir import dtypes
from kiln.passes.rewrite import producer

# Ops whose results hold only values of their first argument: the registry's views (tag `view`: reshapes,
# permutes, slices, selects...), copies and maxima.
_SAME_VALUES = frozenset({"aten.clone.default", "aten.max_pool2d.default", "aten.amax.default"})
# Ops whose first result holds values of their first argument (the others are indices).
_FIRST_RESULT_SAME_VALUES = frozenset({"aten.max_pool2d_with_indices.default", "aten.max.dim"})
# Quantize ops, whose results lie in [quant_min, quant_max] (their arguments 3 and 4).
_QUANTIZE = frozenset({"quantized_decomposed.quantize_per_tensor.default",
                       "quantized_decomposed.quantize_per_tensor.tensor"})
_INTEGER_OUTPUT = ("quant.qlinear_pointwise", "quant.qconv2d_pointwise")
_DEPTH = 16  # producers followed at most (chains of views are short)


def integer_range(value: Any) -> tuple[int, int]:
    """The narrowest [low, high] that every element of the integer tensor `value` is proven to lie in."""
    full = _dtype_bounds(value.type.dtype)
    proven = _proven(value, _DEPTH)
    if proven is None:
        return full
    # (floor and ceil: a cast truncates a clamped float toward zero, into [floor(low), ceil(high)])
    return max(full[0], math.floor(proven[0])), min(full[1], math.ceil(proven[1]))


def _dtype_bounds(dtype: dtypes.DType) -> tuple[int, int]:
    info = np.iinfo(dtype.numpy)
    return int(info.min), int(info.max)


def _proven(value: Any, depth: int) -> tuple[float, float] | None:
    """A range proven for `value` from its producers (None: nothing beyond its dtype)."""
    match = producer(value)
    if match is None or depth == 0:
        return None
    name = match.name
    if (name in _SAME_VALUES or "view" in match.op.opdef.tags
            or (name in _FIRST_RESULT_SAME_VALUES and value is match.op.results[0])):
        return _proven(match.args[0], depth - 1)
    if name == "aten._to_copy.default" and match.result.type.dtype.is_integral:
        # a cast keeps the values' range only when they fit the integer type (else they wrap)
        inner = _proven(match.args[0], depth - 1)
        low, high = _dtype_bounds(match.result.type.dtype)
        return inner if inner is not None and low <= inner[0] and inner[1] <= high else None
    if name == "aten.clamp.default":
        low, high = (match.args + [None, None])[1:3]
        if isinstance(low, (int, float)) and isinstance(high, (int, float)):
            return float(low), float(high)
        return None
    if name == "aten.relu.default":
        inner = _proven(match.args[0], depth - 1)
        return None if inner is None else (max(inner[0], 0.0), max(inner[1], 0.0))
    if name in _QUANTIZE:
        return float(match.args[3]), float(match.args[4])
    if name.rsplit(".", 1)[0] in _INTEGER_OUTPUT and match.result.type.dtype is not dtypes.float32:
        return float(match.args[-4]), float(match.args[-3])  # output_quant_min, output_quant_max
    return None
