"""The C backend's int8 kernels against the reference Q/DQ program, at every CPU capability this machine runs.

Where the math is integer (power-of-two scales: every dequantized value, product, sum and requantization is exact in
float32) the compiled program equals the interpreter's bit for bit. With realistic scales, requantized outputs
differ from the reference by at most one quantization step, and float outputs equal the float64 evaluation of the
same integers within float32 tolerance.
"""

from __future__ import annotations

import importlib
import math

import numpy as np
import pytest

import kiln
from kiln import quantization as kq
from kiln.codegen.c.build import CAPABILITIES
from kiln.ir import dtypes
from kiln.ir.dialect import bound_arguments
from kiln.ir.interpreter import watching
from kiln.ir.program import GraphBuilder, InputKind
from kiln.ir.types import TensorType
from kiln.passes import run
from kiln.testing import assert_close
from tests.runtime.support import use_capability

quantized = kiln.ops.quantized_decomposed


# Activations: uint8, int8, and reduce_range's 7-bit uint8 (0..127), which AVX2 multiplies with vpmaddubsw.
UINT7 = "uint7"
RANGES = {dtypes.uint8: (dtypes.uint8, 0, 255), dtypes.int8: (dtypes.int8, -128, 127), UINT7: (dtypes.uint8, 0, 127)}

# (rows, K, N, activations, post-op, output dtype, dynamic): tails in K (not a multiple of 4, or of AMX's 64-byte
# k-blocks), N (not of the panel width) and M (not of the register tile or of AMX's 16- and 32-row steps; 70 rows of
# K = 4100 take three chunks of AMX's row copies), batched rows, int8 and 7-bit activations, every output form, every
# post-op.
CASES = [
    ((5,), 7, 3, dtypes.uint8, "relu", dtypes.uint8, False),
    ((13,), 67, 33, dtypes.int8, "none", dtypes.int8, False),
    ((32,), 64, 70, dtypes.uint8, "none", dtypes.float32, False),
    ((2, 3), 12, 17, dtypes.uint8, "relu", dtypes.uint8, False),
    ((1,), 130, 40, dtypes.int8, "relu", dtypes.uint8, False),
    ((9,), 30, 20, dtypes.uint8, "none", dtypes.float32, True),
    ((11,), 29, 35, UINT7, "relu", dtypes.uint8, False),
    ((3, 5), 64, 16, UINT7, "none", dtypes.float32, False),
    ((7,), 45, 20, UINT7, "none", dtypes.float32, True),
    ((40,), 96, 48, dtypes.uint8, "gelu", dtypes.uint8, False),
    ((70,), 4100, 20, dtypes.int8, "relu", dtypes.int8, False),
    ((5, 7), 200, 40, dtypes.int8, "gelu_tanh", dtypes.float32, False),
    ((33,), 128, 64, dtypes.uint8, "gelu", dtypes.float32, True),
]

# gelu's float32 value (kiln_math.h's erf) may differ from the reference's in the last bit, so its requantized
# output can be a step off even where every other operation is exact
INEXACT_POST_OPS = ("gelu", "gelu_tanh")


def _post_op(y, post_op: str):
    """The activation the integer ops fuse, applied to the reference pattern's float result."""
    if post_op == "relu":
        return kiln.ops.aten.relu.default(y)
    if post_op in INEXACT_POST_OPS:
        return kiln.ops.aten.gelu.default(y, approximate="tanh" if post_op == "gelu_tanh" else "none")
    return y


def _post_op64(y: np.ndarray, post_op: str) -> np.ndarray:
    """The same activation in float64."""
    if post_op == "relu":
        return np.maximum(y, 0)
    if post_op == "gelu":
        return 0.5 * y * (1 + np.vectorize(math.erf)(y / math.sqrt(2)))
    if post_op == "gelu_tanh":
        return 0.5 * y * (1 + np.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y ** 3)))
    return y


def _constants_builder():
    """A GraphBuilder, the constants dict its program will hold, and `constant(name, array)`, which adds one."""
    builder = GraphBuilder()
    constants: dict[str, np.ndarray] = {}

    def constant(name: str, array: np.ndarray):
        constants[name] = array
        return builder.add_input(name, TensorType.of(array.shape, dtypes.dtype(array.dtype)),
                                 InputKind.CONSTANT_TENSOR, target=name)
    return builder, constants, constant


