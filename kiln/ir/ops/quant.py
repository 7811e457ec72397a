"""Quantize/dequantize ops in torch's `quantized_decomposed` namespace (the reference quantized representation), and
ATen's fake-quantize ops (quantization-aware training) at the end.

PT2E quantization (kiln/passes/quant) writes programs with these ops around float ops, and backends match
`dequantize → op → quantize` into integer kernels. Each reference kernel repeats torch's implementation
(torch/ao/quantization/fx/_decomposed.py) expression by expression with `aten` ops, so dtype promotion and
rounding are torch's: `x * (1 / scale)` rounds differently from `x / scale`, and the qparams must agree bit for bit.
"""

from __future__ import annotations

import numpy as np
import sympy

from kiln.ir import dtypes
from kiln.ir.cpu import usable_cpus
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


# Arithmetic with a tensor or a Python scalar operand (the .Tensor or .Scalar overload, as torch dispatches).

def _times(value, factor):
    return aten.mul.Scalar(value, factor) if isinstance(factor, (int, float)) else aten.mul.Tensor(value, factor)


def _plus(value, term):
    return aten.add.Scalar(value, term) if isinstance(term, (int, float)) else aten.add.Tensor(value, term)


def _minus(value, term):
    return aten.sub.Scalar(value, term) if isinstance(term, (int, float)) else aten.sub.Tensor(value, term)


def _quantize(input, inverse_scale, zero_point, quant_min: int, quant_max: int, dtype: DType):
    """clamp(round(input * inverse_scale) + zero_point, quant_min, quant_max).to(dtype), with tensor or scalar
    qparams, as every torch quantize op writes it."""
    rounded = _plus(aten.round.default(_times(input, inverse_scale)), zero_point)
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


def effective_group_size(input_shape, scales_shape, group_size: int) -> int:
    """The group size a per-group op uses (checked): `group_size`, or the row's width when it is wider than the row
    and there is one scale per row."""
    require_arg(group_size > 1, _op(), f"group_size must be > 1, got {group_size}")
    require_arg(len(input_shape) == 2, _op(), f"expects a 2-d weight, got rank {len(input_shape)}")
    columns = input_shape[-1]
    if isinstance(columns, int) and group_size > columns and scales_shape and scales_shape[-1] == 1:
        group_size = columns  # torch's rule for GPTQ's single-column groups
    require_arg(sym_eq(sympy.Mod(columns, group_size), 0), _op(),
                f"the last dim ({columns}) must be divisible by group_size {group_size}")
    return group_size


def quantize_per_channel_group_meta(input, scales, zero_points, quant_min, quant_max, dtype, group_size=128):
    effective_group_size(list(shape_of(input)), list(shape_of(scales)), group_size)
    return like(input, dtype=dtypes.dtype(dtype))


def quantize_per_channel_group(input, scales, zero_points, quant_min, quant_max, dtype, group_size=128):
    shape = list(shape_of(input))
    group_size = effective_group_size(shape, list(shape_of(scales)), group_size)
    groups = aten.view.default(input, [-1, group_size])
    inverse = aten.reciprocal.default(aten.view.default(scales, [-1, 1]))  # torch: mul(1.0 / scales)
    shifted = aten.add.Tensor(aten.mul.Tensor(groups, inverse), aten.view.default(zero_points, [-1, 1]))
    rounded = aten.clamp.default(aten.round.default(shifted), quant_min, quant_max)
    return aten.view.default(aten._to_copy.default(rounded, dtype=dtypes.dtype(dtype)), shape)


def dequantize_per_channel_group_meta(input, scales, zero_points, quant_min, quant_max, dtype, group_size,
                                      output_dtype):
    effective_group_size(list(shape_of(input)), list(shape_of(scales)), group_size)
    return like(input, dtype=dtypes.dtype(output_dtype))


def dequantize_per_channel_group(input, scales, zero_points, quant_min, quant_max, dtype, group_size, output_dtype):
    shape = list(shape_of(input))
    group_size = effective_group_size(shape, list(shape_of(scales)), group_size)
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
# The activation after the layer: onednn.qlinear_pointwise's post-op names; "gelu_tanh" is its gelu with the "tanh"
# algorithm (aten.gelu's approximate="tanh").
QLINEAR_POST_OPS = ("none", "relu", "gelu", "gelu_tanh")


