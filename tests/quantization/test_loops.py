"""PT2E quantization inside loop bodies (issue 19): the quantizers annotate the ops of scan bodies, observers see
every step, and convert quantizes a weight the body reads once, outside the loop, passing the int8 weight in as a
new invariant operand that the body dequantizes. The quantized recurrent stack of the zoo (LSTM with projections,
bidirectional GRU, ReLU RNN) then runs through C's integer kernels, ONNX in onnxruntime and torch's .pt2 loader,
each checked against kiln's reference Q/DQ program at sequence lengths 1, 7 and 300."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

import kiln
import kiln.models
from kiln import quantization as kq
from kiln.cli.quantize import quantizer_for
from kiln.ir import dtypes
from kiln.ir.control_flow import ScanOp, invariant_source, outermost_source
from kiln.ir.program import InputKind
from kiln.passes.base import input_spec
from tests.quantization.support import ORT_U8S8_SATURATES
from tests.quantization.test_pt2e import assert_quantized_close

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

SCHEMES = ("static", "dynamic", "weight-only-int8")
LENGTHS = (1, 7, 300)
DEQUANTIZE_WEIGHT = "quantized_decomposed.dequantize_per_channel.default"


def _inputs(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((batch, length, 12)).astype(np.float32) for batch, length in zip((2, 3, 1), LENGTHS)]


def _quantize(program, scheme: str):
    quantizer = quantizer_for(scheme, reduce_range=ORT_U8S8_SATURATES)
    prepared = kq.prepare_pt2e(program, quantizer)
    kq.calibrate(prepared, [(x,) for x in _inputs(seed=1)[:2]])
    return kq.convert_pt2e(prepared)


@pytest.fixture(scope="module")
def float_program():
    entry = kiln.models.get("rnn")
    return kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes)


@pytest.fixture(scope="module", params=SCHEMES)
def quantized(request, float_program):
    return request.param, _quantize(float_program, request.param)


def _scans(program) -> list[ScanOp]:
    return [op for op in program.walk_nodes() if isinstance(op, ScanOp)]


def test_every_recurrent_weight_is_quantized_outside_its_loop(float_program, quantized):
    """Each body linear reads a dequantized int8 weight; the int8 values are a program constant, computed once
    from the float weight with the stored per-channel scales, and passed into the loop as an invariant operand."""
    scheme, program = quantized
    scans = _scans(program)
    assert len(scans) == 7  # 2 x 2 LSTM, 2 GRU, 1 RNN
    float_weights = {name: np.asarray(array) for name, array in float_program.state_dict.items()}
    for scan in scans:
        linears = [op for op in scan.body.block.ops if op.name == "aten.linear.default"]
        assert linears, "every recurrent cell has a linear of its hidden state"
        for linear in linears:
            dequantize = linear.operands[1].owner
            assert getattr(dequantize, "name", None) == DEQUANTIZE_WEIGHT
            stored, scales = (outermost_source(v) for v in dequantize.operands[:2])
            assert dequantize.parent_block() is scan.body.block and stored.block is program.body
            spec = input_spec(program, stored)
            assert spec.kind is InputKind.CONSTANT_TENSOR and stored.type.dtype is dtypes.int8
            values, scale = program.constants[spec.target], program.constants[input_spec(program, scales).target]
            # which float weight: the one these int8 values and scales reproduce to within half a step (plus
            # float32's rounding of weight / scale, up to 128 in size)
            restored = values.astype(np.float32) * scale[:, None]
            step = scale[:, None] * (0.5 + 128 * np.finfo(np.float32).eps)
            matches = [name for name, weight in float_weights.items() if weight.shape == values.shape
                       and np.all(np.abs(weight - restored) <= step)]
            assert matches, f"no float weight quantizes to the stored int8 values of {linear.name} ({scheme})"


def test_observers_see_every_step():
    """The observer of a recurrent linear's input (the hidden state carried into each step) sees every step's value:
    its range is that of the zero initial state and of each step's output but the last, over all batches."""
    kiln.manual_seed(0)
    layer = kiln.nn.LSTM(6, 8).eval()
    program = kiln.export(layer, (kiln.randn(5, 2, 6),), dynamic_shapes={"input": {0: kiln.Dim("seq")}})
    config = kq.get_default_x86_inductor_quantization_config()
    prepared = kq.prepare_pt2e(program, kq.X86InductorQuantizer().set_global(config))
    (scan,) = _scans(prepared.program)
    (linear,) = [op for op in scan.body.block.ops if op.name == "aten.linear.default"]
    observer = prepared.observer_of((linear.operands[0], linear))
    rng = np.random.default_rng(3)
    carried = [np.zeros((1, 2, 8), np.float32)]
    for length in (4, 9):
        x = rng.standard_normal((length, 2, 6)).astype(np.float32)
        prepared(x)
        carried.append(np.asarray(program(x)[0])[:-1])
    seen = np.concatenate(carried)
    np.testing.assert_array_equal(observer.min_val, np.float32(seen.min()))
    np.testing.assert_array_equal(observer.max_val, np.float32(seen.max()))