def _program(rng: np.random.Generator, dyadic: bool):
    """One program with a quantized linear layer per case (each with its own input); returns it, the inputs and
    each case's qparams."""
    builder, constants, constant = _constants_builder()
    inputs, outputs, params = [], [], []

    for index, (rows, k, n, activations, post_op, out_dtype, dynamic) in enumerate(CASES):
        if dyadic and (dynamic or post_op in INEXACT_POST_OPS):
            continue
        x_dtype, low, high = RANGES[activations]
        if dyadic:
            x_scale, zero_point = 2.0 ** -4, (low + high + 1) // 2 - 3
            weight_scales = (2.0 ** -rng.integers(5, 9, n)).astype(np.float32)
            bias = (rng.integers(-64, 64, n) * 2.0 ** -8).astype(np.float32)
            out_scale = 2.0 ** -2
            # multiples of the scale: quantizing them is exact and never a tie
            x = ((rng.integers(low, high + 1, (*rows, k)) - zero_point) * x_scale).astype(np.float32)
        else:
            x_scale, zero_point = float(rng.uniform(0.01, 0.03)), int(rng.integers(low + 20, high - 20))
            weight_scales = rng.uniform(0.002, 0.02, n).astype(np.float32)
            bias = rng.standard_normal(n).astype(np.float32)
            out_scale = float(rng.uniform(0.05, 0.2))
            x = rng.uniform((low - zero_point) * x_scale, (high - zero_point) * x_scale, (*rows, k)).astype(np.float32)
        out_zero_point = 10 if out_dtype is dtypes.uint8 else -3
        weight = rng.integers(-128, 128, (n, k)).astype(np.int8)
        inputs.append(x)
        value = builder.add_input(f"x{index}", TensorType.of(x.shape, dtypes.float32))
        w, ws, b = (constant(f"w{index}", weight), constant(f"ws{index}", weight_scales),
                    constant(f"b{index}", bias))
        with builder:
            if dynamic:
                scale, zp = quantized.choose_qparams.tensor(value, low, high, 2.0 ** -12, x_dtype)
                q = quantized.quantize_per_tensor.tensor(value, scale, zp, low, high, x_dtype)
                floats = quantized.dequantize_per_tensor.tensor(q, scale, zp, low, high, x_dtype)
            else:
                q = quantized.quantize_per_tensor.default(value, x_scale, zero_point, low, high, x_dtype)
                floats = quantized.dequantize_per_tensor.default(q, x_scale, zero_point, low, high, x_dtype)
            y = _post_op(kiln.ops.aten.linear.default(
                floats, quantized.dequantize_per_channel.default(w, ws, None, 0, -128, 127, dtypes.int8), b), post_op)
            if out_dtype is not dtypes.float32:
                qlow, qhigh = (0, 255) if out_dtype is dtypes.uint8 else (-128, 127)
                y = quantized.quantize_per_tensor.default(y, out_scale, out_zero_point, qlow, qhigh, out_dtype)
        outputs.append(y)
        params.append((x_scale, zero_point, weight, weight_scales, bias, post_op, out_dtype, dynamic,
                       (low, high, x_dtype)))
    return builder.build(outputs, constants=constants), inputs, params


# (input shape, weight shape, stride, padding, dilation, groups, activation dtype, residual, post-op, output dtype):
# "same" and strided/dilated/grouped windows, 1x1, a residual add, K and C_out tails.
CONV_CASES = [
    ((2, 3, 9, 8), (8, 3, 3, 3), 1, 1, 1, 1, dtypes.uint8, False, "relu", dtypes.uint8),
    ((1, 6, 7, 7), (10, 3, 2, 3), 2, [0, 1], [1, 2], 2, dtypes.int8, False, "none", dtypes.int8),
    ((2, 16, 6, 6), (40, 16, 3, 3), 1, 1, 1, 1, dtypes.uint8, True, "relu", dtypes.uint8),
    ((1, 5, 5, 5), (7, 5, 1, 1), 1, 0, 1, 1, dtypes.uint8, False, "none", dtypes.float32),
    ((2, 3, 9, 9), (8, 3, 3, 3), 1, 1, 1, 1, UINT7, True, "relu", dtypes.uint8),
    ((1, 8, 7, 6), (20, 8, 3, 3), 2, 1, 1, 1, UINT7, False, "none", dtypes.float32),
    ((1, 8, 9, 10), (16, 8, 3, 3), 1, 1, 1, 1, dtypes.int8, False, "relu", dtypes.uint8),
    ((2, 4, 10, 9), (24, 4, 3, 3), 1, 1, 1, 1, dtypes.uint8, True, "gelu", dtypes.uint8),
    # 16 or more channels per group: AMX builds convolve these directly (strided, dilated, grouped; channel counts
    # that take one partial k-step, or two; output rows wider than a 32-pixel step; 40 output channels: a partial
    # second panel)
    ((1, 20, 9, 37), (24, 20, 3, 3), 2, 1, 1, 1, dtypes.int8, False, "none", dtypes.float32),
    ((2, 80, 6, 5), (40, 80, 3, 1), 1, [1, 0], [2, 1], 1, dtypes.uint8, True, "relu", dtypes.uint8),
    ((1, 32, 5, 40), (16, 16, 3, 3), 1, 1, 1, 2, dtypes.uint8, False, "gelu", dtypes.int8),
    ((3, 64, 7, 7), (48, 64, 1, 1), 1, 0, 1, 1, dtypes.int8, False, "relu", dtypes.int8),
]


