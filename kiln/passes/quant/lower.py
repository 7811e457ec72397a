"""Integer lowering: the reference Q/DQ patterns of a converted program become kiln's fused integer-kernel ops.

`dequantize(x) → linear(·, dequantize_per_channel(W), bias) → [relu] → quantize` becomes one
`quant.qlinear_pointwise` (uint8/int8 out); a linear whose result stays float (the last layer, or the dynamic
scheme's `choose_qparams → quantize → dequantize` input) becomes one with a float32 output. The ops' reference
kernels are these patterns, so the program computes what it did; backends with integer kernels (C) run them as
int8 × int8 → int32 GEMMs with the requantization fused. Patterns that do not fit (non-zero weight zero points,
a weight that is not a constant) stay as they are, and backends compute them in float.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.ir import dtypes
from kiln.ir.registry import ops
from kiln.passes.base import register_pass
from kiln.passes.rewrite import Match, RewritePass, current_op, pattern, producer, value_of

aten = ops.aten
quantized = ops.quantized_decomposed
QUANTIZED_ACTIVATIONS = (dtypes.uint8, dtypes.int8)


def _is_float32(value: Any) -> bool:
    return value is None or value.type.dtype is dtypes.float32


def _quantized_input(value: Any) -> tuple | None:
    """(x, scale, zero_point, overload) when `value` is a per-tensor dequantize of uint8/int8 values to float32."""
    dq = producer(value, quantized.dequantize_per_tensor.default, quantized.dequantize_per_tensor.tensor)
    if dq is None or dq.args[0].type.dtype not in QUANTIZED_ACTIVATIONS or dq.kwargs.get("out_dtype") not in (
            None, dtypes.float32):
        return None
    return dq.args[0], dq.args[1], dq.args[2], dq.name.rsplit(".", 1)[1]


def _quantized_weight(value: Any) -> tuple | None:
    """(W, scales) when `value` is a per-output-channel dequantize of a constant int8 [N, K] weight with zero
    zero points (symmetric: the kernels need no weight offset)."""
    dq = producer(value, quantized.dequantize_per_channel.default)
    if dq is None:
        return None
    weight, scales, zero_points, axis = dq.args[:4]
    if (weight.type.dtype is not dtypes.int8 or len(weight.type.shape) != 2 or axis != 0
            or scales.type.dtype is not dtypes.float32 or dq.kwargs.get("out_dtype") not in (None, dtypes.float32)
            or value_of(weight) is None):
        return None
    if zero_points is not None:
        offsets = value_of(zero_points)
        if offsets is None or np.any(offsets != 0):
            return None
    return weight, scales


def _qlinear_operands(linear: Match) -> tuple | None:
    """The operands of a qlinear_pointwise for a linear of dequantized operands, and its overload."""
    x, weight, bias = (linear.args + [None])[:3]
    activation, weights = _quantized_input(x), _quantized_weight(weight)
    if activation is None or weights is None or not _is_float32(bias):
        return None
    q, scale, zero_point, overload = activation
    return (q, scale, zero_point, *weights, bias), overload


def _requantized(value: Any) -> tuple[Match, str] | None:
    """The linear whose float result `value` is, directly or through a relu, when nothing else reads it, and the
    post-op."""
    post_op = "none"
    relu = producer(value, aten.relu.default)
    if relu is not None and relu.has_one_use:
        value, post_op = relu.args[0], "relu"
    linear = producer(value, aten.linear.default)
    if linear is None or not linear.has_one_use or _qlinear_operands(linear) is None:
        return None
    return linear, post_op


def _qlinear(overload: str, *args: Any) -> Any:
    handle = ops.quant.qlinear_pointwise
    return (handle.default if overload == "default" else handle.tensor)(*args)


@register_pass
class LowerQuantized(RewritePass):
    """Match dequantize → linear → [relu] → [quantize] into quant.qlinear_pointwise (integer kernels)."""

    name = "lower-quantized"

    @pattern(quantized.quantize_per_tensor.default)
    def requantize(self, input, scale, zero_point, quant_min, quant_max, dtype):
        found = _requantized(input) if dtypes.dtype(dtype) in QUANTIZED_ACTIVATIONS else None
        if found is None:
            return None
        linear, post_op = found
        operands, overload = _qlinear_operands(linear)
        return _qlinear(overload, *operands, scale, zero_point, quant_min, quant_max, dtype, post_op)

    @pattern(aten.linear.default)
    def linear(self, input, weight, bias=None):
        """A linear whose result stays float: a qlinear with a float32 output."""
        result = current_op().results[0]
        if _quantize_user(result) is not None:
            return None  # `requantize` fuses the quantize too
        found = _qlinear_operands(producer(result))
        if found is None:
            return None
        operands, overload = found
        return _qlinear(overload, *operands, 1.0, 0, 0, 0, dtypes.float32, "none")


def _quantize_user(value: Any) -> Match | None:
    """The uint8/int8 per-tensor quantize `requantize` would fuse `value`'s producer into, if any."""
    for _ in range(2):  # the quantize, or a relu and then the quantize
        uses = list(value.uses)
        if len(uses) != 1 or not uses[0].operation.results:
            return None
        user = producer(uses[0].operation.results[0])
        if user is not None and user.name == "aten.relu.default":
            value = user.result
            continue
        if (user is None or user.name != "quantized_decomposed.quantize_per_tensor.default"
                or dtypes.dtype(user.args[5]) not in QUANTIZED_ACTIVATIONS or _requantized(user.args[0]) is None):
            return None
        return user
    return None
