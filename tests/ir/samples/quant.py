"""Samples for kiln/ir/ops/quant.py (torch's quantized_decomposed ops)."""

from __future__ import annotations

import numpy as np

from kiln.ir import dtypes
from tests.ir.samples import TORCH_EQUIVALENTS, Sample, rand, samples

Q = "quantized_decomposed"


def _ties(scale: float) -> np.ndarray:
    """Values that land exactly halfway between quantization steps: round-half-to-even decides them."""
    return (np.arange(-6, 6, dtype=np.float32) + np.float32(0.5)) * np.float32(scale)


@samples(f"{Q}.quantize_per_tensor.default")
def quantize_per_tensor(rng):
    yield Sample((rand(rng, 3, 5), 0.0237, 131, 0, 255, dtypes.uint8), note="uint8 affine")
    yield Sample((rand(rng, 2, 3, 4) * 10, 0.05, 0, -128, 127, dtypes.int8), note="int8, saturating")
    yield Sample((_ties(0.5), 0.5, 0, -128, 127, dtypes.int8), note="ties round to even")
    yield Sample((rand(rng, 4), 0.1, 2, 0, 127, dtypes.uint8), note="reduce_range 7-bit")
    yield Sample((rand(rng, 6, dtype="bfloat16"), 0.03, 10, 0, 255, dtypes.uint8), note="bfloat16 input")
    yield Sample((rand(rng, 6, dtype="float16"), 0.03, -3, -128, 127, dtypes.int8), note="float16 input")
    yield Sample((rand(rng, 5) * 100, 0.7, 5, -32768, 32767, dtypes.int16), note="int16")


@samples(f"{Q}.quantize_per_tensor.tensor")
def quantize_per_tensor_tensor(rng):
    yield Sample((rand(rng, 3, 5), np.array([0.0237]), np.array([131]), 0, 255, dtypes.uint8), note="float64 scale")
    yield Sample((rand(rng, 4, 2), np.array(0.011, np.float32), np.array(-7, np.int64), -128, 127, dtypes.int8),
                 note="0-d float32 scale")


@samples(f"{Q}.quantize_per_tensor.tensor2")
def quantize_per_tensor_tensor2(rng):
    yield Sample((rand(rng, 3, 5), np.array([0.0237]), np.array([131]), np.array(0), np.array(255), dtypes.uint8))


def _quantized(rng, shape, dtype=dtypes.uint8):
    low, high = np.iinfo(dtype.numpy).min, np.iinfo(dtype.numpy).max
    return rng.integers(low, high + 1, size=shape).astype(dtype.numpy)


@samples(f"{Q}.dequantize_per_tensor.default")
def dequantize_per_tensor(rng):
    yield Sample((_quantized(rng, (3, 5)), 0.0237, 131, 0, 255, dtypes.uint8), note="uint8")
    yield Sample((_quantized(rng, (2, 4), dtypes.int8), 0.05, -3, -128, 127, dtypes.int8), note="int8")
    yield Sample((_quantized(rng, (6,), dtypes.int8), 0.05, 4, -128, 127, dtypes.int8),
                 dict(out_dtype=dtypes.bfloat16), note="bfloat16 result")
    yield Sample((_quantized(rng, (6,), dtypes.int8), 0.0123, 4, -128, 127, dtypes.int8),
                 dict(out_dtype=dtypes.float16), note="float16 result")


@samples(f"{Q}.dequantize_per_tensor.tensor")
def dequantize_per_tensor_tensor(rng):
    yield Sample((_quantized(rng, (3, 5)), np.array([0.0237]), np.array([131]), 0, 255, dtypes.uint8))
    yield Sample((_quantized(rng, (4,), dtypes.int8), np.array(0.3, np.float32), np.array(1, np.int32), -128, 127,
                  dtypes.int8), note="0-d float32 scale, int32 zero point")


@samples(f"{Q}.dequantize_per_tensor.tensor2")
def dequantize_per_tensor_tensor2(rng):
    yield Sample((_quantized(rng, (3, 5)), np.array([0.0237]), np.array([131]), np.array(0), np.array(255),
                  dtypes.uint8))