def _conv_program(rng: np.random.Generator, dyadic: bool):
    """One program with a quantized convolution per case; returns it, the inputs and each case's parameters."""
    builder, constants, constant = _constants_builder()
    inputs, outputs, params = [], [], []

    for index, (shape, w_shape, stride, padding, dilation, groups, activations, residual, post_op, out_dtype) in \
            enumerate(CONV_CASES):
        if dyadic and post_op in INEXACT_POST_OPS:
            continue
        x_dtype, low, high = RANGES[activations]
        c_out = w_shape[0]
        if dyadic:
            x_scale, zero_point, out_scale = 2.0 ** -4, (low + high + 1) // 2 + 5, 2.0 ** -1
            weight_scales = (2.0 ** -rng.integers(6, 10, c_out)).astype(np.float32)
            bias = (rng.integers(-64, 64, c_out) * 2.0 ** -8).astype(np.float32)
            x = ((rng.integers(low, high + 1, shape) - zero_point) * x_scale).astype(np.float32)
        else:
            x_scale, zero_point = float(rng.uniform(0.01, 0.03)), int(rng.integers(low + 20, high - 20))
            weight_scales = rng.uniform(0.002, 0.01, c_out).astype(np.float32)
            bias = rng.standard_normal(c_out).astype(np.float32)
            out_scale = float(rng.uniform(0.05, 0.2))
            x = rng.uniform((low - zero_point) * x_scale, (high - zero_point) * x_scale, shape).astype(np.float32)
        weight = rng.integers(-128, 128, w_shape).astype(np.int8)
        value = builder.add_input(f"x{index}", TensorType.of(x.shape, dtypes.float32))
        inputs.append(x)
        arguments = [value]
        w, ws, b = (constant(f"w{index}", weight), constant(f"ws{index}", weight_scales),
                    constant(f"b{index}", bias))
        with builder:
            q = quantized.quantize_per_tensor.default(value, x_scale, zero_point, low, high, x_dtype)
            floats = quantized.dequantize_per_tensor.default(q, x_scale, zero_point, low, high, x_dtype)
            weights = quantized.dequantize_per_channel.default(w, ws, None, 0, -128, 127, dtypes.int8)
            y = kiln.ops.aten.conv2d.default(floats, weights, b, stride, padding, dilation, groups)
            other = None
            if residual:
                other = (rng.integers(-256, 256, y.type.shape) * 2.0 ** -8).astype(np.float32)
                other_value = builder.add_input(f"other{index}", TensorType.of(other.shape, dtypes.float32))
                inputs.append(other)
                arguments.append(other_value)
                y = kiln.ops.aten.add.Tensor(y, other_value)
            y = _post_op(y, post_op)
            if out_dtype is not dtypes.float32:
                qlow, qhigh = (0, 255) if out_dtype is dtypes.uint8 else (-128, 127)
                y = quantized.quantize_per_tensor.default(y, out_scale, 3, qlow, qhigh, out_dtype)
        outputs.append(y)
        params.append((x_scale, zero_point, weight, weight_scales, bias, stride, padding, dilation, groups, post_op,
                       out_dtype, (low, high, x_dtype)))
    return builder.build(outputs, constants=constants), inputs, params


@pytest.mark.parametrize("layers", ["linear", "conv2d"])
@pytest.mark.parametrize("capability", list(CAPABILITIES))
def test_integer_math_is_exact(capability, layers, monkeypatch, tmp_path):
    use_capability(capability, monkeypatch)
    build, op = (_program, "qlinear_pointwise") if layers == "linear" else (_conv_program, "qconv2d_pointwise")
    program, inputs, params = build(np.random.default_rng(0), dyadic=True)
    assert run(program, "lower-quantized").op_histogram()[f"quant.{op}.default"] == len(params)
    compiled = kiln.compile(program, output=tmp_path / "pkg")
    assert compiled.manifest["cpu_capability"] == capability
    for got, expected in zip(compiled(*inputs), program(*inputs)):
        assert got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("capability", ["AVX2", "AVX512_VNNI", "AVX512_AMX"])
def test_direct_convolutions_in_bands_of_one_row(capability, monkeypatch, tmp_path):
    """Direct convolutions copy their input in bands of output rows; with the band limit at its floor every band is
    one output row (its kernel's rows of input), and the results stay exact."""
    use_capability(capability, monkeypatch)
    monkeypatch.setattr(importlib.import_module("kiln.codegen.c.quantized"), "_DIRECT_BAND_BYTES", 1)
    program, inputs, params = _conv_program(np.random.default_rng(0), dyadic=True)
    compiled = kiln.compile(program, output=tmp_path / "pkg")
    assert "int64_t most = (1 / row_bytes" in (tmp_path / "pkg" / "model.c").read_text()
    for got, expected in zip(compiled(*inputs), program(*inputs)):
        np.testing.assert_array_equal(got, expected)


