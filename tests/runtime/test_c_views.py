"""The C backend's diagonal, as_strided, repeat and index.Tensor: compiled output matches the interpreter."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import kiln
from kiln.frontend.tensor import dispatch as call
from kiln.ir.errors import KilnError
from tests.runtime.test_c_backend import _check
from tests.runtime.test_c_indexing import SIZES, _compile

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
aten = kiln.ops.aten


def _randn(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_diagonal_offsets_and_swapped_dims_dynamic_batch(tmp_path):
    batch = kiln.Dim("batch", max=64)

    def fn(x):
        above = call(aten.diagonal.default, x, 2, 1, 2)  # [n, 4]
        below = call(aten.diagonal.default, x, -2, 2, 1)  # [n, 4]: dims swapped
        batchwise = call(aten.diagonal.default, x, 0, 0, 2)  # [5, min(n, 6)]: the batch dim is a diagonal dim
        return (call(aten.mul.Tensor, above, below) + 1.0, call(aten.sum.dim_IntList, below, [-1]),
                call(aten.amax.default, call(aten.exp.default, batchwise), [0]))

    program, model = _compile(fn, (kiln.randn(3, 5, 6),), ({0: batch},), tmp_path)
    for n in SIZES:
        x = _randn(np.random.default_rng(n), n, 5, 6)
        _check(model(x), program(x))


def test_diagonal_of_a_transposed_view(tmp_path):
    def fn(x):
        t = call(aten.permute.default, x, [1, 0])
        return call(aten.diagonal.default, t, -1) * 2.0, call(aten.diagonal.default, t, 2)

    x = _randn(np.random.default_rng(0), 4, 5)
    program, model = _compile(fn, (kiln.tensor(x),), None, tmp_path)
    _check(model(x), program(x))


def test_as_strided_sliding_windows(tmp_path):
    def fn(x):
        windows = call(aten.as_strided.default, x, [6, 3], [1, 1])  # overlapping windows of 3 over 8 elements
        strided = call(aten.as_strided.default, x, [3, 2], [2, 1], 1)
        return call(aten.sum.dim_IntList, windows, [1]), strided * 3.0

    x = _randn(np.random.default_rng(1), 8)
    program, model = _compile(fn, (kiln.tensor(x),), None, tmp_path)
    _check(model(x), program(x))


def test_as_strided_of_a_non_contiguous_view(tmp_path):
    # The reference reads the input's contiguous storage: a transposed input is copied first.
    def fn(x):
        t = call(aten.permute.default, x, [1, 0])
        return call(aten.as_strided.default, t, [4, 2], [2, 3], 1) + 1.0

    x = _randn(np.random.default_rng(2), 3, 5)
    program, model = _compile(fn, (kiln.tensor(x),), None, tmp_path)
    _check(model(x), program(x))


def test_repeat_with_extra_leading_dims_dynamic_batch(tmp_path):
    batch = kiln.Dim("batch", max=64)

    def fn(x, y):
        return (call(aten.repeat.default, x, [2, 1, 3]) - 1.0, call(aten.repeat.default, y, [3, 2, 1, 2]),
                call(aten.sum.dim_IntList, call(aten.repeat.default, x, [2, 2]), [0]))

    examples = (kiln.randn(3, 4), kiln.tensor(np.array([[1, 2, 3]], np.int64)))
    program, model = _compile(fn, examples, ({0: batch}, None), tmp_path)
    for n in SIZES:
        rng = np.random.default_rng(n)
        x, y = _randn(rng, n, 4), rng.integers(-5, 5, (1, 3)).astype(np.int64)
        _check(model(x, y), program(x, y))


@pytest.mark.parametrize("position", [0, 1, -1])
def test_index_one_tensor_on_each_dim_dynamic_batch(position, tmp_path):
    batch = kiln.Dim("batch", max=64)

    def fn(x, i):
        indices = [None] * (position % 3) + [i]
        return call(aten.index.Tensor, x, indices) * 2.0

    examples = (kiln.randn(3, 5, 4), kiln.tensor(np.zeros((2, 3), np.int64)))
    program, model = _compile(fn, examples, ({0: batch}, None), tmp_path)
    for n in SIZES:
        rng = np.random.default_rng(n)
        x = _randn(rng, n, 5, 4)
        size = x.shape[position]
        i = rng.integers(-size, size, (2, 3)).astype(np.int64)
        _check(model(x, i), program(x, i))


def test_index_with_a_0d_index_and_a_vector(tmp_path):
    def fn(x, i, j):
        return call(aten.index.Tensor, x, [None, i]), call(aten.index.Tensor, x, [j])

    x = _randn(np.random.default_rng(3), 4, 5)
    i, j = np.array(-2, np.int64), np.array([3, -4, 0], np.int64)
    program, model = _compile(fn, (kiln.tensor(x), kiln.tensor(i), kiln.tensor(j)), None, tmp_path)
    _check(model(x, i, j), program(x, i, j))


@pytest.mark.parametrize("bad", [5, -6])
def test_index_out_of_range_fails_the_run(bad, tmp_path):
    def fn(x, i):
        return call(aten.index.Tensor, x, [None, i])

    x = _randn(np.random.default_rng(4), 4, 5)
    i = np.array([4, -5, 0], np.int64)
    program, model = _compile(fn, (kiln.tensor(x), kiln.tensor(i)), None, tmp_path)
    _check(model(x, i), program(x, i))
    bad_index = np.array([0, bad, 1], np.int64)
    with pytest.raises(KilnError):
        program(x, bad_index)
    with pytest.raises(KilnError, match=f"index {bad} is out of bounds for dimension 1 with size 5"):
        model(x, bad_index)
    _check(model(x, i), program(x, i))  # the failed run leaves no state behind
