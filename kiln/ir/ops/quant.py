"""Quantize/dequantize ops in torch's `quantized_decomposed` namespace: the reference quantized representation.

PT2E quantization (kiln/passes/quant) writes programs with these ops around float ops, and backends match
`dequantize → op → quantize` into integer kernels. Each reference kernel repeats torch's implementation
(torch/ao/quantization/fx/_decomposed.py) expression by expression with `aten` ops, so dtype promotion and
rounding are torch's: `x * (1 / scale)` rounds differently from `x / scale`, and the qparams must agree bit for bit.
"""

from __future__ import annotations

import numpy as np
import sympy

from kiln.ir import dtypes
from kiln.ir.dtypes import DType
from kiln.ir.meta import dtype_of, like, numel, require_arg, require_dtype, shape_of, tensor
from kiln.ir.registry import defop, ops, register_decomposition
from kiln.ir.symbolic import guard_bool, sym_eq

aten = ops.aten
NAMESPACE = "quantized_decomposed"

# The integer ranges quantized values may take, per storage dtype (torch's _DTYPE_TO_QVALUE_BOUNDS).
QVALUE_BOUNDS: dict[DType, tuple[int, int]] = {
    dt: (int(np.iinfo(dt.numpy).min), int(np.iinfo(dt.numpy).max))
    for dt in (dtypes.uint8, dtypes.int8, dtypes.int16, dtypes.int32)
}


def _define(schema: str, meta, kernel) -> None:
    defop(f"{NAMESPACE}::{schema}", meta, kernel, tags=("quantize",))


# ---------------------------------------------------------------------------------------------
# Checks shared by the meta rules

def _op() -> str:
    from kiln.ir.meta import current_op
    return current_op()


def _check_bounds(quant_min: int, quant_max: int, dtype: DType) -> None:
    dtype = dtypes.dtype(dtype)
    require_arg(dtype in QVALUE_BOUNDS, _op(), f"quantized dtype {dtype.name} is not supported",
                fix="use one of " + ", ".join(d.name for d in QVALUE_BOUNDS))
    low, high = QVALUE_BOUNDS[dtype]
    require_arg(quant_min >= low, _op(), f"quant_min {quant_min} is below {dtype.name}'s minimum {low}")
    require_arg(quant_max <= high, _op(), f"quant_max {quant_max} is above {dtype.name}'s maximum {high}")


def _float_input(input) -> None:
    dtype = dtype_of(input)
    require_dtype(dtype in (dtypes.float32, dtypes.float16, dtypes.bfloat16), _op(),
                  f"expects a float32 (or float16/bfloat16) input, got {dtype.name}",
                  fix="convert the input with .float() first")


def _one_element(value, what: str) -> None:
    count = numel(shape_of(value))
    require_arg(sym_eq(count, 1), _op(), f"expects a one-element {what} tensor, got {count} elements")


def _axis_in_range(input, axis: int) -> None:
    rank = len(shape_of(input))
    require_arg(axis < rank, _op(), f"axis {axis} is out of range for a rank-{rank} input")


def _quantized_input(input, dtype: DType) -> None:
    require_dtype(dtype_of(input) is dtypes.dtype(dtype), _op(),
                  f"expects an input of dtype {dtypes.dtype(dtype).name}, got {dtype_of(input).name}")


# ---------------------------------------------------------------------------------------------
# Per-tensor

def _as_float32(input):
    return input if dtype_of(input) is dtypes.float32 else aten._to_copy.default(input, dtype=dtypes.float32)


def _quantize(input, inverse_scale, zero_point, quant_min: int, quant_max: int, dtype: DType):
    """clamp(round(input * inverse_scale) + zero_point, quant_min, quant_max).to(dtype), with tensor or scalar
    qparams, as every torch quantize op writes it."""
    mul = aten.mul.Scalar if isinstance(inverse_scale, (int, float)) else aten.mul.Tensor
    add = aten.add.Scalar if isinstance(zero_point, (int, float)) else aten.add.Tensor
    rounded = add(aten.round.default(mul(input, inverse_scale)), zero_point)
    return aten._to_copy.default(aten.clamp.default(rounded, quant_min, quant_max), dtype=dtypes.dtype(dtype))


def quantize_per_tensor_meta(input, scale, zero_point, quant_min, quant_max, dtype):
    _float_input(input)
    _check_bounds(quant_min, quant_max, dtype)
    return like(input, dtype=dtypes.dtype(dtype))


def quantize_per_tensor(input, scale, zero_point, quant_min, quant_max, dtype):
    return _quantize(_as_float32(input), 1.0 / scale, zero_point, quant_min, quant_max, dtype)


def quantize_per_tensor_tensor_meta(input, scale, zero_point, quant_min, quant_max, dtype):
    _one_element(scale, "scale")
    _one_element(zero_point, "zero_point")
    return quantize_per_tensor_meta(input, 1.0, 0, quant_min, quant_max, dtype)


