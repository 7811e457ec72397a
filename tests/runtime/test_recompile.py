"""Rebuilding a package folder in one process: every load runs the code on disk at that moment, and models loaded
earlier keep running their own code (the dynamic loader would otherwise hand back the first library it loaded
under that path)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import kiln
import kiln.nn as nn
from kiln.cli.main import main
from kiln.ir.errors import KilnError
from kiln.compiler import compile as compile_c

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")

MODELS_SOURCE = '''
import kiln
import kiln.nn as nn


class Scale(nn.Module):
    def forward(self, x):
        return x * 3.0


class Softmax(nn.Module):
    def forward(self, x):
        return kiln.softmax(x, dim=-1) + 1.0
'''


class Affine(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(x).relu()


class Scale(nn.Module):
    def forward(self, x):
        return x * 3.0


def _programs() -> dict[str, kiln.ExportedProgram]:
    """Three programs over x: f32[batch, 8]; 'static' has no symbol at all, so its symbol list differs."""
    kiln.manual_seed(0)
    batch = kiln.Dim("batch", max=64)
    example = (kiln.randn(4, 8),)
    return {"affine": kiln.export(Affine(), example, dynamic_shapes={"x": {0: batch}}),
            "scale": kiln.export(Scale(), example, dynamic_shapes={"x": {0: batch}}),
            "static": kiln.export(Affine(), example)}


def _x(batch: int) -> np.ndarray:
    return np.random.default_rng(batch).standard_normal((batch, 8)).astype(np.float32)


def _check(got: np.ndarray, program: kiln.ExportedProgram, x: np.ndarray) -> None:
    expected = np.asarray(program(x))
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1.3e-6, atol=1e-5)


@pytest.mark.parametrize("order", [("affine", "scale"), ("scale", "affine"), ("affine", "static"),
                                   ("static", "scale")])
def test_two_programs_compiled_into_one_folder(tmp_path, order):
    programs = _programs()
    folder = tmp_path / "pkg"
    loaded = []
    for name in order:
        model = compile_c(programs[name], output=folder)
        loaded.append((name, model))
        batch = 4 if name == "static" else 32
        _check(model(_x(batch)), programs[name], _x(batch))
        _check(kiln.runtime.load(folder)(_x(batch)), programs[name], _x(batch))  # a fresh load: the same code
    for name, model in loaded:  # the models loaded before the rebuild still run their own code
        batch = 4 if name == "static" else 3
        _check(model(_x(batch)), programs[name], _x(batch))


def test_cli_compile_twice_into_one_folder_then_run(tmp_path, capsys, monkeypatch):
    (tmp_path / "two_models.py").write_text(MODELS_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import two_models
    x = _x(5)
    np.save(tmp_path / "x.npy", x)
    folder, out = tmp_path / "pkg", tmp_path / "out.npz"
    shape = ["--input", "x=batch,8", "--dynamic", "batch=1:64", "-q"]
    for name in ("Scale", "Softmax", "Scale"):
        assert main(["compile", f"{tmp_path / 'two_models.py'}:{name}", "-o", str(folder), *shape]) == 0
        assert main(["run", str(folder), "--input", f"x={tmp_path / 'x.npy'}", "--output", str(out)]) == 0
        with np.load(out) as saved:
            got = saved[saved.files[0]]
        _check(got, kiln.export(getattr(two_models, name)(), (kiln.from_numpy(x),)), x)
    capsys.readouterr()


def test_a_library_from_another_package_is_refused(tmp_path):
    programs = _programs()
    compile_c(programs["affine"], output=tmp_path / "a")
    compile_c(programs["scale"], output=tmp_path / "b")
    (tmp_path / "a" / "model.so").unlink()
    shutil.copy(tmp_path / "b" / "model.so", tmp_path / "a" / "model.so")
    with pytest.raises(KilnError, match="was not built from this package's model.c"):
        kiln.runtime.load(tmp_path / "a")
