"""The standalone C runner (examples/c_deploy/main.c + kiln/codegen/c/kiln.h), built by its Makefile, prints outputs
equal to Python's."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import numpy as np
import pytest

import kiln
import kiln.models
from kiln.compiler import compile as compile_c
from kiln.runtime import load

pytestmark = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("make") is None,
                                reason="needs a C compiler and make")
ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples/c_deploy"


def make_example(build_dir: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    """Run examples/c_deploy/Makefile with its outputs in `build_dir` (the source tree stays clean and parallel
    workers don't race) and -Werror on main.c; fail the test with the compiler's output if make fails."""
    result = subprocess.run(["make", "--no-print-directory", "-C", str(EXAMPLE), f"BUILD_DIR={build_dir}",
                             "EXTRA_CFLAGS=-Werror", *args], capture_output=True, text=True)
    assert result.returncode == 0, f"make failed:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    build_dir = tmp_path_factory.mktemp("deploy")
    result = make_example(build_dir)
    assert "warning" not in result.stderr, result.stderr  # -Wall -Wextra clean (-Werror would fail anyway)
    return build_dir / "kiln_deploy"


@pytest.fixture(scope="module")
def mlp_package(tmp_path_factory):
    entry = kiln.models.get("mlp")
    program = kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes)
    path = tmp_path_factory.mktemp("pkg") / "mlp"
    compile_c(program, output=path)
    return path, program


def parse_outputs(text: str) -> dict[str, np.ndarray]:
    outputs: dict[str, np.ndarray] = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        _, name, dtype, shape = lines[i].split(" ", 3)
        dims = [int(d) for d in shape.strip("[]").split(",") if d.strip()]
        count = int(np.prod(dims))
        outputs[name] = np.array([float(v) for v in lines[i + 1:i + 1 + count]]).astype(dtype).reshape(dims)
        i += 1 + count
    return outputs


@pytest.mark.parametrize("batch", [1, 3, 13])
def test_c_runner_matches_python(runner, mlp_package, tmp_path, batch):
    path, program = mlp_package
    x = np.random.default_rng(batch).standard_normal((batch, 32)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    result = subprocess.run([str(runner), str(path), f"x={tmp_path / 'x.npy'}"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    got = parse_outputs(result.stdout)
    expected = load(path)(x)
    (name,) = got
    assert got[name].shape == expected.shape == (batch, 10) and got[name].dtype == expected.dtype
    np.testing.assert_array_equal(got[name], expected)  # same library, values printed with %.9g: exact
    np.testing.assert_allclose(got[name], np.asarray(program(x)), rtol=1.3e-6, atol=1e-5)


@pytest.mark.parametrize("array, message", [
    (np.zeros((2, 32), np.float64), "must have dtype float32"),
    (np.zeros((2, 31), np.float32), "dim 1 must be 32"),
    (np.zeros((2, 32, 1), np.float32), "rank"),
    (np.zeros((5000, 32), np.float32), "outside its range"),
])
def test_c_runner_rejects_bad_inputs(runner, mlp_package, tmp_path, array, message):
    path, _ = mlp_package
    np.save(tmp_path / "x.npy", array)
    result = subprocess.run([str(runner), str(path), f"x={tmp_path / 'x.npy'}"], capture_output=True, text=True)
    assert result.returncode == 2 and message in result.stderr and not result.stdout


def test_c_runner_needs_every_input(runner, mlp_package):
    result = subprocess.run([str(runner), str(mlp_package[0])], capture_output=True, text=True)
    assert result.returncode == 1 and "no input for 'x'" in result.stderr
