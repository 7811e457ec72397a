"""`kiln export` and `kiln compile` on every kind of MODEL: a torch class, factory or instance (through torch.export),
a kiln module (class or instance), and a .pt2 written by torch.export, checked against torch eager; plus what
happens without torch."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kiln.cli.main import main
from tests.no_torch import without_torch

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

REPO = Path(__file__).resolve().parents[1]
BATCHES = (3, 17)  # inside --dynamic batch=1:64, and neither is the example size (2) the model was traced at
DIMS = ["--input", "x=batch,3,8,8", "--dynamic", "batch=1:64"]

TORCH_SOURCE = '''
import torch
from torch import nn


class Net(nn.Module):
    """A small CNN; batch norm and dropout make train and eval mode differ."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)  # every Net() holds the same weights, so the test can rebuild them
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.drop = nn.Dropout(0.5)
        self.fc = nn.Linear(8 * 4 * 4, 10)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        y = self.pool(torch.relu(self.bn(self.conv(x))))
        return self.fc(self.drop(y.flatten(1)))


def make_net():
    return Net()


model = Net()  # left in train mode: the CLI exports in eval mode


def make_tuple():
    return (Net(),)


class Tagger(nn.Module):
    """Token ids (int64) in, per-token scores out."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.embed = nn.Embedding(50, 16)
        self.proj = nn.Linear(16, 4)

    def forward(self, tokens):
        return self.proj(torch.tanh(self.embed(tokens)))
'''

KILN_SOURCE = '''
from pathlib import Path

import numpy as np

import kiln.nn as nn


class KilnNet(nn.Module):
    """net.py's Net in kiln.nn, holding its weights (weights.npz)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.drop = nn.Dropout(0.5)
        self.fc = nn.Linear(8 * 4 * 4, 10)
        with np.load(Path(__file__).with_name("weights.npz")) as weights:
            self.load_state_dict({name: weights[name] for name in weights.files})

    def forward(self, x):
        y = self.pool(self.bn(self.conv(x)).relu())
        return self.fc(self.drop(y.flatten(1)))


