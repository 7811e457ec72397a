"""Hostile .npy / .npz inputs: `kiln run --input NAME=FILE.npy` and `kiln quantize --calibration DATA.npz` never
unpickle, refuse truncated, oversized and mismatched arrays with exit status 2 and one line, and leave no output."""

from __future__ import annotations

import io
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.hostile.support import cli_error, deadline, tree

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")


class _Exploit:
    """Unpickling this runs code that creates `marker`."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",))


def _pickled_array(marker: Path) -> np.ndarray:
    array = np.empty(2, dtype=object)
    array[0], array[1] = _Exploit(marker), 1.0
    return array


def _npy_header(shape: tuple, descr: str = "<f4") -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": descr, "fortran_order": False, "shape": shape})
    return buffer.getvalue()


def _genuine_npy() -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.ones((2, 3), np.float32))
    return buffer.getvalue()


def _save(path: Path, array: np.ndarray) -> None:
    np.save(path, array, allow_pickle=True)


# What each hostile input file holds: a function of (path to write, marker a pickle payload would create).
HOSTILE_NPY = {
    "pickled-object-array": (lambda path, marker: _save(path, _pickled_array(marker)),
                             "Python objects in dtype"),
    "pickle-not-npy": (lambda path, marker: path.write_bytes(pickle.dumps(_Exploit(marker))), "cannot read"),
    "truncated-data": (lambda path, marker: path.write_bytes(_genuine_npy()[:-5]), "cannot read"),
    "truncated-header": (lambda path, marker: path.write_bytes(_genuine_npy()[:20]), "cannot read"),
    "empty-file": (lambda path, marker: path.write_bytes(b""), "cannot read"),
    "header-claims-12-TiB": (lambda path, marker: path.write_bytes(_npy_header((2 ** 40, 3)) + bytes(24)),
                             "cannot read"),
    "header-claims-2**64-values": (lambda path, marker: path.write_bytes(_npy_header((2 ** 62, 4)) + bytes(24)),
                                   "cannot read"),
    "header-not-a-dict": (lambda path, marker: path.write_bytes(b"\x93NUMPY\x01\x00\x10\x00" + b"[1, 2, 3]".ljust(16)),
                          "cannot read"),
    "float64": (lambda path, marker: _save(path, np.ones((2, 3))), "has dtype float64 but the program expects float32"),
    "int32": (lambda path, marker: _save(path, np.ones((2, 3), np.int32)), "has dtype int32"),
    "rank-3": (lambda path, marker: _save(path, np.ones((1, 2, 3), np.float32)), "has rank 3"),
    "scalar": (lambda path, marker: _save(path, np.float32(1)), "has rank 0"),
    "static-dim": (lambda path, marker: _save(path, np.ones((2, 4), np.float32)), "dimension 1 is 4"),
    "batch-above-range": (lambda path, marker: _save(path, np.ones((65, 3), np.float32)), "outside the range"),
    "batch-zero": (lambda path, marker: _save(path, np.ones((0, 3), np.float32)), "outside the range"),
    "npz-one-array": (lambda path, marker: np.savez(path.with_suffix(".npz"), x=np.ones((2, 3), np.float32))
                      or os.replace(path.with_suffix(".npz"), path), "is an .npz archive"),
    "npz-pickled": (lambda path, marker: np.savez(path.with_suffix(".npz"), x=_pickled_array(marker))
                    or os.replace(path.with_suffix(".npz"), path), "is an .npz archive"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_NPY))
def test_hostile_npy_inputs_are_refused_and_never_unpickled(genuine, tmp_path, capsys, name):
    write, match = HOSTILE_NPY[name]
    marker = tmp_path / "pwned"
    write(tmp_path / "x.npy", marker)
    before = tree(tmp_path)
    with deadline(30):
        line = cli_error(capsys, "run", str(genuine[1]), "--input", f"x={tmp_path / 'x.npy'}",
                         "--output", str(tmp_path / "out.npz"))
    assert match in line
    assert not marker.exists()  # the pickle was never unpickled
    assert tree(tmp_path) == before  # no out.npz, no temporary


@pytest.mark.parametrize("arguments, match", [
    (lambda d: [f"x={d / 'absent.npy'}"], "does not exist"),
    (lambda d: [f"x={d}"], "is not a regular file"),
    (lambda d: ["x=/dev/zero"], "is not a regular file"),
    (lambda d: [], "no --input for x"),
    (lambda d: [f"y={d / 'x.npy'}"], "'y' is not an input of the package"),
    (lambda d: [f"x={d / 'x.npy'}", f"x={d / 'x.npy'}"], "given twice"),
    (lambda d: [f"x={d / 'x.npy'}", f"extra={d / 'x.npy'}"], "'extra' is not an input"),
    (lambda d: ["=x.npy"], "malformed --input"),
], ids=["absent", "folder", "device", "missing-name", "wrong-name", "twice", "extra-name", "no-name"])
def test_input_names_and_paths_are_checked(genuine, tmp_path, capsys, arguments, match):
    np.save(tmp_path / "x.npy", np.ones((2, 3), np.float32))
    before = tree(tmp_path)
    flags = [flag for text in arguments(tmp_path) for flag in ("--input", text)]
    with deadline(30):
        assert match in cli_error(capsys, "run", str(genuine[1]), *flags, "--output", str(tmp_path / "out.npz"))
    assert tree(tmp_path) == before


@pytest.mark.parametrize("layout", ["fortran", "big-endian"])
def test_unusual_but_valid_npy_layouts_run_correctly(genuine, tmp_path, capsys, layout):
    from kiln.cli.main import main
    program, package = genuine
    x = np.random.default_rng(1).standard_normal((5, 3)).astype(np.float32)
    stored = {"fortran": np.asfortranarray(x), "big-endian": x.astype(">f4")}[layout]
    np.save(tmp_path / "x.npy", stored)
    assert main(["run", str(package), "--input", f"x={tmp_path / 'x.npy'}", "--output", str(tmp_path / "o.npz")]) == 0
    with np.load(tmp_path / "o.npz") as outputs:
        np.testing.assert_allclose(outputs[outputs.files[0]], np.asarray(program(x)), rtol=1.3e-6, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# kiln quantize --calibration DATA.npz


def _calibration(path: Path, marker: Path, kind: str) -> None:
    batches = np.ones((2, 4, 32), np.float32)  # the zoo MLP's x is f32[batch, 32]
    if kind == "missing-name":
        np.savez(path, a=batches, b=batches)
    elif kind == "extra-name":
        np.savez(path, x=batches, y=batches)
    elif kind == "npy-not-npz":
        np.save(path.with_suffix(".npy"), batches)
        os.replace(path.with_suffix(".npy"), path)
    elif kind == "pickled":
        np.savez(path, x=_pickled_array(marker))
    elif kind == "scalar":
        np.savez(path, x=np.float32(1))
    elif kind == "wrong-dtype":
        np.savez(path, x=batches.astype(np.float64))
    elif kind == "truncated":
        np.savez(path, x=batches)
        path.write_bytes(path.read_bytes()[:100])
    elif kind == "not-a-zip":
        path.write_bytes(pickle.dumps(_Exploit(marker)))


@pytest.mark.parametrize("kind, match", [
    ("missing-name", "has no array for input(s) x"),
    ("extra-name", "has array(s) y, which are not inputs"),
    ("npy-not-npz", "not named arrays (.npz)"),
    ("pickled", "Object arrays cannot be loaded"),
    ("scalar", "is a scalar"),
    ("wrong-dtype", "is float64, the model takes float32"),
    ("truncated", "cannot read"),
    ("not-a-zip", "cannot read"),
])
def test_hostile_calibration_files_are_refused(tmp_path, capsys, monkeypatch, kind, match):
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "pwned"
    _calibration(tmp_path / "calib.npz", marker, kind)
    before = tree(tmp_path)
    line = cli_error(capsys, "quantize", "kiln.models:mlp", "--scheme", "static", "--calibration", "calib.npz",
                     "-o", "out.pt2", "-q", "--calibrate-with", "interpreter")
    assert match in line
    assert not marker.exists() and tree(tmp_path) == before


@pytest.mark.parametrize("path, match", [("absent.npz", "does not exist"), ("", "does not exist"),
                                         (".", "does not exist")])
def test_calibration_paths_that_are_not_files_are_refused(tmp_path, capsys, monkeypatch, path, match):
    monkeypatch.chdir(tmp_path)
    line = cli_error(capsys, "quantize", "kiln.models:mlp", "--scheme", "static", "--calibration", path,
                     "-o", "out.pt2", "-q")
    assert match in line and tree(tmp_path) == set()
