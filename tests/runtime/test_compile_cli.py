"""`kiln compile` / `kiln run`: a zoo model compiles, runs on .npy inputs and matches the interpreter; errors exit 2
and write nothing."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import kiln
import kiln.models
from kiln.cli.main import main

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")


@pytest.fixture(scope="module")
def mlp_package(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "mlp_pkg"
    assert main(["compile", "kiln.models:mlp", "--target", "c", "-o", str(path), "-q"]) == 0
    return path


def _reference(x):
    entry = kiln.models.get("mlp")
    program = kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes)
    return np.asarray(program(x))


def test_compile_writes_a_package(mlp_package):
    assert {p.name for p in mlp_package.iterdir()} == {"manifest.json", "weights.bin", "model.c", "model.so"}
    assert not [p for p in mlp_package.parent.iterdir() if p.name.startswith(".")]  # no staging leftovers


@pytest.mark.parametrize("batch", [1, 5])
def test_run_matches_interpreter(mlp_package, tmp_path, batch, capsys):
    x = np.random.default_rng(batch).standard_normal((batch, 32)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out.npz"
    assert main(["run", str(mlp_package), "--input", f"x={tmp_path / 'x.npy'}", "--output", str(out)]) == 0
    with np.load(out) as saved:
        (name,) = saved.files
        np.testing.assert_allclose(saved[name], _reference(x), rtol=1.3e-6, atol=1e-5)
    assert name in capsys.readouterr().out


def test_run_prints_and_benches(mlp_package, tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.ones((2, 32), np.float32))
    assert main(["run", str(mlp_package), "--input", f"x={tmp_path / 'x.npy'}", "--bench", "5"]) == 0
    out = capsys.readouterr().out
    assert "shape [2, 10] float32" in out and "median" in out


def test_run_profiles_kernels_on_given_threads(mlp_package, tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.ones((3, 32), np.float32))
    assert main(["run", str(mlp_package), "--input", f"x={tmp_path / 'x.npy'}", "--profile", "4",
                 "--threads", "1"]) == 0
    out = capsys.readouterr().out
    source = (mlp_package / "model.c").read_text()
    kernels = source.count("\nstatic void kernel_") - source.count("\nstatic void kernel_body_")  # bodies are shared
    assert "profile: mean per run over 4 runs" in out and out.count("%  kernel_") == kernels


@pytest.mark.parametrize("flags, message", [(["--profile", "-1"], "--profile -1 is negative"),
                                            (["--threads", "0"], "--threads 0 is not a positive count")])
def test_run_rejects_bad_counts(mlp_package, tmp_path, capsys, flags, message):
    np.save(tmp_path / "x.npy", np.ones((3, 32), np.float32))
    assert main(["run", str(mlp_package), "--input", f"x={tmp_path / 'x.npy'}", *flags]) == 2
    assert message in capsys.readouterr().err


def test_compile_from_pt2_and_pipeline(tmp_path, capsys):
    entry = kiln.models.get("mlp")
    kiln.save(kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes), tmp_path / "mlp.pt2")
    package = tmp_path / "pkg"
    assert main(["compile", str(tmp_path / "mlp.pt2"), "--target", "c", "-o", str(package), "-q",
                 "-p", "decompose,canonicalize,cse,dce"]) == 0
    x = np.random.default_rng(0).standard_normal((3, 32)).astype(np.float32)
    np.testing.assert_allclose(kiln.runtime.load(package)(x), _reference(x), rtol=1.3e-6, atol=1e-5)
    # recompiling over an existing package replaces it
    assert main(["compile", str(tmp_path / "mlp.pt2"), "-o", str(package), "-q"]) == 0
    assert (package / "model.so").is_file()


def test_compile_with_input_and_dynamic(tmp_path):
    package = tmp_path / "pkg"
    assert main(["compile", "kiln.models.mlp:MLP", "-o", str(package), "-q", "--input", "x=batch,32",
                 "--dynamic", "batch=1:64"]) == 0
    symbols = kiln.runtime.load(package).manifest["symbols"]
    assert [(s["name"], s["lower"], s["upper"]) for s in symbols] == [("batch", 1, 64)]


@pytest.mark.parametrize("args, message", [
    (["kiln.models:nope"], "unknown zoo model"),
    (["kiln.models:mlp", "-p", "bogus"], "unknown pass"),
    (["missing.pt2"], "does not exist"),
    (["kiln.models:mlp", "--dynamic", "batch=9:1"], "above the maximum"),
])
def test_compile_errors_exit_2_and_write_nothing(tmp_path, capsys, args, message):
    assert main(["compile", *args, "-o", str(tmp_path / "pkg"), "-q"]) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_compile_refuses_to_overwrite_a_non_package(tmp_path, capsys):
    (tmp_path / "file.txt").write_text("keep me")
    assert main(["compile", "kiln.models:mlp", "-o", str(tmp_path / "file.txt"), "-q"]) == 2
    assert "not a kiln package" in capsys.readouterr().err
    assert (tmp_path / "file.txt").read_text() == "keep me"
    assert main(["compile", "kiln.models:mlp", "-o", str(tmp_path / "no" / "pkg"), "-q"]) == 2


def test_compile_pt2_rejects_input_flags(tmp_path, capsys):
    entry = kiln.models.get("mlp")
    kiln.save(kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes), tmp_path / "mlp.pt2")
    assert main(["compile", str(tmp_path / "mlp.pt2"), "-o", str(tmp_path / "pkg"), "--input", "x=4,32"]) == 2
    assert "not to a .pt2" in capsys.readouterr().err and not (tmp_path / "pkg").exists()


@pytest.mark.parametrize("make_input, message", [
    (lambda d: [], "no --input for x"),
    (lambda d: [f"y={d / 'x.npy'}"], "is not an input"),
    (lambda d: ["x"], "malformed --input"),
    (lambda d: [f"x={d / 'absent.npy'}"], "does not exist"),
    (lambda d: [f"x={d / 'bad.npy'}"], "cannot read"),
    (lambda d: [f"x={d / 'f64.npy'}"], "'x'"),
])
def test_run_errors_exit_2(mlp_package, tmp_path, capsys, make_input, message):
    np.save(tmp_path / "x.npy", np.ones((2, 32), np.float32))
    np.save(tmp_path / "f64.npy", np.ones((2, 32), np.float64))
    (tmp_path / "bad.npy").write_bytes(b"not npy")
    args = [a for text in make_input(tmp_path) for a in ("--input", text)]
    assert main(["run", str(mlp_package), *args, "--output", str(tmp_path / "out.npz")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out.npz").exists()


def test_run_needs_a_package(tmp_path, capsys):
    assert main(["run", str(tmp_path), "--input", "x=x.npy"]) == 2
    assert "not a kiln package" in capsys.readouterr().err