def test_narrow_kernels_where_the_range_is_proven():
    """Layers whose activations are quantized to 0..127 (reduce_range) are scheduled narrow; full 8-bit and int8
    activations, and uint8 values the program does not clamp, are not."""
    from kiln.codegen.c.target import TARGET
    from kiln.codegen.schedule import schedule
    from kiln.codegen.driver import DEFAULT_PIPELINE
    for build, activations in ((_program, [case[3] for case in CASES]),
                               (_conv_program, [case[6] for case in CONV_CASES])):
        program, _, _ = build(np.random.default_rng(0), dyadic=False)
        kernels = [k for k in schedule(run(program, DEFAULT_PIPELINE), TARGET).kernels
                   if k.kind in ("qlinear", "qconv")]
        assert [k.detail.narrow for k in kernels] == [kind == UINT7 for kind in activations]
    # a uint8 program input: no producer proves a range
    builder, constants, constant = _constants_builder()
    q = builder.add_input("q", TensorType.of([4, 8], dtypes.uint8))
    with builder:
        weights = quantized.dequantize_per_channel.default(
            constant("w", np.ones((3, 8), np.int8)), constant("s", np.ones(3, np.float32)), None, 0, -128, 127,
            dtypes.int8)
        y = kiln.ops.aten.linear.default(quantized.dequantize_per_tensor.default(q, 0.1, 0, 0, 127, dtypes.uint8),
                                         weights)
    kernels = schedule(run(builder.build([y], constants=constants), DEFAULT_PIPELINE), TARGET).kernels
    assert [k.detail.narrow for k in kernels if k.kind == "qlinear"] == [False]


@pytest.mark.parametrize("capability", list(CAPABILITIES))
def test_kernels_build_at_every_capability(capability, tmp_path):
    """The int8 kernels (narrow and wide, linear and convolution) compile for every capability, including those
    this CPU cannot run: an AVX2-only machine still checks that the AVX-512 paths build (their values are checked
    by the tests above on CPUs that run them)."""
    from kiln.codegen.c.build import build_library
    for index, build in enumerate((_program, _conv_program)):
        program, _, _ = build(np.random.default_rng(0), dyadic=False)
        kiln.compile(program, output=tmp_path / f"pkg{index}")
        source = (tmp_path / f"pkg{index}" / "model.c").read_text()
        assert build_library(source, capability).stat().st_size > 0


@pytest.mark.parametrize("capability", list(CAPABILITIES))
def test_requantized_within_one_step(capability, monkeypatch, tmp_path):
    use_capability(capability, monkeypatch)
    program, inputs, params = _program(np.random.default_rng(1), dyadic=False)
    compiled = kiln.compile(program, output=tmp_path / "pkg")
    for x, got, expected, (x_scale, zero_point, weight, weight_scales, bias, post_op, out_dtype, dynamic,
                           (low, high, x_dtype)) in zip(inputs, compiled(*inputs), program(*inputs), params):
        assert got.dtype == expected.dtype
        if out_dtype is not dtypes.float32:
            steps = np.abs(got.astype(np.int64) - expected.astype(np.int64))
            assert steps.max() <= 1, f"{steps.max()} quantization steps off"
            continue
        # float output: the float64 value of the integer math the reference describes
        if dynamic:
            scale, zp = (np.asarray(v) for v in quantized.choose_qparams.tensor(x, low, high, 2.0 ** -12, x_dtype))
            x_scale, zero_point = float(scale.item()), int(zp.item())
            q = quantized.quantize_per_tensor.tensor(x, scale, zp, low, high, x_dtype)
        else:
            q = quantized.quantize_per_tensor.default(x, x_scale, zero_point, low, high, x_dtype)
        floats = (np.asarray(q, np.float64) - zero_point) * np.float32(x_scale)
        expected64 = _post_op64(floats @ (weight.astype(np.float64) * weight_scales[:, None]).T + bias, post_op)
        assert_close(got, expected64.astype(np.float32))


@pytest.mark.parametrize("capability", list(CAPABILITIES))
def test_convolution_requantized_within_one_step(capability, monkeypatch, tmp_path):
    use_capability(capability, monkeypatch)
    program, inputs, params = _conv_program(np.random.default_rng(4), dyadic=False)
    compiled = kiln.compile(program, output=tmp_path / "pkg")
    feeds = iter(inputs)
    for case, got, expected, (x_scale, zero_point, weight, weight_scales, bias, stride, padding, dilation, groups,
                              post_op, out_dtype, (low, high, x_dtype)) in zip(CONV_CASES, compiled(*inputs),
                                                                                program(*inputs), params):
        x = next(feeds)
        if case[7]:
            next(feeds)  # its residual
        assert got.dtype == expected.dtype
        if out_dtype is not dtypes.float32:
            steps = np.abs(got.astype(np.int64) - expected.astype(np.int64))
            assert steps.max() <= 1, f"{steps.max()} quantization steps off"
            continue
        q = quantized.quantize_per_tensor.default(x, x_scale, zero_point, low, high, x_dtype)
        floats = (np.asarray(q, np.float64) - zero_point) * np.float32(x_scale)
        weights = weight.astype(np.float64) * weight_scales[:, None, None, None]
        expected64 = kiln.ops.aten.conv2d.default(floats, weights, bias.astype(np.float64), stride, padding,
                                                  dilation, groups)
        assert_close(got, np.asarray(expected64).astype(np.float32))