def quantize_per_tensor_tensor(input, scale, zero_point, quant_min, quant_max, dtype):
    return quantize_per_tensor(input, scale.item(), int(zero_point.item()), quant_min, quant_max, dtype)


def quantize_per_tensor_tensor2_meta(input, scale, zero_point, quant_min, quant_max, dtype):
    _one_element(quant_min, "quant_min")
    _one_element(quant_max, "quant_max")
    low, high = QVALUE_BOUNDS.get(dtypes.dtype(dtype), (0, 0))  # the bounds are values: checked when it runs
    return quantize_per_tensor_tensor_meta(input, scale, zero_point, low, high, dtype)


def quantize_per_tensor_tensor2(input, scale, zero_point, quant_min, quant_max, dtype):
    return quantize_per_tensor(input, scale.item(), int(zero_point.item()), int(quant_min.item()),
                               int(quant_max.item()), dtype)


def dequantize_per_tensor_meta(input, scale, zero_point, quant_min, quant_max, dtype, out_dtype=None):
    _quantized_input(input, dtype)
    _check_bounds(quant_min, quant_max, dtype)
    return like(input, dtype=dtypes.dtype(out_dtype or dtypes.float32))


def dequantize_per_tensor(input, scale, zero_point, quant_min, quant_max, dtype, out_dtype=None):
    floats = aten._to_copy.default(input, dtype=dtypes.dtype(out_dtype or dtypes.float32))
    return aten.mul.Scalar(aten.sub.Scalar(floats, zero_point), scale)


def dequantize_per_tensor_tensor_meta(input, scale, zero_point, quant_min, quant_max, dtype, out_dtype=None):
    _one_element(scale, "scale")
    _one_element(zero_point, "zero_point")
    return dequantize_per_tensor_meta(input, 1.0, 0, quant_min, quant_max, dtype, out_dtype=out_dtype)


def dequantize_per_tensor_tensor(input, scale, zero_point, quant_min, quant_max, dtype, out_dtype=None):
    return dequantize_per_tensor(input, scale.item(), int(zero_point.item()), quant_min, quant_max, dtype,
                                 out_dtype=out_dtype)


def dequantize_per_tensor_tensor2_meta(input, scale, zero_point, quant_min, quant_max, dtype, out_dtype=None):
    _one_element(quant_min, "quant_min")
    _one_element(quant_max, "quant_max")
    low, high = QVALUE_BOUNDS.get(dtypes.dtype(dtype), (0, 0))  # the bounds are values: checked when it runs
    return dequantize_per_tensor_tensor_meta(input, scale, zero_point, low, high, dtype, out_dtype=out_dtype)


def dequantize_per_tensor_tensor2(input, scale, zero_point, quant_min, quant_max, dtype, out_dtype=None):
    return dequantize_per_tensor(input, scale.item(), int(zero_point.item()), int(quant_min.item()),
                                 int(quant_max.item()), dtype, out_dtype=out_dtype)


_define("quantize_per_tensor(Tensor input, float scale, int zero_point, int quant_min, int quant_max, "
        "ScalarType dtype) -> Tensor", quantize_per_tensor_meta, quantize_per_tensor)
_define("quantize_per_tensor.tensor(Tensor input, Tensor scale, Tensor zero_point, int quant_min, int quant_max, "
        "ScalarType dtype) -> Tensor", quantize_per_tensor_tensor_meta, quantize_per_tensor_tensor)
_define("quantize_per_tensor.tensor2(Tensor input, Tensor scale, Tensor zero_point, Tensor quant_min, "
        "Tensor quant_max, ScalarType dtype) -> Tensor", quantize_per_tensor_tensor2_meta,
        quantize_per_tensor_tensor2)
_define("dequantize_per_tensor(Tensor input, float scale, int zero_point, int quant_min, int quant_max, "
        "ScalarType dtype, *, ScalarType? out_dtype=None) -> Tensor", dequantize_per_tensor_meta,
        dequantize_per_tensor)
_define("dequantize_per_tensor.tensor(Tensor input, Tensor scale, Tensor zero_point, int quant_min, "
        "int quant_max, ScalarType dtype, *, ScalarType? out_dtype=None) -> Tensor",
        dequantize_per_tensor_tensor_meta, dequantize_per_tensor_tensor)
_define("dequantize_per_tensor.tensor2(Tensor input, Tensor scale, Tensor zero_point, Tensor quant_min, "
        "Tensor quant_max, ScalarType dtype, *, ScalarType? out_dtype=None) -> Tensor",
        dequantize_per_tensor_tensor2_meta, dequantize_per_tensor_tensor2)


# ---------------------------------------------------------------------------------------------
# Choosing qparams at run time (dynamic quantization)

