"""PT2E prepare → calibrate → convert in kiln against torchao's on the same torch modules and data, and quantized
programs through .pt2 both ways."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import kiln
from kiln import quantization as kq
from tests.no_torch import without_torch
from tests.quantization.support import TORCHAO, requires_torchao
from tests.torch_oracle import torch

pytestmark = requires_torchao

Q_OPS = ("quantized_decomposed.quantize_per_tensor", "quantized_decomposed.choose_qparams")


def _cnn():
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 8, 3, padding=1),
                         nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 4))


def _mlp():
    nn = torch.nn
    return nn.Sequential(nn.Linear(24, 64), nn.GELU(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 10))


def _residual():
    nn = torch.nn

    class Residual(nn.Module):
        """ResNet's blocks in small: conv → add → relu and conv → add, the X86 recipe's binary patterns."""

        def __init__(self):
            super().__init__()
            self.stem, self.relu0 = nn.Conv2d(3, 8, 3, padding=1), nn.ReLU()
            self.conv1, self.relu1 = nn.Conv2d(8, 8, 3, padding=1), nn.ReLU()
            self.conv2, self.relu2 = nn.Conv2d(8, 8, 3, padding=1), nn.ReLU()
            self.conv3 = nn.Conv2d(8, 8, 3, padding=1)
            self.pool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(8, 4)

        def forward(self, x):
            x = self.relu0(self.stem(x))
            x = self.relu2(self.conv2(self.relu1(self.conv1(x))) + x)
            x = self.conv3(x) + x
            return self.fc(torch.flatten(self.pool(x), 1))
    return Residual()


MODELS = {"cnn": (_cnn, (32, 3, 10, 10)), "mlp": (_mlp, (32, 24)), "residual": (_residual, (32, 3, 12, 12))}


def assert_quantized_close(actual, expected):
    """kiln's float kernels and torch's (oneDNN's convolution) differ in the last ulp; a value on a rounding boundary
    then lands one quantization step apart, and the flip spreads through that sample's later layers. Measured on
    these models: the MLP agrees exactly, the CNN differs by up to 2.8% of the output range in a third to half of
    its outputs. A wrong scale, zero point or placement moves the outputs by far more than the 5% allowed; the
    qparams themselves are compared strictly by `_assert_same_quantize_args`."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    difference = np.abs(actual - expected).max()
    bound = max(0.05 * np.abs(expected).max(), 1e-5)  # float32's absolute tolerance for values near zero
    assert difference <= bound, f"max difference {difference} exceeds 5% of the output range {bound}"


def _assert_same_quantize_args(actual, expected):
    """Same placement and ranges; zero points equal; scales equal up to a few float32 ulps (the observed
    activations come from kiln's and torch's float kernels)."""
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected):
        if want[0] == "dynamic":
            assert got == want
            continue
        assert got[1:] == want[1:], f"{got} vs {want}"
        assert got[0] == pytest.approx(want[0], rel=1e-6), f"{got} vs {want}"


def _calibration(shape, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=generator) * (1 + i) for i in range(3)]


def _torchao_flow(module, data, config):
    _, flow, x86 = TORCHAO
    prepared = flow.prepare_pt2e(torch.export.export(module, (data[0],)).module(),
                                 x86.X86InductorQuantizer().set_global(config))
    for batch in data:
        prepared(batch)
    return flow.convert_pt2e(prepared)


def _kiln_flow(module, data, config):
    prepared = kq.prepare_pt2e(kiln.from_torch(module, (data[0],)), kq.X86InductorQuantizer().set_global(config))
    for batch in data:
        prepared(batch.numpy())
    return kq.convert_pt2e(prepared)


def _quantize_args(graph_module):
    """(op name, scale, zero point, quant_min, quant_max) of each quantize op torch's converted graph runs."""
    found = []
    for node in graph_module.graph.nodes:
        if node.op == "call_function" and "quantize_per_tensor" in str(node.target) and "dequantize" not in \
                str(node.target):
            found.append(tuple(node.args[1:5]) if isinstance(node.args[1], float) else ("dynamic",) + tuple(
                node.args[3:5]))
    return found


