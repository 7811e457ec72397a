"""Integer lowering: the reference Q/DQ patterns of a converted program become kiln's fused integer-kernel ops.

- `dequantize(x) → linear(·, dequantize_per_channel(W), bias) → [relu | gelu] → quantize` becomes one
  `quant.qlinear_pointwise` (uint8/int8 out), and a conv2d likewise one `quant.qconv2d_pointwise` (the residual add
  of conv → add → relu fused too); a layer whose result stays float (the last layer, or each layer of the dynamic
  scheme, whose `choose_qparams → quantize → dequantize` feeds it) becomes one with a float32 output. Activations
  quantized per token (`choose_qparams_per_token_asymmetric → quantize_per_token → dequantize_per_token`, the
  dynamic activations of torchao's and ExecuTorch's 8da recipes) make a linear layer's `.token` overload.
- A float linear of a dequantized int8 / int4-valued weight (the weight-only schemes) becomes
  `quant.linear_weight_only`.
- A max pool, a flatten or a view between a dequantize and a quantize with the same qparams runs on the integers,
  and an adaptive average pool between them becomes `quant.qadaptive_avg_pool2d` (the integers summed, then
  requantized).

The ops' reference kernels are these patterns, so the program computes exactly what it did; backends with integer
kernels (C) run them as uint8 × int8 → int32 GEMMs with the requantization fused. Patterns that do not fit (non-zero
weight zero points under quantized activations, a weight that is not a constant) stay as they are, and backends
compute them in float (`fold-dequantized-weights` then dequantizes their weights once, at compile time).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.ir import dtypes
from kiln.ir.registry import ops
from kiln.passes.base import register_pass
from kiln.passes.rewrite import Match, RewritePass, constant, current_op, op_names, pattern, producer, value_of

aten = ops.aten
quantized = ops.quantized_decomposed
QUANTIZED_ACTIVATIONS = (dtypes.uint8, dtypes.int8)
# The int32 accumulators hold sum_k x_k * w_k for |x| <= 255, |w| <= 128 when K is at most this: longer rows stay
# in float.
MAX_INTEGER_K = (2 ** 31 - 1) // (255 * 128)
# Activations the integer ops apply to their float result before requantizing it (their post_op).
ACTIVATIONS = (aten.relu.default, aten.gelu.default)
VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def _is_float32(value: Any) -> bool:
    return value is None or value.type.dtype is dtypes.float32


def _quantized_input(value: Any) -> tuple | None:
    """(x, scale, zero_point, overload) when `value` is a per-tensor (overload `default` or `tensor`) or per-token
    (`token`) dequantize of uint8/int8 values to float32."""
    dq = producer(value, quantized.dequantize_per_tensor.default, quantized.dequantize_per_tensor.tensor,
                  quantized.dequantize_per_token.default)
    if dq is None or dq.args[0].type.dtype not in QUANTIZED_ACTIVATIONS:
        return None
    if dq.name == "quantized_decomposed.dequantize_per_token.default":
        return (dq.args[0], dq.args[1], dq.args[2], "token") if dtypes.dtype(dq.args[6]) is dtypes.float32 else None
    if dq.kwargs.get("out_dtype") not in (None, dtypes.float32):
        return None
    return dq.args[0], dq.args[1], dq.args[2], dq.name.rsplit(".", 1)[1]


def _quantized_weight(value: Any) -> tuple | None:
    """(W, scales) when `value` is a per-output-channel dequantize of a constant int8 weight with zero zero points
    (symmetric: the kernels need no weight offset)."""
    dq = producer(value, quantized.dequantize_per_channel.default)
    if dq is None:
        return None
    weight, scales, zero_points, axis = dq.args[:4]
    if (weight.type.dtype is not dtypes.int8 or axis != 0
            or scales.type.dtype is not dtypes.float32 or dq.kwargs.get("out_dtype") not in (None, dtypes.float32)
            or value_of(weight) is None):
        return None
    if zero_points is not None:
        offsets = value_of(zero_points)
        if offsets is None or np.any(offsets != 0):
            return None
    return weight, scales


def _weight_only(value: Any) -> tuple | None:
    """(W, scales, zero points, group size, quant_min, quant_max) when `value` is a per-channel or per-group
    dequantize of a constant int8 [N, K] weight to float32 (zero points int32, int64 or none)."""
    dq = producer(value, quantized.dequantize_per_channel.default, quantized.dequantize_per_channel_group.default)
    if dq is None:
        return None
    if dq.name == "quantized_decomposed.dequantize_per_channel.default":
        (weight, scales, zero_points, axis, quant_min, quant_max, dtype), output = dq.args[:7], \
            dq.kwargs.get("out_dtype")
        group_size = weight.type.shape[1] if len(weight.type.shape) == 2 else None
        if axis != 0 or len(scales.type.shape) != 1:
            return None
    else:
        # (one group per row reads back as per channel: (W - zero point) x scale, exactly the same values)
        weight, scales, zero_points, quant_min, quant_max, dtype, group_size, output = dq.args[:8]
    if (dtypes.dtype(dtype) is not dtypes.int8 or output not in (None, dtypes.float32) or len(weight.type.shape) != 2
            or not isinstance(group_size, int) or scales.type.dtype is not dtypes.float32 or value_of(weight) is None
            or value_of(scales) is None
            or (zero_points is not None and (zero_points.type.dtype not in (dtypes.int32, dtypes.int64)
                                             or value_of(zero_points) is None))):
        return None
    if zero_points is not None and not np.any(value_of(zero_points)):
        zero_points = None  # symmetric: subtracting zeros changes no value, and the kernel skips the correction
    return weight, scales, zero_points, group_size, quant_min, quant_max


def _layer_operands(layer: Match) -> tuple | None:
    """The integer op's operands (up to its output qparams) for a linear or conv2d of dequantized operands, and
    the integer op to emit; None when the layer does not fit the kernels."""
    x, weight, bias = (layer.args + [None])[:3]
    activation, weights = _quantized_input(x), _quantized_weight(weight)
    rank = 2 if layer.name == "aten.linear.default" else 4
    if activation is None or weights is None or not _is_float32(bias) or len(weight.type.shape) != rank:
        return None
    if int(np.prod(weight.type.shape[1:])) > MAX_INTEGER_K:
        return None
    q, scale, zero_point, overload = activation
    if layer.name == "aten.linear.default":
        return (q, scale, zero_point, *weights, bias), getattr(ops.quant.qlinear_pointwise, overload)
    stride, padding, dilation, groups = (layer.args + [None] * 7)[3:7]
    if len(x.type.shape) != 4 or overload == "token":
        return None
    handle = ops.quant.qconv2d_pointwise
    return (q, scale, zero_point, *weights, bias, stride or [1, 1], padding or [0, 0], dilation or [1, 1],
            groups or 1), handle.default if overload == "default" else handle.tensor


def _post_op(activation: Match) -> str:
    """The integer ops' name for a relu or gelu (quant.QLINEAR_POST_OPS)."""
    if activation.name == "aten.relu.default":
        return "relu"
    approximate = activation.kwargs.get("approximate", activation.args[1] if len(activation.args) > 1 else "none")
    return "gelu_tanh" if approximate == "tanh" else "gelu"


