"""`kiln export --format onnx`: zoo and file models, --input/--dynamic, and errors that exit 2 writing nothing."""

from __future__ import annotations

import onnx
import pytest

from kiln.cli.main import main

MODEL_SOURCE = '''
import kiln.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc(x).relu()


def make_net():
    return Net()
'''


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "net.py"
    path.write_text(MODEL_SOURCE)
    return path


def test_zoo_model_exports_and_verifies(tmp_path, capsys):
    out = tmp_path / "mlp.onnx"
    assert main(["export", "kiln.models:mlp", "--format", "onnx", "-o", str(out), "--verify"]) == 0
    onnx.checker.check_model(str(out), full_check=True)
    log = capsys.readouterr().err
    assert "verifying" in log and "max abs diff" in log and "done" in log


def test_file_model_with_symbolic_input_and_range(tmp_path, model_file):
    out = tmp_path / "net.onnx"
    for target in ("Net", "make_net"):
        assert main(["export", f"{model_file}:{target}", "--format", "onnx", "-o", str(out), "-q",
                     "--input", "x=batch,16:float32", "--dynamic", "batch=1:64", "--opset", "21"]) == 0
        model = onnx.load(str(out))
        assert [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim] == ["batch", 16]
        assert {p.key: p.value for p in model.metadata_props}["kiln.range.batch"] == "VR[1, 64]"
        assert model.opset_import[0].version == 21


def test_help_documents_formats_and_an_example(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["export", "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    assert "--input" in text and "--dynamic" in text and "kiln export kiln.models:gpt" in text and "onnx" in text


ERRORS = {
    "unknown format": (["kiln.models:mlp", "--format", "tflite"], "invalid choice"),
    "malformed input": (["{file}:Net", "--format", "onnx", "--input", "x=batch;16"], "malformed"),
    "bad dtype": (["{file}:Net", "--format", "onnx", "--input", "x=4,16:float99"], "unknown dtype"),
    "missing file": (["{dir}/nope.py:Net", "--format", "onnx"], "does not exist"),
    "missing class": (["{file}:Nope", "--format", "onnx", "--input", "x=4,16"], "no class or factory named 'Nope'"),
    "unknown zoo model": (["kiln.models:resnet9000", "--format", "onnx"], "unknown zoo model"),
    "dim out of range": (["kiln.models:mlp", "--format", "onnx", "--dynamic", "batch=8:16"], "outside the declared"),
    "unknown dynamic dim": (["kiln.models:mlp", "--format", "onnx", "--dynamic", "seq=1:8"], "not dynamic dims"),
    "malformed dynamic": (["kiln.models:mlp", "--format", "onnx", "--dynamic", "batch=a:b"], "malformed --dynamic"),
    "file model without inputs": (["{file}:Net", "--format", "onnx"], "no example inputs"),
    "bad opset": (["kiln.models:mlp", "--format", "onnx", "--opset", "7"], "opset 7"),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_errors_exit_2_and_write_nothing(case, tmp_path, model_file, capsys):
    arguments, expected = ERRORS[case]
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    arguments = [a.format(file=model_file, dir=tmp_path) for a in arguments]
    try:
        code = main(["export", *arguments, "-o", str(out)])
    except SystemExit as exited:  # argparse's own errors
        code = exited.code
    assert code == 2
    assert expected in capsys.readouterr().err
    assert list(out.parent.iterdir()) == []
