"""Hostile .onnx files given to `kiln inspect` (the one kiln command that reads ONNX; `kiln export` and `kiln compile`
take a model spec or a .pt2): a KilnError or exit status 2 with one line, no crash, no hang, and external data named
outside the model's folder is refused, never opened."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np
import pytest

from kiln.cli.inspect import inspect_file
from kiln.ir.errors import KilnError
from tests.hostile.support import cli_error, deadline, opened_paths, tree

onnx = pytest.importorskip("onnx")
from onnx import AttributeProto, TensorProto, helper, numpy_helper  # noqa: E402


def _model() -> onnx.ModelProto:
    """y = x + w, x f32[batch, 3], w an initializer of 3 values."""
    node = helper.make_node("Add", ["x", "w"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
                              [numpy_helper.from_array(np.arange(3, dtype=np.float32), "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _write(folder: Path, model: onnx.ModelProto | bytes, name: str = "model.onnx") -> Path:
    path = folder / name
    path.write_bytes(model if isinstance(model, bytes) else model.SerializeToString())
    return path


def _varint(number: int) -> bytes:
    out = bytearray()
    while True:
        low, number = number & 0x7F, number >> 7
        out.append(low | (0x80 if number else 0))
        if not number:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field: appending one to a serialized message sets (or adds to) that field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _nested(depth: int, op: str) -> bytes:
    """A model whose graph holds an If (then_branch) or Loop (body) whose subgraph holds another, `depth` deep.
    Built as bytes: protobuf's own builders copy each level and would take quadratic memory."""
    attribute_name = {"If": "then_branch", "Loop": "body"}[op]
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["o"])], "leaf", [],
                              [helper.make_tensor_value_info("o", TensorProto.FLOAT, [1])]).SerializeToString()
    for _ in range(depth):
        attribute = AttributeProto(name=attribute_name, type=AttributeProto.GRAPH).SerializeToString()
        node = helper.make_node(op, ["c"], ["o"]).SerializeToString() + _field(5, attribute + _field(6, graph))
        graph = helper.make_graph([], "level", [], []).SerializeToString() + _field(1, node)
    top = helper.make_model(helper.make_graph([], "top", [], []), opset_imports=[helper.make_opsetid("", 18)])
    return top.SerializeToString() + _field(7, graph)


def test_the_genuine_model_inspects(tmp_path):
    summary = inspect_file(_write(tmp_path, _model()))
    assert summary["ops"] == {"Add": 1} and summary["weights"]["initializers"]["bytes"] == 12


# ---------------------------------------------------------------------------------------------
# not ONNX at all


def _truncated() -> bytes:
    data = _model().SerializeToString()
    return data[:len(data) // 2]


def _zip() -> bytes:
    import io
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("archive/archive_format", "pt2")
    return buffer.getvalue()


@pytest.mark.parametrize("make, match", [
    (_truncated, "not a readable ONNX model"),
    (lambda: np.random.default_rng(0).bytes(4096), "not a readable ONNX model"),
    (lambda: b"", "holds no ONNX graph"),
    (lambda: b"\x00" * 64, "not a readable ONNX model|holds no ONNX graph"),
    (lambda: b"this is plain text, not a protobuf", "not a readable ONNX model"),
    (_zip, "not a readable ONNX model"),
], ids=["truncated", "garbage", "empty", "zeros", "text", "zip"])
def test_files_that_are_not_onnx_are_refused(tmp_path, capsys, make, match):
    path = _write(tmp_path, make())
    with pytest.raises(KilnError, match=match):
        inspect_file(path)
    assert "kiln: error: " in cli_error(capsys, "inspect", str(path))


# ---------------------------------------------------------------------------------------------
# initializers whose declared shape or type lies


def _initializer(**changes) -> onnx.ModelProto:
    model = _model()
    tensor = model.graph.initializer[0]
    for key, value in changes.items():
        if key == "dims":
            tensor.dims[:] = value
        else:
            setattr(tensor, key, value)
    return model


def _typed_data() -> onnx.ModelProto:
    model = _initializer(raw_data=b"")
    model.graph.initializer[0].float_data[:] = [1.0, 2.0]  # 2 values for dims [3]
    return model


@pytest.mark.parametrize("make, match", [
    (lambda: _initializer(dims=[2 ** 62]), "declares dims \\[4611686018427387904\\]"),
    (lambda: _initializer(dims=[2 ** 62, 2 ** 62]), "declares dims"),
    (lambda: _initializer(dims=[2 ** 31, 2 ** 31, 2 ** 31]), "declares dims"),
    (lambda: _initializer(dims=[-3]), "negative dims"),
    (lambda: _initializer(dims=[0, -1]), "negative dims"),
    (lambda: _initializer(data_type=999), "unknown element type 999"),
    (lambda: _initializer(raw_data=b"\x00" * 5), "holds 5 bytes, not 12"),
    (_typed_data, "holds 2 values, not 3"),
], ids=["dims-2**62", "dims-2**124", "dims-2**93", "negative", "negative-second", "element-type", "short-raw",
        "short-typed"])
def test_initializers_that_do_not_hold_together_are_refused(tmp_path, capsys, make, match):
    path = _write(tmp_path, make())
    with pytest.raises(KilnError, match=match):
        inspect_file(path)
    cli_error(capsys, "inspect", str(path))


def test_absurd_dims_of_an_input_are_only_reported(tmp_path):
    model = _model()
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 2 ** 62  # metadata: nothing is allocated
    assert inspect_file(_write(tmp_path, model))["inputs"][0]["type"] == "float32[batch, 4611686018427387904]"


# ---------------------------------------------------------------------------------------------
# external data: refused when it names a path outside the model's folder, and never opened


def _external(location: str) -> onnx.ModelProto:
    model = _model()
    tensor = model.graph.initializer[0]
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value=location)
    tensor.external_data.add(key="length", value="12")
    return model


