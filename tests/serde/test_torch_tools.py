"""kiln's own .pt2 files work with torch's downstream tools: torch.export.load's example_inputs, run_decompositions,
torch.onnx.export (dynamo) run by onnxruntime, and AOTInductor. kiln writes the example inputs in torch.save's format
without torch, and kiln.load still never unpickles them."""

from __future__ import annotations

import io
import pickle
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest

import kiln
import kiln.models
import kiln.nn as nn
from kiln.models import MODELS
from kiln.ir.serde.torch_save import torch_save_bytes
from tests.frontend.test_models import _inputs_at
from tests.no_torch import without_torch
from tests.serde.support import to_torch

torch = pytest.importorskip("torch")


def _saved(name, tmp_path):
    """The zoo entry, kiln's program (dynamic dims), and torch.export.load of kiln's file."""
    entry = kiln.models.get(name)
    program = kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes)
    path = tmp_path / f"{name}.pt2"
    kiln.save(program, path)
    return entry, program, torch.export.load(path)


def _sizes(entry) -> list[tuple]:
    """The example inputs, then inputs with each dynamic dim at another size."""
    return [entry.args] + [_inputs_at(entry, {dim: values[-1]}) for dim, values in entry.dim_examples.items()]


def _expected(program, args):
    return to_torch(program(*args).numpy())


@pytest.mark.parametrize("name", sorted(MODELS))
def test_torch_reads_the_example_inputs_kiln_exported_with(name, tmp_path):
    entry, _, loaded = _saved(name, tmp_path)
    args, kwargs = loaded.example_inputs
    assert kwargs == {}
    assert len(args) == len(entry.args)
    for got, sent in zip(args, entry.args):
        torch.testing.assert_close(got, to_torch(sent), rtol=0, atol=0)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_run_decompositions_of_kilns_file_matches_kiln(name, tmp_path):
    entry, program, loaded = _saved(name, tmp_path)
    decomposed = loaded.run_decompositions()
    for args in _sizes(entry):
        torch.testing.assert_close(decomposed.module()(*to_torch(args)), _expected(program, args))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_torch_onnx_export_of_kilns_file_runs_in_onnxruntime(name, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    entry, program, loaded = _saved(name, tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onnx_program = torch.onnx.export(loaded, dynamo=True, verbose=False)
    onnx_path = tmp_path / f"{name}.onnx"
    onnx_program.save(str(onnx_path))
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    for args in _sizes(entry):
        feeds = {spec.name: arg.numpy() for spec, arg in zip(session.get_inputs(), args)}
        (output,) = session.run(None, feeds)
        torch.testing.assert_close(torch.from_numpy(output), _expected(program, args))


# torch 2.13's Inductor lowers a scan only when the trip count is its one symbol: torch.export itself specializes a
# dynamic batch that flows through a scan's carry, and Inductor raises KeyError on kiln's program, which keeps it.
AOTI_REFUSES = {"rnn": "torch 2.13's Inductor cannot lower a scan whose carry has a dynamic batch dim"}


@pytest.mark.slow  # AOTInductor builds C++ with the system compiler: 25-55 s a model on 2 cores
@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.xfail(
    reason=AOTI_REFUSES[name], raises=torch._inductor.exc.InductorError, strict=True)) if name in AOTI_REFUSES
    else name for name in sorted(MODELS)])
def test_aoti_compiles_and_runs_kilns_file(name, tmp_path):
    entry, program, loaded = _saved(name, tmp_path)
    package = torch._inductor.aoti_compile_and_package(loaded, package_path=str(tmp_path / f"{name}_aoti.pt2"))
    compiled = torch._inductor.aoti_load_package(package)
    for args in _sizes(entry):
        torch.testing.assert_close(compiled(*to_torch(args)), _expected(program, args))


# -- the format, checked against torch.save itself

def _records(data: bytes) -> list[str]:
    return [info.filename for info in zipfile.ZipFile(io.BytesIO(data)).infolist()]


def _data_offsets(data: bytes) -> list[int]:
    """Where each member's bytes start (local header + name + extra field)."""
    raw = zipfile.ZipFile(io.BytesIO(data))
    offsets = []
    for info in raw.infolist():
        header = data[info.header_offset:info.header_offset + 30]
        name_length, extra_length = int.from_bytes(header[26:28], "little"), int.from_bytes(header[28:30], "little")
        offsets.append(info.header_offset + 30 + name_length + extra_length)
    return offsets


def _torch_of(array: np.ndarray):
    """The tensor torch itself would make: native byte order, torch's contiguous strides."""
    array = array.astype(array.dtype.newbyteorder("="))
    if array.dtype.name in ("bfloat16", "uint16"):
        as_torch = getattr(torch, array.dtype.name)
        tensor = torch.from_numpy(array.view(np.int16).copy()).view(as_torch)
    else:
        tensor = torch.from_numpy(np.array(array, order="C"))
    return tensor.clone(memory_format=torch.contiguous_format)


def _comparable(value):
    """Tensors as (dtype, shape, values) so nested inputs with None, str and bools compare with ==."""
    from torch.utils._pytree import tree_map_only
    return tree_map_only(torch.Tensor, lambda t: (t.dtype, tuple(t.shape), t.stride(), t.tolist()), value)


