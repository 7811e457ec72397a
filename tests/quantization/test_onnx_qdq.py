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


def _weight_only_int4(group_size: int):
    kiln.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64)).eval()  # 8 KB int8 weights
    program = kiln.export(model, (kiln.randn(8, 64),))
    return kq.convert_pt2e(kq.prepare_pt2e(program, kq.WeightOnlyQuantizer("int4", group_size=group_size)))


def _float32_session(model_proto, optimized_path):
    """onnxruntime's MatMulNBits at accuracy level 0: float32 activations, as the program computes."""
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(optimized_path)
    options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    return ort.InferenceSession(model_proto.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _initializers(model_proto):
    return {tensor.name: tensor for tensor in model_proto.graph.initializer}


@pytest.mark.parametrize("group_size", [32, 64])
@pytest.mark.parametrize("opset", [21, 23])
def test_int4_weights_are_int4_initializers_onnxruntime_runs_as_matmulnbits(group_size, opset, tmp_path):
    """From opset 21 a 4-bit group-wise weight is an INT4 initializer [K, N] (two values per byte) read by a blocked
    DequantizeLinear along K, then MatMul: onnxruntime fuses the pair into MatMulNBits, and in float32 it computes
    what kiln's reference program does."""
    import torch
    program = _weight_only_int4(group_size)
    x = np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32)
    model_proto = kiln.onnx.export(program, (x,), opset_version=opset).model_proto
    onnx.checker.check_model(model_proto, full_check=True)
    dequantizes = [node for node in model_proto.graph.node if node.op_type == "DequantizeLinear"]
    assert len(dequantizes) == 2
    for node, (k, n) in zip(dequantizes, [(64, 128), (128, 64)]):
        attributes = {a.name: a.i for a in node.attribute}
        assert attributes == {"axis": 0, "block_size": group_size}
        weight, scales = (_initializers(model_proto)[name] for name in node.input[:2])
        assert weight.data_type == onnx.TensorProto.INT4 and list(weight.dims) == [k, n]
        assert len(weight.raw_data) == k * n // 2
        assert list(scales.dims) == [k // group_size, n] and len(node.input) == 2  # symmetric: no zero point
    float_weights = [t for t in model_proto.graph.initializer if t.data_type == onnx.TensorProto.FLOAT and
                     len(t.dims) == 2 and t.dims[0] * t.dims[1] >= 64 * 32]
    assert not float_weights, "a weight was written as float32"
    session = _float32_session(model_proto, tmp_path / "optimized.onnx")
    (got,) = session.run(None, {session.get_inputs()[0].name: x})
    fused = [node.op_type for node in onnx.load(tmp_path / "optimized.onnx").graph.node]
    assert fused.count("MatMulNBits") == 2, fused
    torch.testing.assert_close(torch.from_numpy(got), torch.from_numpy(np.asarray(program(x))))


def test_int4_weights_before_opset_21_stay_int8_and_dequantize_in_the_graph():
    """Opset 20 has no 4-bit type: the weight stays the program's int8 initializer (neither folded to float32 nor
    widened to int64 for the subtraction), and the graph computes torch's (w - zero) * scale per group."""
    import torch
    program = _weight_only_int4(32)
    x = np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32)
    model_proto = kiln.onnx.export(program, (x,), opset_version=20).model_proto
    onnx.checker.check_model(model_proto, full_check=True)
    weights = sorted(tuple(t.dims) for t in model_proto.graph.initializer if len(t.dims) == 2 and
                     t.data_type == onnx.TensorProto.INT8)
    assert weights == [(64, 128), (128, 64)]
    assert "DequantizeLinear" not in {node.op_type for node in model_proto.graph.node}
    (got,) = _session(model_proto).run(None, {"input": x})
    torch.testing.assert_close(torch.from_numpy(got), torch.from_numpy(np.asarray(program(x))))


def test_uint4_weights_with_zero_points(tmp_path):
    """uint8 storage in 0..15 with per-group zero points (asymmetric 4-bit) is a UINT4 weight and a UINT4 zero point."""
    import torch
    from kiln.ir.program import GraphBuilder
    from kiln.ir.types import TensorType
    qd = kiln.ops.quantized_decomposed
    rng = np.random.default_rng(3)
    n, k, group = 48, 64, 16
    weight = rng.integers(0, 16, (n, k)).astype(np.uint8)
    scales = rng.uniform(0.01, 0.05, (n, k // group)).astype(np.float32)
    zeros = rng.integers(0, 16, (n, k // group)).astype(np.int32)
    bias = rng.standard_normal(n).astype(np.float32)
    builder = GraphBuilder()
    x = builder.add_input("x", TensorType.of([5, k], "f32"))
    w, s, z, b = (builder.add_input(name, TensorType.of(list(array.shape), dtype), kiln.InputKind.CONSTANT_TENSOR,
                                    name)
                  for name, array, dtype in [("w", weight, "ui8"), ("s", scales, "f32"), ("z", zeros, "i32"),
                                             ("b", bias, "f32")])
    with builder:
        dequantized = qd.dequantize_per_channel_group.default(w, s, z, 0, 15, kiln.uint8, group, kiln.float32)
        out = kiln.ops.aten.linear.default(x, dequantized, b)
    program = builder.build([out], constants={"w": weight, "s": scales, "z": zeros, "b": bias})
    inputs = rng.standard_normal((5, k)).astype(np.float32)
    model_proto = kiln.onnx.export(program, (inputs,), opset_version=21).model_proto
    onnx.checker.check_model(model_proto, full_check=True)
    (node,) = [node for node in model_proto.graph.node if node.op_type == "DequantizeLinear"]
    stored = [_initializers(model_proto)[name] for name in node.input]
    assert [t.data_type for t in stored] == [onnx.TensorProto.UINT4, onnx.TensorProto.FLOAT, onnx.TensorProto.UINT4]
    assert onnx.numpy_helper.to_array(stored[2]).astype(np.int32).tolist() == zeros.T.tolist()
    session = _float32_session(model_proto, tmp_path / "optimized.onnx")
    (got,) = session.run(None, {session.get_inputs()[0].name: inputs})
    assert "MatMulNBits" in [node.op_type for node in onnx.load(tmp_path / "optimized.onnx").graph.node]
    torch.testing.assert_close(torch.from_numpy(got), torch.from_numpy(np.asarray(program(inputs))))
