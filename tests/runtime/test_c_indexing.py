"""The C backend's index_select, gather, cumsum and flip: compiled output matches the interpreter."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import kiln
from kiln.frontend.tensor import dispatch as call
from kiln.ir.errors import KilnError, UnsupportedError
from kiln.compiler import compile as compile_c
from tests.runtime.test_c_backend import _check
from tests.modules import LambdaModule

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
aten = kiln.ops.aten
SIZES = (1, 3, 17)


def _compile(fn, examples, dynamic, tmp_path):
    program = kiln.export(LambdaModule(fn), examples, dynamic_shapes=dynamic)
    return program, compile_c(program, output=tmp_path / "model")


def test_index_select_along_each_dim_dynamic_batch(tmp_path):
    batch = kiln.Dim("batch", max=64)

    def fn(x, i, j):
        return (call(aten.index_select.default, x, 0, i), call(aten.index_select.default, x, 1, j) * 2.0,
                call(aten.index_select.default, x, -1, j[:2]))

    examples = (kiln.randn(3, 5, 4), kiln.tensor(np.array([0, 2], np.int64)),
                kiln.tensor(np.array([3, 0, 1], np.int64)))
    program, model = _compile(fn, examples, ({0: batch}, None, None), tmp_path)
    for n in SIZES:
        rng = np.random.default_rng(n)
        x = rng.standard_normal((n, 5, 4)).astype(np.float32)
        i = rng.integers(0, n, 2).astype(np.int64)
        j = np.array([3, 0, 3], np.int64)
        _check(model(x, i, j), program(x, i, j))


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_gather_along_each_dim(dim, tmp_path):
    batch = kiln.Dim("batch", max=64)

    def fn(x, index):
        return call(aten.gather.default, x, dim, index) + 1.0

    examples = (kiln.randn(3, 5, 4), kiln.tensor(np.zeros((3, 5, 4), np.int64)))
    program, model = _compile(fn, examples, ({0: batch}, {0: batch}), tmp_path)
    for n in SIZES:
        rng = np.random.default_rng(n)
        x = rng.standard_normal((n, 5, 4)).astype(np.float32)
        index = rng.integers(0, x.shape[dim], (n, 5, 4)).astype(np.int64)
        _check(model(x, index), program(x, index))


def test_gather_with_a_smaller_index(tmp_path):
    def fn(x, index):
        return call(aten.gather.default, x, 1, index)

    x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    index = np.array([[5, 0], [1, 1], [2, 4]], np.int64)
    program, model = _compile(fn, (kiln.tensor(x), kiln.tensor(index)), None, tmp_path)
    _check(model(x, index), program(x, index))


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_cumsum_on_each_dim(dim, tmp_path):
    batch = kiln.Dim("batch", max=64)

    def fn(x, k):
        return (call(aten.cumsum.default, x, dim), call(aten.cumsum.default, x.permute(0, 2, 1), dim),
                call(aten.cumsum.default, k, dim))

    examples = (kiln.randn(3, 5, 4), kiln.tensor(np.zeros((3, 5, 4), np.int64)))
    program, model = _compile(fn, examples, ({0: batch}, {0: batch}), tmp_path)
    for n in SIZES:
        rng = np.random.default_rng(n)
        x = rng.standard_normal((n, 5, 4)).astype(np.float32)
        k = rng.integers(-50, 50, (n, 5, 4)).astype(np.int64)
        _check(model(x, k), program(x, k))


def test_cumsum_with_a_casting_dtype_converts_first(tmp_path):
    """dtype= other than the input's: legalized into a conversion, then the kernel's cumsum (to bool it stays
    refused)."""
    def fn(x):
        return call(aten.cumsum.default, x, 0, dtype=kiln.float64)

    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    program = kiln.export(LambdaModule(fn), (kiln.tensor(x),))
    _check(compile_c(program, output=tmp_path / "model")(x), program(x))
    to_bool = kiln.export(LambdaModule(lambda x: call(aten.cumsum.default, x, 0, dtype=kiln.bool)),
                          (kiln.tensor(x),))
    with pytest.raises(UnsupportedError, match="cumsum.*dtype="):
        compile_c(to_bool, output=tmp_path / "to_bool")


def test_flip_feeding_pointwise_reduction_and_matmul(tmp_path):
    batch = kiln.Dim("batch", max=64)

    def fn(x, w):
        flipped = call(aten.flip.default, x, [0, -1])
        return (flipped * 2.0 + 1.0, call(aten.flip.default, x, [1]).sum(-1),
                call(aten.flip.default, x, [0, 1]).sum([1, 2]),
                call(aten.mm.default, call(aten.flip.default, x[:, 0, :], [0, 1]), call(aten.flip.default, w, [0])),
                call(aten.flip.default, x, [2]))

    examples = (kiln.randn(3, 5, 4), kiln.randn(4, 6))
    program, model = _compile(fn, examples, ({0: batch}, None), tmp_path)
    for n in SIZES:
        rng = np.random.default_rng(n)
        x = rng.standard_normal((n, 5, 4)).astype(np.float32)
        w = rng.standard_normal((4, 6)).astype(np.float32)
        _check(model(x, w), program(x, w))


@pytest.mark.parametrize("bad", [5, -1])
def test_out_of_range_index_fails_the_run(bad, tmp_path):
    # Like the reference kernels, index_select and gather refuse negative indices (no wrapping).
    def fn(x, i, g):
        return call(aten.index_select.default, x, 1, i), call(aten.gather.default, x, 0, g)

    x = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
    i, g = np.array([4, 0, 2], np.int64), np.zeros((3, 5), np.int64)
    program, model = _compile(fn, (kiln.tensor(x), kiln.tensor(i), kiln.tensor(g)), None, tmp_path)
    _check(model(x, i, g), program(x, i, g))
    with pytest.raises(KilnError, match=f"index {bad} is out of bounds for dimension 1 with size 5"):
        model(x, np.array([0, bad, 1], np.int64), g)
    with pytest.raises(KilnError, match=f"index {bad - 1} is out of bounds for dimension 0 with size 4"):
        model(x, i, np.full((3, 5), bad - 1, np.int64))
    _check(model(x, i, g), program(x, i, g))  # the failed run leaves no state behind


def test_whole_rows_gathered_check_each_row_index_once(tmp_path):
    """x[i] of whole rows: the kernel checks each row's index once, before the loop over the row (_Exprs'
    hoist_from); negative indices wrap, an out-of-range one fails the run naming the op."""
    def fn(x, i):
        return call(aten.index.Tensor, x, [i]) * 2.0

    x = np.random.default_rng(0).standard_normal((5, 3, 8)).astype(np.float32)
    i = np.array([4, -1, 0, 2], np.int64)
    program, model = _compile(fn, (kiln.tensor(x), kiln.tensor(i)), None, tmp_path)
    source = (tmp_path / "model" / "model.c").read_text()
    assert "const int64_t h0 = kiln_index_wrap(" in source
    _check(model(x, i), program(x, i))
    with pytest.raises(KilnError, match="aten.index.Tensor: index 5 is out of bounds for dimension 0 with size 5"):
        model(x, np.array([0, 5, 1, 1], np.int64))
    _check(model(x, i), program(x, i))
