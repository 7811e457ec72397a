"""ONNX lowerings of the quantized_decomposed ops: the QDQ format (QuantizeLinear / DequantizeLinear, per tensor
or per axis) that onnxruntime fuses with the float op between them into its int8 kernels.

QuantizeLinear divides by the scale where torch multiplies by its reciprocal, so a value within an ulp of a
rounding tie can land one step apart; everything else (saturation, round-half-to-even, dequantization) is torch's
arithmetic. Ops with float64 or int16 qparams, and the per-token and per-group ops, are decomposed instead, except
a linear layer's 4-bit group-wise weight at opset 21 or later: DequantizeLinear of an INT4 initializer with a block
size, the form onnxruntime fuses with its MatMul into MatMulNBits.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from kiln.ir import dtypes
from kiln.ir.dialect import bound_arguments
from kiln.ir.ops.quant import effective_group_size

from kiln.codegen.onnx.context import LoweringContext
from kiln.codegen.onnx.graph import Value
from kiln.codegen.onnx.lowerings import lowers

Q = "quantized_decomposed"


def _saturated(ctx: LoweringContext, quantized: str, dtype: dtypes.DType, quant_min: int, quant_max: int) -> str:
    """QuantizeLinear saturates to the storage type's range; a narrower one (reduce_range's 0..127) adds a Clip,
    which onnxruntime's QDQ fusion does not look through."""
    info = np.iinfo(dtype.numpy)
    if (quant_min, quant_max) == (int(info.min), int(info.max)):
        return quantized
    return ctx.node("Clip", [quantized, ctx.const(np.asarray(quant_min, dtype.numpy)),
                             ctx.const(np.asarray(quant_max, dtype.numpy))])


def _scale_and_zero(ctx: LoweringContext, scale: Any, zero_point: Any, dtype: dtypes.DType) -> tuple[str, str]:
    if isinstance(scale, Value):  # a one-element tensor (dynamic qparams): scalars, as QuantizeLinear wants
        scale_name = ctx.node("Reshape", [ctx.as_dtype(scale, dtypes.float32), ctx.ints([])])
        zero_name = ctx.node("Reshape", [ctx.graph.cast(zero_point.name, zero_point.dtype, dtype), ctx.ints([])])
        return scale_name, zero_name
    return ctx.const(np.float32(scale)), ctx.const(np.asarray(zero_point, dtype.numpy))


def _qdq_ready(ctx: LoweringContext, dtype: dtypes.DType, scales: Any = None, zero_points: Any = None,
               dequantize: bool = False) -> bool:
    """Whether QuantizeLinear/DequantizeLinear express the op exactly as torch computes it: 8-bit storage,
    float32 scales, zero points known and inside the storage range (torch adds them as floats, so a uint8
    program may use a negative one); otherwise the lowering writes torch's arithmetic out."""
    if dtype not in (dtypes.uint8, dtypes.int8) and not (dequantize and dtype is dtypes.int32):
        return False  # (int32: a bias on the accumulator's grid, which only DequantizeLinear takes)
    if isinstance(scales, Value) and scales.dtype is not dtypes.float32:
        return False
    if isinstance(zero_points, Value):
        zero_points = ctx.graph.model.constant(zero_points.name)
        if zero_points is None:
            return False
    info = np.iinfo(dtype.numpy)
    if dtype is dtypes.int32:  # DequantizeLinear takes int32 only with a zero point of 0
        return zero_points is None or not np.any(np.asarray(zero_points))
    return zero_points is None or bool(np.all((np.asarray(zero_points) >= info.min) &
                                              (np.asarray(zero_points) <= info.max)))


def _explicit_quantize(ctx: LoweringContext, x: Value, inverse: str, zero_point: str, compute: dtypes.DType,
                       quant_min: int, quant_max: int, dtype: dtypes.DType) -> str:
    """torch's clamp(round(x * inverse) + zero_point, quant_min, quant_max).to(dtype), in `compute`."""
    rounded = ctx.node("Round", [ctx.node("Mul", [ctx.as_dtype(x, compute), inverse])])
    clipped = ctx.node("Clip", [ctx.node("Add", [rounded, zero_point]), ctx.const(quant_min, compute),
                                ctx.const(quant_max, compute)])
    return ctx.graph.cast(clipped, compute, dtype)