@pytest.mark.parametrize("padding", [0, 1])
def test_max_pool_runs_on_the_integers(padding, tmp_path):
    """quantize(max_pool2d(dequantize(x))) with shared qparams becomes a uint8 max pool: the same values, exactly."""
    builder = GraphBuilder()
    value = builder.add_input("x", TensorType.of([2, 3, 9, 8], dtypes.float32))
    with builder:
        q = quantized.quantize_per_tensor.default(value, 0.02, 128, 0, 255, dtypes.uint8)
        pooled = kiln.ops.aten.max_pool2d.default(
            quantized.dequantize_per_tensor.default(q, 0.02, 128, 0, 255, dtypes.uint8), [3, 3], [2, 2], [padding] * 2)
        result = quantized.quantize_per_tensor.default(pooled, 0.02, 128, 0, 255, dtypes.uint8)
    program = builder.build([result])
    lowered = run(program, "lower-quantized").op_histogram()
    assert lowered["aten.max_pool2d.default"] == 1 and lowered["quantized_decomposed.quantize_per_tensor.default"] == 1
    assert "quantized_decomposed.dequantize_per_tensor.default" not in lowered
    x = np.random.default_rng(5).uniform(-3, 3, (2, 3, 9, 8)).astype(np.float32)
    np.testing.assert_array_equal(kiln.compile(program, output=tmp_path / "pkg")(x), program(x))


def test_flatten_between_shared_qparams_moves_the_integers(tmp_path):
    """quantize(flatten(dequantize(x))) with the same qparams (a CNN's classifier input) is flatten(x), exactly."""
    builder = GraphBuilder()
    value = builder.add_input("x", TensorType.of([2, 6, 1, 1], dtypes.float32))
    with builder:
        q = quantized.quantize_per_tensor.default(value, 0.05, 3, 0, 255, dtypes.uint8)
        floats = quantized.dequantize_per_tensor.default(q, 0.05, 3, 0, 255, dtypes.uint8)
        again = quantized.quantize_per_tensor.default(kiln.ops.aten.flatten.using_ints(floats, 1), 0.05, 3, 0, 255,
                                                      dtypes.uint8)
        other = quantized.quantize_per_tensor.default(kiln.ops.aten.flatten.using_ints(floats, 1), 0.04, 3, 0, 255,
                                                      dtypes.uint8)  # other qparams: stays
    program = builder.build([again, other])
    lowered = run(program, "lower-quantized").op_histogram()
    assert lowered["quantized_decomposed.quantize_per_tensor.default"] == 2  # the input's, and the other one
    assert lowered["quantized_decomposed.dequantize_per_tensor.default"] == 1
    x = np.random.default_rng(9).uniform(-1, 10, (2, 6, 1, 1)).astype(np.float32)
    for got, expected in zip(kiln.compile(program, output=tmp_path / "pkg")(x), program(x)):
        np.testing.assert_array_equal(got, expected)


# (input shape, output size, dtype, (x scale, x zero point), (output scale, output zero point))
POOL_CASES = [((2, 5, 9, 7), [1, 1], dtypes.uint8, (0.02, 128), (0.02, 128)),  # global, shared qparams (X86)
              ((1, 3, 10, 6), [3, 4], dtypes.int8, (0.05, -4), (0.03, 7)),
              ((2, 4, 11, 13), [5, 3], dtypes.uint8, (0.013, 90), (0.011, 100))]


def average_pool_program(cases: list) -> tuple:
    """quantize(adaptive_avg_pool2d(dequantize(x))) per case, one program, and inputs spanning each dtype's range."""
    builder = GraphBuilder()
    inputs, outputs = [], []
    rng = np.random.default_rng(8)
    for index, (shape, size, dtype, (x_scale, x_zp), (out_scale, out_zp)) in enumerate(cases):
        low, high = (0, 255) if dtype is dtypes.uint8 else (-128, 127)
        inputs.append(rng.uniform((low - x_zp) * x_scale, (high - x_zp) * x_scale, shape).astype(np.float32))
        value = builder.add_input(f"x{index}", TensorType.of(shape, dtypes.float32))
        with builder:
            q = quantized.quantize_per_tensor.default(value, x_scale, x_zp, low, high, dtype)
            pooled = kiln.ops.aten.adaptive_avg_pool2d.default(
                quantized.dequantize_per_tensor.default(q, x_scale, x_zp, low, high, dtype), size)
            outputs.append(quantized.quantize_per_tensor.default(pooled, out_scale, out_zp, low, high, dtype))
    return builder.build(outputs), inputs