def test_quantized_loops_run_in_onnxruntime(quantized, float_program):
    scheme, program = quantized
    onnx_program = kiln.onnx.export(program, (_inputs()[0],))
    scan_bodies = [node.attribute[0].g for node in onnx_program.model_proto.graph.node if node.op_type == "Scan"]
    assert scan_bodies and any(n.op_type == "DequantizeLinear" for body in scan_bodies for n in body.node)
    for x in _inputs():
        expected = np.asarray(program(x))
        assert_quantized_close(onnx_program.run([x])[0], expected)
        _assert_near_float(expected, np.asarray(float_program(x)))


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_quantized_loops_compile_to_integer_kernels(quantized, tmp_path):
    scheme, program = quantized
    model = kiln.compile(program, output=tmp_path / "pkg")
    # every body linear (LSTM: hidden and projection, GRU, RNN: hidden) is one integer kernel run by its loop
    kind = "wlinear" if scheme.startswith("weight-only") else "qlinear"
    source = (tmp_path / "pkg" / "model.c").read_text()
    body_kernels = re.findall(rf"static void (kernel_\d+_scan_\w+_{kind}_\w+)\(", source)
    assert len(body_kernels) == 11, body_kernels
    for x in _inputs():
        torch.testing.assert_close(torch.from_numpy(model(x)), torch.from_numpy(np.asarray(program(x))))


def test_quantized_loops_save_for_torch(quantized, tmp_path):
    scheme, program = quantized
    kiln.save(program, tmp_path / "quantized.pt2")
    loaded = torch.export.load(tmp_path / "quantized.pt2").module()
    for x in _inputs():
        torch.testing.assert_close(loaded(torch.from_numpy(x)), torch.from_numpy(np.asarray(program(x))))


def test_calibrating_loops_in_c_is_refused_clearly(float_program):
    prepared = kq.prepare_pt2e(float_program, quantizer_for("static"))
    with pytest.raises(kiln.KilnError, match="inside loop bodies"):
        kq.calibrate(prepared, [(_inputs()[0],)], backend="c")


def _assert_near_float(quantized: np.ndarray, reference: np.ndarray) -> None:
    """8-bit quantization of every layer, recurrent weights and states included, keeps the output's SQNR above
    25 dB (as the zoo's other models)."""
    noise = np.sum((quantized.astype(np.float64) - reference) ** 2)
    assert 10 * np.log10(np.sum(reference.astype(np.float64) ** 2) / max(noise, 1e-30)) > 25


class _ContextLoop(kiln.nn.Module):
    """A scan whose body multiplies each step by a top-level activation (relu(x), an invariant operand)."""

    def forward(self, x, steps):
        context = x.relu()

        def step(h, row):
            h = (context * row + h).tanh()
            return h, h
        return kiln.scan(step, kiln.zeros(4), steps)[1]


class _InvariantInputQuantizer(kq.Quantizer):
    """Observes the invariant operands that ops of a loop body read."""

    def annotate(self, program):
        spec = kq.QuantizationSpec(dtypes.uint8, kq.MinMaxObserver, quant_min=0, quant_max=255,
                                   qscheme=kq.per_tensor_affine)
        for op in program.walk_nodes():
            invariants = [v for v in op.operands if invariant_source(v) is not None]
            if invariants and op.name.startswith("aten."):
                kq.annotate(program, op, kq.QuantizationAnnotation({v: spec for v in invariants}))
        return program

    def validate(self, program):
        pass


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_calibrating_in_c_observes_a_loop_invariant_as_its_top_level_value():
    """A body's invariant operand is the top-level value it stands for: the C build returns that value, and the
    observer sees the same range as on the interpreter (relu's results are exact in both)."""
    kiln.manual_seed(0)
    program = kiln.export(_ContextLoop(), (kiln.randn(4), kiln.randn(3, 4)),
                          dynamic_shapes={"steps": {0: kiln.Dim("seq")}})
    rng = np.random.default_rng(5)
    batches = [(rng.standard_normal(4).astype(np.float32), rng.standard_normal((n, 4)).astype(np.float32))
               for n in (2, 6)]
    ranges = {}
    for backend in kq.CALIBRATION_BACKENDS:
        prepared = kq.prepare_pt2e(program, _InvariantInputQuantizer())
        kq.calibrate(prepared, batches, backend=backend)
        (observer,) = [o for o in prepared.observers.values() if o is not None]
        ranges[backend] = (float(observer.min_val), float(observer.max_val))
    expected_high = max(float(np.maximum(x, 0).max()) for x, _ in batches)
    assert ranges["c"] == ranges["interpreter"] == (0.0, expected_high)
