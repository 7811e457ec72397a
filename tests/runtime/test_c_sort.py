"""The C backend's sort and topk: values and indices match the interpreter's stable, NaN-largest order."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import kiln
from kiln.frontend.tensor import dispatch as call
from tests.runtime.test_c_indexing import SIZES, _compile

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
aten = kiln.ops.aten


def _check(got, expected):
    for g, e in zip(got, expected):
        e = np.asarray(e)
        assert g.shape == e.shape and g.dtype == e.dtype
        if e.dtype == np.int64:
            np.testing.assert_array_equal(g, e)
        else:
            np.testing.assert_allclose(g, e, rtol=1.3e-6, atol=1e-5, equal_nan=True)


def _rows_with_ties(rng, shape, dtype=np.float32):
    """Few distinct values (many ties), with NaN, +-inf and signed zeros sprinkled in for floats."""
    x = rng.integers(-3, 4, shape).astype(dtype)
    if np.issubdtype(dtype, np.floating):
        flat = x.reshape(-1)
        picks = rng.integers(0, flat.size, (4, max(1, flat.size // 8)))
        flat[picks[0]], flat[picks[1]], flat[picks[2]], flat[picks[3]] = np.nan, np.inf, -np.inf, -0.0
    return x


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_sort_matches_interpreter(dim, descending, dtype, tmp_path):
    batch = kiln.Dim("batch", max=64)

    def fn(x):
        return call(aten.sort.default, x, dim, descending)

    examples = (kiln.tensor(np.zeros((3, 9, 6), dtype)),)
    program, model = _compile(fn, examples, ({0: batch},), tmp_path)
    for n in SIZES:
        x = _rows_with_ties(np.random.default_rng(n), (n, 9, 6), dtype)
        _check(model(x), program(x))


@pytest.mark.parametrize("k", [1, 4, 9])
@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("dim", [1, -1])
def test_topk_matches_interpreter(k, largest, dim, tmp_path):
    batch = kiln.Dim("batch", max=64)

    def fn(x):
        return call(aten.topk.default, x * 2.0, k, dim, largest, True)

    examples = (kiln.randn(3, 9, 9),)
    program, model = _compile(fn, examples, ({0: batch},), tmp_path)
    for n in SIZES:
        x = _rows_with_ties(np.random.default_rng(n), (n, 9, 9))
        _check(model(x), program(x))


def test_topk_along_dynamic_dim_and_unsorted(tmp_path):
    batch = kiln.Dim("batch", max=64)

    def fn(x):
        return call(aten.topk.default, x, 2, 0, True, False) + (call(aten.sort.default, x, 0, True)[1],)

    examples = (kiln.randn(3, 5),)
    program, model = _compile(fn, examples, ({0: batch},), tmp_path)
    for n in (2, 3, 17):
        x = _rows_with_ties(np.random.default_rng(n), (n, 5))
        _check(model(x), program(x))


def test_long_row_with_nan_and_inf(tmp_path):
    def fn(x):
        return call(aten.sort.default, x, -1, False) + call(aten.topk.default, x, 100, -1, True, True)

    rng = np.random.default_rng(0)
    x = _rows_with_ties(rng, (2, 1000))
    x[1] = rng.standard_normal(1000).astype(np.float32)
    program, model = _compile(fn, (kiln.tensor(x),), None, tmp_path)
    _check(model(x), program(x))


@pytest.mark.parametrize("dtype", [np.int32, np.int16, np.int8, np.uint8, np.bool_])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_and_topk_of_every_integer_dtype(dtype, descending, tmp_path):
    """The merge sort is of any element type: values over the dtype's whole range (many ties for the narrow ones),
    sorted stably with their indices, and topk, as the interpreter (ATen's stable order)."""
    def fn(x):
        return call(aten.sort.stable, x, stable=True, dim=-1, descending=descending) + \
            call(aten.topk.default, x, 3, -1, descending, True)

    rng = np.random.default_rng(0)
    info = np.iinfo(dtype) if dtype is not np.bool_ else None
    x = (rng.integers(0, 2, (4, 40)) if info is None else
         rng.integers(info.min, info.max, (4, 40), endpoint=True)).astype(dtype)
    x[0, ::3] = x[0, 1]  # ties
    program, model = _compile(fn, (kiln.tensor(x),), None, tmp_path)
    for got, expected in zip(model(x), program(x)):
        np.testing.assert_array_equal(got, np.asarray(expected))