@samples(f"{Q}.choose_qparams.tensor", f"{Q}.choose_qparams_symmetric.tensor")
def choose_qparams(rng):
    yield Sample((rand(rng, 4, 8), 0, 255, 2.0 ** -12, dtypes.uint8), note="uint8, mixed signs")
    yield Sample((rand(rng, 16, low=0.5, high=2), -128, 127, 1e-5, dtypes.int8), note="all positive")
    yield Sample((rand(rng, 16, low=-2, high=-0.5), 0, 127, 1e-5, dtypes.uint8), note="all negative, 7-bit")
    yield Sample((np.zeros(5, np.float32), 0, 255, 2.0 ** -12, dtypes.uint8), note="all zero: eps decides the scale")


def _per_channel_qparams(rng, channels: int, scale_dtype=np.float32, zero_dtype=np.int64, symmetric=True):
    scales = rng.uniform(0.005, 0.05, channels).astype(scale_dtype)
    zero_points = np.zeros(channels, zero_dtype) if symmetric else rng.integers(-5, 5, channels).astype(zero_dtype)
    return scales, zero_points


@samples(f"{Q}.quantize_per_channel.default")
def quantize_per_channel(rng):
    scales, zeros = _per_channel_qparams(rng, 4)
    yield Sample((rand(rng, 4, 3, 2, 2) / 5, scales, zeros, 0, -128, 127, dtypes.int8), note="conv weight, axis 0")
    scales, zeros = _per_channel_qparams(rng, 5, np.float64, np.int64, symmetric=False)
    yield Sample((rand(rng, 3, 5) / 5, scales, zeros, 1, -128, 127, dtypes.int8), note="float64 scales, axis 1")
    scales, zeros = _per_channel_qparams(rng, 3, np.float32, np.int32, symmetric=False)
    yield Sample((rand(rng, 3, 4), scales, zeros, 0, 0, 255, dtypes.uint8), note="int32 zero points, saturating")


@samples(f"{Q}.dequantize_per_channel.default")
def dequantize_per_channel(rng):
    scales, zeros = _per_channel_qparams(rng, 4)
    yield Sample((_quantized(rng, (4, 3, 2, 2), dtypes.int8), scales, zeros, 0, -128, 127, dtypes.int8))
    scales, zeros = _per_channel_qparams(rng, 5, np.float64, np.int64, symmetric=False)
    yield Sample((_quantized(rng, (3, 5), dtypes.int8), scales, zeros, 1, -128, 127, dtypes.int8), note="axis 1")
    yield Sample((_quantized(rng, (3, 5), dtypes.int8), scales, None, 1, -128, 127, dtypes.int8),
                 dict(out_dtype=dtypes.float16), note="no zero points, float16 result")


@samples(f"{Q}.choose_qparams_per_token_asymmetric.default")
def choose_qparams_per_token_asymmetric(rng):
    yield Sample((rand(rng, 4, 8), dtypes.int8))
    yield Sample((rand(rng, 2, 3, 8, low=0.1, high=2), dtypes.int8), note="all positive rows, rank 3")


@samples(f"{Q}.quantize_per_token.default")
def quantize_per_token(rng):
    scales = rng.uniform(0.01, 0.05, (4, 1))
    zeros = rng.integers(-10, 10, (4, 1))
    yield Sample((rand(rng, 4, 8), scales, zeros, -128, 127, dtypes.int8), note="float64 scales, int64 zeros")
    yield Sample((rand(rng, 2, 3, 8), scales.reshape(2, 2, 1)[:, :1].repeat(3, 1).astype(np.float32)[:2],
                  np.zeros((2, 3, 1), np.int64), -128, 127, dtypes.int8), note="rank 3, float32 scales")


@samples(f"{Q}.dequantize_per_token.default")
def dequantize_per_token(rng):
    scales = rng.uniform(0.01, 0.05, (4, 1))
    zeros = rng.integers(-10, 10, (4, 1))
    yield Sample((_quantized(rng, (4, 8), dtypes.int8), scales, zeros, -128, 127, dtypes.int8, dtypes.float32))
    yield Sample((_quantized(rng, (4, 8), dtypes.int8), scales.astype(np.float32), zeros, -128, 127, dtypes.int8,
                  dtypes.float16), note="float32 scales, float16 result")