@pytest.mark.parametrize("capability", list(CAPABILITIES))
def test_average_pool_sums_the_integers(capability, monkeypatch, tmp_path):
    """quantize(adaptive_avg_pool2d(dequantize(x))) becomes quant.qadaptive_avg_pool2d: the integers summed per window,
    the mean requantized; within one step of the reference (which averages dequantized float32 values)."""
    use_capability(capability, monkeypatch)
    program, inputs = average_pool_program(POOL_CASES[:2])
    lowered = run(program, "lower-quantized")
    assert lowered.op_histogram()["quant.qadaptive_avg_pool2d.default"] == 2
    np.testing.assert_array_equal(lowered(*inputs)[0], program(*inputs)[0])
    for got, expected in zip(kiln.compile(program, output=tmp_path / "pkg")(*inputs), program(*inputs)):
        assert got.dtype == expected.dtype
        assert np.abs(got.astype(np.int64) - expected.astype(np.int64)).max() <= 1


@pytest.mark.parametrize("rows", [7, 40])
@pytest.mark.parametrize("capability", list(CAPABILITIES))
def test_weight_only_layers_match_the_reference(capability, rows, monkeypatch, tmp_path):
    """Weight-only int8 (per channel) and int4 (groups of 32 and 64, with zero points) linear layers: with few rows
    the kernel converts the weights in registers and sums each group's products before scaling them (the reference
    scales every weight first), with many it dequantizes panels as the reference does and runs the float32 GEMM;
    outputs within float32 tolerance of the reference."""
    use_capability(capability, monkeypatch)
    nn = kiln.nn
    kiln.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 37)).eval()
    program = kiln.export(model, (kiln.randn(rows, 64),))
    x = np.random.default_rng(7).standard_normal((rows, 64)).astype(np.float32)
    for index, quantizer in enumerate((kq.WeightOnlyQuantizer("int8"), kq.WeightOnlyQuantizer("int4", group_size=32),
                                       kq.WeightOnlyQuantizer("int4", group_size=64))):
        reference = kq.convert_pt2e(kq.prepare_pt2e(program, quantizer))
        lowered = run(reference, "lower-quantized")
        assert lowered.op_histogram()["quant.linear_weight_only.default"] == 2
        np.testing.assert_array_equal(lowered(x), reference(x))  # lowering changes no value
        compiled = kiln.compile(reference, output=tmp_path / f"pkg{index}")
        assert (tmp_path / f"pkg{index}" / "model.c").read_text().count("/* wlinear: ") == 2
        assert_close(compiled(x), reference(x))
        # int4 weights sit in the weights file two per byte
        quantized_weights = [w for w in compiled.manifest["weights"] if w["name"].startswith("quantized_weight")]
        assert len(quantized_weights) == 2
        for weight in quantized_weights:
            assert weight["bits"] == (8 if index == 0 else 4)
            assert weight["nbytes"] == np.prod(weight["shape"]) * weight["bits"] // 8


def test_rows_too_long_for_int32_stay_float():
    """A layer whose K could overflow the int32 sums (255 x 128 x K > 2^31 - 1) is left to the float path."""
    from kiln.passes.quant.lower import MAX_INTEGER_K
    rng = np.random.default_rng(8)
    for k, lowered in ((MAX_INTEGER_K, True), (MAX_INTEGER_K + 1, False)):
        batches = [rng.standard_normal((1, k)).astype(np.float32)]
        quantizer = kq.X86InductorQuantizer().set_global(kq.get_default_x86_inductor_quantization_config())
        counts = run(_calibrated(kiln.nn.Linear(k, 1).eval(), quantizer, batches), "lower-quantized").op_histogram()
        assert ("quant.qlinear_pointwise.default" in counts) == lowered
        assert ("aten.linear.default" in counts) != lowered


class _Residual(kiln.nn.Module):
    """conv → relu → max pool → conv → add → relu → linear: every pattern lower-quantized fuses."""

    def __init__(self):
        super().__init__()
        nn = kiln.nn
        self.stem, self.conv, self.pool = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1), nn.MaxPool2d(2)
        self.head = nn.Linear(8 * 4 * 4, 4)

    def forward(self, x):
        y = self.pool(kiln.nn.functional.relu(self.stem(x)))
        y = kiln.nn.functional.relu(self.conv(y) + y)
        return self.head(y.flatten(1))


@pytest.mark.parametrize("dynamic", [False, True])
def test_lowering_fuses_every_layer_and_changes_no_value(dynamic):
    rng = np.random.default_rng(6)
    batches = [rng.standard_normal((2, 3, 8, 8)).astype(np.float32) for _ in range(3)]
    quantizer = kq.X86InductorQuantizer().set_global(
        kq.get_default_x86_inductor_quantization_config(is_dynamic=dynamic))
    reference = _calibrated(_Residual().eval(), quantizer, batches)
    lowered = run(reference, "lower-quantized")
    counts = lowered.op_histogram()
    overload = "tensor" if dynamic else "default"
    assert counts[f"quant.qconv2d_pointwise.{overload}"] == 2 and counts[f"quant.qlinear_pointwise.{overload}"] == 1
    assert not {"aten.conv2d.default", "aten.linear.default", "aten.relu.default", "aten.add.Tensor"} & set(counts)
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    np.testing.assert_array_equal(lowered(x), reference(x))


