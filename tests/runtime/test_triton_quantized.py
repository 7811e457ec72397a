"""The Triton backend's integer kernels (kiln/codegen/triton/quantized.py) against the reference Q/DQ program, with
the C backend's test programs (tests/quantization/test_c_int8.py) and PT2E-quantized models.

Where the math is integer (power-of-two scales) the compiled program equals the interpreter's bit for bit; with
realistic scales requantized outputs are within one quantization step of the reference and float outputs within
float32 tolerance of the float64 value of the same integers, as for the C backend.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")  # tests/conftest.py sets it before triton's first import
pytest.importorskip("torch")
pytest.importorskip("triton")

import kiln  # noqa: E402
from kiln import quantization as kq  # noqa: E402
from kiln.compiler import compile as compile_program  # noqa: E402
from kiln.ir import dtypes  # noqa: E402
from kiln.ir.errors import UnsupportedError  # noqa: E402
from kiln.ir.program import GraphBuilder  # noqa: E402
from kiln.ir.types import TensorType  # noqa: E402
from kiln.testing import assert_close  # noqa: E402
from tests.quantization.test_c_int8 import (  # noqa: E402
    CONV_CASES, POOL_CASES, TOKEN_CASES, _calibrated, _conv_program, _post_op64, _program, _Residual,
    assert_within_a_hidden_step, average_pool_program, per_token_expected, per_token_program, quantized_mlp,
)

quantized = kiln.ops.quantized_decomposed


def _compile(program, path):
    return compile_program(program, target="triton", output=path)


def _kernel_kinds(path) -> list[str]:
    """The integer kernels model.py holds, by kind (its `# kind: ops` comments)."""
    return [line.split(":")[0][2:] for line in (path / "model.py").read_text().splitlines()
            if line.startswith(("# qlinear:", "# qconv:", "# wlinear:", "# qpool:"))]


@pytest.mark.parametrize("layers", ["linear", "conv2d"])
def test_integer_math_is_exact(layers, tmp_path):
    build, kind = (_program, "qlinear") if layers == "linear" else (_conv_program, "qconv")
    program, inputs, params = build(np.random.default_rng(0), dyadic=True)
    compiled = _compile(program, tmp_path / "pkg")
    assert _kernel_kinds(tmp_path / "pkg") == [kind] * len(params)
    for got, expected in zip(compiled(*inputs), program(*inputs)):
        assert got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected)


def test_linear_requantized_within_one_step(tmp_path):
    program, inputs, params = _program(np.random.default_rng(1), dyadic=False)
    compiled = _compile(program, tmp_path / "pkg")
    for x, got, expected, (x_scale, zero_point, weight, weight_scales, bias, post_op, out_dtype, dynamic,
                           (low, high, x_dtype)) in zip(inputs, compiled(*inputs), program(*inputs), params):
        assert got.dtype == expected.dtype
        if out_dtype is not dtypes.float32:
            assert np.abs(got.astype(np.int64) - expected.astype(np.int64)).max() <= 1
            continue
        if dynamic:  # the qparams choose_qparams picks at run time
            scale, zp = (np.asarray(v) for v in quantized.choose_qparams.tensor(x, low, high, 2.0 ** -12, x_dtype))
            x_scale, zero_point = float(scale.item()), int(zp.item())
            q = quantized.quantize_per_tensor.tensor(x, scale, zp, low, high, x_dtype)
        else:
            q = quantized.quantize_per_tensor.default(x, x_scale, zero_point, low, high, x_dtype)
        floats = (np.asarray(q, np.float64) - zero_point) * np.float32(x_scale)
        expected64 = _post_op64(floats @ (weight.astype(np.float64) * weight_scales[:, None]).T + bias, post_op)
        assert_close(got, expected64.astype(np.float32))


def test_per_token_layers(tmp_path):
    """Layers whose activations are quantized per token run as qlinear kernels with a scale and zero point per
    tile row; their float outputs are the float64 value of the same integers within float32 tolerance."""
    program, inputs, params = per_token_program(np.random.default_rng(7))
    compiled = _compile(program, tmp_path / "pkg")
    assert _kernel_kinds(tmp_path / "pkg") == ["qlinear"] * len(TOKEN_CASES)
    for x, got, case in zip(inputs, compiled(*inputs), params):
        assert_close(got, per_token_expected(x, *case))


def test_convolution_requantized_within_one_step(tmp_path):
    program, inputs, params = _conv_program(np.random.default_rng(4), dyadic=False)
    compiled = _compile(program, tmp_path / "pkg")
    feeds = iter(inputs)
    for case, got, expected, (x_scale, zero_point, weight, weight_scales, bias, stride, padding, dilation, groups,
                              post_op, out_dtype, (low, high, x_dtype)) in zip(CONV_CASES, compiled(*inputs),
                                                                                program(*inputs), params):
        x = next(feeds)
        if case[7]:
            next(feeds)  # its residual
        assert got.dtype == expected.dtype
        if out_dtype is not dtypes.float32:
            assert np.abs(got.astype(np.int64) - expected.astype(np.int64)).max() <= 1
            continue
        q = quantized.quantize_per_tensor.default(x, x_scale, zero_point, low, high, x_dtype)
        floats = (np.asarray(q, np.float64) - zero_point) * np.float32(x_scale)
        weights = weight.astype(np.float64) * weight_scales[:, None, None, None]
        expected64 = kiln.ops.aten.conv2d.default(floats, weights, bias.astype(np.float64), stride, padding,
                                                  dilation, groups)
        assert_close(got, np.asarray(expected64).astype(np.float32))


def test_average_pool_matches_the_reference(tmp_path):
    """quant.qadaptive_avg_pool2d dequantizes and averages as the reference does (float32 values, float64 means),
    so its requantized output is the reference's, uneven windows included."""
    program, inputs = average_pool_program(POOL_CASES)
    compiled = _compile(program, tmp_path / "pkg")
    assert _kernel_kinds(tmp_path / "pkg") == ["qpool"] * len(POOL_CASES)
    for got, expected in zip(compiled(*inputs), program(*inputs)):
        assert got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("rows", [7, 40])