def _check_integer_layer(x, x_scale, x_zero_point, weight, weight_scale, bias, output_quant_min, output_quant_max,
                         output_dtype, post_op, per_token: bool = False) -> DType:
    """The checks the integer-kernel ops share: uint8/int8 activations (one-element tensor qparams for .tensor), an
    int8 weight with float32 scales and bias per output channel, the post-op, the output's dtype and range; returns
    the output dtype."""
    require_dtype(dtype_of(x) in (dtypes.uint8, dtypes.int8), _op(),
                  f"expects a uint8 or int8 input, got {dtype_of(x).name}")
    require_dtype(dtype_of(weight) is dtypes.int8, _op(), f"expects an int8 weight, got {dtype_of(weight).name}")
    if per_token:  # one scale and zero point per row of x (its last dim's vectors)
        tokens = numel(shape_of(x)[:-1])
        for name, value in (("x_scale", x_scale), ("x_zero_point", x_zero_point)):
            require_arg(sym_eq(numel(shape_of(value)), tokens), _op(),
                        f"expects one {name} per token ({tokens}), got {numel(shape_of(value))}")
    elif not isinstance(x_scale, (int, float)):
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
                           output_quant_min, output_quant_max, output_dtype, post_op, per_token=False):
    x_shape, w_shape = list(shape_of(x)), list(shape_of(weight))
    require_arg(len(x_shape) >= 1 and len(w_shape) == 2, _op(),
                f"expects an input [..., K] and a weight [N, K], got {x_shape} and {w_shape}")
    require_arg(sym_eq(x_shape[-1], w_shape[1]), _op(),
                f"the input's last dim {x_shape[-1]} does not match the weight's K {w_shape[1]}")
    output_dtype = _check_integer_layer(x, x_scale, x_zero_point, weight, weight_scale, bias, output_quant_min,
                                        output_quant_max, output_dtype, post_op, per_token)
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
    elif post_op in ("gelu", "gelu_tanh"):
        result = aten.gelu.default(result, approximate="tanh" if post_op == "gelu_tanh" else "none")
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


def _dequantize_per_token(x, scales, zero_points, quant_min, quant_max, dtype):
    return quantized.dequantize_per_token.default(x, scales, zero_points, quant_min, quant_max, dtype, dtypes.float32)


def _define_static_and_dynamic(name: str, tail: str, meta, make_kernel, per_token: bool = False) -> None:
    """`name` with float / int activation qparams (static), and its `.tensor` overload with one-element tensor
    qparams (dynamic: choose_qparams's outputs), and with `per_token` its `.token` overload with a scale and zero
    point per row (dynamic per token: choose_qparams_per_token_asymmetric's); each one's kernel (and
    decomposition) is its pattern."""
    overloads = [("", "float x_scale, int x_zero_point", quantized.dequantize_per_tensor.default),
                 (".tensor", "Tensor x_scale, Tensor x_zero_point", quantized.dequantize_per_tensor.tensor)]
    if per_token:
        overloads.append((".token", "Tensor x_scale, Tensor x_zero_point", _dequantize_per_token))
    for overload, scale_type, dequantize in overloads:
        kernel = make_kernel(dequantize)
        rule = (lambda *args: meta(*args, per_token=True)) if overload == ".token" else meta
        defop(f"{KERNEL_NAMESPACE}::{name}{overload}(Tensor x, {scale_type}, {tail}", rule, kernel,
              tags=("quantize",))
        register_decomposition(f"{KERNEL_NAMESPACE}.{name}{overload or '.default'}")(kernel)


quantized = ops.quantized_decomposed
_define_static_and_dynamic(
    "qlinear_pointwise", "Tensor weight, Tensor weight_scale, Tensor? bias, float output_scale, int output_zero_point, "
    "int output_quant_min, int output_quant_max, ScalarType output_dtype, str post_op) -> Tensor",
    qlinear_pointwise_meta, _qlinear_pointwise, per_token=True)


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


def qadaptive_avg_pool2d_meta(x, x_scale, x_zero_point, output_size, output_scale, output_zero_point,
                              output_quant_min, output_quant_max, output_dtype):
    require_dtype(dtype_of(x) in (dtypes.uint8, dtypes.int8), _op(),
                  f"expects a uint8 or int8 input, got {dtype_of(x).name}")
    require_arg(len(shape_of(x)) == 4 and len(output_size) == 2 and all(isinstance(s, int) and s > 0
                                                                         for s in output_size), _op(),
                f"expects an input [N, C, H, W] and two positive output sizes, got {list(shape_of(x))} and "
                f"{list(output_size)}")
    output_dtype = dtypes.dtype(output_dtype)
    _check_bounds(output_quant_min, output_quant_max, output_dtype)
    return tensor([*shape_of(x)[:2], *output_size], output_dtype)


def qadaptive_avg_pool2d(x, x_scale, x_zero_point, output_size, output_scale, output_zero_point, output_quant_min,
                         output_quant_max, output_dtype):
    """dequantize → adaptive_avg_pool2d → quantize: a quantized CNN's global average pool (the X86 recipe shares
    the input's qparams with it)."""
    low, high = QVALUE_BOUNDS[dtype_of(x)]
    floats = quantized.dequantize_per_tensor.default(x, x_scale, x_zero_point, low, high, dtype_of(x))
    return quantized.quantize_per_tensor.default(aten.adaptive_avg_pool2d.default(floats, output_size), output_scale,
                                                 output_zero_point, output_quant_min, output_quant_max, output_dtype)


defop(f"{KERNEL_NAMESPACE}::qadaptive_avg_pool2d(Tensor x, float x_scale, int x_zero_point, int[2] output_size, "
      "float output_scale, int output_zero_point, int output_quant_min, int output_quant_max, "
      "ScalarType output_dtype) -> Tensor", qadaptive_avg_pool2d_meta, qadaptive_avg_pool2d, tags=("quantize",))
register_decomposition(f"{KERNEL_NAMESPACE}.qadaptive_avg_pool2d.default")(qadaptive_avg_pool2d)


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