def affine_qparams(min_val: np.ndarray, max_val: np.ndarray, quant_min: int, quant_max: int, dtype: DType,
                   eps: float, symmetric: bool, customized_range: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """torch's qparam math (observers' `_calculate_qparams`, `determine_qparams`): scale and zero point from float32
    ranges, per tensor (0-d min/max) or per channel, with torch's result dtypes (float32 scale; int64 zero point,
    int32 for affine). Observers and choose_qparams share it."""
    min_val = np.asarray(min_val, np.float32)
    max_val = np.asarray(max_val, np.float32)
    if min_val.size == 0 or (min_val.ndim == 0 and min_val == np.inf and max_val == -np.inf):
        return np.array([1.0], np.float32), np.array([0], np.int64)  # an observer that saw nothing
    eps32 = np.float32(eps)
    min_neg = np.minimum(min_val, np.float32(0))
    max_pos = np.maximum(max_val, np.float32(0))
    if symmetric:
        max_pos = np.maximum(-min_neg, max_pos)
        scale = np.maximum(max_pos / np.float32((quant_max - quant_min) / 2), eps32)
        if dtypes.dtype(dtype) is dtypes.uint8:
            zero_point = np.full(scale.shape, (quant_min + quant_max) // 2 if customized_range else 128, np.int64)
        else:
            zero_point = np.zeros(scale.shape, np.int64)
    else:
        scale = np.maximum((max_pos - min_neg) / np.float32(quant_max - quant_min), eps32)
        zero_point = np.clip(quant_min - np.round(min_neg / scale).astype(np.int32), quant_min, quant_max)
        zero_point = zero_point.astype(np.int32)
    return np.atleast_1d(scale), np.atleast_1d(zero_point)


def choose_qparams_meta(input, quant_min, quant_max, eps, dtype):
    _float_input(input)
    require_arg(quant_min < quant_max, _op(), f"quant_min {quant_min} must be below quant_max {quant_max}")
    return tensor([1], dtypes.float64), tensor([1], dtypes.int64)


def _choose_qparams(symmetric: bool):
    def kernel(input, quant_min, quant_max, eps, dtype):
        values = input.astype(np.float32)
        if values.size == 0:
            raise ValueError("choose_qparams of an empty tensor")  # torch.aminmax refuses it too
        scale, zero_point = affine_qparams(values.min(), values.max(), quant_min, quant_max, dtype, eps, symmetric)
        return scale.astype(np.float64), zero_point.astype(np.int64)  # determine_qparams's result dtypes
    return kernel


_define("choose_qparams.tensor(Tensor input, int quant_min, int quant_max, float eps, ScalarType dtype) -> "
        "(Tensor, Tensor)", choose_qparams_meta, _choose_qparams(symmetric=False))
_define("choose_qparams_symmetric.tensor(Tensor input, int quant_min, int quant_max, float eps, "
        "ScalarType dtype) -> (Tensor, Tensor)", choose_qparams_meta, _choose_qparams(symmetric=True))


# ---------------------------------------------------------------------------------------------
# Per-channel

def _channel_view(values, axis: int, rank: int):
    """A per-channel vector shaped to broadcast along `axis` of a rank-`rank` tensor."""
    shape = [1] * rank
    shape[axis] = shape_of(values)[0]
    return aten.view.default(values, shape)


def quantize_per_channel_meta(input, scales, zero_points, axis, quant_min, quant_max, dtype):
    _float_input(input)
    _axis_in_range(input, axis)
    _check_bounds(quant_min, quant_max, dtype)
    return like(input, dtype=dtypes.dtype(dtype))


def quantize_per_channel(input, scales, zero_points, axis, quant_min, quant_max, dtype):
    input = _as_float32(input)
    rank = len(shape_of(input))
    inverse = aten.reciprocal.default(_channel_view(scales, axis, rank))  # torch: input * (1.0 / scales)
    return _quantize(input, inverse, _channel_view(zero_points, axis, rank), quant_min, quant_max, dtype)


def dequantize_per_channel_meta(input, scales, zero_points, axis, quant_min, quant_max, dtype, out_dtype=None):
    _quantized_input(input, dtype)
    _axis_in_range(input, axis)
    _check_bounds(quant_min, quant_max, dtype)
    return like(input, dtype=dtypes.dtype(out_dtype or dtypes.float32))


def dequantize_per_channel(input, scales, zero_points, axis, quant_min, quant_max, dtype, out_dtype=None):
    rank = len(shape_of(input))
    scales = _channel_view(scales, axis, rank)
    if zero_points is not None:
        input = aten.sub.Tensor(input, _channel_view(zero_points, axis, rank))
    result = aten.mul.Tensor(input, scales)
    return aten._to_copy.default(result, dtype=dtypes.dtype(out_dtype or dtypes.float32))


_define("quantize_per_channel(Tensor input, Tensor scales, Tensor zero_points, int axis, int quant_min, "
        "int quant_max, ScalarType dtype) -> Tensor", quantize_per_channel_meta, quantize_per_channel)
_define("dequantize_per_channel(Tensor input, Tensor scales, Tensor? zero_points, int axis, int quant_min, "
        "int quant_max, ScalarType dtype, *, ScalarType? out_dtype=None) -> Tensor", dequantize_per_channel_meta,
        dequantize_per_channel)


# ---------------------------------------------------------------------------------------------
# Per-token (one scale per row of the last dim) and per-group (int4 weight-only)

def choose_qparams_per_token_asymmetric_meta(input, dtype):
    _float_input(input)
    shape = list(shape_of(input)[:-1]) + [1]
    return tensor(shape, dtypes.float64), tensor(shape, dtypes.int64)


def choose_qparams_per_token_asymmetric(input, dtype):
    """XNNPACK's asymmetric int8 per-token qparams: scale from the row's range including 0, the zero point from
    whichever end loses less."""
    quant_min, quant_max = -128, 127
    min_neg = aten.clamp.default(aten.amin.default(input, [-1], True), None, 0.0)  # torch.min(x, zeros_like)
    max_pos = aten.clamp.default(aten.amax.default(input, [-1], True), 0.0)
    scale = aten.div.Scalar(aten.sub.Tensor(max_pos, min_neg), float(quant_max - quant_min))
    scale = aten.clamp.default(scale, float(np.finfo(np.float32).eps))
    descaled_min = aten.div.Tensor(min_neg, scale)
    descaled_max = aten.div.Tensor(max_pos, scale)
    from_min_error = aten.add.Scalar(descaled_min, quant_min)
    from_max_error = aten.add.Scalar(descaled_max, quant_max)
    zero_point = aten.where.self(aten.gt.Scalar(aten.add.Tensor(from_min_error, from_max_error), 0),
                                 aten.rsub.Scalar(descaled_min, quant_min), aten.rsub.Scalar(descaled_max, quant_max))
    zero_point = aten.round.default(aten.clamp.default(zero_point, quant_min, quant_max))
    return (aten._to_copy.default(scale, dtype=dtypes.float64), aten._to_copy.default(zero_point, dtype=dtypes.int64))


def quantize_per_token_meta(input, scales, zero_points, quant_min, quant_max, dtype):
    _check_bounds(quant_min, quant_max, dtype)
    tokens = numel(shape_of(input)[:-1])
    require_arg(sym_eq(numel(shape_of(scales)), tokens) and sym_eq(numel(shape_of(zero_points)), tokens), _op(),
                f"expects one scale and zero point per token ({tokens}), got {numel(shape_of(scales))}")
    return like(input, dtype=dtypes.dtype(dtype))


def quantize_per_token(input, scales, zero_points, quant_min, quant_max, dtype):
    inverse = aten.reciprocal.default(scales)  # torch: input.mul(1.0 / scales)
    rounded = aten.round.default(aten.add.Tensor(aten.mul.Tensor(input, inverse), zero_points))
    return aten._to_copy.default(aten.clamp.default(rounded, quant_min, quant_max), dtype=dtypes.dtype(dtype))


def dequantize_per_token_meta(input, scales, zero_points, quant_min, quant_max, dtype, output_dtype):
    _check_bounds(quant_min, quant_max, dtype)
    return like(input, dtype=dtypes.dtype(output_dtype))


def dequantize_per_token(input, scales, zero_points, quant_min, quant_max, dtype, output_dtype):
    shifted = aten.sub.Tensor(input, zero_points)
    return aten._to_copy.default(aten.mul.Tensor(shifted, scales), dtype=dtypes.dtype(output_dtype))


_define("choose_qparams_per_token_asymmetric(Tensor input, ScalarType dtype) -> (Tensor, Tensor)",
        choose_qparams_per_token_asymmetric_meta, choose_qparams_per_token_asymmetric)
_define("quantize_per_token(Tensor input, Tensor scales, Tensor zero_points, int quant_min, int quant_max, "
        "ScalarType dtype) -> Tensor", quantize_per_token_meta, quantize_per_token)
_define("dequantize_per_token(Tensor input, Tensor scales, Tensor zero_points, int quant_min, int quant_max, "
        "ScalarType dtype, ScalarType output_dtype) -> Tensor", dequantize_per_token_meta, dequantize_per_token)


def _group_size(input_shape, scales_shape, group_size: int) -> int:
    require_arg(group_size > 1, _op(), f"group_size must be > 1, got {group_size}")
    require_arg(len(input_shape) == 2, _op(), f"expects a 2-d weight, got rank {len(input_shape)}")
    columns = input_shape[-1]
    if isinstance(columns, int) and group_size > columns and scales_shape and scales_shape[-1] == 1:
        group_size = columns  # torch's rule for GPTQ's single-column groups
    require_arg(sym_eq(sympy.Mod(columns, group_size), 0), _op(),
                f"the last dim ({columns}) must be divisible by group_size {group_size}")
    return group_size


def quantize_per_channel_group_meta(input, scales, zero_points, quant_min, quant_max, dtype, group_size=128):
    _group_size(list(shape_of(input)), list(shape_of(scales)), group_size)
    return like(input, dtype=dtypes.dtype(dtype))


def quantize_per_channel_group(input, scales, zero_points, quant_min, quant_max, dtype, group_size=128):
    shape = list(shape_of(input))
    group_size = _group_size(shape, list(shape_of(scales)), group_size)
    groups = aten.view.default(input, [-1, group_size])
    inverse = aten.reciprocal.default(aten.view.default(scales, [-1, 1]))  # torch: mul(1.0 / scales)
    shifted = aten.add.Tensor(aten.mul.Tensor(groups, inverse), aten.view.default(zero_points, [-1, 1]))
    rounded = aten.clamp.default(aten.round.default(shifted), quant_min, quant_max)
    return aten.view.default(aten._to_copy.default(rounded, dtype=dtypes.dtype(dtype)), shape)


def dequantize_per_channel_group_meta(input, scales, zero_points, quant_min, quant_max, dtype, group_size,
                                      output_dtype):
    _group_size(list(shape_of(input)), list(shape_of(scales)), group_size)
    return like(input, dtype=dtypes.dtype(output_dtype))


def dequantize_per_channel_group(input, scales, zero_points, quant_min, quant_max, dtype, group_size, output_dtype):
    shape = list(shape_of(input))
    group_size = _group_size(shape, list(shape_of(scales)), group_size)
    groups = aten.view.default(input, [-1, group_size])
    if zero_points is not None:  # (torch subtracts a 0-d int32 zero otherwise: the weight's dtype and values stay)
        groups = aten.sub.Tensor(groups, aten.view.default(zero_points, [-1, 1]))
    dequantized = aten.view.default(aten.mul.Tensor(groups, aten.view.default(scales, [-1, 1])), shape)
    return aten._to_copy.default(dequantized, dtype=dtypes.dtype(output_dtype))


_define("quantize_per_channel_group(Tensor input, Tensor scales, Tensor zero_points, int quant_min, "
        "int quant_max, ScalarType dtype, int group_size) -> Tensor", quantize_per_channel_group_meta,
        quantize_per_channel_group)
_define("dequantize_per_channel_group(Tensor input, Tensor scales, Tensor? zero_points, int quant_min, "
        "int quant_max, ScalarType dtype, int group_size, ScalarType output_dtype) -> Tensor",
        dequantize_per_channel_group_meta, dequantize_per_channel_group)


# ---------------------------------------------------------------------------------------------
# fp16 weight-only: a dtype conversion that constant folding leaves alone, so the weight stays stored in float16

def convert_element_type_meta(input, dtype):
    return like(input, dtype=dtypes.dtype(dtype))


def convert_element_type(input, dtype):
    return aten._to_copy.default(input, dtype=dtypes.dtype(dtype))


_define("convert_element_type.no_fuse(Tensor input, ScalarType dtype) -> Tensor", convert_element_type_meta,
        convert_element_type)


# ---------------------------------------------------------------------------------------------
# Decompositions into aten ops: backends without integer kernels for a pattern run these in float, exactly as
# the reference kernels compute (the per-tensor and per-channel kernels above are written with aten ops only and
# serve as their own decompositions).

def _scalar(value, dtype: DType | None = None):
    """A one-element qparam tensor as a 0-d tensor (optionally converted), so it broadcasts like the scalar torch
    reads with .item()."""
    value = aten.view.default(value, [])
    return value if dtype is None else aten._to_copy.default(value, dtype=dtype)


def quantize_per_tensor_tensor_decomposition(input, scale, zero_point, quant_min, quant_max, dtype):
    # torch: 1.0 / scale.item() in double, rounded to float32 where it multiplies the input
    inverse = aten.reciprocal.default(_scalar(scale, dtypes.float64))
    return _quantize(_as_float32(input), inverse, _scalar(zero_point), quant_min, quant_max, dtype)


def dequantize_per_tensor_tensor_decomposition(input, scale, zero_point, quant_min, quant_max, dtype,
                                               out_dtype=None):
    floats = aten._to_copy.default(input, dtype=dtypes.dtype(out_dtype or dtypes.float32))
    return aten.mul.Tensor(aten.sub.Tensor(floats, _scalar(zero_point)), _scalar(scale))


def quantize_per_tensor_tensor2_decomposition(input, scale, zero_point, quant_min, quant_max, dtype):
    inverse = aten.reciprocal.default(_scalar(scale, dtypes.float64))
    rounded = aten.add.Tensor(aten.round.default(aten.mul.Tensor(_as_float32(input), inverse)), _scalar(zero_point))
    clamped = aten.clamp.Tensor(rounded, _scalar(quant_min), _scalar(quant_max))
    return aten._to_copy.default(clamped, dtype=dtypes.dtype(dtype))


def dequantize_per_tensor_tensor2_decomposition(input, scale, zero_point, quant_min, quant_max, dtype,
                                                out_dtype=None):
    return dequantize_per_tensor_tensor_decomposition(input, scale, zero_point, 0, 0, dtype, out_dtype)


def choose_qparams_decomposition(symmetric: bool):
    def decomposition(input, quant_min, quant_max, eps, dtype):
        values = _as_float32(input)
        min_neg = aten.clamp.default(aten.amin.default(values, []), None, 0.0)
        max_pos = aten.clamp.default(aten.amax.default(values, []), 0.0)
        if symmetric:
            max_pos = aten.maximum.default(aten.neg.default(min_neg), max_pos)
            scale = aten.div.Scalar(max_pos, float(quant_max - quant_min) / 2)
        else:
            scale = aten.div.Scalar(aten.sub.Tensor(max_pos, min_neg), float(quant_max - quant_min))
        scale = aten.clamp.default(scale, float(np.float32(eps)))
        if symmetric:
            zero = 128 if dtypes.dtype(dtype) is dtypes.uint8 else 0
            zero_point = aten.full.default([1], zero, dtype=dtypes.int64)
        else:
            shift = aten._to_copy.default(aten.round.default(aten.div.Tensor(min_neg, scale)), dtype=dtypes.int32)
            zero_point = aten.clamp.default(aten.rsub.Scalar(shift, quant_min), quant_min, quant_max)
            zero_point = aten._to_copy.default(aten.view.default(zero_point, [1]), dtype=dtypes.int64)
        return aten._to_copy.default(aten.view.default(scale, [1]), dtype=dtypes.float64), zero_point
    return decomposition


for _name, _fn in [
    ("quantize_per_tensor.default", quantize_per_tensor),
    ("dequantize_per_tensor.default", dequantize_per_tensor),
    ("quantize_per_channel.default", quantize_per_channel),
    ("dequantize_per_channel.default", dequantize_per_channel),
    ("quantize_per_tensor.tensor", quantize_per_tensor_tensor_decomposition),
    ("dequantize_per_tensor.tensor", dequantize_per_tensor_tensor_decomposition),
    ("choose_qparams.tensor", choose_qparams_decomposition(symmetric=False)),
    ("choose_qparams_symmetric.tensor", choose_qparams_decomposition(symmetric=True)),
    ("quantize_per_tensor.tensor2", quantize_per_tensor_tensor2_decomposition),
    ("dequantize_per_tensor.tensor2", dequantize_per_tensor_tensor2_decomposition),
    ("choose_qparams_per_token_asymmetric.default", choose_qparams_per_token_asymmetric),
    ("quantize_per_token.default", quantize_per_token),
    ("dequantize_per_token.default", dequantize_per_token),
    ("quantize_per_channel_group.default", quantize_per_channel_group),
    ("dequantize_per_channel_group.default", dequantize_per_channel_group),
    ("convert_element_type.no_fuse", convert_element_type),
]:
    register_decomposition(f"{NAMESPACE}.{_name}")(_fn)


# ---------------------------------------------------------------------------------------------
# Integer-kernel ops (kiln's `quant` namespace): one op per `dequantize → linear → [relu] → [quantize]` pattern,
# which kiln/passes/quant/lower.py writes for backends with integer kernels (torch's inductor matches the same
# pattern into `onednn.qlinear_pointwise`, whose weight is an opaque prepacked tensor; here it stays int8 [N, K]).
# The reference kernel is the pattern itself, so a lowered program computes exactly what the Q/DQ program did.

KERNEL_NAMESPACE = "quant"
QLINEAR_POST_OPS = ("none", "relu")


def _check_integer_layer(x, x_scale, x_zero_point, weight, weight_scale, bias, output_quant_min, output_quant_max,
                         output_dtype, post_op) -> DType:
    """The checks the integer-kernel ops share: uint8/int8 activations (one-element tensor qparams for .tensor), an
    int8 weight with float32 scales and bias per output channel, the post-op, the output's dtype and range; returns
    the output dtype."""
    require_dtype(dtype_of(x) in (dtypes.uint8, dtypes.int8), _op(),
                  f"expects a uint8 or int8 input, got {dtype_of(x).name}")
    require_dtype(dtype_of(weight) is dtypes.int8, _op(), f"expects an int8 weight, got {dtype_of(weight).name}")
    if not isinstance(x_scale, (int, float)):
        _one_element(x_scale, "x_scale")
        _one_element(x_zero_point, "x_zero_point")
    channels = shape_of(weight)[0] if shape_of(weight) else None
    for name, value in (("weight_scale", weight_scale), ("bias", bias)):
        if value is not None:
            require_arg(list(shape_of(value)) == [channels] and dtype_of(value) is dtypes.float32, _op(),
                        f"expects a float32 {name} [{channels}], got {dtype_of(value).name}{list(shape_of(value))}")
    require_arg(post_op in QLINEAR_POST_OPS, _op(), f"unknown post_op {post_op!r}",
                fix=f"use one of {', '.join(QLINEAR_POST_OPS)}")
    output_dtype = dtypes.dtype(output_dtype)
    if output_dtype is not dtypes.float32:
        _check_bounds(output_quant_min, output_quant_max, output_dtype)
    return output_dtype


def qlinear_pointwise_meta(x, x_scale, x_zero_point, weight, weight_scale, bias, output_scale, output_zero_point,
                           output_quant_min, output_quant_max, output_dtype, post_op):
    x_shape, w_shape = list(shape_of(x)), list(shape_of(weight))
    require_arg(len(x_shape) >= 1 and len(w_shape) == 2, _op(),
                f"expects an input [..., K] and a weight [N, K], got {x_shape} and {w_shape}")
    require_arg(sym_eq(x_shape[-1], w_shape[1]), _op(),
                f"the input's last dim {x_shape[-1]} does not match the weight's K {w_shape[1]}")
    output_dtype = _check_integer_layer(x, x_scale, x_zero_point, weight, weight_scale, bias, output_quant_min,
                                        output_quant_max, output_dtype, post_op)
    return tensor([*x_shape[:-1], w_shape[0]], output_dtype)


def _operands_in_float(x, x_scale, x_zero_point, weight, weight_scale, dequantize):
    """The integer ops' inputs dequantized, as the reference patterns have them."""
    low, high = QVALUE_BOUNDS[dtype_of(x)]
    floats = dequantize(x, x_scale, x_zero_point, low, high, dtype_of(x))
    return floats, quantized.dequantize_per_channel.default(weight, weight_scale, None, 0, -128, 127, dtypes.int8)


def _output(result, post_op, output_scale, output_zero_point, output_quant_min, output_quant_max, output_dtype):
    """The post-op, then the requantization (none for a float32 output)."""
    if post_op == "relu":
        result = aten.relu.default(result)
    if dtypes.dtype(output_dtype) is dtypes.float32:
        return result
    return quantized.quantize_per_tensor.default(result, output_scale, output_zero_point, output_quant_min,
                                                 output_quant_max, output_dtype)


def _qlinear_pointwise(dequantize):
    def kernel(x, x_scale, x_zero_point, weight, weight_scale, bias, output_scale, output_zero_point,
               output_quant_min, output_quant_max, output_dtype, post_op):
        floats, weights = _operands_in_float(x, x_scale, x_zero_point, weight, weight_scale, dequantize)
        return _output(aten.linear.default(floats, weights, bias), post_op, output_scale, output_zero_point,
                       output_quant_min, output_quant_max, output_dtype)
    return kernel


def _define_static_and_dynamic(name: str, tail: str, meta, make_kernel) -> None:
    """`name` with float / int activation qparams (static), and its `.tensor` overload with one-element tensor
    qparams (dynamic: choose_qparams's outputs); each one's kernel (and decomposition) is its pattern."""
    for overload, scale_type, dequantize in (
            ("", "float x_scale, int x_zero_point", quantized.dequantize_per_tensor.default),
            (".tensor", "Tensor x_scale, Tensor x_zero_point", quantized.dequantize_per_tensor.tensor)):
        kernel = make_kernel(dequantize)
        defop(f"{KERNEL_NAMESPACE}::{name}{overload}(Tensor x, {scale_type}, {tail}", meta, kernel,
              tags=("quantize",))
        register_decomposition(f"{KERNEL_NAMESPACE}.{name}{overload or '.default'}")(kernel)


quantized = ops.quantized_decomposed
_define_static_and_dynamic(
    "qlinear_pointwise", "Tensor weight, Tensor weight_scale, Tensor? bias, float output_scale, int output_zero_point, "
    "int output_quant_min, int output_quant_max, ScalarType output_dtype, str post_op) -> Tensor",
    qlinear_pointwise_meta, _qlinear_pointwise)


def qconv2d_pointwise_meta(x, x_scale, x_zero_point, weight, weight_scale, bias, stride, padding, dilation, groups,
                           other, output_scale, output_zero_point, output_quant_min, output_quant_max, output_dtype,
                           post_op):
    from kiln.ir.ops.nn import _convolution_meta  # the convolution's shape rules and their errors
    require_arg(len(shape_of(x)) == 4 and len(shape_of(weight)) == 4, _op(),
                f"expects an input [N, C, H, W] and a weight [C_out, C / groups, kH, kW], got "
                f"{list(shape_of(x))} and {list(shape_of(weight))}")
    output_dtype = _check_integer_layer(x, x_scale, x_zero_point, weight, weight_scale, bias, output_quant_min,
                                        output_quant_max, output_dtype, post_op)
    result = _convolution_meta(like(x, dtype=dtypes.float32), like(weight, dtype=dtypes.float32), None, stride,
                               padding, dilation, False, [0, 0], groups)
    if other is not None:
        require_arg(dtype_of(other) is dtypes.float32 and all(map(sym_eq, shape_of(other), shape_of(result))), _op(),
                    f"expects a float32 `other` of the output's shape {list(shape_of(result))}, got "
                    f"{dtype_of(other).name}{list(shape_of(other))}")
    return like(result, dtype=output_dtype)


def _qconv2d_pointwise(dequantize):
    def kernel(x, x_scale, x_zero_point, weight, weight_scale, bias, stride, padding, dilation, groups, other,
               output_scale, output_zero_point, output_quant_min, output_quant_max, output_dtype, post_op):
        """dequantize → conv2d → [+ other] → [relu] → [quantize]: the X86 recipe's convolution patterns (other: the
        residual of conv → add → relu, already float)."""
        floats, weights = _operands_in_float(x, x_scale, x_zero_point, weight, weight_scale, dequantize)
        result = aten.conv2d.default(floats, weights, bias, stride, padding, dilation, groups)
        if other is not None:
            result = aten.add.Tensor(result, other)
        return _output(result, post_op, output_scale, output_zero_point, output_quant_min, output_quant_max,
                       output_dtype)
    return kernel


_define_static_and_dynamic(
    "qconv2d_pointwise", "Tensor weight, Tensor weight_scale, Tensor? bias, int[2] stride, int[2] padding, "
    "int[2] dilation, int groups, Tensor? other, float output_scale, int output_zero_point, int output_quant_min, "
    "int output_quant_max, ScalarType output_dtype, str post_op) -> Tensor", qconv2d_pointwise_meta, _qconv2d_pointwise)


def linear_weight_only_meta(x, weight, scales, zero_points, bias, group_size, quant_min, quant_max):
    require_dtype(dtype_of(x) is dtypes.float32, _op(), f"expects a float32 input, got {dtype_of(x).name}")
    require_dtype(dtype_of(weight) is dtypes.int8, _op(), f"expects an int8 weight, got {dtype_of(weight).name}")
    x_shape, w_shape, s_shape = list(shape_of(x)), list(shape_of(weight)), list(shape_of(scales))
    require_arg(len(x_shape) >= 1 and len(w_shape) == 2 and sym_eq(x_shape[-1], w_shape[1]), _op(),
                f"expects an input [..., K] and a weight [N, K], got {x_shape} and {w_shape}")
    require_arg(isinstance(group_size, int) and group_size > 0
                and guard_bool(sympy.Eq(sympy.Mod(w_shape[1], group_size), 0)), _op(),
                f"group_size {group_size} does not divide K = {w_shape[1]}")
    groups = w_shape[0] * sympy.floor(sympy.sympify(w_shape[1]) / group_size)
    require_arg(dtype_of(scales) is dtypes.float32 and sym_eq(numel(s_shape), groups), _op(),
                f"expects {groups} float32 scales (one per row and group of {group_size}), got "
                f"{dtype_of(scales).name}{s_shape}")
    if zero_points is not None:
        require_arg(sym_eq(numel(shape_of(zero_points)), groups) and dtype_of(zero_points) in (dtypes.int32,
                                                                                             dtypes.int64), _op(),
                    f"expects {groups} int32/int64 zero points, got {dtype_of(zero_points).name}"
                    f"{list(shape_of(zero_points))}")
    if bias is not None:
        require_arg(list(shape_of(bias)) == w_shape[:1] and dtype_of(bias) is dtypes.float32, _op(),
                    f"expects a float32 bias [{w_shape[0]}], got {dtype_of(bias).name}{list(shape_of(bias))}")
    _check_bounds(quant_min, quant_max, dtypes.int8)
    return tensor([*x_shape[:-1], w_shape[0]], dtypes.float32)


def linear_weight_only(x, weight, scales, zero_points, bias, group_size, quant_min, quant_max):
    """dequantize_per_channel (group_size = K: scales [N]) or dequantize_per_channel_group (a scale per row and group
    of group_size columns) of an int8 (or int4-valued) weight → linear: the weight-only schemes' pattern."""
    if group_size == shape_of(weight)[1] and len(shape_of(scales)) == 1:
        weights = quantized.dequantize_per_channel.default(weight, scales, zero_points, 0, quant_min, quant_max,
                                                           dtypes.int8)
    else:
        weights = quantized.dequantize_per_channel_group.default(weight, scales, zero_points, quant_min, quant_max,
                                                                 dtypes.int8, group_size, dtypes.float32)
    return aten.linear.default(x, weights, bias)


defop(f"{KERNEL_NAMESPACE}::linear_weight_only(Tensor x, Tensor weight, Tensor scales, Tensor? zero_points, "
      "Tensor? bias, int group_size, int quant_min, int quant_max) -> Tensor", linear_weight_only_meta,
      linear_weight_only, tags=("quantize",))
register_decomposition(f"{KERNEL_NAMESPACE}.linear_weight_only.default")(linear_weight_only)