@pytest.mark.parametrize("location", ["../../etc/passwd", "/etc/passwd", "{outside}/secret.bin", "..\\secret.bin",
                                      "data/../../secret.bin", "", "C:/Windows/win.ini"])
def test_external_data_outside_the_folder_is_refused_and_never_opened(tmp_path, capsys, location):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.bin").write_bytes(bytes(12))
    folder = tmp_path / "model"
    folder.mkdir()
    path = _write(folder, _external(location.format(outside=outside)))
    with opened_paths() as opened, pytest.raises(KilnError, match="outside the model's folder"):
        inspect_file(path)
    assert not [p for p in opened if "passwd" in p or "secret" in p or "win.ini" in p]
    cli_error(capsys, "inspect", str(path))


def test_external_data_through_a_symlink_escaping_the_folder_is_refused(tmp_path):
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "w.bin").write_bytes(bytes(12))
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "data").symlink_to(tmp_path / "outside")
    with opened_paths() as opened, pytest.raises(KilnError, match="outside the model's folder"):
        inspect_file(_write(folder, _external("data/w.bin")))
    assert not [p for p in opened if "w.bin" in p]


def test_external_data_inside_the_folder_is_summarized_without_being_read(tmp_path):
    with opened_paths() as opened:  # the data file does not even exist: it is never needed
        summary = inspect_file(_write(tmp_path, _external("weights/w.bin")))
    assert summary["weights"]["initializers"] == {"tensors": 1, "values": 3, "bytes": 12}
    assert not [p for p in opened if "w.bin" in p]


# ---------------------------------------------------------------------------------------------
# recursion bombs and files that never end


@pytest.mark.parametrize("op", ["If", "Loop"])
def test_ten_thousand_nested_subgraphs_are_refused_without_recursion_error(tmp_path, capsys, op):
    path = _write(tmp_path, _nested(10_000, op))
    with deadline(30), pytest.raises(KilnError, match="not a readable ONNX model"):
        inspect_file(path)
    cli_error(capsys, "inspect", str(path))


@pytest.mark.parametrize("op", ["If", "Loop"])
def test_nested_subgraphs_within_protobufs_limit_are_counted(tmp_path, op):
    summary = inspect_file(_write(tmp_path, _nested(20, op)))
    assert summary["ops"] == {op: 20, "Identity": 1}


def test_a_fifo_named_like_a_model_is_refused_without_hanging(tmp_path, capsys):
    os.mkfifo(tmp_path / "model.onnx")
    with deadline(10):
        line = cli_error(capsys, "inspect", str(tmp_path / "model.onnx"))
    assert "not a regular file" in line


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_a_device_is_refused_without_reading_it(capsys, device):
    if not os.path.exists(device):
        pytest.skip(f"no {device}")
    with deadline(10):
        assert "not a regular file" in cli_error(capsys, "inspect", device)


def test_export_and_compile_do_not_read_onnx(tmp_path, capsys, monkeypatch):
    """An .onnx given as MODEL is refused as a spec before anything is opened or written."""
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, _external("../../etc/passwd"))
    before = tree(tmp_path)
    assert "malformed MODEL" in cli_error(capsys, "export", "model.onnx", "--format", "onnx", "-o", "out.onnx")
    assert "malformed MODEL" in cli_error(capsys, "compile", "model.onnx", "-o", "pkg", "-q")
    assert tree(tmp_path) == before