def test_sample_inputs_have_torch_saves_records_alignment_and_values():
    import ml_dtypes
    arrays = [np.arange(6, dtype=np.float32).reshape(2, 3), np.arange(4, dtype=np.int64), np.ones((), np.float16),
              np.zeros((2, 0), np.float32), np.array([True, False]), np.array([1.5, -2], ml_dtypes.bfloat16),
              np.arange(6, dtype=np.float64).reshape(2, 3).T, np.array([7, 9], np.uint16),
              np.array([1 + 2j], np.complex64), np.arange(3, dtype=">i4")]
    plain = (None, True, 3, 70000, -5, 2**40, -(2**70), 1.5, "text", [], {}, (1, 2, 3, 4, 5))
    value = (tuple(arrays) + plain, {"mask": {"a": [arrays[4], False]}, "x": kiln.tensor([1.0, 2.0])})
    mine = torch_save_bytes(value)
    buffer = io.BytesIO()
    torch_value = (tuple(_torch_of(a) for a in arrays) + plain,
                   {"mask": {"a": [_torch_of(arrays[4]), False]}, "x": torch.tensor([1.0, 2.0])})
    torch.save(torch_value, buffer, pickle_protocol=2)
    assert _records(mine) == _records(buffer.getvalue())
    assert all(offset % 64 == 0 for offset in _data_offsets(mine))
    loaded = torch.load(io.BytesIO(mine), weights_only=True)
    assert _comparable(loaded) == _comparable(torch_value)
    assert _comparable(loaded) == _comparable(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True))


def test_example_inputs_from_kiln_save_argument_and_attribute(tmp_path):
    program = kiln.export(nn.Linear(3, 2), (kiln.randn(4, 3),))
    assert program.example_inputs is not None and program.run_decompositions().example_inputs is not None
    other = np.full((4, 3), 2.0, np.float32)
    kiln.save(program, tmp_path / "explicit.pt2", example_inputs=((other,), {}))
    torch.testing.assert_close(torch.export.load(tmp_path / "explicit.pt2").example_inputs[0][0], to_torch(other))
    with pytest.raises(kiln.KilnError, match="structure"):
        kiln.save(program, tmp_path / "wrong.pt2", example_inputs=((other, other), {}))
    program.example_inputs = None
    kiln.save(program, tmp_path / "none.pt2")  # as before: an empty member, torch reads no example inputs
    assert torch.export.load(tmp_path / "none.pt2").example_inputs is None
    assert kiln.load(tmp_path / "none.pt2").example_inputs is None


def test_example_inputs_that_cannot_be_written_are_left_out_with_a_warning(tmp_path):
    program = kiln.export(nn.Linear(3, 2), (kiln.randn(4, 3),))
    program.example_inputs = ((object(),), {})  # structure checked first: a leaf torch.save would pickle by class
    program.in_spec = None
    with pytest.warns(UserWarning, match="writes no example inputs"):
        kiln.save(program, tmp_path / "odd.pt2")
    assert torch.export.load(tmp_path / "odd.pt2").example_inputs is None
    with pytest.raises(kiln.KilnError, match="no torch.save encoding"):
        kiln.save(program, tmp_path / "odd.pt2", example_inputs=((object(),), {}))


def test_kiln_load_never_unpickles_the_inputs_kiln_wrote(tmp_path, monkeypatch):
    program = kiln.export(nn.Linear(3, 2), (kiln.randn(4, 3),))
    kiln.save(program, tmp_path / "model.pt2")

    def refuse(*args, **kwargs):
        raise AssertionError("kiln.load unpickled something")
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = kiln.load(tmp_path / "model.pt2")
    assert loaded.example_inputs is None
    assert "never unpickles" in loaded.metadata["skipped"]["data/sample_inputs/model.pt"]
    x = np.ones((4, 3), np.float32)
    np.testing.assert_array_equal(loaded(x), program(x))


NO_TORCH_CHILD = without_torch("""
    import kiln, kiln.models
    entry = kiln.models.get("mlp")
    program = kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes)
    kiln.save(program, sys.argv[1])
    entry.args[0].numpy().tofile(sys.argv[1] + ".raw")
    assert sys.modules.get("torch") is None and not any(m.startswith("torch.") for m in sys.modules)
""")


def test_example_inputs_are_written_without_torch(tmp_path):
    path = tmp_path / "mlp.pt2"
    result = subprocess.run([sys.executable, "-c", NO_TORCH_CHILD, str(path)], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parents[2], timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    (x,), kwargs = torch.export.load(path).example_inputs
    expected = np.fromfile(str(path) + ".raw", np.float32).reshape(x.shape)
    assert kwargs == {}
    torch.testing.assert_close(x, torch.from_numpy(expected), rtol=0, atol=0)


def test_from_torch_keeps_torchs_example_inputs_through_kiln_save(tmp_path):
    x = torch.randn(5, 3)
    program = kiln.from_torch(torch.nn.Linear(3, 2), (x,), {})
    (args, kwargs) = program.example_inputs
    np.testing.assert_array_equal(args[0], x.numpy())
    kiln.save(program, tmp_path / "bridged.pt2")
    (loaded_x,), loaded_kwargs = torch.export.load(tmp_path / "bridged.pt2").example_inputs
    assert loaded_kwargs == {} and kwargs == {}
    torch.testing.assert_close(loaded_x, x, rtol=0, atol=0)