def _group_qparams(rng, rows: int, columns: int, group_size: int):
    groups = rows * columns // group_size
    return (rng.uniform(0.01, 0.2, groups).astype(np.float32),
            rng.integers(-2, 2, groups).astype(np.int32))


@samples(f"{Q}.quantize_per_channel_group.default")
def quantize_per_channel_group(rng):
    scales, zeros = _group_qparams(rng, 4, 64, 32)
    yield Sample((rand(rng, 4, 64), scales, zeros, -8, 7, dtypes.int8, 32), note="int4 range, group 32")
    scales, zeros = _group_qparams(rng, 2, 256, 128)
    yield Sample((rand(rng, 2, 256), scales.reshape(2, 2), zeros.reshape(2, 2), -128, 127, dtypes.int8, 128),
                 note="int8, group 128, 2-d qparams")


@samples(f"{Q}.dequantize_per_channel_group.default")
def dequantize_per_channel_group(rng):
    scales, zeros = _group_qparams(rng, 4, 64, 32)
    quantized = rng.integers(-8, 8, (4, 64)).astype(np.int8)
    yield Sample((quantized, scales, zeros, -8, 7, dtypes.int8, 32, dtypes.float32), note="int4 range, group 32")
    yield Sample((quantized, scales, None, -8, 7, dtypes.int8, 32, dtypes.float32), note="no zero points")
    unsigned = rng.integers(0, 16, (4, 64)).astype(np.uint8)
    yield Sample((unsigned, scales, np.full(8, 8, np.int32), 0, 15, dtypes.uint8, 32, dtypes.float32),
                 note="uint4 range, zero point 8")
    yield Sample((quantized[:, :6], scales[:4].reshape(4, 1), zeros[:4].reshape(4, 1), -8, 7, dtypes.int8, 32,
                  dtypes.float32), note="one group per row, narrower than group_size (GPTQ)")


@samples(f"{Q}.convert_element_type.no_fuse")
def convert_element_type(rng):
    yield Sample((rand(rng, 4, 6).astype(np.float16), dtypes.float32), note="an fp16 weight read as float32")
    yield Sample((rand(rng, 3, 5), dtypes.float16), note="float32 to float16 rounds")


# -- kiln's integer-kernel ops: torch computes each as its Q/DQ pattern

def _torch_output(torch, result, post_op, output_scale, output_zero_point, output_quant_min, output_quant_max,
                  output_dtype):
    if post_op == "relu":
        result = torch.relu(result)
    elif post_op in ("gelu", "gelu_tanh"):
        result = torch.nn.functional.gelu(result, approximate="tanh" if post_op == "gelu_tanh" else "none")
    if output_dtype == torch.float32:
        return result
    return torch.ops.quantized_decomposed.quantize_per_tensor(result, output_scale, output_zero_point,
                                                              output_quant_min, output_quant_max, output_dtype)


def _torch_qlinear(dequantize: str):
    def equivalent(torch):
        quantized = torch.ops.quantized_decomposed

        def qlinear(x, x_scale, x_zero_point, weight, weight_scale, bias, output_scale, output_zero_point,
                    output_quant_min, output_quant_max, output_dtype, post_op):
            info = torch.iinfo(x.dtype)
            if dequantize == "token":
                floats = quantized.dequantize_per_token(x, x_scale, x_zero_point, info.min, info.max, x.dtype,
                                                        torch.float32)
            else:
                floats = getattr(quantized.dequantize_per_tensor, dequantize)(x, x_scale, x_zero_point, info.min,
                                                                               info.max, x.dtype)
            weights = quantized.dequantize_per_channel(weight, weight_scale, None, 0, -128, 127, torch.int8)
            return _torch_output(torch, torch.nn.functional.linear(floats, weights, bias), post_op, output_scale,
                                 output_zero_point, output_quant_min, output_quant_max, output_dtype)
        return qlinear
    return equivalent