# ---------------------------------------------------------------------------------------------
# Fake quantization (ATen's `fake_quantize_*` ops): quantize and dequantize in float, for quantization-aware
# training. Each op is written with aten ops that repeat ATen's CPU kernel (QuantizedOpKernels.cpp) step by step, so
# the function is at once the reference kernel and the decomposition: the product `x * (1.0f / scale)` in float32
# (float64 for a float64 input), round half to even, the zero point added after rounding (the learnable ops' backward
# adds it before), the per-tensor result `(q - zero_point) * scale` in float32 and the per-channel one in float64,
# then stored in the input's dtype. Where the C++ compiler contracts `a * b + c` into an FMA (x86-64 builds from AVX2
# up, aarch64), kiln rounds once too (`_fused_multiply_add`).

from kiln.ir.ops._grad import cast  # noqa: E402

_FAKE_QUANT_INPUTS = (dtypes.float32, dtypes.float64, dtypes.float16, dtypes.bfloat16)


def _opmath(x):
    """The dtype ATen's fake-quant kernels compute in: float32, or float64 for a float64 input."""
    return x if dtype_of(x) in (dtypes.float32, dtypes.float64) else aten._to_copy.default(x, dtype=dtypes.float32)


def _in_range(codes, quant_min: int, quant_max: int):
    """The straight-through estimator's mask: where the unclamped code lies in [quant_min, quant_max]."""
    return aten.logical_and.default(aten.ge.Scalar(codes, quant_min), aten.le.Scalar(codes, quant_max))


def _per_tensor_codes(x, inverse_scale, zero_point):
    """`zero_point + nearbyint(x * inverse_scale)` in the kernel's opmath: the quantized value before clamping."""
    return _plus(aten.round.default(_times(_opmath(x), inverse_scale)), zero_point)


def _per_tensor_dequantized(x, codes, scale, zero_point, quant_min: int, quant_max: int):
    """`(clamp(codes) - zero_point) * scale`: an integer times the float32 scale, in float32, stored in x's dtype."""
    steps = cast(_minus(aten.clamp.default(codes, quant_min, quant_max), zero_point), dtypes.float32)
    return cast(_times(steps, scale), dtype_of(x))


def _per_tensor_qparams(scale, zero_point):
    """The 1.0f / scale, scale and zero point that the per-tensor kernel reads from a float and an int."""
    scale = float(np.float32(scale))
    return float(np.float32(1) / np.float32(scale)), scale, zero_point


def _tensor_qparams(scale, zero_point):
    """Tensor qparams read like `scale.item().toFloat()` and `zero_point.item().toInt()` (a float zero point truncates),
    as 0-d tensors that broadcast against any input."""
    scale = _scalar(scale, dtypes.float32)
    return aten.reciprocal.default(scale), scale, _scalar(zero_point, dtypes.int64)


def _learnable_tensor_qparams(scale, zero_point, quant_min: int, quant_max: int):
    """`scale[0].item<float>()`, and the zero point rounded to nearest even and clamped into the range."""
    scale = _scalar(scale, dtypes.float32)
    rounded = aten.clamp.default(aten.round.default(_scalar(zero_point, dtypes.float32)), quant_min, quant_max)
    return aten.reciprocal.default(scale), scale, cast(rounded, dtypes.int64)


def _fake_quantize_per_tensor(x, qparams, quant_min: int, quant_max: int):
    inverse, scale, zero_point = qparams
    codes = _per_tensor_codes(x, inverse, zero_point)
    return _per_tensor_dequantized(x, codes, scale, zero_point, quant_min, quant_max)


def fake_quantize_per_tensor_affine(self, scale, zero_point, quant_min, quant_max):
    return _fake_quantize_per_tensor(self, _per_tensor_qparams(scale, zero_point), quant_min, quant_max)


def fake_quantize_per_tensor_affine_tensor_qparams(self, scale, zero_point, quant_min, quant_max):
    return _fake_quantize_per_tensor(self, _tensor_qparams(scale, zero_point), quant_min, quant_max)


def _fake_quantize_learnable_per_tensor_affine(self, scale, zero_point, quant_min, quant_max, grad_factor=1.0):
    return _fake_quantize_per_tensor(self, _learnable_tensor_qparams(scale, zero_point, quant_min, quant_max),
                                     quant_min, quant_max)


def _fused_multiply_add(a, b, c):
    """`a * b + c` rounded once, as ATen's kernels compute it where the compiler contracts it into an FMA (x86-64
    builds from AVX2 up, aarch64): for float32, exactly in float64 and then rounded to float32."""
    if dtype_of(a) is dtypes.float32:
        wide = [cast(value, dtypes.float64) for value in (a, b, c)]
        return cast(aten.add.Tensor(aten.mul.Tensor(wide[0], wide[1]), wide[2]), dtypes.float32)
    return aten.add.Tensor(aten.mul.Tensor(a, b), c)


def _per_channel_codes(x, inverse_scale, zero_point, integer_zero_point: bool):
    """The unclamped code per element: `zero_point + nearbyint(x * inv_scale)` for an int32 zero point, and
    `lrintf(zero_point + x * inv_scale)` (one FMA) for a float one (the affine-float-qparams equation)."""
    if not integer_zero_point:
        return aten.round.default(cast(_fused_multiply_add(_opmath(x), inverse_scale, zero_point), dtypes.float32))
    return aten.add.Tensor(aten.round.default(aten.mul.Tensor(_opmath(x), inverse_scale)), zero_point)