@lowers(f"{Q}.choose_qparams.tensor")
def _choose_qparams(ctx: LoweringContext, x: Value, quant_min: int, quant_max: int, eps: float,
                    dtype: dtypes.DType) -> list[str]:
    """The qparams as torch computes them. For uint8 over [0, 255] also a DynamicQuantizeLinear, whose outputs the
    quantize and dequantize that use these qparams take instead (the pattern onnxruntime fuses into its int8
    kernels); it matches torch except that torch floors the scale at eps, so for an activation whose whole range is
    below 255 * eps (0.06 with the X86 config's eps) onnxruntime quantizes more finely."""
    values = ctx.as_dtype(x, dtypes.float32)
    zero = ctx.const(np.float32(0))
    min_neg = ctx.node("Min", [ctx.node("ReduceMin", [values], keepdims=0), zero])
    max_pos = ctx.node("Max", [ctx.node("ReduceMax", [values], keepdims=0), zero])
    scale = ctx.node("Div", [ctx.node("Sub", [max_pos, min_neg]), ctx.const(np.float32(quant_max - quant_min))])
    scale = ctx.node("Max", [scale, ctx.const(np.float32(eps))])
    shift = ctx.node("Round", [ctx.node("Div", [min_neg, scale])])
    zero_point = ctx.node("Clip", [ctx.node("Sub", [ctx.const(np.float32(quant_min)), shift]),
                                   ctx.const(np.float32(quant_min)), ctx.const(np.float32(quant_max))])
    scale_out = ctx.graph.cast(ctx.node("Reshape", [scale, ctx.ints([1])]), dtypes.float32, dtypes.float64)
    zero_out = ctx.graph.cast(ctx.node("Reshape", [zero_point, ctx.ints([1])]), dtypes.float32, dtypes.int64)
    if (quant_min, quant_max, dtypes.dtype(dtype)) == (0, 255, dtypes.uint8):
        quantized, dynamic_scale, dynamic_zero = ctx.node("DynamicQuantizeLinear", [values], outputs=3)
        ctx.graph.dynamic_quantized[ctx.op.results[0]] = (ctx.op.operands[0], quantized, dynamic_scale, dynamic_zero)
    return [scale_out, zero_out]


@lowers(f"{Q}.quantize_per_tensor.default", f"{Q}.quantize_per_tensor.tensor")
def _quantize_per_tensor(ctx: LoweringContext, x: Value, scale: Any, zero_point: Any, quant_min: int,
                         quant_max: int, dtype: dtypes.DType) -> str:
    dtype = dtypes.dtype(dtype)
    dynamic = isinstance(scale, Value)  # choose_qparams's zero point is clamped into the range
    found = ctx.graph.dynamic_quantized.get(ctx.op.operands[1]) if dynamic else None
    if found is not None and found[0] is ctx.op.operands[0] and (quant_min, quant_max, dtype) == (0, 255, dtypes.uint8):
        return found[1]  # DynamicQuantizeLinear already quantized x
    if not dynamic and not _qdq_ready(ctx, dtype, zero_points=zero_point):
        inverse = ctx.const(np.float32(1.0 / scale))
        return _explicit_quantize(ctx, x, inverse, ctx.const(np.float32(zero_point)), dtypes.float32, quant_min,
                                  quant_max, dtype)
    scale_name, zero_name = _scale_and_zero(ctx, scale, zero_point, dtype)
    quantized = ctx.node("QuantizeLinear", [ctx.as_dtype(x, dtypes.float32), scale_name, zero_name])
    return _saturated(ctx, quantized, dtype, quant_min, quant_max)