TORCH_EQUIVALENTS["quant.qlinear_pointwise.default"] = _torch_qlinear("default")
TORCH_EQUIVALENTS["quant.qlinear_pointwise.tensor"] = _torch_qlinear("tensor")
TORCH_EQUIVALENTS["quant.qlinear_pointwise.token"] = _torch_qlinear("token")


def _qlinear_operands(rng, rows: tuple, k: int, n: int, x_dtype: str = "uint8"):
    low, high = (0, 256) if x_dtype == "uint8" else (-128, 128)
    x = rng.integers(low, high, (*rows, k)).astype(x_dtype)
    weight = rng.integers(-128, 128, (n, k)).astype(np.int8)
    scales = rng.uniform(0.002, 0.02, n).astype(np.float32)
    return x, weight, scales, rng.standard_normal(n).astype(np.float32)


@samples("quant.qlinear_pointwise.default")
def qlinear_pointwise(rng):
    x, w, s, b = _qlinear_operands(rng, (5,), 24, 7)
    yield Sample((x, 0.031, 131, w, s, b, 0.07, 3, 0, 255, dtypes.uint8, "relu"), note="uint8 out, relu")
    x, w, s, b = _qlinear_operands(rng, (2, 3), 13, 9, "int8")
    yield Sample((x, 0.02, -4, w, s, None, 1.0, 0, 0, 0, dtypes.float32, "none"), note="int8 in, float out")
    x, w, s, b = _qlinear_operands(rng, (4,), 16, 6)
    yield Sample((x, 0.05, 64, w, s, b, 0.09, -5, -128, 127, dtypes.int8, "none"), note="int8 out")
    x, w, s, b = _qlinear_operands(rng, (6,), 20, 8)
    yield Sample((x, 0.03, 128, w, s, b, 0.05, 10, 0, 255, dtypes.uint8, "gelu"), note="gelu, uint8 out")
    x, w, s, b = _qlinear_operands(rng, (3,), 12, 5, "int8")
    yield Sample((x, 0.04, 2, w, s, b, 1.0, 0, 0, 0, dtypes.float32, "gelu_tanh"), note="tanh gelu, float out")


@samples("quant.qlinear_pointwise.tensor")
def qlinear_pointwise_tensor(rng):
    x, w, s, b = _qlinear_operands(rng, (3,), 10, 5)
    yield Sample((x, np.array([0.013]), np.array([120]), w, s, b, 1.0, 0, 0, 0, dtypes.float32, "none"),
                 note="dynamic: float64 scale from choose_qparams")
    x, w, s, b = _qlinear_operands(rng, (4, 2), 21, 11, "int8")
    yield Sample((x, np.array(0.02, np.float32), np.array(-3), w, s, b, 0.1, 7, 0, 255, dtypes.uint8, "relu"),
                 note="0-d float32 scale, int8 in, uint8 out")


@samples("quant.qlinear_pointwise.token")
def qlinear_pointwise_token(rng):
    x, w, s, b = _qlinear_operands(rng, (4,), 10, 5, "int8")
    yield Sample((x, rng.uniform(0.01, 0.03, (4, 1)), rng.integers(-20, 20, (4, 1)), w, s, b, 1.0, 0, 0, 0,
                  dtypes.float32, "none"), note="per token: float64 scales and int64 zero points [rows, 1]")
    x, w, s, b = _qlinear_operands(rng, (2, 3), 17, 6, "int8")
    yield Sample((x, rng.uniform(0.01, 0.03, (2, 3, 1)).astype(np.float32), rng.integers(-9, 9, (2, 3, 1)), w, s,
                  None, 1.0, 0, 0, 0, dtypes.float32, "gelu"), note="batched tokens, float32 scales, no bias, gelu")