def _before_views(value: Any, shared: bool) -> Any:
    """What `value` reshapes: back through view and reshape ops, each read only by the next (the first, `value`'s
    own producer, may have other readers when `shared`)."""
    while (view := producer(value, *VIEWS)) is not None and (view.has_one_use or shared):
        value, shared = view.args[0], False
    return value


def _fusable_layer(value: Any, replaced: bool = False) -> tuple[Match, Any, str] | None:
    """The linear or conv2d that `value` is computed from: the layer, then (conv2d only) a residual add of a float
    tensor of its shape, then a relu or gelu, each read only by the next, with reshapes before and after the
    activation (a transformer's MLP reshapes [tokens, features] to [batch, seq, features] and back around it) as long
    as `value` has the layer's shape (`value` itself may have other readers when `replaced`: the fused op replaces
    it); returns (layer, the residual or None, post-op)."""
    shape = list(value.type.shape)
    inner = _before_views(value, replaced)
    post_op, other, last = "none", None, inner is value
    activation = producer(inner, *ACTIVATIONS)
    if activation is not None and (activation.has_one_use or (replaced and last)):
        inner, post_op, last = _before_views(activation.args[0], False), _post_op(activation), False
    add = producer(inner, aten.add.Tensor)
    if add is not None and (add.has_one_use or (replaced and last)) and add.kwargs.get("alpha", 1) == 1:
        for mine, theirs in ((0, 1), (1, 0)):
            conv = producer(add.args[mine], aten.conv2d.default)
            residual = add.args[theirs]
            if (conv is not None and getattr(residual, "type", None) == conv.result.type and conv.has_one_use
                    and _layer_operands(conv) is not None and list(conv.result.type.shape) == shape):
                return conv, residual, post_op
        return None
    layer = producer(inner, aten.linear.default, aten.conv2d.default)
    if layer is None or not (layer.has_one_use or (replaced and last)) or _layer_operands(layer) is None \
            or list(layer.result.type.shape) != shape:
        return None
    return layer, other, post_op


def _emit(layer: Match, other: Any, output_qparams: tuple, post_op: str) -> Any:
    operands, handle = _layer_operands(layer)
    if handle.name.startswith("quant.qconv2d_pointwise"):
        operands = (*operands, other)
    return handle(*operands, *output_qparams, post_op)