def _per_channel_qparams(x, scale, zero_point, axis: int):
    rank = len(shape_of(x))
    scale = _channel_view(cast(scale, dtypes.float32), axis, rank)
    return aten.reciprocal.default(scale), scale, _channel_view(zero_point, axis, rank)


def fake_quantize_per_channel_affine(self, scale, zero_point, axis, quant_min, quant_max):
    integer_zero_point = not dtype_of(zero_point).is_floating_point
    return _fake_quantize_per_channel(self, scale, zero_point, axis, quant_min, quant_max, integer_zero_point)


def _fake_quantize_per_channel(self, scale, zero_point, axis, quant_min, quant_max, integer_zero_point: bool):
    inverse, scale, zero_point = _per_channel_qparams(self, scale, zero_point, axis)
    codes = _per_channel_codes(self, inverse, zero_point, integer_zero_point)
    clamped = cast(aten.clamp.default(codes, quant_min, quant_max), dtypes.float64)
    # the kernel's fmin/fmax return double, so `(q - zero_point) * scale` is computed in double, then stored
    steps = aten.sub.Tensor(clamped, cast(zero_point, dtypes.float64))
    return cast(aten.mul.Tensor(steps, cast(scale, dtypes.float64)), dtype_of(self))


def _rounded_zero_points(zero_point, quant_min: int, quant_max: int):
    """`zero_point.round().clamp_(quant_min, quant_max)`: the learnable per-channel op's integer zero points."""
    return aten.clamp.default(aten.round.default(zero_point), quant_min, quant_max)


def _fake_quantize_learnable_per_channel_affine(self, scale, zero_point, axis, quant_min, quant_max,
                                                grad_factor=1.0):
    # torch converts the rounded zero points to int32; kiln keeps their (integral) float values, which compute the
    # same: the C backend misreads a float32 operand that meets an int32 zero point used twice
    zero_points = cast(_rounded_zero_points(zero_point, quant_min, quant_max), dtypes.float32)
    return _fake_quantize_per_channel(self, scale, zero_points, axis, quant_min, quant_max, integer_zero_point=True)


def _fake_quant_input(self) -> None:
    require_dtype(dtype_of(self) in _FAKE_QUANT_INPUTS, _op(),
                  f"expects a floating-point input, got {dtype_of(self).name}", fix="convert the input with .float()")


def _fake_quant_range(quant_min: int, quant_max: int) -> None:
    require_arg(quant_min <= quant_max, _op(), f"quant_min {quant_min} must not exceed quant_max {quant_max}")


def fake_quantize_per_tensor_affine_meta(self, scale, zero_point, quant_min, quant_max):
    _fake_quant_input(self)
    _fake_quant_range(quant_min, quant_max)
    require_arg(quant_min <= zero_point <= quant_max, _op(),
                f"zero_point {zero_point} must be between quant_min {quant_min} and quant_max {quant_max}")
    return like(self)


def fake_quantize_tensor_qparams_meta(self, scale, zero_point, quant_min, quant_max, grad_factor=1.0):
    _fake_quant_input(self)
    _fake_quant_range(quant_min, quant_max)
    _one_element(scale, "scale")
    _one_element(zero_point, "zero_point")
    return like(self)


def fake_quantize_learnable_per_tensor_meta(self, scale, zero_point, quant_min, quant_max, grad_factor=1.0):
    # the kernel reads scale[0] and zero_point[0]: a 0-d one (which the tensor_qparams op takes) has no element 0
    for value, what in ((scale, "scale"), (zero_point, "zero_point")):
        require_arg(len(shape_of(value)) >= 1, _op(), f"expects a 1-D one-element {what} tensor, got a 0-d one",
                    fix=f"pass {what}.reshape(1), as torch.ao's FakeQuantize modules hold it")
    return fake_quantize_tensor_qparams_meta(self, scale, zero_point, quant_min, quant_max, grad_factor)


def fake_quantize_per_channel_meta(self, scale, zero_point, axis, quant_min, quant_max, grad_factor=None):
    _fake_quant_input(self)
    _fake_quant_range(quant_min, quant_max)
    rank = len(shape_of(self))
    require_arg(0 <= axis < rank, _op(), f"axis {axis} must be in [0, {rank}) for a rank-{rank} input")
    require_dtype(dtype_of(scale) in (dtypes.float32, dtypes.bfloat16), _op(),
                  f"scale must be float32 or bfloat16, got {dtype_of(scale).name}")
    if grad_factor is None:  # the learnable op rounds its float zero points to int32 itself
        require_dtype(dtype_of(zero_point) in (dtypes.int32, dtypes.float32, dtypes.float16), _op(),
                      f"zero_point must be int32, float32 or float16, got {dtype_of(zero_point).name}")
    require_arg(len(shape_of(scale)) == 1 and len(shape_of(zero_point)) == 1, _op(),
                "scale and zero_point must be 1-d tensors")
    channels = shape_of(self)[axis]
    require_arg(sym_eq(shape_of(scale)[0], channels) and sym_eq(shape_of(zero_point)[0], channels), _op(),
                f"expects {channels} scales and zero points (the input's dim {axis}), got "
                f"{shape_of(scale)[0]} and {shape_of(zero_point)[0]}")
    return like(self)