@lowers(f"{Q}.dequantize_per_tensor.default", f"{Q}.dequantize_per_tensor.tensor")
def _dequantize_per_tensor(ctx: LoweringContext, x: Value, scale: Any, zero_point: Any, quant_min: int,
                           quant_max: int, dtype: dtypes.DType, out_dtype: Any = None) -> str:
    dtype = dtypes.dtype(dtype)
    found = ctx.graph.dynamic_quantized.get(ctx.op.operands[1]) if isinstance(scale, Value) else None
    if found is not None:  # DequantizeLinear straight on DynamicQuantizeLinear's outputs: what onnxruntime fuses
        result = ctx.node("DequantizeLinear", [x.name, found[2], found[3]])
    elif not isinstance(scale, Value) and not _qdq_ready(ctx, dtype, zero_points=zero_point, dequantize=True):
        shifted = ctx.node("Sub", [ctx.as_dtype(x, dtypes.float32), ctx.const(np.float32(zero_point))])
        result = ctx.node("Mul", [shifted, ctx.const(np.float32(scale))])
    else:
        scale_name, zero_name = _scale_and_zero(ctx, scale, zero_point, dtype)
        result = ctx.node("DequantizeLinear", [x.name, scale_name, zero_name])
    return ctx.graph.cast(result, dtypes.float32, ctx.out_dtype)


def _axis_qparams(ctx: LoweringContext, scales: Value, zero_points: Value | None, dtype: dtypes.DType,
                  size: Any) -> tuple[str, str]:
    scale_name = ctx.as_dtype(scales, dtypes.float32)
    if zero_points is None:
        return scale_name, ctx.const(np.zeros(int(size), dtype.numpy))
    return scale_name, ctx.graph.cast(zero_points.name, zero_points.dtype, dtype)


def _along(ctx: LoweringContext, vector: Value, axis: int, rank: int, dtype: dtypes.DType) -> str:
    """A per-channel vector as `dtype`, shaped to broadcast along `axis`."""
    shape = [1] * rank
    shape[axis] = -1
    return ctx.node("Reshape", [ctx.as_dtype(vector, dtype), ctx.ints(shape)])


@lowers(f"{Q}.quantize_per_channel.default")
def _quantize_per_channel(ctx: LoweringContext, x: Value, scales: Value, zero_points: Value, axis: int,
                          quant_min: int, quant_max: int, dtype: dtypes.DType) -> str:
    dtype = dtypes.dtype(dtype)
    if not _qdq_ready(ctx, dtype, scales, zero_points):  # e.g. float64 scales: torch computes in float64
        rank = len(x.shape)
        compute = dtypes.promote_types(dtypes.float32, scales.dtype)
        inverse = ctx.node("Reciprocal", [_along(ctx, scales, axis, rank, compute)])
        return _explicit_quantize(ctx, x, inverse, _along(ctx, zero_points, axis, rank, compute), compute,
                                  quant_min, quant_max, dtype)
    scale_name, zero_name = _axis_qparams(ctx, scales, zero_points, dtype, scales.shape[0])
    quantized = ctx.node("QuantizeLinear", [ctx.as_dtype(x, dtypes.float32), scale_name, zero_name], axis=axis)
    return _saturated(ctx, quantized, dtype, quant_min, quant_max)


@lowers(f"{Q}.dequantize_per_channel.default")
def _dequantize_per_channel(ctx: LoweringContext, x: Value, scales: Value, zero_points: Value | None, axis: int,
                            quant_min: int, quant_max: int, dtype: dtypes.DType, out_dtype: Any = None) -> str:
    if not _qdq_ready(ctx, dtypes.dtype(dtype), scales, zero_points, dequantize=True):  # else torch's arithmetic
        rank = len(x.shape)
        shifted = ctx.as_dtype(x, dtypes.int64)
        if zero_points is not None:
            shifted = ctx.node("Sub", [shifted, _along(ctx, zero_points, axis, rank, dtypes.int64)])
        compute = dtypes.promote_types(dtypes.float32, scales.dtype)
        scaled = ctx.node("Mul", [ctx.graph.cast(shifted, dtypes.int64, compute),
                                  _along(ctx, scales, axis, rank, compute)])
        return ctx.graph.cast(scaled, compute, ctx.out_dtype)
    scale_name, zero_name = _axis_qparams(ctx, scales, zero_points, dtypes.dtype(dtype), scales.shape[0])
    result = ctx.node("DequantizeLinear", [x.name, scale_name, zero_name], axis=axis)
    return ctx.graph.cast(result, dtypes.float32, ctx.out_dtype)