def _claimed_downstream(value: Any, layer: Any) -> bool:
    """Whether an op after `value` (an add, an activation, a reshape or a quantize, each reading the one before only)
    takes `layer` into its fusion: the last op of the chain that can, emits it."""
    chain_ops = {name for handle in (*ACTIVATIONS, *VIEWS, aten.add.Tensor) for name in op_names(handle)}
    for _ in range(6):
        uses = list(value.uses)
        if len(uses) != 1 or not uses[0].operation.results:
            return False
        user = producer(uses[0].operation.results[0])
        if user is None:
            return False
        if user.name == "quantized_decomposed.quantize_per_tensor.default":
            found = _fusable_layer(user.args[0]) if dtypes.dtype(user.args[5]) in QUANTIZED_ACTIVATIONS else None
            return found is not None and found[0].op is layer
        if user.name not in chain_ops:
            return False
        found = _fusable_layer(user.result, replaced=True)  # as that op's own pattern would see it
        if found is not None and found[0].op is layer:
            return True
        value = user.result
    return False


@register_pass
class LowerQuantized(RewritePass):
    """Match dequantize → linear/conv2d → [add] → [relu | gelu] → [quantize] into kiln's integer-kernel ops."""

    name = "lower-quantized"

    @pattern(quantized.quantize_per_tensor.default)
    def requantize(self, input, scale, zero_point, quant_min, quant_max, dtype):
        found = _fusable_layer(input) if dtypes.dtype(dtype) in QUANTIZED_ACTIVATIONS else None
        if found is None:
            return None
        layer, other, post_op = found
        return _emit(layer, other, (scale, zero_point, quant_min, quant_max, dtype), post_op)

    @pattern(aten.linear.default)
    def weight_only(self, input, weight, bias=None):
        """A float linear layer of a dequantized int8 (or int4-valued) weight: quant.linear_weight_only."""
        activation = _quantized_input(input)
        if input.type.dtype is not dtypes.float32 or not _is_float32(bias) or activation is not None and (
                activation[3] != "token" or _quantized_weight(weight) is not None):
            return None  # quantized activations are the integer layer's (per token: with an int8 per-channel weight)
        found = _weight_only(weight)
        return None if found is None else ops.quant.linear_weight_only.default(input, *found[:3], bias, *found[3:])

    @pattern(quantized.quantize_per_tensor.default)
    def in_integers(self, input, scale, zero_point, quant_min, quant_max, dtype):
        """quantize(op(dequantize(x))) with the same qparams (the X86 recipe shares them) is op(x) for a max pool
        (dequantizing is monotonic) or an op that only moves values (a flatten before a classifier): quantizing a
        dequantized value gives it back."""
        moved = producer(input, aten.max_pool2d.default, aten.flatten.using_ints, *VIEWS)
        dq = producer(moved.args[0], quantized.dequantize_per_tensor.default) \
            if moved and moved.has_one_use else None
        if dq is None or dq.kwargs.get("out_dtype") not in (None, dtypes.float32) or \
                list(dq.args[1:6]) != [scale, zero_point, quant_min, quant_max, dtypes.dtype(dtype)]:
            return None
        return moved.handle(dq.args[0], *moved.args[1:], **moved.kwargs)

    @pattern(quantized.quantize_per_tensor.default)
    def average_pool(self, input, scale, zero_point, quant_min, quant_max, dtype):
        """quantize(adaptive_avg_pool2d(dequantize(x))): quant.qadaptive_avg_pool2d, which sums the integers."""
        pool = producer(input, aten.adaptive_avg_pool2d.default)
        found = _quantized_input(pool.args[0]) if pool is not None and pool.has_one_use else None
        if found is None or found[3] != "default" or dtypes.dtype(dtype) not in QUANTIZED_ACTIVATIONS:
            return None
        x, x_scale, x_zero_point, _ = found
        return ops.quant.qadaptive_avg_pool2d.default(x, x_scale, x_zero_point, list(pool.args[1]), scale, zero_point,
                                                      quant_min, quant_max, dtype)

    @pattern(aten.linear.default, aten.conv2d.default, *ACTIVATIONS, aten.add.Tensor, *VIEWS)
    def float_output(self, *args, **kwargs):
        """A layer (with its residual add and activation) whose result stays float: the integer op with a float32
        output."""
        result = current_op().results[0]
        found = _fusable_layer(result, replaced=True)
        if found is None or _claimed_downstream(result, found[0].op):
            return None  # not a layer's result, or a quantize (or relu) after it fuses more
        layer, other, post_op = found
        return _emit(layer, other, (1.0, 0, 0, 0, dtypes.float32), post_op)


@register_pass
class FoldDequantizedWeights(RewritePass):
    """Fold the dequantize of a constant (a weight no integer kernel took) into a float constant."""

    name = "fold-dequantized-weights"

    @pattern(quantized.dequantize_per_channel.default, quantized.dequantize_per_tensor.default,
             quantized.dequantize_per_channel_group.default)
    def dequantize(self, *args, **kwargs):
        # Backends would otherwise dequantize the weight on every call; run lower-quantized first, or this takes
        # the weights its integer kernels read.
        match = producer(current_op().results[0])
        values = [value_of(a) if hasattr(a, "type") else a for a in match.args]
        if any(v is None and hasattr(a, "type") for v, a in zip(values, match.args)):
            return None
        return constant(np.asarray(match.handle(*values, **match.kwargs)), "dequantized_weight")