def _fake_quantize_per_channel_kernel(self, scale, zero_point, axis, quant_min, quant_max):
    if not dtype_of(zero_point).is_floating_point and zero_point.size:
        low, high = int(zero_point.min()), int(zero_point.max())
        require_arg(quant_min <= low and high <= quant_max, _op(),
                    f"zero points in [{low}, {high}] must be between quant_min {quant_min} and quant_max {quant_max}")
    return fake_quantize_per_channel_affine(self, scale, zero_point, axis, quant_min, quant_max)


for _schema, _meta, _kernel, _decomposition in [
    ("fake_quantize_per_tensor_affine(Tensor self, float scale, int zero_point, int quant_min, int quant_max) -> "
     "Tensor", fake_quantize_per_tensor_affine_meta, fake_quantize_per_tensor_affine, None),
    ("fake_quantize_per_tensor_affine.tensor_qparams(Tensor self, Tensor scale, Tensor zero_point, int quant_min, "
     "int quant_max) -> Tensor", fake_quantize_tensor_qparams_meta, fake_quantize_per_tensor_affine_tensor_qparams,
     None),
    ("fake_quantize_per_channel_affine(Tensor self, Tensor scale, Tensor zero_point, int axis, int quant_min, "
     "int quant_max) -> Tensor", fake_quantize_per_channel_meta, _fake_quantize_per_channel_kernel,
     fake_quantize_per_channel_affine),
    ("_fake_quantize_learnable_per_tensor_affine(Tensor self, Tensor scale, Tensor zero_point, int quant_min, "
     "int quant_max, float grad_factor=1.) -> Tensor", fake_quantize_learnable_per_tensor_meta,
     _fake_quantize_learnable_per_tensor_affine, None),
    ("_fake_quantize_learnable_per_channel_affine(Tensor self, Tensor scale, Tensor zero_point, int axis, "
     "int quant_min, int quant_max, float grad_factor=1.) -> Tensor", fake_quantize_per_channel_meta,
     _fake_quantize_learnable_per_channel_affine, None),
]:
    _opdef = defop(_schema, _meta, _kernel, tags=("composite",))
    register_decomposition(_opdef.name)(_decomposition or _kernel)


# ---------------------------------------------------------------------------------------------
# The learnable ops' backward (FakeQuantPerTensorAffine.cpp, FakeQuantPerChannelAffine.cpp), as torch registers it:
# an op of its own giving (dx, dscale, dzero_point). Elementwise, the code is recomputed with the zero point added
# before rounding (torch's backward does so, and rounds a per-tensor zero point half up where the forward rounds it
# half to even, so at a tie its mask can differ from the forward's); inside [quant_min, quant_max] dx = grad,
# dscale = grad * (x_fq - x) / scale and dzero_point = 0; outside, dx = 0, dscale = grad * (quant_min or quant_max -
# zero_point) and dzero_point = -grad * scale; dscale and dzero_point times grad_factor, each step in float32. The
# reference kernel then sums dscale and dzero_point in ATen's order (SumKernel.cpp's cascade sum under
# TensorIterator, `_aten_float32_sum`): the sums cancel heavily, so only ATen's order gives torch's gradients at
# float32 tolerances. The decomposition sums with aten.sum.

_SUM_LANES = 8  # ATen's float32 sum kernel runs on 8-lane vectors (it is not built for AVX-512)
_GRAIN_SIZE = 32768  # at::internal::GRAIN_SIZE: smaller reductions run on one thread


def _sequential_sum(rows: np.ndarray, start: np.ndarray | None = None) -> np.ndarray:
    """start + rows[0] + rows[1] + ... in float32, in order (rows: [n, ...])."""
    first = (np.zeros(rows.shape[1:], np.float32) if start is None else np.asarray(start, np.float32))[None]
    return np.add.accumulate(np.concatenate([first, rows]), axis=0, dtype=np.float32)[-1]


