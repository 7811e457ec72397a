"""Misusing a loaded CompiledModel from Python: wrong dtypes, ranks, sizes, non-arrays and argument counts raise an
InputError naming the input before any native code runs; unusual but valid arrays (non-contiguous, read-only,
byte-swapped, unaligned, mapped from disk) run and match the reference interpreter."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import kiln
import kiln.runtime
from kiln.ir.errors import InputError, KilnError

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")


@pytest.fixture(scope="module")
def model(genuine):
    return kiln.runtime.load(genuine[1])


def _x(batch: int = 5) -> np.ndarray:
    return np.random.default_rng(batch).standard_normal((batch, 3)).astype(np.float32)


@pytest.mark.parametrize("dtype", ["float64", "float16", "int32", "int64", "uint8", "bool", "complex64", "object"])
def test_wrong_dtypes_are_refused(model, dtype):
    with pytest.raises(InputError, match=f"input 'x' has dtype {dtype}"):
        model(_x().astype(dtype))


@pytest.mark.parametrize("shape, match", [
    ((3,), "has rank 1"), ((1, 5, 3), "has rank 3"), ((), "has rank 0"),
    ((5, 4), "dimension 1 is 4"), ((5, 0), "dimension 1 is 0"),
    ((0, 3), "outside the range of symbol batch"), ((65, 3), "outside the range of symbol batch"),
])
def test_wrong_ranks_and_sizes_are_refused(model, shape, match):
    with pytest.raises(InputError, match=match):
        model(np.ones(shape, np.float32))


@pytest.mark.parametrize("value", [[[1.0, 2.0, 3.0]], [1.0, 2.0, 3.0], 1.0, 3, None, "x", {"x": 1}, b"\0" * 12],
                         ids=["nested-list", "list", "float", "int", "None", "str", "dict", "bytes"])
def test_python_values_are_refused(model, value):
    with pytest.raises(InputError, match="input 'x' must be a numpy array, got"):
        model(value)


@pytest.mark.parametrize("count", [0, 2, 3])
def test_wrong_argument_counts_are_refused(model, count):
    with pytest.raises(InputError, match=f"takes 1 input\\(s\\) \\(x\\) but got {count}"):
        model(*[_x()] * count)


def _transposed():
    return np.ascontiguousarray(_x().T).T  # a (5, 3) view with strides (4, 20)


def _read_only():
    x = _x()
    x.setflags(write=False)
    return x


def _unaligned():
    buffer = np.zeros(5 * 3 * 4 + 1, np.uint8)
    x = np.frombuffer(buffer.data, np.float32, 15, offset=1).reshape(5, 3)
    x[...] = _x()
    assert not x.flags.aligned
    return x


def _mapped(tmp_path):
    np.save(tmp_path / "x.npy", _x())
    return np.load(tmp_path / "x.npy", mmap_mode="r")


VALID = {
    "transposed": lambda tmp_path: _transposed(),
    "every-other-row": lambda tmp_path: _x(10)[::2],
    "reversed-rows": lambda tmp_path: _x()[::-1],
    "column-slice": lambda tmp_path: np.concatenate([_x(), _x()], axis=1)[:, 1:4],
    "fortran-order": lambda tmp_path: np.asfortranarray(_x()),
    "broadcast": lambda tmp_path: np.broadcast_to(_x(1), (5, 3)),
    "read-only": lambda tmp_path: _read_only(),
    "read-only-mmap": _mapped,
    "big-endian": lambda tmp_path: _x().astype(">f4"),
    "unaligned": lambda tmp_path: _unaligned(),
    "kiln-tensor": lambda tmp_path: kiln.tensor(_x()),
}


@pytest.mark.parametrize("layout", sorted(VALID))
def test_unusual_valid_arrays_run_and_match_the_interpreter(genuine, model, tmp_path, layout):
    program, _ = genuine
    x = VALID[layout](tmp_path)
    values = np.array(x.__kiln_array__() if hasattr(x, "__kiln_array__") else x, dtype=np.float32)
    got = model(x)
    np.testing.assert_allclose(got, np.asarray(program(values)), rtol=1.3e-6, atol=1e-5)
    assert got.flags.writeable and got.flags.c_contiguous and got.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(x.__kiln_array__() if hasattr(x, "__kiln_array__") else x), values)


@pytest.mark.parametrize("value", ["2", 0, -1, True, 1.5])
def test_bad_thread_counts_are_refused(genuine, model, value):
    with pytest.raises(KilnError, match="num_threads must be a positive int or None"):
        model.num_threads = value
    with pytest.raises(KilnError, match="num_threads must be a positive int or None"):
        kiln.runtime.load(genuine[1], num_threads=value)


@pytest.mark.parametrize("runs", [0, -3, "3", 2.5, None])
def test_bad_profile_run_counts_are_refused(model, runs):
    with pytest.raises(KilnError, match="runs must be a positive int"):
        model.profile(_x(), runs=runs)


@pytest.mark.parametrize("where", ["", "/nonexistent/package", "{file}"])
def test_loading_what_is_not_a_package_is_refused(tmp_path, where):
    (tmp_path / "file.txt").write_text("not a package")
    with pytest.raises(KilnError, match="cannot read the package manifest"):
        kiln.runtime.load(where.replace("{file}", str(tmp_path / "file.txt")))


def test_a_refused_call_leaves_the_model_usable(genuine, model):
    for bad in (np.ones((5, 4), np.float32), [1.0], np.ones((65, 3), np.float32)):
        with pytest.raises(InputError):
            model(bad)
    x = _x()
    np.testing.assert_allclose(model(x), np.asarray(genuine[0](x)), rtol=1.3e-6, atol=1e-5)