def _torch_qadaptive_avg_pool2d(torch):
    quantized = torch.ops.quantized_decomposed

    def pool(x, x_scale, x_zero_point, output_size, output_scale, output_zero_point, output_quant_min,
             output_quant_max, output_dtype):
        info = torch.iinfo(x.dtype)
        floats = quantized.dequantize_per_tensor(x, x_scale, x_zero_point, info.min, info.max, x.dtype)
        return quantized.quantize_per_tensor(torch.nn.functional.adaptive_avg_pool2d(floats, output_size),
                                             output_scale, output_zero_point, output_quant_min, output_quant_max,
                                             output_dtype)
    return pool


TORCH_EQUIVALENTS["quant.qadaptive_avg_pool2d.default"] = _torch_qadaptive_avg_pool2d


@samples("quant.qadaptive_avg_pool2d.default")
def qadaptive_avg_pool2d(rng):
    x = rng.integers(0, 256, (2, 3, 7, 6)).astype(np.uint8)
    yield Sample((x, 0.02, 100, [1, 1], 0.02, 100, 0, 255, dtypes.uint8), note="global, shared qparams")
    x = rng.integers(-128, 128, (1, 4, 9, 5)).astype(np.int8)
    yield Sample((x, 0.05, -3, [3, 5], 0.03, 5, -128, 127, dtypes.int8), note="int8, even windows")
    # (int8 with uneven windows exports too, but onnxruntime 1.32's QDQ propagation, at opset 23 with its graph
    # optimizations on, rewrites the DequantizeLinear -> Slice it becomes into an invalid QuantizeLinear)
    x = rng.integers(0, 256, (1, 4, 9, 5)).astype(np.uint8)
    yield Sample((x, 0.05, 120, [4, 2], 0.03, 5, 0, 255, dtypes.uint8), note="uint8, uneven windows")


def _torch_qconv2d(dequantize: str):
    return lambda torch: _torch_qconv2d_of(torch, dequantize)


def _torch_qconv2d_of(torch, dequantize: str):
    quantized = torch.ops.quantized_decomposed

    def qconv2d(x, x_scale, x_zero_point, weight, weight_scale, bias, stride, padding, dilation, groups, other,
                output_scale, output_zero_point, output_quant_min, output_quant_max, output_dtype, post_op):
        info = torch.iinfo(x.dtype)
        floats = getattr(quantized.dequantize_per_tensor, dequantize)(x, x_scale, x_zero_point, info.min, info.max,
                                                                       x.dtype)
        weights = quantized.dequantize_per_channel(weight, weight_scale, None, 0, -128, 127, torch.int8)
        result = torch.nn.functional.conv2d(floats, weights, bias, stride, padding, dilation, groups)
        if other is not None:
            result = result + other
        return _torch_output(torch, result, post_op, output_scale, output_zero_point, output_quant_min,
                             output_quant_max, output_dtype)
    return qconv2d


TORCH_EQUIVALENTS["quant.qconv2d_pointwise.default"] = _torch_qconv2d("default")
TORCH_EQUIVALENTS["quant.qconv2d_pointwise.tensor"] = _torch_qconv2d("tensor")


@samples("quant.qconv2d_pointwise.default")
def qconv2d_pointwise(rng):
    x = rng.integers(0, 256, (2, 3, 7, 6)).astype(np.uint8)
    w = rng.integers(-128, 128, (5, 3, 3, 3)).astype(np.int8)
    s, b = rng.uniform(0.002, 0.02, 5).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    yield Sample((x, 0.03, 120, w, s, b, [1, 1], [1, 1], [1, 1], 1, None, 0.08, 2, 0, 255, dtypes.uint8, "relu"),
                 note="same padding, relu, uint8 out")
    x = rng.integers(-128, 128, (1, 4, 9, 8)).astype(np.int8)
    w = rng.integers(-128, 128, (6, 2, 2, 3)).astype(np.int8)
    s = rng.uniform(0.002, 0.02, 6).astype(np.float32)
    yield Sample((x, 0.02, -5, w, s, None, [2, 1], [0, 1], [1, 2], 2, None, 1.0, 0, 0, 0, dtypes.float32, "none"),
                 note="int8 in, strided, dilated, grouped, float out")
    x = rng.integers(0, 256, (1, 2, 5, 5)).astype(np.uint8)
    w = rng.integers(-128, 128, (3, 2, 3, 3)).astype(np.int8)
    s, b = rng.uniform(0.002, 0.02, 3).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    other = rng.standard_normal((1, 3, 5, 5)).astype(np.float32)
    yield Sample((x, 0.05, 100, w, s, b, [1, 1], [1, 1], [1, 1], 1, other, 0.1, 0, 0, 255, dtypes.uint8, "relu"),
                 note="residual add, relu")
    yield Sample((x, 0.05, 100, w, s, b, [1, 1], [1, 1], [1, 1], 1, None, 0.1, 0, 0, 255, dtypes.uint8, "gelu"),
                 note="gelu")