model = KilnNet()
'''

# kind -> (MODEL with {dir} for the folder, extra flags)
MODELS = {
    "torch class": ("{dir}/net.py:Net", DIMS),
    "torch factory": ("{dir}/net.py:make_net", DIMS),
    "torch instance": ("{dir}/net.py:model", DIMS),
    "kiln class": ("{dir}/kiln_net.py:KilnNet", DIMS),
    "kiln instance": ("{dir}/kiln_net.py:model", DIMS),
    "torch .pt2": ("{dir}/net.pt2", []),
}

# A process where `import torch` fails, as where torch is not installed; argv[1:] are the kiln arguments.
WITHOUT_TORCH = without_torch("""
    from kiln.cli.main import main
    code = main(sys.argv[1:])
    assert sys.modules.get("torch") is None and not any(m.startswith("torch.") for m in sys.modules)
    sys.exit(code)
""")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """net.py (torch), kiln_net.py (the same model in kiln, with net.py's weights) and net.pt2 (torch.export's)."""
    path = tmp_path_factory.mktemp("models")
    (path / "net.py").write_text(TORCH_SOURCE)
    (path / "kiln_net.py").write_text(KILN_SOURCE)
    reference = _reference(path)
    np.savez(path / "weights.npz", **{name: value.numpy() for name, value in reference.state_dict().items()})
    batch = torch.export.Dim("batch", min=1, max=64)
    exported = torch.export.export(reference, (torch.randn(2, 3, 8, 8),), dynamic_shapes={"x": {0: batch}})
    torch.export.save(exported, path / "net.pt2")
    return path


def _reference(path: Path, name: str = "Net") -> torch.nn.Module:
    """net.py's Net in eval mode: the torch eager oracle for every kind of MODEL."""
    namespace: dict = {}
    exec(compile(TORCH_SOURCE, str(path / "net.py"), "exec"), namespace)
    return namespace[name]().eval()


def _inputs(batch: int) -> np.ndarray:
    return np.random.default_rng(batch).standard_normal((batch, 3, 8, 8)).astype(np.float32)


def _arguments(kind: str, folder: Path) -> list[str]:
    spec, flags = MODELS[kind]
    return [spec.format(dir=folder), *flags]


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_export_onnx_matches_torch_eager(kind, folder, tmp_path):
    out = tmp_path / "net.onnx"
    model, *flags = _arguments(kind, folder)
    assert main(["export", model, "--format", "onnx", "-o", str(out), "-q", *flags]) == 0
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    (declared,) = session.get_inputs()
    if kind != "torch .pt2":  # the user's dim name survives torch.export (torch names it s<N> in its .pt2)
        assert declared.shape == ["batch", 3, 8, 8]
    reference = _reference(folder)
    for batch in BATCHES:
        x = _inputs(batch)
        (actual,) = session.run(None, {declared.name: x})
        with torch.no_grad():
            torch.testing.assert_close(torch.from_numpy(actual), reference(torch.from_numpy(x)))


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_compile_and_run_match_torch_eager(kind, folder, tmp_path, capsys):
    package = tmp_path / "pkg"
    model, *flags = _arguments(kind, folder)
    assert main(["compile", model, "-o", str(package), "-q", *flags]) == 0
    reference = _reference(folder)
    for batch in BATCHES:
        x = _inputs(batch)
        np.save(tmp_path / "x.npy", x)
        out = tmp_path / f"out{batch}.npz"
        assert main(["run", str(package), "--input", f"x={tmp_path / 'x.npy'}", "--output", str(out)]) == 0
        with np.load(out) as saved, torch.no_grad():
            (name,) = saved.files
            torch.testing.assert_close(torch.from_numpy(saved[name]), reference(torch.from_numpy(x)))
    import kiln.runtime
    symbols = kiln.runtime.load(package).manifest["symbols"]
    assert [(s["lower"], s["upper"]) for s in symbols] == [(1, 64)]
    if kind != "torch .pt2":
        assert [s["name"] for s in symbols] == ["batch"]


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_int64_input_and_two_dynamic_dims(folder, tmp_path):
    flags = ["--input", "tokens=batch,seq:int64", "--dynamic", "batch=1:8", "--dynamic", "seq=1:32"]
    model = f"{folder}/net.py:Tagger"
    assert main(["export", model, "--format", "onnx", "-o", str(tmp_path / "tagger.onnx"), "-q", *flags]) == 0
    assert main(["compile", model, "-o", str(tmp_path / "pkg"), "-q", *flags]) == 0
    session = ort.InferenceSession(str(tmp_path / "tagger.onnx"), providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].shape == ["batch", "seq"]
    import kiln.runtime
    compiled = kiln.runtime.load(tmp_path / "pkg")
    reference = _reference(folder, "Tagger")
    for shape in ((3, 5), (7, 20)):
        tokens = np.random.default_rng(shape[1]).integers(0, 50, shape, dtype=np.int64)
        with torch.no_grad():
            expected = reference(torch.from_numpy(tokens))
        torch.testing.assert_close(torch.from_numpy(session.run(None, {"tokens": tokens})[0]), expected)
        torch.testing.assert_close(torch.from_numpy(np.asarray(compiled(tokens))), expected)


ERRORS = {
    "torch model without inputs": (["{dir}/net.py:Net"], "has no example inputs"),
    "factory returning no module": (["{dir}/net.py:make_tuple", *DIMS], "not a kiln.nn.Module or torch.nn.Module"),
    "torch.export rejects the range": (["{dir}/net.py:Net", "--input", "x=batch,3,h,8", "--dynamic", "h=2:64"],
                                       "torch.export failed on"),
    ".pt2 with --input": (["{dir}/net.pt2", "--input", "x=4,3,8,8"], "not to a .pt2"),
}


@pytest.mark.parametrize("command", ["export", "compile"])
@pytest.mark.parametrize("case", sorted(ERRORS))
def test_errors_exit_2_and_write_nothing(case, command, folder, tmp_path, capsys):
    arguments, expected = ERRORS[case]
    arguments = [a.format(dir=folder) for a in arguments]
    out = tmp_path / "out"
    out.mkdir()
    target = ["--format", "onnx", "-o", str(out / "net.onnx")] if command == "export" else ["-o", str(out / "pkg")]
    assert main([command, *arguments, *target, "-q"]) == 2
    message = capsys.readouterr().err
    assert expected in message and message.startswith("kiln: error: ")
    assert list(out.iterdir()) == []


def _without_torch(*arguments: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_TORCH, *arguments], capture_output=True, text=True,
                          cwd=cwd, timeout=300, env=_child_env())


def _child_env() -> dict:
    import os
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


@pytest.mark.parametrize("command", ["export", "compile"])
def test_torch_model_without_torch_says_how_to_install_it(command, folder, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    target = ["--format", "onnx", "-o", str(out / "net.onnx")] if command == "export" else ["-o", str(out / "pkg")]
    result = _without_torch(command, f"{folder}/net.py:Net", *DIMS, *target, "-q", cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    first, *rest = result.stderr.strip().splitlines()
    assert first == f"kiln: error: {folder}/net.py imports torch, which is not installed"
    assert any("pip install 'kiln[torch]'" in line for line in rest)
    assert "Traceback" not in result.stderr
    assert list(out.iterdir()) == []


def test_pt2_to_onnx_without_torch(folder, tmp_path):
    out = tmp_path / "net.onnx"
    result = _without_torch("export", str(folder / "net.pt2"), "--format", "onnx", "-o", str(out), "--verify",
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ok" in result.stderr  # --verify's report: onnxruntime agrees with kiln's interpreter
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    reference = _reference(folder)
    for batch in BATCHES:
        x = _inputs(batch)
        (actual,) = session.run(None, {session.get_inputs()[0].name: x})
        with torch.no_grad():
            torch.testing.assert_close(torch.from_numpy(actual), reference(torch.from_numpy(x)))


def test_from_torch_names_symbols_after_their_dims():
    """What keeps `batch` through the CLI: kiln.from_torch renames torch's s<N> after the Dim, derived dims aside."""
    import kiln

    class Pair(torch.nn.Module):
        def forward(self, x, y):
            return x.repeat(2, 1) + y

    batch = torch.export.Dim("batch", min=1, max=32)
    program = kiln.from_torch(Pair(), (torch.randn(3, 4), torch.randn(6, 4)),
                              dynamic_shapes={"x": {0: batch}, "y": {0: 2 * batch}})
    assert {str(symbol): (r.lower, r.upper) for symbol, r in program.range_constraints.items()} == {"batch": (1, 32)}
    x, y = np.ones((5, 4), np.float32), np.ones((10, 4), np.float32)
    np.testing.assert_array_equal(program(x, y), np.full((10, 4), 2, np.float32))