class _ReshapedFFN(kiln.nn.Module):
    """Linear → GELU → Linear with the activation on [1, tokens, features], as Hugging Face's GPT-2 MLP has it."""

    def __init__(self, approximate: str):
        super().__init__()
        self.up, self.down = kiln.nn.Linear(32, 64), kiln.nn.Linear(64, 16)
        self.act = kiln.nn.GELU(approximate=approximate)

    def forward(self, x):
        hidden = self.act(self.up(x).view(1, x.shape[0], 64))
        return self.down(hidden.view(-1, 64))


@pytest.mark.parametrize("reshaped", [False, True])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dynamic", [False, True])
def test_gelu_fuses_into_the_layer_before_it(dynamic, approximate, reshaped):
    """Linear → GELU → quantize (a transformer's FFN under the X86 recipe, which leaves GELU in float) is one integer
    op with a gelu post-op, reshapes around the GELU included: its uint8 output (static) or float output (dynamic)
    comes straight from the tile."""
    nn = kiln.nn
    rng = np.random.default_rng(7)
    model = _ReshapedFFN(approximate) if reshaped else \
        nn.Sequential(nn.Linear(32, 64), nn.GELU(approximate=approximate), nn.Linear(64, 16))
    model.eval()
    batches = [rng.standard_normal((8, 32)).astype(np.float32) for _ in range(3)]
    reference = _calibrated(model, kq.X86InductorQuantizer().set_global(
        kq.get_default_x86_inductor_quantization_config(is_dynamic=dynamic)), batches)
    lowered = run(reference, "lower-quantized")
    layers = [op for op in lowered.nodes() if op.name.startswith("quant.qlinear_pointwise")]
    post_ops = [bound_arguments(op)[-1] for op in layers]
    assert post_ops == ["gelu_tanh" if approximate == "tanh" else "gelu", "none"]
    assert "aten.gelu.default" not in lowered.op_histogram()
    x = rng.standard_normal((8, 32)).astype(np.float32)
    np.testing.assert_array_equal(lowered(x), reference(x))


def _calibrated(model, quantizer, batches):
    program = kiln.export(model, (kiln.tensor(batches[0]),))
    prepared = kq.prepare_pt2e(program, quantizer)
    for batch in batches:
        prepared(batch)
    return kq.convert_pt2e(prepared)


@pytest.mark.parametrize("scheme", ["x86-static", "x86-dynamic", "xnnpack", "xnnpack-dynamic"])
def test_quantized_mlp_compiles_to_int8_kernels(scheme, tmp_path):
    """A PT2E-quantized MLP: every linear layer becomes an int8 kernel; the output stays within what one
    quantization step of each hidden activation can move it."""
    reference, rng = quantized_mlp(scheme)
    lowered = run(reference, "lower-quantized").op_histogram()
    assert sum(count for name, count in lowered.items() if name.startswith("quant.qlinear_pointwise")) == 2
    assert "aten.linear.default" not in lowered
    compiled = kiln.compile(reference, output=tmp_path / "pkg")
    assert "kiln_qukernel(" in (tmp_path / "pkg" / "model.c").read_text()
    x = rng.standard_normal((16, 48)).astype(np.float32)
    assert_within_a_hidden_step(compiled(x), reference, x)


def quantized_mlp(scheme: str) -> tuple:
    """A PT2E-quantized MLP 48 -> 96 -> 10 under `scheme` (x86-static, x86-dynamic, xnnpack, xnnpack-dynamic),
    calibrated on four batches of 16; and the generator that drew them, for the inputs."""
    nn = kiln.nn
    rng = np.random.default_rng(2)
    model = nn.Sequential(nn.Linear(48, 96), nn.ReLU(), nn.Linear(96, 10)).eval()
    if scheme.startswith("xnnpack"):  # int8 activations
        quantizer = kq.XNNPACKQuantizer().set_global(
            kq.get_symmetric_quantization_config(is_dynamic=scheme == "xnnpack-dynamic"))
    else:
        quantizer = kq.X86InductorQuantizer().set_global(
            kq.get_default_x86_inductor_quantization_config(is_dynamic=scheme == "x86-dynamic"))
    batches = [rng.standard_normal((16, 48)).astype(np.float32) for _ in range(4)]
    return _calibrated(model, quantizer, batches), rng


def assert_within_a_hidden_step(got, reference, x) -> None:
    """One step of the hidden activations' scale in each of an output's 96 inputs moves it by at most
    hidden_scale * sum_k |W2[n, k]| (dequantized); float32 rounding of the output adds the default atol."""
    expected = reference(x)
    weight = next(np.asarray(v, np.float64) for k, v in sorted(reference.constants.items())
                  if k.startswith("quantized_weight") and np.shape(v) == (10, 96))
    scales = next(np.asarray(v, np.float64) for k, v in sorted(reference.constants.items())
                  if k.startswith("weight_scale") and np.shape(v) == (10,))
    bound = _hidden_scale(reference, x) * np.abs(weight * scales[:, None]).sum(axis=1).max()
    assert np.abs(got - expected).max() <= bound * (1 + 1e-6) + 1e-5