def dynamic_linear(ctx: LoweringContext, bias: Value | None) -> str | None:
    """linear(dequantize(dynamically quantized x), dequantize_per_channel(int8 weight)) as onnxruntime's integer
    form: MatMulInteger on DynamicQuantizeLinear's output and the transposed int8 weight, then one float multiply by
    input scale × weight scale (and the bias). onnxruntime fuses it into DynamicQuantizeMatMul; the QDQ form of the
    same program it runs in float. None when the linear is not that pattern."""
    x_dq, w_dq = (operand.owner for operand in ctx.op.operands[:2])
    if getattr(x_dq, "name", "") != f"{Q}.dequantize_per_tensor.tensor" or \
            getattr(w_dq, "name", "") != f"{Q}.dequantize_per_channel.default":
        return None
    found = ctx.graph.dynamic_quantized.get(x_dq.operands[1])
    weight = ctx.values.get(w_dq.operands[0])
    scales = ctx.values.get(w_dq.operands[1])
    zero_points = ctx.values.get(w_dq.operands[2]) if len(w_dq.operands) > 2 else None
    if found is None or weight is None or scales is None or scales.dtype is not dtypes.float32:
        return None
    axis, dtype = bound_arguments(w_dq)[3], dtypes.dtype(bound_arguments(w_dq)[6])
    stored = ctx.graph.model.constant(weight.name)
    zeros = ctx.graph.model.constant(zero_points.name) if zero_points is not None else np.zeros(1)
    if axis != 0 or dtype is not dtypes.int8 or stored is None or stored.ndim != 2 or zeros is None or np.any(zeros):
        return None
    _, quantized, input_scale, input_zero = found
    product = ctx.node("MatMulInteger", [quantized, ctx.const(np.ascontiguousarray(stored.T)), input_zero,
                                         ctx.const(np.int8(0))])
    result = ctx.node("Mul", [ctx.graph.cast(product, dtypes.int32, dtypes.float32),
                              ctx.node("Mul", [input_scale, ctx.as_dtype(scales, dtypes.float32)])])
    if bias is not None:
        result = ctx.node("Add", [result, ctx.as_dtype(bias, dtypes.float32)])
    return ctx.graph.cast(result, dtypes.float32, ctx.out_dtype)


# ONNX opset 21 gave QuantizeLinear / DequantizeLinear 4-bit types and blocked (group-wise) quantization.
BLOCKED_QDQ_OPSET = 21


def _four_bit_groups(ctx: LoweringContext, weight: Value, scales: Value, zero_points: Value | None,
                     quant_min: int, quant_max: int, dtype: Any, group_size: int) -> tuple[np.ndarray, ...] | None:
    """A group-wise dequantize's constant operands as DequantizeLinear's blocked form takes them, from opset 21:
    the weight [N, K] as 4-bit values (ml_dtypes int4 for int8 storage, uint4 for uint8), the float32 scales and
    the zero points [N, K / group] (zero points None when all are 0). None when the weight is not a 2-d constant
    whose range and values fit 4 bits, or a scale or zero point is computed or of another type."""
    if ctx.opset < BLOCKED_QDQ_OPSET or dtypes.dtype(dtype) not in (dtypes.int8, dtypes.uint8):
        return None
    signed = dtypes.dtype(dtype) is dtypes.int8
    low, high = dtypes.INT4_RANGE if signed else dtypes.UINT4_RANGE
    constant = ctx.graph.model.constant
    stored, scale_array = constant(weight.name), constant(scales.name)
    zeros = np.zeros(1, np.int64) if zero_points is None else constant(zero_points.name)
    if stored is None or scale_array is None or zeros is None or stored.ndim != 2 or \
            scale_array.dtype != np.float32 or not low <= quant_min <= quant_max <= high:
        return None
    rows, columns = stored.shape
    groups = columns // effective_group_size(list(stored.shape), list(scales.shape), group_size)  # the op's rule
    if scale_array.size != rows * groups or zeros.size not in (1, scale_array.size) or \
            np.any((stored < low) | (stored > high)) or np.any((zeros < low) | (zeros > high)):
        return None
    four_bits = ml_dtypes.int4 if signed else ml_dtypes.uint4
    zero_grid = np.broadcast_to(zeros.reshape(-1, 1), (rows * groups, 1)).reshape(rows, groups).astype(four_bits) \
        if np.any(zeros) else None
    return stored.astype(four_bits), scale_array.reshape(rows, groups), zero_grid