def test_weight_only_layers_match_the_reference(rows, tmp_path):
    """Weight-only int8 (per channel) and int4 (groups of 32 and 64, with zero points) linear layers: each weight
    dequantized as the reference does, then a float32 GEMM; within float32 tolerance of the reference."""
    nn = kiln.nn
    kiln.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 37)).eval()
    program = kiln.export(model, (kiln.randn(rows, 64),))
    x = np.random.default_rng(7).standard_normal((rows, 64)).astype(np.float32)
    for index, quantizer in enumerate((kq.WeightOnlyQuantizer("int8"), kq.WeightOnlyQuantizer("int4", group_size=32),
                                       kq.WeightOnlyQuantizer("int4", group_size=64))):
        reference = kq.convert_pt2e(kq.prepare_pt2e(program, quantizer))
        compiled = _compile(reference, tmp_path / f"pkg{index}")
        assert _kernel_kinds(tmp_path / f"pkg{index}") == ["wlinear"] * 2
        assert_close(compiled(x), reference(x))


@pytest.mark.parametrize("scheme", ["x86-static", "x86-dynamic", "xnnpack", "xnnpack-dynamic"])
def test_quantized_mlp_compiles_to_int8_kernels(scheme, tmp_path):
    """A PT2E-quantized MLP: every linear layer becomes an int8 kernel; the output stays within what one
    quantization step of each hidden activation can move it (as tests/quantization/test_c_int8.py bounds C's)."""
    reference, rng = quantized_mlp(scheme)
    compiled = _compile(reference, tmp_path / "pkg")
    assert _kernel_kinds(tmp_path / "pkg") == ["qlinear"] * 2
    x = rng.standard_normal((16, 48)).astype(np.float32)
    assert_within_a_hidden_step(compiled(x), reference, x)


@pytest.mark.parametrize("dynamic", [False, True])
def test_quantized_cnn_matches_the_lowered_reference(dynamic, tmp_path):
    """A PT2E-quantized residual CNN (X86 recipe: conv → relu → max pool → conv → add → relu → linear): every layer
    runs as an integer kernel; its hidden activations requantize to the reference's values, so the float output is
    the reference's within float32 tolerance."""
    rng = np.random.default_rng(6)
    batches = [rng.standard_normal((2, 3, 8, 8)).astype(np.float32) for _ in range(3)]
    quantizer = kq.X86InductorQuantizer().set_global(
        kq.get_default_x86_inductor_quantization_config(is_dynamic=dynamic))
    reference = _calibrated(_Residual().eval(), quantizer, batches)
    compiled = _compile(reference, tmp_path / "pkg")
    assert sorted(_kernel_kinds(tmp_path / "pkg")) == ["qconv", "qconv", "qlinear"]
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    assert_close(compiled(x), reference(x))


def test_padded_convolution_refuses_a_zero_point_outside_the_bytes(tmp_path):
    """The im2col tile pads with the activations' zero point as one of their bytes: a padded convolution whose zero
    point is no uint8 value is refused with that reason (an unpadded one, or one inside the range, compiles)."""
    def program(zero_point: int, padding: int):
        builder = GraphBuilder()
        x = builder.add_input("x", TensorType.of([1, 2, 5, 5], dtypes.uint8))
        w = builder.add_input("w", TensorType.of([3, 2, 3, 3], dtypes.int8))
        s = builder.add_input("s", TensorType.of([3], dtypes.float32))
        with builder:
            y = kiln.ops.quant.qconv2d_pointwise.default(x, 0.05, zero_point, w, s, None, [1, 1], [padding] * 2,
                                                         [1, 1], 1, None, 1.0, 0, 0, 0, dtypes.float32, "none")
        return builder.build([y])
    with pytest.raises(UnsupportedError, match="zero point 300 lies outside"):
        _compile(program(300, 1), tmp_path / "refused")
    rng = np.random.default_rng(3)
    inputs = (rng.integers(0, 256, (1, 2, 5, 5)).astype(np.uint8),
              rng.integers(-128, 128, (3, 2, 3, 3)).astype(np.int8), rng.uniform(0.002, 0.02, 3).astype(np.float32))
    for zero_point, padding in ((300, 0), (100, 1)):
        reference = program(zero_point, padding)
        assert_close(_compile(reference, tmp_path / f"pkg{zero_point}")(*inputs), reference(*inputs))