def _kiln_quantize_args(program):
    from kiln.ir.dialect import bound_arguments
    found = []
    for op in program.nodes():
        if op.name == "quantized_decomposed.quantize_per_tensor.default":
            found.append(tuple(bound_arguments(op)[1:5]))
        elif op.name == "quantized_decomposed.quantize_per_tensor.tensor":
            found.append(("dynamic",) + tuple(bound_arguments(op)[3:5]))
    return found


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("reduce_range", [False, True], ids=["8bit", "reduce_range"])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_x86_flow_matches_torchao(model, dynamic, reduce_range):
    """Same quantize/dequantize placement, the same qparams, and the same quantized outputs as torchao."""
    factory, shape = MODELS[model]
    torch.manual_seed(0)
    module = factory().eval()
    data = _calibration(shape)
    expected_module = _torchao_flow(module, data, TORCHAO[2].get_default_x86_inductor_quantization_config(
        is_dynamic=dynamic, reduce_range=reduce_range))
    program = _kiln_flow(module, data, kq.get_default_x86_inductor_quantization_config(
        is_dynamic=dynamic, reduce_range=reduce_range))
    expected = _quantize_args(expected_module)
    assert expected, "torchao quantized nothing: the test model does not exercise the flow"
    actual = _kiln_quantize_args(program)
    _assert_same_quantize_args(actual, expected)
    weights = [n for n in expected_module.graph.nodes if "dequantize_per_channel" in str(n.target)]
    assert program.op_histogram().get("quantized_decomposed.dequantize_per_channel.default") == len(weights)
    test_input = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    assert_quantized_close(program(test_input.numpy()), expected_module(test_input).detach().numpy())


def test_weights_are_stored_as_int8():
    torch.manual_seed(0)
    module = _mlp().eval()
    program = _kiln_flow(module, _calibration((5, 24)), kq.get_default_x86_inductor_quantization_config())
    stored = [value for key, value in program.constants.items() if key.startswith("quantized_weight")]
    assert len(stored) == 3 and all(value.dtype == np.int8 for value in stored)
    assert not any(spec.kind is kiln.InputKind.PARAMETER and spec.target.endswith("weight")
                   for spec in program.graph_signature.input_specs), "float weights are left in the program"


def test_module_type_config_keeps_other_layers_float():
    torch.manual_seed(0)
    module = _cnn().eval()
    data = _calibration((32, 3, 10, 10))
    quantizer = kq.X86InductorQuantizer().set_module_type_qconfig(torch.nn.Conv2d,
                                                                  kq.get_default_x86_inductor_quantization_config())
    prepared = kq.prepare_pt2e(kiln.from_torch(module, (data[0],)), quantizer)
    for batch in data:
        prepared(batch.numpy())
    histogram = kq.convert_pt2e(prepared).op_histogram()
    assert histogram["quantized_decomposed.dequantize_per_channel.default"] == 2  # the two convs, not the linears


