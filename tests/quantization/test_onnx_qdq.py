"""Quantized programs as ONNX QDQ: onnx.checker accepts them, onnxruntime fuses the static ones into its int8
kernels, and its results agree with kiln's reference quantized program."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import kiln
import kiln.nn as nn
from kiln import quantization as kq
from tests.quantization.support import ORT_U8S8_SATURATES
from tests.quantization.test_pt2e import assert_quantized_close


def _quantized_cnn(dynamic: bool, reduce_range: bool = False):
    kiln.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 4 * 4, 16),
                          nn.ReLU(), nn.Linear(16, 4)).eval()
    program = kiln.export(model, (kiln.randn(16, 3, 10, 10),))
    config = kq.get_default_x86_inductor_quantization_config(is_dynamic=dynamic, reduce_range=reduce_range)
    prepared = kq.prepare_pt2e(program, kq.X86InductorQuantizer().set_global(config))
    rng = np.random.default_rng(0)
    for _ in range(3):
        prepared(rng.standard_normal((16, 3, 10, 10)).astype(np.float32))
    return kq.convert_pt2e(prepared)


def _session(model_proto, optimized_path=None):
    options = ort.SessionOptions()
    if optimized_path is not None:
        options.optimized_model_filepath = str(optimized_path)
    return ort.InferenceSession(model_proto.SerializeToString(), options, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("dynamic,reduce_range", [(False, False), (False, True), (True, False)],
                         ids=["static", "static-reduce_range", "dynamic"])
def test_qdq_model_runs_in_onnxruntime_like_kiln(dynamic, reduce_range, tmp_path):
    program = _quantized_cnn(dynamic, reduce_range or ORT_U8S8_SATURATES and not dynamic)
    x = np.random.default_rng(1).standard_normal((16, 3, 10, 10)).astype(np.float32)
    model_proto = kiln.onnx.export(program, (x,)).model_proto
    onnx.checker.check_model(model_proto, full_check=True)
    kinds = [node.op_type for node in model_proto.graph.node]
    histogram = program.op_histogram()
    # a dynamic quantize is DynamicQuantizeLinear (choose_qparams and quantize in one, as onnxruntime writes it)
    quantizer = "DynamicQuantizeLinear" if dynamic else "QuantizeLinear"
    assert kinds.count(quantizer) == histogram.get("quantized_decomposed.quantize_per_tensor.default", 0) + \
        histogram.get("quantized_decomposed.quantize_per_tensor.tensor", 0)
    dequantizes = sum(count for name, count in histogram.items() if "dequantize" in name)
    linear_layers = histogram["aten.linear.default"]
    if dynamic:  # a dynamic linear layer is MatMulInteger on its two integer inputs: no DequantizeLinear
        assert kinds.count("MatMulInteger") == linear_layers
        dequantizes -= 2 * linear_layers
    assert kinds.count("DequantizeLinear") == dequantizes
    if dynamic and ORT_U8S8_SATURATES:  # 7-bit dynamic activations are not DynamicQuantizeLinear's: no oracle here
        pytest.skip("onnxruntime's dynamic uint8 x int8 kernels saturate on this CPU (no VNNI)")
    session = _session(model_proto, tmp_path / "optimized.onnx")
    (got,) = session.run(None, {session.get_inputs()[0].name: x})
    assert_quantized_close(got, program(x))
    fused = [node.op_type for node in onnx.load(tmp_path / "optimized.onnx").graph.node]
    if dynamic:  # onnxruntime's integer kernels: DynamicQuantizeLinear + MatMulInteger + scaling in one
        assert fused.count("DynamicQuantizeMatMul") == linear_layers, fused
    elif not reduce_range:  # the QDQ pairs around conv and linear become int8 kernels
        assert {"QLinearConv", "QGemm"} <= set(fused), fused


def test_quantize_ops_lower_to_quantizelinear_with_per_axis_scales():
    """A per-channel quantize/dequantize pair of a weight lowers to QuantizeLinear/DequantizeLinear with axis."""
    from kiln.ir.program import GraphBuilder
    from kiln.ir.types import TensorType
    qd = kiln.ops.quantized_decomposed
    rng = np.random.default_rng(2)
    scales = rng.uniform(0.01, 0.05, 6).astype(np.float32)
    zeros = np.zeros(6, np.int64)
    builder = GraphBuilder()
    w = builder.add_input("w", TensorType.of([6, 5], "f32"))
    program_inputs = [rng.standard_normal((6, 5)).astype(np.float32)]
    s = builder.add_input("scales", TensorType.of([6], "f32"), kiln.InputKind.CONSTANT_TENSOR, "scales")
    z = builder.add_input("zeros", TensorType.of([6], "i64"), kiln.InputKind.CONSTANT_TENSOR, "zeros")
    with builder:
        quantized = qd.quantize_per_channel.default(w, s, z, 0, -128, 127, kiln.int8)
        out = qd.dequantize_per_channel.default(quantized, s, z, 0, -128, 127, kiln.int8)
    program = builder.build([out], constants={"scales": scales, "zeros": zeros})
    model_proto = kiln.onnx.export(program, tuple(program_inputs)).model_proto
    nodes = {node.op_type: node for node in model_proto.graph.node}
    assert "QuantizeLinear" in nodes and "DequantizeLinear" in nodes
    assert any(a.name == "axis" and a.i == 0 for a in nodes["QuantizeLinear"].attribute)
    session = _session(model_proto)
    (got,) = session.run(None, {session.get_inputs()[0].name: program_inputs[0]})
    expected = program(*program_inputs)
    steps = np.abs(np.round((got - expected) / scales[:, None]))
    assert steps.max() <= 1  # QuantizeLinear divides where torch multiplies by the reciprocal: ties may differ


def test_int32_bias_lets_onnxruntime_fuse_linear_layers(tmp_path):
    """With int32 biases (on the input scale × weight scale grid) onnxruntime fuses each dequantize → linear into
    QGemm; kiln's reference program with int32 biases stays within float32 tolerance of onnxruntime."""
    kiln.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 16)).eval()
    program = kiln.export(model, (kiln.randn(8, 64),))
    rng = np.random.default_rng(0)
    batches = [rng.standard_normal((8, 64)).astype(np.float32) for _ in range(3)]
    results = {}
    for int32_bias in (False, True):
        config = kq.get_default_x86_inductor_quantization_config(int32_bias=int32_bias,
                                                                 reduce_range=ORT_U8S8_SATURATES)
        prepared = kq.prepare_pt2e(program, kq.X86InductorQuantizer().set_global(config))
        for batch in batches:
            prepared(batch)
        results[int32_bias] = kq.convert_pt2e(prepared)
    quantized = results[True]
    assert quantized.op_histogram()["quantized_decomposed.dequantize_per_channel.default"] == 4  # 2 weights, 2 biases
    x = batches[0]
    # the int32 grid moves each bias by at most half a step of input scale × weight scale
    assert_quantized_close(quantized(x), results[False](x))
    model_proto = kiln.onnx.export(quantized, (x,)).model_proto
    onnx.checker.check_model(model_proto, full_check=True)
    session = _session(model_proto, tmp_path / "optimized.onnx")
    (got,) = session.run(None, {session.get_inputs()[0].name: x})
    fused = [node.op_type for node in onnx.load(tmp_path / "optimized.onnx").graph.node]
    assert fused.count("QGemm") == 2, fused
    assert_quantized_close(got, quantized(x))


def test_int32_bias_needs_calibration():
    kiln.manual_seed(0)
    program = kiln.export(nn.Sequential(nn.Linear(8, 4)).eval(), (kiln.randn(2, 8),))
    config = kq.get_default_x86_inductor_quantization_config(int32_bias=True)
    prepared = kq.prepare_pt2e(program, kq.X86InductorQuantizer().set_global(config))
    with pytest.raises(kiln.KilnError, match="calibrate"):
        kq.convert_pt2e(prepared)