@samples("quant.qconv2d_pointwise.tensor")
def qconv2d_pointwise_tensor(rng):
    x = rng.integers(0, 256, (2, 3, 6, 5)).astype(np.uint8)
    w = rng.integers(-128, 128, (4, 3, 3, 3)).astype(np.int8)
    s, b = rng.uniform(0.002, 0.02, 4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    yield Sample((x, np.array(0.025, np.float32), np.array(97), w, s, b, [1, 1], [1, 1], [1, 1], 1, None, 1.0, 0, 0, 0,
                  dtypes.float32, "none"), note="dynamic activations: 0-d scale, float out")


def _torch_linear_weight_only(torch):
    quantized = torch.ops.quantized_decomposed

    def linear_weight_only(x, weight, scales, zero_points, bias, group_size, quant_min, quant_max):
        if scales.dim() == 1:
            weights = quantized.dequantize_per_channel(weight, scales, zero_points, 0, quant_min, quant_max,
                                                       torch.int8)
        else:
            weights = quantized.dequantize_per_channel_group(weight, scales, zero_points, quant_min, quant_max,
                                                             torch.int8, group_size, torch.float32)
        return torch.nn.functional.linear(x, weights, bias)
    return linear_weight_only


TORCH_EQUIVALENTS["quant.linear_weight_only.default"] = _torch_linear_weight_only


@samples("quant.linear_weight_only.default")
def linear_weight_only(rng):
    x = rand(rng, 5, 64)
    w = rng.integers(-127, 128, (6, 64)).astype(np.int8)
    yield Sample((x, w, rng.uniform(0.002, 0.02, 6).astype(np.float32), None, rand(rng, 6), 64, -127, 127),
                 note="int8 per channel, symmetric")
    w = rng.integers(-8, 8, (9, 64)).astype(np.int8)
    scales = rng.uniform(0.01, 0.1, (9, 2)).astype(np.float32)
    zero_points = rng.integers(-3, 4, (9, 2)).astype(np.int64)
    yield Sample((rand(rng, 2, 3, 64), w, scales, zero_points, None, 32, -8, 7), note="int4 values, group 32")


# -- ATen's fake-quantize ops (quantization-aware training)

def _fake_quant_input(rng, shape, scale: float, zero_point: int, quant_min: int, quant_max: int) -> np.ndarray:
    """Random values around the representable range, with its two ends exactly, one step past each end, and
    half-steps (ties that round half to even) placed first."""
    values = rng.uniform((quant_min - zero_point - 3) * scale, (quant_max - zero_point + 3) * scale,
                         size=shape).astype(np.float32)
    special = [(quant_min - zero_point) * scale, (quant_max - zero_point) * scale,
               (quant_min - zero_point - 1) * scale, (quant_max - zero_point + 1) * scale]
    special += [(k + 0.5) * scale for k in range(-3, 3)]
    flat = values.reshape(-1)
    count = min(flat.size, len(special))
    flat[:count] = np.array(special[:count], np.float32)
    return values


@samples("aten.fake_quantize_per_tensor_affine.default")
def fake_quantize_per_tensor_affine(rng):
    yield Sample((_fake_quant_input(rng, (4, 6), 0.25, 131, 0, 255), 0.25, 131, 0, 255),
                 note="uint8 affine, ends and ties exactly")
    yield Sample((_fake_quant_input(rng, (3, 5), 0.0237, 10, 0, 127), 0.0237, 10, 0, 127), note="reduce_range")
    yield Sample((rand(rng, 2, 3, 4) * 4, 0.03125, 0, -128, 127), note="int8 symmetric")
    yield Sample((_fake_quant_input(rng, (12,), 0.125, -2, -8, 7), 0.125, -2, -8, 7), note="4-bit")
    yield Sample((rand(rng, 7, dtype="float16"), 0.02, 3, -128, 127), note="float16 input")
    yield Sample((rand(rng, 7, dtype="bfloat16"), 0.02, 3, -128, 127), note="bfloat16 input")
    yield Sample((np.array(0.3, np.float32), 0.1, 0, -128, 127), note="0-d input")


@samples("aten.fake_quantize_per_tensor_affine.tensor_qparams")
def fake_quantize_per_tensor_affine_tensor_qparams(rng):
    yield Sample((_fake_quant_input(rng, (4, 6), 0.25, 131, 0, 255), np.array([0.25], np.float32),
                  np.array([131], np.int32), 0, 255), note="uint8 affine, ends and ties exactly")
    yield Sample((_fake_quant_input(rng, (3, 5), 0.0237, -7, -128, 127), np.array([0.0237], np.float32),
                  np.array([-7], np.int32), -128, 127), note="int8 affine")
    yield Sample((rand(rng, 3, 4), np.array(0.05, np.float32), np.array(2.7, np.float32), 0, 255),
                 note="0-d qparams, a float zero point truncates")
    yield Sample((rand(rng, 6, dtype="float16"), np.array([0.02], np.float32), np.array([0], np.int32), -128, 127),
                 note="float16 input")


def _channel_qparams(rng, channels: int, quant_min: int, quant_max: int, zero_dtype=np.int32):
    scales = rng.uniform(0.01, 0.05, channels).astype(np.float32)
    scales[0] = 0.25  # a power of two: exact ties in the first channel
    zero_points = rng.integers(quant_min, quant_max + 1, channels).astype(zero_dtype)
    return scales, zero_points


def _per_channel_input(rng, shape, axis: int, scales, zero_points, quant_min: int, quant_max: int):
    """Each channel spans a little more than its range; channel 0 also gets its ends, one step past them and ties."""
    values = np.moveaxis(np.empty(shape, np.float32), axis, 0)
    for channel, (scale, zero) in enumerate(zip(scales, zero_points.astype(np.float64))):
        values[channel] = _fake_quant_input(rng, values.shape[1:], float(scale), 0, int(quant_min - zero),
                                            int(quant_max - zero))
    return np.ascontiguousarray(np.moveaxis(values, 0, axis))


@samples("aten.fake_quantize_per_channel_affine.default")
def fake_quantize_per_channel_affine(rng):
    scales, zeros = _channel_qparams(rng, 4, -128, 127)
    zeros[:] = 0
    yield Sample((_per_channel_input(rng, (4, 3, 2, 2), 0, scales, zeros, -128, 127), scales, zeros, 0, -128, 127),
                 note="conv weight, symmetric int8, axis 0")
    scales, zeros = _channel_qparams(rng, 5, 0, 255)
    yield Sample((_per_channel_input(rng, (3, 5), 1, scales, zeros, 0, 255), scales, zeros, 1, 0, 255),
                 note="uint8 affine, axis 1")
    scales, _ = _channel_qparams(rng, 3, 0, 255)
    floats = np.array([0.0, 17.25, 100.5], np.float32)
    yield Sample((rand(rng, 3, 8), scales, floats, 0, 0, 255), note="float zero points (affine float qparams)")
    yield Sample((rand(rng, 3, 8, dtype="float16"), scales, floats.astype(np.float16), 0, 0, 255),
                 note="float16 input and zero points")
    yield Sample((rand(rng, 2, 3, dtype="bfloat16"), scales, np.zeros(3, np.int32), 1, -128, 127),
                 note="bfloat16 input")  # (torch's CPU kernel refuses bfloat16 scales)


@samples("aten._fake_quantize_learnable_per_tensor_affine.default")
def fake_quantize_learnable_per_tensor_affine(rng):
    yield Sample((_fake_quant_input(rng, (4, 6), 0.25, 131, 0, 255), np.array([0.25], np.float32),
                  np.array([131.0], np.float32), 0, 255), note="uint8 affine, ends and ties exactly")
    yield Sample((_fake_quant_input(rng, (3, 5), 0.0237, 0, -128, 127), np.array([0.0237], np.float32),
                  np.array([2.5], np.float32), -128, 127, 0.2),
                 note="a zero point at a tie: the forward rounds it to even, the backward up; grad_factor 0.2")
    yield Sample((rand(rng, 10), np.array([0.11], np.float32), np.array([-3.3], np.float32), -8, 7),
                 note="4-bit, a negative fractional zero point")
    yield Sample((rand(rng, 2, 4, dtype="bfloat16"), np.array([0.05], np.float32), np.array([1.0], np.float32),
                  -128, 127), note="bfloat16 input")


@samples("aten._fake_quantize_learnable_per_channel_affine.default")
def fake_quantize_learnable_per_channel_affine(rng):
    scales, zeros = _channel_qparams(rng, 4, -128, 127, np.float32)
    zeros[:] = 0
    yield Sample((_per_channel_input(rng, (4, 3, 2), 0, scales, zeros, -128, 127), scales, zeros, 0, -128, 127),
                 note="symmetric int8 weight, axis 0")
    scales, zeros = _channel_qparams(rng, 5, -8, 7, np.float32)
    zeros += np.float32(0.5)  # ties: rounded to even
    zeros[-1] = 9.0  # clamped into the range
    yield Sample((_per_channel_input(rng, (3, 5), 1, scales, np.clip(np.round(zeros), -8, 7), -8, 7), scales, zeros,
                  1, -8, 7, 0.3), note="4-bit, fractional zero points, axis 1, grad_factor 0.3")
    yield Sample((rand(rng, 3, 4, dtype="bfloat16"), scales[:3], np.array([0.0, 1.0, -2.0], np.float32), 0, -128,
                  127), note="bfloat16 input")


@samples("aten._fake_quantize_learnable_per_tensor_affine_backward.default")
def fake_quantize_learnable_per_tensor_affine_backward(rng):
    x = _fake_quant_input(rng, (4, 6), 0.25, 131, 0, 255)
    yield Sample((rand(rng, 4, 6), x, np.array([0.25], np.float32), np.array([131.0], np.float32), 0, 255),
                 note="uint8 affine, ends and ties exactly")
    x = _fake_quant_input(rng, (3, 5), 0.0237, 2, -128, 127)
    yield Sample((rand(rng, 3, 5), x, np.array([0.0237], np.float32), np.array([2.5], np.float32), -128, 127, 0.2),
                 note="a zero point at a tie (the backward rounds it up), grad_factor 0.2")
    yield Sample((rand(rng, 40), rand(rng, 40), np.array([0.11], np.float32), np.array([-3.3], np.float32), -8, 7),
                 note="4-bit: most values clamped, sums past one vector")


@samples("aten._fake_quantize_learnable_per_channel_affine_backward.default")
def fake_quantize_learnable_per_channel_affine_backward(rng):
    scales, zeros = _channel_qparams(rng, 4, -128, 127, np.float32)
    x = _per_channel_input(rng, (4, 3, 3), 0, scales, zeros, -128, 127)
    yield Sample((rand(rng, 4, 3, 3), x, scales, zeros, 0, -128, 127), note="int8 affine weight, axis 0")
    scales, zeros = _channel_qparams(rng, 5, -8, 7, np.float32)
    zeros += np.float32(0.5)
    yield Sample((rand(rng, 9, 5), rand(rng, 9, 5), scales, zeros, 1, -8, 7, 0.3),
                 note="4-bit, zero points at ties, axis 1, grad_factor 0.3")
    scales, zeros = _channel_qparams(rng, 3, -128, 127, np.float32)
    yield Sample((rand(rng, 2, 3, 10), rand(rng, 2, 3, 10, dtype="bfloat16"), scales, zeros, 1, -128, 127),
                 note="bfloat16 input, a middle axis")