@pytest.mark.cpu_capability
def test_torchao_program_loads_and_runs_in_kiln_without_torch(tmp_path):
    """torchao → torch.export.save → kiln.load runs it with torch blocked, equal to torch's own run, and compiles it
    to C with its linear layers as int8 kernels."""
    torch.manual_seed(0)
    module = _cnn().eval()
    data = _calibration((32, 3, 10, 10))
    converted = _torchao_flow(module, data, TORCHAO[2].get_default_x86_inductor_quantization_config())
    path = tmp_path / "quantized.pt2"
    torch.export.save(torch.export.export(converted, (data[0],)), path)
    x = _calibration((32, 3, 10, 10), seed=3)[0]
    np.save(tmp_path / "x.npy", x.numpy())
    script = without_torch(f"""
        import numpy as np, kiln
        program = kiln.load({str(path)!r})
        assert program.op_histogram()["quantized_decomposed.quantize_per_tensor.default"] >= 3
        lowered = kiln.passes.run(program, "lower-quantized").op_histogram()
        assert lowered["quant.qlinear_pointwise.default"] == 2 and "aten.linear.default" not in lowered
        x = np.load({str(tmp_path / 'x.npy')!r})
        np.save({str(tmp_path / 'out.npy')!r}, program(x))
        compiled = kiln.compile(program, output={str(tmp_path / 'pkg')!r})
        np.save({str(tmp_path / 'compiled.npy')!r}, compiled(x))
    """)
    subprocess.run([sys.executable, "-c", script], check=True)
    assert_quantized_close(np.load(tmp_path / "out.npy"), converted(x).detach().numpy())
    assert "kiln_qukernel(" in (tmp_path / "pkg" / "model.c").read_text()
    assert_quantized_close(np.load(tmp_path / "compiled.npy"), np.load(tmp_path / "out.npy"))


def test_kiln_quantized_program_saves_for_torch(tmp_path):
    """kiln's converted program → kiln.save → torch.export.load runs it with torch's quantized_decomposed ops."""
    torch.manual_seed(0)
    module = _cnn().eval()
    data = _calibration((32, 3, 10, 10))
    program = _kiln_flow(module, data, kq.get_default_x86_inductor_quantization_config())
    kiln.save(program, tmp_path / "kiln_quantized.pt2")
    loaded = torch.export.load(tmp_path / "kiln_quantized.pt2")
    targets = {str(node.target) for node in loaded.graph.nodes}
    assert "quantized_decomposed.quantize_per_tensor.default" in targets
    x = torch.randn(32, 3, 10, 10, generator=torch.Generator().manual_seed(4))
    assert_quantized_close(program(x.numpy()), loaded.module()(x).detach().numpy())


def test_prepare_refuses_a_torch_module():
    with pytest.raises(kiln.KilnError, match="export the model first"):
        kq.prepare_pt2e(_mlp(), kq.X86InductorQuantizer())


def test_convert_twice_is_refused():
    torch.manual_seed(0)
    prepared = kq.prepare_pt2e(kiln.from_torch(_mlp().eval(), (torch.randn(2, 24),)),
                               kq.X86InductorQuantizer().set_global(kq.get_default_x86_inductor_quantization_config()))
    prepared(np.random.default_rng(0).standard_normal((2, 24)).astype(np.float32))
    kq.convert_pt2e(prepared)
    with pytest.raises(kiln.KilnError, match="already converted"):
        kq.convert_pt2e(prepared)


def test_calibrating_in_c_matches_the_interpreter():
    """backend="c" compiles the program once with the observed values as extra outputs: the same placement, and
    qparams within float32 rounding of the interpreter's (the C kernels round differently in the last bits)."""
    import shutil
    if shutil.which("cc") is None:
        pytest.skip("needs a C compiler")
    torch.manual_seed(0)
    module = _cnn().eval()
    data = [batch.numpy() for batch in _calibration((32, 3, 10, 10))]
    program = kiln.from_torch(module, (torch.from_numpy(data[0]),))
    before = program.to_mlir()
    config = kq.get_default_x86_inductor_quantization_config()
    results = {}
    for backend in kq.CALIBRATION_BACKENDS:
        prepared = kq.prepare_pt2e(program, kq.X86InductorQuantizer().set_global(config))
        seen = []
        kq.calibrate(prepared, [(batch,) for batch in data], backend=backend, progress=seen.append)
        assert seen == [1, 2, 3]
        results[backend] = _kiln_quantize_args(kq.convert_pt2e(prepared))
        assert len(prepared.program.body.last_op.operands) == 1  # the extra outputs were for the build only
    _assert_same_quantize_args(results["c"], results["interpreter"])
    assert program.to_mlir() == before
    with pytest.raises(kiln.KilnError, match="unknown calibration backend"):
        kq.calibrate(prepared, [], backend="gpu")