def _multi_row_sum(rows: np.ndarray) -> np.ndarray:
    """ATen's multi_row_sum over axis 0: running sums of 16 or more rows, carried up four levels of accumulators."""
    size = rows.shape[0]
    power = max(4, (1 if size <= 2 else (size - 1).bit_length()) // 4)
    step, mask = 1 << power, (1 << power) - 1
    levels = np.zeros((4,) + rows.shape[1:], np.float32)
    i = 0
    while i + step <= size:
        levels[0] = _sequential_sum(rows[i:i + step])
        i += step
        for level in range(1, 4):
            levels[level] += levels[level - 1]
            levels[level - 1] = 0
            if i & (mask << (level * power)):
                break
    total = _sequential_sum(rows[i:], levels[0])
    for level in range(1, 4):
        total = total + levels[level]
    return total


def _row_sum(rows: np.ndarray) -> np.ndarray:
    """ATen's row_sum over axis 0: four interleaved multi-row sums, the leftover rows, then the four together."""
    interleaved = rows.shape[0] // 4
    partial = _multi_row_sum(rows[:interleaved * 4].reshape((interleaved, 4) + rows.shape[1:]))
    total = _sequential_sum(rows[interleaved * 4:], partial[0])
    for k in range(1, 4):
        total = total + partial[k]
    return total


def _inner_sums(rows: np.ndarray) -> np.ndarray:
    """Each row of `rows` [R, n] summed along its contiguous elements (vectorized_inner_sum, or scalar row_sum)."""
    count, size = rows.shape
    if size < _SUM_LANES:
        return _row_sum(rows.T)
    vectors = size // _SUM_LANES
    lanes = _row_sum(rows[:, :vectors * _SUM_LANES].reshape(count, vectors, _SUM_LANES).transpose(1, 0, 2))
    total = _sequential_sum(rows[:, vectors * _SUM_LANES:].T)
    for lane in range(_SUM_LANES):
        total = total + lanes[:, lane]
    return total


def _outer_sums(columns: np.ndarray) -> np.ndarray:
    """Each column of `columns` [A, C] summed down its rows (vectorized_outer_sum, or scalar_outer_sum)."""
    count = columns.shape[1]
    total = np.empty(count, np.float32)
    block = 4 * _SUM_LANES if count >= _SUM_LANES else 4
    j = 0
    while j + block <= count:
        total[j:j + block] = _multi_row_sum(columns[:, j:j + block])
        j += block
    while count >= _SUM_LANES and j + _SUM_LANES <= count:
        total[j:j + _SUM_LANES] = _row_sum(columns[:, j:j + _SUM_LANES])
        j += _SUM_LANES
    if j < count:
        total[j:] = _row_sum(columns[:, j:])
    return total


def _parallel_ranges(count: int, grain: int, threads: int) -> list[tuple[int, int]]:
    """at::parallel_for's split of [0, count) (OpenMP): one chunk per thread, or the whole range serially."""
    if not (count > grain and count > 1 and threads > 1):
        return [(0, count)]
    chunk = -(-count // min(threads, -(-count // grain)))
    return [(begin, min(count, begin + chunk)) for begin in range(0, count, chunk)]


def _aten_float32_sum(values: np.ndarray, keep_axis: int | None = None) -> np.ndarray:
    """torch.sum of a contiguous float32 array over every dim (or every dim but `keep_axis`), bit for bit: ATen
    puts the reduced dims innermost and dispatches on the strides (TensorIterator), sums with the cascade of
    SumKernel.cpp, and splits large reductions over threads (TensorIteratorReduce.cpp)."""
    values = np.ascontiguousarray(values, np.float32)
    threads = usable_cpus()  # torch's intra-op threads by default
    if keep_axis is not None and values.ndim:
        before, channels = int(np.prod(values.shape[:keep_axis])), values.shape[keep_axis]
        after = int(np.prod(values.shape[keep_axis + 1:]))
    if keep_axis is None or values.ndim == 0 or channels == 1:
        flat = values.reshape(1, -1)
        if flat.size < _GRAIN_SIZE or threads == 1:
            total = _inner_sums(flat)
        else:  # two-pass: a partial sum per thread, then the sum of those
            partials = np.zeros((1, threads), np.float32)
            for thread, (begin, end) in enumerate(_parallel_ranges(flat.size, _GRAIN_SIZE, threads)):
                partials[0, thread] = _inner_sums(flat[:, begin:end])[0]
            total = _inner_sums(partials)
        return total.reshape(() if keep_axis is None else (1,))
    blocks = values.reshape(before, channels, after)
    if before == 1 and after == 1:
        return blocks.reshape(channels) + np.float32(0)
    if before == 1:
        return _inner_sums(blocks[0])
    if after > 1:  # per outer index, each channel's contiguous run summed, then added up in order
        return _sequential_sum(_inner_sums(blocks.reshape(before * channels, after)).reshape(before, channels))
    columns = blocks[:, :, 0]
    if values.size < _GRAIN_SIZE or threads == 1:
        return _outer_sums(columns)
    total = np.empty(channels, np.float32)
    for begin, end in _parallel_ranges(channels, 1, threads):  # threads take 128-byte-aligned column ranges
        begin -= begin % 32
        end -= end % 32 if end != channels else 0
        if begin != end:
            total[begin:end] = _outer_sums(columns[:, begin:end])
    return total


def _learnable_elementwise(grad, x, inverse, scale, zero_point, quant_min: int, quant_max: int, grad_factor: float):
    """Elementwise (dx, dscale, dzero_point) of the learnable backward kernels, in their float arithmetic;
    `zero_point` is the backward's integer-valued zero point (0-d, or shaped to broadcast per channel)."""
    x = _opmath(x)
    kind = dtype_of(x)
    grad, zero_point = cast(grad, kind), cast(zero_point, kind)
    scale, inverse = cast(scale, kind), cast(inverse, kind)
    codes = aten.round.default(_fused_multiply_add(x, inverse, zero_point))  # nearbyint(zp + x * inv_scale)
    inside = _in_range(codes, quant_min, quant_max)
    dx = aten.mul.Tensor(grad, inside)
    steps = aten.sub.Tensor(aten.clamp.default(codes, quant_min, quant_max), zero_point)
    error = _fused_multiply_add(steps, scale, aten.neg.default(x))  # x_fq - x, with x_fq = steps * scale fused in
    scale_inside = aten.mul.Tensor(aten.mul.Tensor(grad, error), inverse)
    below = aten.mul.Tensor(grad, aten.rsub.Scalar(zero_point, quant_min))  # grad * (quant_min - zero_point)
    above = aten.mul.Tensor(grad, aten.rsub.Scalar(zero_point, quant_max))
    scale_outside = aten.where.self(aten.lt.Scalar(codes, quant_min), below, above)
    dscale = aten.mul.Scalar(aten.where.self(inside, scale_inside, scale_outside), grad_factor)
    zero_point_outside = aten.mul.Scalar(aten.mul.Tensor(aten.neg.default(grad), scale), grad_factor)
    dzero_point = aten.where.self(inside, aten.full_like.default(zero_point_outside, 0), zero_point_outside)
    return dx, dscale, dzero_point


def _learnable_per_tensor_elementwise(grad, self, scale, zero_point, quant_min, quant_max, grad_factor):
    scale_value = _scalar(scale, dtypes.float32)
    # static_cast<int64_t>(clamp(zero_point + 0.5f)): half rounds up (toward zero below 0), unlike the forward
    zero_value = aten.clamp.default(aten.add.Scalar(_scalar(zero_point, dtypes.float32), 0.5), quant_min, quant_max)
    zero_value = cast(cast(zero_value, dtypes.int64), dtypes.float32)
    return _learnable_elementwise(grad, self, aten.reciprocal.default(scale_value), scale_value, zero_value,
                                  quant_min, quant_max, grad_factor)


def _learnable_per_channel_elementwise(grad, self, scale, zero_point, axis, quant_min, quant_max, grad_factor):
    rank = len(shape_of(self))
    scales = _channel_view(cast(scale, dtypes.float32), axis, rank)
    zero_points = _channel_view(cast(_rounded_zero_points(zero_point, quant_min, quant_max), dtypes.float32), axis,
                                rank)
    return _learnable_elementwise(grad, self, aten.reciprocal.default(scales), scales, zero_points, quant_min,
                                  quant_max, grad_factor)


def fake_quantize_learnable_per_tensor_backward(grad, self, scale, zero_point, quant_min, quant_max,
                                                grad_factor=1.0):
    dx, dscale, dzero_point = _learnable_per_tensor_elementwise(grad, self, scale, zero_point, quant_min, quant_max,
                                                                grad_factor)
    return (dx, aten.view.default(aten.sum.dim_IntList(dscale, [], False), [1]),
            aten.view.default(aten.sum.dim_IntList(dzero_point, [], False), [1]))


def _fake_quantize_learnable_per_tensor_backward_kernel(grad, self, scale, zero_point, quant_min, quant_max,
                                                        grad_factor=1.0):
    dx, dscale, dzero_point = _learnable_per_tensor_elementwise(grad, self, scale, zero_point, quant_min, quant_max,
                                                                grad_factor)
    return dx, _aten_float32_sum(dscale).reshape(1), _aten_float32_sum(dzero_point).reshape(1)


def fake_quantize_learnable_per_channel_backward(grad, self, scale, zero_point, axis, quant_min, quant_max,
                                                 grad_factor=1.0):
    dx, dscale, dzero_point = _learnable_per_channel_elementwise(grad, self, scale, zero_point, axis, quant_min,
                                                                 quant_max, grad_factor)
    others = [d for d in range(len(shape_of(self))) if d != axis]
    if not others:
        return dx, dscale, dzero_point
    return dx, aten.sum.dim_IntList(dscale, others, False), aten.sum.dim_IntList(dzero_point, others, False)


def _fake_quantize_learnable_per_channel_backward_kernel(grad, self, scale, zero_point, axis, quant_min, quant_max,
                                                         grad_factor=1.0):
    dx, dscale, dzero_point = _learnable_per_channel_elementwise(grad, self, scale, zero_point, axis, quant_min,
                                                                 quant_max, grad_factor)
    return dx, _aten_float32_sum(dscale, axis), _aten_float32_sum(dzero_point, axis)


def _learnable_backward_checks(grad, self, scale, zero_point, quant_min, quant_max) -> None:
    require_arg(quant_min <= 0 <= quant_max, _op(),
                f"the quantization range [{quant_min}, {quant_max}] must include 0")
    require_arg(all(map(sym_eq, shape_of(grad), shape_of(self))) and len(shape_of(grad)) == len(shape_of(self)),
                _op(), f"grad {list(shape_of(grad))} and self {list(shape_of(self))} must have the same shape")
    float_inputs = (dtypes.float32,) if dtype_of(self) is not dtypes.bfloat16 else (dtypes.bfloat16, dtypes.float32)
    for name, value in (("grad", grad), ("self", self), ("scale", scale), ("zero_point", zero_point)):
        require_dtype(dtype_of(value) in float_inputs, _op(),
                      f"{name} must be float32, got {dtype_of(value).name}", fix="fake-quantize float32 tensors")


def fake_quantize_learnable_per_tensor_backward_meta(grad, self, scale, zero_point, quant_min, quant_max,
                                                     grad_factor=1.0):
    require_dtype(dtype_of(self) is dtypes.float32, _op(), f"self must be float32, got {dtype_of(self).name}",
                  fix="fake-quantize float32 tensors")
    _learnable_backward_checks(grad, self, scale, zero_point, quant_min, quant_max)
    _one_element(scale, "scale")
    _one_element(zero_point, "zero_point")
    return like(self), tensor([1], dtypes.float32), tensor([1], dtypes.float32)


def fake_quantize_learnable_per_channel_backward_meta(grad, self, scale, zero_point, axis, quant_min, quant_max,
                                                      grad_factor=1.0):
    _learnable_backward_checks(grad, self, scale, zero_point, quant_min, quant_max)
    rank = len(shape_of(self))
    require_arg(0 <= axis < rank, _op(), f"axis {axis} must be in [0, {rank}) for a rank-{rank} input")
    require_arg(len(shape_of(scale)) == 1 and len(shape_of(zero_point)) == 1, _op(),
                "scale and zero_point must be 1-d tensors")
    channels = shape_of(self)[axis]
    require_arg(sym_eq(shape_of(scale)[0], channels) and sym_eq(shape_of(zero_point)[0], channels), _op(),
                f"expects {channels} scales and zero points (the input's dim {axis})")
    return like(self, dtype=dtypes.float32), tensor([channels], dtypes.float32), tensor([channels], dtypes.float32)


for _schema, _meta, _kernel, _decomposition in [
    ("_fake_quantize_learnable_per_tensor_affine_backward(Tensor grad, Tensor self, Tensor scale, "
     "Tensor zero_point, int quant_min, int quant_max, float grad_factor=1.) -> (Tensor, Tensor, Tensor)",
     fake_quantize_learnable_per_tensor_backward_meta, _fake_quantize_learnable_per_tensor_backward_kernel,
     fake_quantize_learnable_per_tensor_backward),
    ("_fake_quantize_learnable_per_channel_affine_backward(Tensor grad, Tensor self, Tensor scale, "
     "Tensor zero_point, int axis, int quant_min, int quant_max, float grad_factor=1.) -> (Tensor, Tensor, Tensor)",
     fake_quantize_learnable_per_channel_backward_meta, _fake_quantize_learnable_per_channel_backward_kernel,
     fake_quantize_learnable_per_channel_backward),
]:
    _opdef = defop(_schema, _meta, _kernel, tags=("composite", "backward"))
    register_decomposition(_opdef.name)(_decomposition)


# ---------------------------------------------------------------------------------------------
# VJP rules (torch's derivatives.yaml). The fixed-qparams ops pass the gradient straight through where the unclamped
# code was in [quant_min, quant_max] (fake_quantize_*_cachemask_backward: `grad * mask`) and give their qparams none;
# torch even refuses a scale or zero point that requires grad there. The learnable ops call their backward op.

from kiln.ir.registry import mark_nondifferentiable, register_vjp  # noqa: E402


def _straight_through(grad, codes, quant_min: int, quant_max: int):
    return aten.mul.Tensor(grad, _in_range(codes, quant_min, quant_max))


@register_vjp("aten.fake_quantize_per_tensor_affine.default")
def _fake_quantize_per_tensor_vjp(grad, out, self, scale, zero_point, quant_min, quant_max):
    inverse, _, zero_point = _per_tensor_qparams(scale, zero_point)
    return _straight_through(grad, _per_tensor_codes(self, inverse, zero_point), quant_min, quant_max)


@register_vjp("aten.fake_quantize_per_tensor_affine.tensor_qparams")
def _fake_quantize_tensor_qparams_vjp(grad, out, self, scale, zero_point, quant_min, quant_max):
    inverse, _, zero_point = _tensor_qparams(scale, zero_point)
    return _straight_through(grad, _per_tensor_codes(self, inverse, zero_point), quant_min, quant_max), None, None


@register_vjp("aten.fake_quantize_per_channel_affine.default")
def _fake_quantize_per_channel_vjp(grad, out, self, scale, zero_point, axis, quant_min, quant_max):
    inverse, _, zero_point = _per_channel_qparams(self, scale, zero_point, axis)
    codes = _per_channel_codes(self, inverse, zero_point, not dtype_of(zero_point).is_floating_point)
    return _straight_through(grad, codes, quant_min, quant_max), None, None


mark_nondifferentiable("aten.fake_quantize_per_tensor_affine.tensor_qparams",
                       "aten.fake_quantize_per_channel_affine.default", arguments=("scale", "zero_point"))


def _gradient_of(gradient, argument):
    """A qparam's gradient in its argument's shape and dtype (None for an integer argument)."""
    if not dtype_of(argument).is_floating_point:
        return None
    return cast(aten.view.default(gradient, list(shape_of(argument))), dtype_of(argument))


@register_vjp("aten._fake_quantize_learnable_per_tensor_affine.default")
def _fake_quantize_learnable_per_tensor_vjp(grad, out, self, scale, zero_point, quant_min, quant_max,
                                            grad_factor=1.0):
    dx, dscale, dzero_point = aten._fake_quantize_learnable_per_tensor_affine_backward.default(
        cast(grad, dtype_of(out)), self, scale, zero_point, quant_min, quant_max, grad_factor)
    return cast(dx, dtype_of(self)), _gradient_of(dscale, scale), _gradient_of(dzero_point, zero_point)


@register_vjp("aten._fake_quantize_learnable_per_channel_affine.default")
def _fake_quantize_learnable_per_channel_vjp(grad, out, self, scale, zero_point, axis, quant_min, quant_max,
                                             grad_factor=1.0):
    dx, dscale, dzero_point = aten._fake_quantize_learnable_per_channel_affine_backward.default(
        cast(grad, dtype_of(out)), self, scale, zero_point, axis, quant_min, quant_max, grad_factor)
    return cast(dx, dtype_of(self)), _gradient_of(dscale, scale), _gradient_of(dzero_point, zero_point)