def _hidden_scale(program, x) -> float:
    """The scale the [16, 96] hidden activations are quantized with: a constant, or what choose_qparams picks at
    run time (the dynamic scheme)."""
    chosen = []

    def watch(value, array):
        op = value.owner
        if (getattr(op, "name", "") == "quantized_decomposed.choose_qparams.tensor" and value is op.results[0]
                and list(op.operands[0].type.shape) == [16, 96]):
            chosen.append(float(np.asarray(array).item()))
    with watching(watch):
        program(x)
    if chosen:
        return chosen[0]
    dequantize = next(op for op in program.nodes() if op.name.startswith("quantized_decomposed.dequantize_per_tensor")
                      and list(op.operands[0].type.shape) == [16, 96])
    return float(bound_arguments(dequantize)[1])


# (rows, K, N, post-op, bias): activations quantized per token (one scale and zero point per row), as torchao's and
# ExecuTorch's 8da recipes do; tails in K, N and M, batched rows, a row of constants (its scale clamps to eps).
TOKEN_CASES = [((9,), 30, 20, "none", True), ((2, 5), 67, 35, "relu", False), ((33,), 128, 64, "gelu", True),
               ((70,), 200, 40, "none", True)]


def per_token_program(rng: np.random.Generator):
    """One program with a per-token dynamically quantized linear layer per TOKEN_CASES entry; returns it, the
    inputs and each case's (weight, weight scales, bias, post-op)."""
    builder, constants, constant = _constants_builder()
    inputs, outputs, params = [], [], []
    for index, (rows, k, n, post_op, has_bias) in enumerate(TOKEN_CASES):
        x = (rng.standard_normal((*rows, k)) * rng.uniform(0.1, 3.0, (*rows, 1))).astype(np.float32)
        x.reshape(-1, k)[0] = 0.5  # a constant row
        weight = rng.integers(-128, 128, (n, k)).astype(np.int8)
        weight_scales = rng.uniform(0.002, 0.02, n).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32) if has_bias else None
        inputs.append(x)
        value = builder.add_input(f"x{index}", TensorType.of(x.shape, dtypes.float32))
        w, ws = constant(f"w{index}", weight), constant(f"ws{index}", weight_scales)
        b = constant(f"b{index}", bias) if has_bias else None
        with builder:
            scale, zp = quantized.choose_qparams_per_token_asymmetric.default(value, dtypes.int8)
            q = quantized.quantize_per_token.default(value, scale, zp, -128, 127, dtypes.int8)
            floats = quantized.dequantize_per_token.default(q, scale, zp, -128, 127, dtypes.int8, dtypes.float32)
            outputs.append(_post_op(kiln.ops.aten.linear.default(
                floats, quantized.dequantize_per_channel.default(w, ws, None, 0, -128, 127, dtypes.int8), b), post_op))
        params.append((weight, weight_scales, bias, post_op))
    return builder.build(outputs, constants=constants), inputs, params


def per_token_expected(x: np.ndarray, weight, weight_scales, bias, post_op) -> np.ndarray:
    """The float64 value of the integer math a per-token layer describes (its activations as the reference
    quantizes them)."""
    scale, zp = (np.asarray(v) for v in quantized.choose_qparams_per_token_asymmetric.default(x, dtypes.int8))
    q = np.asarray(quantized.quantize_per_token.default(x, scale, zp, -128, 127, dtypes.int8), np.float64)
    floats = (q - zp) * scale.astype(np.float32)
    product = floats @ (weight.astype(np.float64) * weight_scales[:, None]).T
    return _post_op64(product + (bias if bias is not None else 0.0), post_op).astype(np.float32)


@pytest.mark.parametrize("capability", list(CAPABILITIES))
def test_per_token_layers_run_as_integer_kernels(capability, monkeypatch, tmp_path):
    """A linear layer whose activations are quantized per token lowers to quant.qlinear_pointwise.token, which C
    runs as an integer kernel with each row's scale and zero point in its epilogue: its float output is the
    float64 value of the same integers within float32 tolerance, as the per-tensor layers' is."""
    use_capability(capability, monkeypatch)
    program, inputs, params = per_token_program(np.random.default_rng(7))
    lowered = run(program, "lower-quantized").op_histogram()
    assert lowered.get("quant.qlinear_pointwise.token") == len(TOKEN_CASES), lowered
    assert "quantized_decomposed.dequantize_per_token.default" not in lowered
    compiled = kiln.compile(program, output=tmp_path / "pkg")
    source = (tmp_path / "pkg" / "model.c").read_text()
    assert source.count("row_scale = (float)") == len(TOKEN_CASES)
    for x, got, case in zip(inputs, compiled(*inputs), params):
        assert_close(got, per_token_expected(x, *case))
