"""The per-layer report (against SQNR computed by hand) and `kiln quantize`."""

from __future__ import annotations

import math

import numpy as np
import onnxruntime as ort
import pytest

import kiln
import kiln.nn as nn
from kiln import quantization as kq
from kiln.cli.main import main


def _sqnr(reference: np.ndarray, actual: np.ndarray) -> float:
    reference, actual = reference.astype(np.float64), actual.astype(np.float64)
    return 10 * math.log10(np.sum(reference ** 2) / np.sum((actual - reference) ** 2))


@pytest.fixture(scope="module")
def mlp():
    kiln.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)).eval()
    program = kiln.export(model, (kiln.randn(16, 32),))
    rng = np.random.default_rng(0)
    data = [rng.standard_normal((16, 32)).astype(np.float32) for _ in range(4)]
    return program, data


def _static(program, data, quantizer=None):
    quantizer = quantizer or kq.X86InductorQuantizer().set_global(kq.get_default_x86_inductor_quantization_config())
    prepared = kq.prepare_pt2e(program, quantizer)
    for batch in data:
        prepared(batch)
    return kq.convert_pt2e(prepared)


def test_report_sqnr_matches_hand_computation(mlp):
    program, data = mlp
    quantized = _static(program, data)
    result = kq.report(program, quantized, [(batch,) for batch in data])
    assert [layer.name for layer in result.layers] == ["0", "2", "4"]
    expected = np.concatenate([program(batch) for batch in data])
    actual = np.concatenate([quantized(batch) for batch in data])
    assert result.output_sqnr_db == pytest.approx(_sqnr(expected, actual), rel=1e-9)
    assert result.layers[-1].sqnr_db == pytest.approx(result.output_sqnr_db, rel=1e-9)  # the last linear is the output
    assert result.layers[-1].max_error == pytest.approx(float(np.abs(actual - expected).max()), rel=1e-6)
    assert "output SQNR" in str(result)


def test_keeping_the_suggested_layer_in_float_recovers_sqnr(mlp):
    program, data = mlp
    result = kq.report(program, _static(program, data), [(batch,) for batch in data])
    assert result.suggestions, str(result)
    config = kq.get_default_x86_inductor_quantization_config()
    quantizer = kq.X86InductorQuantizer().set_global(config).set_module_name_qconfig(result.suggestions[0], None)
    mixed = _static(program, data, quantizer)
    better = kq.report(program, mixed, [(batch,) for batch in data])
    assert better.output_sqnr_db > result.output_sqnr_db


def test_report_refuses_unrelated_programs(mlp):
    program, data = mlp
    other = kiln.export(nn.Sequential(nn.Linear(32, 8)).eval(), (kiln.randn(16, 32),))
    with pytest.raises(kiln.KilnError, match="pair up"):
        kq.report(program, other, [(data[0],)])


@pytest.fixture
def calibration(tmp_path):
    entry = kiln.models.get("mlp")
    shape = entry.args[0].shape
    batches = np.random.default_rng(0).standard_normal((4, *shape)).astype(np.float32)
    np.savez(tmp_path / "calib.npz", x=batches)
    return tmp_path / "calib.npz", batches


def test_cli_static_writes_the_same_program_as_python(tmp_path, calibration, capsys):
    path, batches = calibration
    out = tmp_path / "mlp_int8.pt2"
    assert main(["quantize", "kiln.models:mlp", "--scheme", "static", "--calibration", str(path), "-o", str(out),
                 "--report", "--calibrate-with", "interpreter"]) == 0
    assert "output SQNR" in capsys.readouterr().out
    loaded = kiln.load(out)
    assert loaded.op_histogram()["quantized_decomposed.quantize_per_tensor.default"] >= 2
    entry = kiln.models.get("mlp")
    expected = _static(kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes), list(batches))
    x = np.random.default_rng(1).standard_normal(batches.shape[1:]).astype(np.float32)
    np.testing.assert_array_equal(loaded(x), expected(x))


def test_cli_dynamic_onnx_runs_in_onnxruntime(tmp_path):
    out = tmp_path / "mlp_dynamic.onnx"
    assert main(["quantize", "kiln.models:mlp", "--scheme", "dynamic", "-o", str(out), "-q"]) == 0
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    entry = kiln.models.get("mlp")
    program = kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes)
    reference = kq.convert_pt2e(kq.prepare_pt2e(program, kq.X86InductorQuantizer().set_global(
        kq.get_default_x86_inductor_quantization_config(is_dynamic=True))))
    x = np.random.default_rng(2).standard_normal((5, entry.args[0].shape[1])).astype(np.float32)
    (got,) = session.run(None, {session.get_inputs()[0].name: x})
    from tests.quantization.test_pt2e import assert_quantized_close
    assert_quantized_close(got, reference(x))


def test_cli_weight_only_int4(tmp_path):
    out = tmp_path / "mlp_w4.pt2"
    assert main(["quantize", "kiln.models:mlp", "--scheme", "weight-only-int4", "--group-size", "32",
                 "-o", str(out), "-q"]) == 0
    assert "quantized_decomposed.dequantize_per_channel_group.default" in kiln.load(out).op_histogram()


