"""`kiln inspect FILE` for .pt2 and .onnx: shapes with symbols and ranges, op histogram, weight totals."""

from __future__ import annotations

import json

import pytest

import kiln
import kiln.models
from kiln.cli.main import main


@pytest.fixture(scope="module")
def mlp_file(tmp_path_factory):
    entry = kiln.models.get("mlp")
    program = kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes)
    path = tmp_path_factory.mktemp("inspect") / "mlp.pt2"
    kiln.save(program, path)
    return path, program


def test_inspect_pt2_shows_symbols_ranges_ops_and_weights(mlp_file, capsys):
    path, program = mlp_file
    assert main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    assert "x: f32[batch, 32]" in text and "batch: [1, 4096]" in text
    assert "aten.linear.default" in text
    parameters = sum(value.size for value in program.state_dict.values())
    assert f"parameters: 6 tensors, {parameters:,} values" in text


def test_inspect_pt2_json(mlp_file, capsys):
    path, program = mlp_file
    assert main(["inspect", str(path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["ops"]["aten.linear.default"] == 3
    assert summary["symbols"] == {"batch": [1, 4096]}
    assert summary["weights"]["parameters"]["bytes"] == sum(v.nbytes for v in program.state_dict.values())


def test_inspect_onnx(tmp_path, capsys):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    import numpy as np
    weight = numpy_helper.from_array(np.ones((4, 3), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Relu", ["y"], ["z"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", 3])], [weight])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph), str(path))
    assert main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    assert "x: float32[batch, 4]" in text and "MatMul  1" in text and "1 tensors, 12 values, 48 B" in text


def test_inspect_refuses_a_hostile_file_cleanly(tmp_path, capsys):
    path = tmp_path / "bad.pt2"
    path.write_bytes(b"not a zip")
    assert main(["inspect", str(path)]) == 2
    assert "not a .pt2" in capsys.readouterr().err


def test_kiln_export_format_pt2_writes_a_file_torch_loads(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    output = tmp_path / "mlp.pt2"
    assert main(["export", "kiln.models:mlp", "--format", "pt2", "-o", str(output), "--dynamic", "batch=2:128",
                 "-q"]) == 0
    loaded = torch.export.load(output)
    assert [(r.lower, r.upper) for r in loaded.range_constraints.values()] == [(2, 128)]
    entry = kiln.models.get("mlp")
    x = entry.args[0].numpy()
    program = kiln.load(output)
    torch.testing.assert_close(loaded.module()(torch.from_numpy(x.copy())), torch.from_numpy(program(x)))
    assert main(["inspect", str(output)]) == 0
    assert "batch: [2, 128]" in capsys.readouterr().out


def test_inspect_names_the_pickled_sample_inputs_it_did_not_read(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    path = tmp_path / "linear.pt2"
    torch.export.save(torch.export.export(torch.nn.Linear(4, 2), (torch.randn(3, 4),)), path)
    assert main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    assert "not read:\n  data/sample_inputs/model.pt: pickled sample inputs: kiln never unpickles" in text
