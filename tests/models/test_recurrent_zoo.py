"""Issue 19's acceptance on the zoo's `rnn` (LSTM with projections, dropout and two bidirectional layers, a GRU
without biases, a ReLU RNN, all batch-first): exported ONCE with dynamic batch and sequence dims, it matches torch
eager, on the same source and weights, at sequence lengths 1, 7 and 300 through kiln's interpreter, ONNX in
onnxruntime, the compiled C package, and the .pt2 file loaded by torch."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import kiln
import kiln.models

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
import onnx  # noqa: E402

LENGTHS = (1, 7, 300)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    entry = kiln.models.get("rnn")
    torch.manual_seed(0)
    reference = kiln.models.torch_twin("kiln.models.recurrent").RecurrentStack().eval()
    entry.model.load_state_dict(reference.state_dict())
    program = kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes)
    assert sum(op.name == "kiln.scan" for op in program.body.walk()) == 7  # 2 x 2 LSTM + 2 GRU + 1 RNN
    return reference, program, tmp_path_factory.mktemp("rnn")


def _expected(reference, x: np.ndarray) -> torch.Tensor:
    with torch.no_grad():
        return reference(torch.from_numpy(x))


def _inputs():
    rng = np.random.default_rng(0)
    return [rng.standard_normal((batch, length, 12)).astype(np.float32) for batch, length in zip((2, 3, 1), LENGTHS)]


def test_interpreter(pair):
    reference, program, _ = pair
    for x in _inputs():
        torch.testing.assert_close(torch.from_numpy(np.asarray(program(x))), _expected(reference, x))


def test_onnx_in_onnxruntime(pair):
    reference, program, folder = pair
    kiln.onnx.export(program, f=folder / "rnn.onnx")
    session = ort.InferenceSession(str(folder / "rnn.onnx"), providers=["CPUExecutionProvider"])
    # The projected LSTM's scans stay Scans (ONNX's LSTM has no projection); the GRU and RNN are ONNX's ops, one
    # bidirectional GRU for both directions.
    op_types = [node.op_type for node in onnx.load(str(folder / "rnn.onnx")).graph.node]
    assert (op_types.count("Scan"), op_types.count("GRU"), op_types.count("RNN")) == (4, 1, 1)
    name = session.get_inputs()[0].name
    for x in _inputs():
        torch.testing.assert_close(torch.from_numpy(session.run(None, {name: x})[0]), _expected(reference, x))


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_compiled_c(pair):
    reference, program, folder = pair
    model = kiln.compile(program, output=folder / "c")
    for x in _inputs():
        torch.testing.assert_close(torch.from_numpy(model(x)), _expected(reference, x))


def test_pt2_loaded_by_torch(pair):
    reference, program, folder = pair
    kiln.save(program, folder / "rnn.pt2")
    loaded = torch.export.load(folder / "rnn.pt2").module()
    for x in _inputs():
        torch.testing.assert_close(loaded(torch.from_numpy(x)), _expected(reference, x))