def test_cli_weight_only_int4_onnx_holds_int4_weights(tmp_path):
    """`-o X.onnx` with weight-only-int4 writes opset 21: INT4 initializers, which onnxruntime runs as MatMulNBits
    and, at float32 accuracy, to the same values as the quantized program."""
    import onnx
    import torch
    out = tmp_path / "mlp_w4.onnx"
    assert main(["quantize", "kiln.models:mlp", "--scheme", "weight-only-int4", "--group-size", "32",
                 "-o", str(out), "-q"]) == 0
    model_proto = onnx.load(out)
    assert model_proto.opset_import[0].version == 21
    assert any(t.data_type == onnx.TensorProto.INT4 for t in model_proto.graph.initializer)
    entry = kiln.models.get("mlp")
    program = kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes)
    reference = kq.convert_pt2e(kq.prepare_pt2e(program, kq.WeightOnlyQuantizer("int4", group_size=32)))
    options = ort.SessionOptions()
    options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    session = ort.InferenceSession(str(out), options, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(2).standard_normal((5, entry.args[0].shape[1])).astype(np.float32)
    (got,) = session.run(None, {session.get_inputs()[0].name: x})
    torch.testing.assert_close(torch.from_numpy(got), torch.from_numpy(np.asarray(reference(x))))


@pytest.mark.parametrize("arguments,message", [
    (["--scheme", "static"], "needs calibration data"),
    (["--scheme", "static", "--calibration", "missing.npz"], "does not exist"),
    (["--scheme", "dynamic", "--report"], "--report compares outputs on data"),
    (["--scheme", "weight-only-int4", "--group-size", "48"], "group size 48"),
    (["--scheme", "dynamic", "--opset", "21"], "--opset applies to ONNX output"),
])
def test_cli_errors_exit_2_and_write_nothing(tmp_path, capsys, arguments, message, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["quantize", "kiln.models:mlp", *arguments, "-o", "out.pt2", "-q"]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out.pt2").exists()


def test_cli_refuses_misnamed_calibration_arrays(tmp_path, capsys):
    entry = kiln.models.get("mlp")
    np.savez(tmp_path / "bad.npz", a=np.zeros((2, *entry.args[0].shape), np.float32),
             b=np.zeros((2, 3), np.float32))
    assert main(["quantize", "kiln.models:mlp", "--scheme", "static", "--calibration", str(tmp_path / "bad.npz"),
                 "-o", str(tmp_path / "out.pt2"), "-q"]) == 2
    assert "no array for input" in capsys.readouterr().err
    assert not (tmp_path / "out.pt2").exists()


def test_cli_refuses_unknown_output_format(tmp_path, capsys):
    assert main(["quantize", "kiln.models:mlp", "--scheme", "dynamic", "-o", str(tmp_path / "out.bin")]) == 2
    assert "OUT.pt2 or OUT.onnx" in capsys.readouterr().err


def test_cli_compiles_a_quantized_program_to_int8_c(tmp_path, calibration):
    """`kiln quantize` then `kiln compile`: the package runs the linear layers as int8 kernels, and its outputs stay
    within one quantization step of the hidden activations of the reference program's (see test_c_int8.py)."""
    import shutil
    if shutil.which("cc") is None:
        pytest.skip("needs a C compiler")
    path, batches = calibration
    program_path, package = tmp_path / "mlp_int8.pt2", tmp_path / "pkg"
    assert main(["quantize", "kiln.models:mlp", "--scheme", "static", "--calibration", str(path), "-o",
                 str(program_path), "-q"]) == 0
    assert main(["compile", str(program_path), "-o", str(package)]) == 0
    source = (package / "model.c").read_text()
    assert source.count("/* qlinear: quant.qlinear_pointwise.default */") == 3  # every linear layer
    reference, compiled = kiln.load(program_path), kiln.runtime.load(package)
    x = np.random.default_rng(1).standard_normal(batches.shape[1:]).astype(np.float32)
    expected = reference(x)
    assert np.abs(compiled(x) - expected).max() <= 0.05 * np.abs(expected).max()


def test_cli_static_onnx_fuses_into_qgemm(tmp_path, calibration):
    """For ONNX the CLI stores static biases as int32, so onnxruntime runs every linear layer as QGemm."""
    import onnx
    path, batches = calibration
    out = tmp_path / "mlp_int8.onnx"
    assert main(["quantize", "kiln.models:mlp", "--scheme", "static", "--calibration", str(path), "-o", str(out),
                 "-q", "--calibrate-with", "interpreter"]) == 0
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    session = ort.InferenceSession(str(out), options, providers=["CPUExecutionProvider"])
    fused = [node.op_type for node in onnx.load(tmp_path / "optimized.onnx").graph.node]
    entry = kiln.models.get("mlp")
    program = kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes)
    assert fused.count("QGemm") == program.op_histogram()["aten.linear.default"], fused
    config = kq.get_default_x86_inductor_quantization_config(int32_bias=True)
    expected = _static(program, list(batches), kq.X86InductorQuantizer().set_global(config))
    x = batches[0]
    (got,) = session.run(None, {session.get_inputs()[0].name: x})
    from tests.quantization.test_pt2e import assert_quantized_close
    assert_quantized_close(got, expected(x))


def test_cli_fp16_weights_round_trip_through_torch(tmp_path):
    """fp16 weight-only: weights stored as float16 (read through convert_element_type.no_fuse, which torch has
    too), so torch runs the saved program and agrees with kiln."""
    import torch
    out = tmp_path / "mlp_fp16.pt2"
    assert main(["quantize", "kiln.models:mlp", "--scheme", "fp16", "-o", str(out), "-q"]) == 0
    program = kiln.load(out)
    assert all(array.dtype == np.float16 for key, array in program.constants.items() if key.startswith("weight"))
    assert program.op_histogram()["quantized_decomposed.convert_element_type.no_fuse"] >= 2
    x = np.random.default_rng(3).standard_normal((4, kiln.models.get("mlp").args[0].shape[1])).astype(np.float32)
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (torch's quantized_decomposed ops)
    loaded = torch.export.load(out)
    np.testing.assert_allclose(loaded.module()(torch.from_numpy(x)).detach().numpy(), program(x),
                               rtol=1.3e-6, atol=1e-5)