@lowers(f"{Q}.dequantize_per_channel_group.default")
def _dequantize_per_channel_group(ctx: LoweringContext, x: Value, scales: Value, zero_points: Value | None,
                                  quant_min: int, quant_max: int, dtype: Any, group_size: int,
                                  output_dtype: Any) -> str:
    """Blocked DequantizeLinear of an INT4 (UINT4) initializer from opset 21; otherwise torch's arithmetic,
    (x - zero_points) * scales over groups of `group_size` along the last dim. A lowering of its own keeps the int4
    weight out of constant folding, which would store it as float32."""
    found = _four_bit_groups(ctx, x, scales, zero_points, quant_min, quant_max, dtype, group_size)
    if found is not None:
        weight, scale_grid, zero_grid = found
        inputs = [ctx.const(weight), ctx.const(scale_grid)] + ([ctx.const(zero_grid)] if zero_grid is not None else [])
        block = weight.shape[1] // scale_grid.shape[1]
        return ctx.graph.cast(ctx.node("DequantizeLinear", inputs, axis=1, block_size=block), dtypes.float32,
                              ctx.out_dtype)
    group_size = effective_group_size(list(x.shape), list(scales.shape), group_size)
    shifted = ctx.node("Reshape", [ctx.as_dtype(x, dtypes.int64), ctx.ints([-1, group_size])])
    if zero_points is not None:
        shifted = ctx.node("Sub", [shifted, ctx.node("Reshape", [ctx.as_dtype(zero_points, dtypes.int64),
                                                                 ctx.ints([-1, 1])])])
    compute = dtypes.promote_types(dtypes.float32, scales.dtype)
    scaled = ctx.node("Mul", [ctx.graph.cast(shifted, dtypes.int64, compute),
                              ctx.node("Reshape", [ctx.as_dtype(scales, compute), ctx.ints([-1, 1])])])
    return ctx.graph.cast(ctx.node("Reshape", [scaled, ctx.dims(x.shape)]), compute, ctx.out_dtype)


def int4_weight_linear(ctx: LoweringContext, x: Value, bias: Value | None) -> str | None:
    """linear(x, dequantize_per_channel_group(4-bit constant weight)) from opset 21: the weight transposed to
    [K, N], blocked DequantizeLinear along axis 0, then MatMul. That is onnxruntime's pattern for MatMulNBits, its
    4-bit GEMM (whose default accuracy level quantizes the activations to 8 bits; session option
    `session.qdq_matmulnbits_accuracy_level` "0" keeps them float32). DequantizeLinear computes (w - zero) * scale
    in float32, as torch does. None when the linear is not that pattern."""
    w_dq = ctx.op.operands[1].owner
    if getattr(w_dq, "name", "") != f"{Q}.dequantize_per_channel_group.default" or \
            ctx.out_dtype is not dtypes.float32:
        return None
    weight, scales, zero_points, quant_min, quant_max, dtype, group_size, out_dtype = \
        bound_arguments(w_dq, ctx.values.get)
    if weight is None or scales is None or (w_dq.operands[2:3] and zero_points is None) or \
            dtypes.dtype(out_dtype) is not dtypes.float32:
        return None
    found = _four_bit_groups(ctx, weight, scales, zero_points, quant_min, quant_max, dtype, group_size)
    if found is None:
        return None
    weight_grid, scale_grid, zero_grid = (None if grid is None else np.ascontiguousarray(grid.T) for grid in found)
    inputs = [ctx.const(weight_grid), ctx.const(scale_grid)] + ([ctx.const(zero_grid)] if zero_grid is not None else [])
    matrix = ctx.node("DequantizeLinear", inputs, axis=0, block_size=weight_grid.shape[0] // scale_grid.shape[0])
    result = ctx.node("MatMul", [ctx.as_dtype(x, dtypes.float32), matrix])
    return ctx.node("Add", [result, ctx.as_dtype(bias, dtypes.float32)]) if bias is not None else result
