"""The C backend's advanced indexing and scatters: index.Tensor with several broadcasting indices, index_put,
scatter, scatter_add and scatter_reduce match the interpreter (and torch where installed), bit for bit where
duplicates make the order matter, and fail cleanly on an out-of-range index."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import kiln
from kiln.frontend.tensor import dispatch as call
from kiln.ir.errors import KilnError
from kiln.compiler import compile as compile_c
from kiln.runtime import load
from tests.modules import LambdaModule
from tests.runtime.test_c_backend import _array, _check

try:
    import torch
except ImportError:  # torch is only the oracle: the interpreter comparisons still run
    torch = None

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
aten = kiln.ops.aten


def _compile(fn, examples, dynamic, tmp_path, **kwargs):
    program = kiln.export(LambdaModule(fn), examples, dynamic_shapes=dynamic)
    return program, compile_c(program, output=tmp_path / "model", **kwargs)


def _exact(got, expected):
    got = got if isinstance(got, tuple) else (got,)
    expected = expected if isinstance(expected, (tuple, list)) else (expected,)
    for g, e in zip(got, expected):
        e = _array(e)
        assert g.shape == e.shape and g.dtype == e.dtype
        np.testing.assert_array_equal(g, e)


def _torch_close(got, expected):
    if torch is not None:
        torch.testing.assert_close(torch.from_numpy(np.ascontiguousarray(got)), expected, equal_nan=True)


@pytest.mark.parametrize("form", ["front", "between", "adjacent", "trailing"])
def test_index_with_broadcasting_indices_and_none_entries(form, tmp_path):
    batch = kiln.Dim("batch", max=32)
    layouts = {"front": lambda a, b: [a, b], "between": lambda a, b: [a, None, b],
               "adjacent": lambda a, b: [None, a, b], "trailing": lambda a, b: [None, None, a]}

    def fn(x, a, b):
        indices = layouts[form](a, b) if form != "trailing" else layouts[form](a, None)
        return call(aten.index.Tensor, x, indices) + 1.0

    examples = (kiln.randn(3, 4, 5), kiln.tensor(np.zeros((2, 1), np.int64)), kiln.tensor(np.zeros(3, np.int64)))
    program, model = _compile(fn, examples, ({0: batch}, None, None), tmp_path)
    for n in (3, 6, 17):
        rng = np.random.default_rng(n)
        x = rng.standard_normal((n, 4, 5)).astype(np.float32)
        sizes = {"front": (n, 4), "between": (n, 5), "adjacent": (4, 5), "trailing": (5, 5)}[form]
        a = rng.integers(-sizes[0], sizes[0], (2, 1)).astype(np.int64)  # negative entries wrap
        b = rng.integers(-sizes[1], sizes[1], 3).astype(np.int64)
        got = model(x, a, b)
        _check(got, program(x, a, b))
        if torch is not None:
            tx, ta, tb = map(torch.from_numpy, (x, a, b))
            expected = {"front": lambda: tx[ta, tb], "between": lambda: tx[ta, :, tb],
                        "adjacent": lambda: tx[:, ta, tb], "trailing": lambda: tx[:, :, ta]}[form]() + 1.0
            _torch_close(got, expected)


def test_index_with_three_indices_and_a_0d_one(tmp_path):
    def fn(x, a, b, c):
        return call(aten.index.Tensor, x, [a, None, b, c])

    x = np.random.default_rng(1).standard_normal((3, 2, 4, 5)).astype(np.float32)
    a, b, c = np.array(-1, np.int64), np.array([[0], [3], [-2]], np.int64), np.array([4, 0], np.int64)
    program, model = _compile(fn, tuple(map(kiln.tensor, (x, a, b, c))), None, tmp_path)
    got = model(x, a, b, c)
    _exact(got, program(x, a, b, c))
    if torch is not None:
        tx, ta, tb, tc = map(torch.from_numpy, (x, a, b, c))  # aten's op: Python indexing turns a 0-d index into an int
        _torch_close(got, torch.ops.aten.index.Tensor(tx, [ta, None, tb, tc]))


def test_hf_style_padding_mask(tmp_path):
    # transformers' sdpa mask: padding_mask[batch_idx[:, None, None, None], kv_idx[None, None, None, :]]
    batch, seq = kiln.Dim("batch", max=16), kiln.Dim("seq", max=64)

    def fn(padding_mask, scores):
        batch_idx, kv_idx = kiln.arange(padding_mask.shape[0]), kiln.arange(padding_mask.shape[1])
        allowed = padding_mask[batch_idx[:, None, None, None], kv_idx[None, None, None, :]]
        return kiln.where(allowed, scores, -1e9)

    examples = (kiln.tensor(np.ones((2, 5), bool)), kiln.randn(2, 1, 5, 5))
    program, model = _compile(fn, examples, ({0: batch, 1: seq}, {0: batch, 2: seq, 3: seq}), tmp_path)
    for n, s in ((1, 1), (2, 5), (3, 7), (16, 64)):
        rng = np.random.default_rng(n * s)
        mask = rng.random((n, s)) > 0.3
        scores = rng.standard_normal((n, 1, s, s)).astype(np.float32)
        got = model(mask, scores)
        _exact(got, program(mask, scores))
        if torch is not None:
            tm = torch.from_numpy(mask)
            allowed = tm[torch.arange(n)[:, None, None, None], torch.arange(s)[None, None, None, :]]
            _torch_close(got, torch.where(allowed, torch.from_numpy(scores), torch.tensor(-1e9)))


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put_with_duplicates_matches_in_order(accumulate, tmp_path):
    # Many duplicates: last write wins without accumulate; with it, float32 sums in source order (bit-exact).
    def fn(x, rows, cols, values):
        return (call(aten.index_put.default, x, [rows, None, cols], values, accumulate),
                call(aten.index_put.default, x, [None, rows], values[:, :1, :1], accumulate))

    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 3, 5)).astype(np.float32)
    rows = rng.integers(-3, 3, (40, 1)).astype(np.int64)
    cols = rng.integers(-5, 5, (1, 6)).astype(np.int64)
    values = (rng.standard_normal((40, 6, 3)) * 1e3).astype(np.float32)
    program, model = _compile(fn, tuple(map(kiln.tensor, (x, rows, cols, values))), None, tmp_path)
    got = model(x, rows, cols, values)
    _exact(got, program(x, rows, cols, values))
    if torch is not None:
        tx, tr, tc, tv = map(torch.from_numpy, (x, rows, cols, values))
        expected = torch.ops.aten.index_put.default(tx, [tr, None, tc], tv, accumulate)
        if accumulate:  # without accumulate torch leaves the winner of duplicates unspecified
            _torch_close(got[0], expected)


def test_index_put_with_a_mask(tmp_path):
    def fn(x, mask, row, value):
        return (call(aten.index_put.default, x, [mask], value), call(aten.index_put.default, x, [mask], row, True),
                call(aten.index_put.default, x, [None, mask[0]], value, True))

    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    mask, row, value = rng.random((3, 4)) > 0.5, rng.standard_normal(1).astype(np.float32), np.float32(7.5)
    program, model = _compile(fn, tuple(map(kiln.tensor, (x, mask, row, np.array(value)))), None, tmp_path)
    _exact(model(x, mask, row, np.array(value)), program(x, mask, row, np.array(value)))


def test_index_put_with_a_mask_and_count_dependent_values(tmp_path):
    # values that vary along the mask's count: a scatter to nonzero(mask)'s coordinates, sized while running
    # (tests/runtime/test_c_data_dependent.py)
    def fn(x, mask, y):
        return call(aten.index_put.default, x, [mask], call(aten.index.Tensor, y, [mask]))

    examples = (kiln.randn(3, 4), kiln.tensor(np.ones((3, 4), bool)), kiln.randn(3, 4))
    program, model = _compile(fn, examples, None, tmp_path)
    rng = np.random.default_rng(3)
    for density in (0.0, 0.5, 1.0):
        x, y = rng.standard_normal((2, 3, 4)).astype(np.float32)
        mask = rng.random((3, 4)) < density
        _exact(model(x, mask, y), np.where(mask, y, x))
        _exact(model(x, mask, y), program(x, mask, y))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_scatter_family_with_duplicates(dim, tmp_path):
    batch = kiln.Dim("batch", max=32)

    def fn(x, index, src):
        return (call(aten.scatter.src, x, dim, index, src), call(aten.scatter.value, x, dim, index, -3.5),
                call(aten.scatter_add.default, x, dim, index, src))

    examples = (kiln.randn(4, 5, 3), kiln.tensor(np.zeros((4, 5, 3), np.int64)), kiln.randn(4, 6, 3))
    program, model = _compile(fn, examples, ({0: batch}, {0: batch}, {0: batch}), tmp_path)
    for n in (4, 9):
        rng = np.random.default_rng(n)
        x = rng.standard_normal((n, 5, 3)).astype(np.float32)
        size = x.shape[dim]
        index = rng.integers(0, min(size, 2), (n, 5, 3)).astype(np.int64)  # mostly duplicates
        src = (rng.standard_normal((n, 6, 3)) * 1e4).astype(np.float32)
        got = model(x, index, src)
        _exact(got, program(x, index, src))
        if torch is not None:
            tx, ti, ts = map(torch.from_numpy, (x, index, src))
            _torch_close(got[2], tx.scatter_add(dim, ti, ts[:, :5]))


def test_scatters_split_across_threads_give_the_serial_result(tmp_path):
    # Big enough for a two-thread team: each thread owns whole output lines, so duplicates still add up in
    # source order and every thread count gives the interpreter's bits.
    def fn(x, index, src):
        return (call(aten.scatter_add.default, x, 1, index, src),
                call(aten.scatter_reduce.two, x, 1, index, src, "mean", include_self=False),
                call(aten.index_put.default, x, [None, index[0, :50]], src[:, :50], True))

    rng = np.random.default_rng(6)
    x = rng.standard_normal((400, 1000)).astype(np.float32)
    index = rng.integers(0, 20, (400, 1000)).astype(np.int64)
    src = (rng.standard_normal((400, 1000)) * 1e3).astype(np.float32)
    program, _ = _compile(fn, tuple(map(kiln.tensor, (x, index, src))), None, tmp_path)
    expected = program(x, index, src)
    for threads in (1, 2, 3):
        _exact(load(tmp_path / "model", num_threads=threads)(x, index, src), expected)


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(reduce, include_self, tmp_path):
    def fn(x, index, src, k, kindex, ksrc):
        return (call(aten.scatter_reduce.two, x, 1, index, src, reduce, include_self=include_self),
                call(aten.scatter_reduce.two, k, 0, kindex, ksrc, reduce, include_self=include_self))

    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 6)).astype(np.float32)
    x[0, 2] = np.nan
    index = rng.integers(0, 4, (3, 9)).astype(np.int64)
    src = rng.standard_normal((3, 9)).astype(np.float32)
    k = rng.integers(-9, 9, (4, 3)).astype(np.int64)
    kindex = rng.integers(0, 3, (7, 3)).astype(np.int64)
    ksrc = rng.integers(-9, 9, (7, 3)).astype(np.int64)
    arrays = (x, index, src, k, kindex, ksrc)
    program, model = _compile(fn, tuple(map(kiln.tensor, arrays)), None, tmp_path)
    got = model(*arrays)
    _exact(got, program(*arrays))
    if torch is not None:
        tensors = list(map(torch.from_numpy, arrays))
        _torch_close(got[0], tensors[0].scatter_reduce(1, tensors[1], tensors[2], reduce, include_self=include_self))
        _torch_close(got[1], tensors[3].scatter_reduce(0, tensors[4], tensors[5], reduce, include_self=include_self))


@pytest.mark.parametrize("case", ["index", "index_put", "scatter", "scatter_add", "scatter_reduce"])
def test_out_of_range_index_fails_the_run(case, tmp_path):
    ops = {"index": lambda x, i, v: call(aten.index.Tensor, x, [i, None, i]),
           "index_put": lambda x, i, v: call(aten.index_put.default, x, [i, None, i], v[:, 0, :1], True),
           "scatter": lambda x, i, v: call(aten.scatter.src, x, 2, i, v),
           "scatter_add": lambda x, i, v: call(aten.scatter_add.default, x, 0, i, v),
           "scatter_reduce": lambda x, i, v: call(aten.scatter_reduce.two, x, 2, i, v, "mean", include_self=False)}
    name = {"index": "aten.index.Tensor", "index_put": "aten.index_put.default", "scatter": "aten.scatter.src",
            "scatter_add": "aten.scatter_add.default", "scatter_reduce": "aten.scatter_reduce.two"}[case]
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 3, 3)).astype(np.float32)
    v = rng.standard_normal((3, 3, 3)).astype(np.float32)
    good = np.zeros((3, 3, 3), np.int64)
    if case.startswith("index"):
        good = np.array([-3, 2, 0], np.int64)
    program, model = _compile(ops[case], tuple(map(kiln.tensor, (x, good, v))), None, tmp_path)
    _exact(model(x, good, v), program(x, good, v))
    for bad_value in (3, -4 if case.startswith("index") else -1):  # scatters take no negative index
        bad = good.copy()
        bad.flat[1] = bad_value
        with pytest.raises(KilnError):
            program(x, bad, v)
        with pytest.raises(KilnError, match=rf"{name}: index {bad_value} is out of bounds for dimension \d with "
                                            r"size 3"):
            model(x, bad, v)
    _exact(model(x, good, v), program(x, good, v))  # the failed run leaves no state behind


@pytest.mark.parametrize("p", [2.0, 1.0, 0.0, 3.0, float("inf")])
def test_cdist_and_pdist_with_dynamic_rows(p, tmp_path):
    # Euclidean cdist switches to the matrix-product formula above 25 rows: decided per run, as the rows vary.
    rows = kiln.Dim("rows", max=64)

    def fn(x1, x2):
        return call(aten._cdist_forward.default, x1, x2, p, None), call(aten._pdist_forward.default, x1, p)

    program, model = _compile(fn, (kiln.randn(4, 3), kiln.randn(2, 5, 3)), ({0: rows}, None), tmp_path)
    for n in (1, 2, 20, 30, 64):
        rng = np.random.default_rng(n)
        x1 = rng.standard_normal((n, 3)).astype(np.float32)
        x2 = rng.standard_normal((2, 5, 3)).astype(np.float32)
        x1[0, 1] = np.nan if n > 2 else x1[0, 1]
        got = model(x1, x2)
        _check(got, program(x1, x2))
        if torch is not None:
            _torch_close(got[1], torch.pdist(torch.from_numpy(x1), p))


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_embedding_bag_with_dynamic_bags_and_bad_offsets(mode, tmp_path):
    count, bags = kiln.Dim("count", max=64), kiln.Dim("bags", max=16)

    def fn(weight, indices, offsets):
        return call(aten._embedding_bag.default, weight, indices, offsets, False, mode, False, None, False, 1)

    rng = np.random.default_rng(7)
    weight = rng.standard_normal((10, 6)).astype(np.float32)
    examples = (kiln.tensor(weight), kiln.tensor(np.zeros(8, np.int64)), kiln.tensor(np.array([0, 3, 3], np.int64)))
    program, model = _compile(fn, examples, (None, {0: count}, {0: bags}), tmp_path)
    for n, b in ((2, 2), (8, 3), (40, 16)):
        indices = rng.integers(0, 10, n).astype(np.int64)
        offsets = np.sort(rng.integers(0, n + 1, b)).astype(np.int64)
        offsets[0] = 0
        got = model(weight, indices, offsets)
        _exact(got[1:], program(weight, indices, offsets)[1:])
        _check(got[0], program(weight, indices, offsets)[0])
        if torch is not None:
            expected = torch.ops.aten._embedding_bag.default(*map(torch.from_numpy, (weight, indices, offsets)),
                                                               False, mode, False, None, False, 1)
            _torch_close(got[0], expected[0])
    indices = np.array([1, 2, 3, 4], np.int64)
    with pytest.raises(KilnError, match=r"aten._embedding_bag.default: index 10 is out of bounds for dimension 0"):
        model(weight, np.array([1, 10, 2, 3], np.int64), np.array([0, 2], np.int64))
    for offsets in ([1, 2], [0, 3, 2], [0, 5]):
        with pytest.raises(KilnError, match=r"aten._embedding_bag.default offsets"):
            model(weight, indices, np.array(offsets, np.int64))
    _exact(model(weight, indices, np.array([0, 2], np.int64))[1:], program(weight, indices, np.array([0, 2]))[1:])


@pytest.mark.parametrize("interpolation", [0, 1, 2])
@pytest.mark.parametrize("padding", [0, 1, 2])
def test_grid_sampler_2d_with_dynamic_sizes_and_odd_coordinates(interpolation, padding, tmp_path):
    batch, height = kiln.Dim("batch", max=8), kiln.Dim("height", min=2, max=32)

    def fn(x, grid):
        return (call(aten.grid_sampler_2d.default, x, grid, interpolation, padding, False),
                call(aten.grid_sampler_2d.default, x, grid, interpolation, padding, True))

    examples = (kiln.randn(2, 3, 5, 6), kiln.randn(2, 4, 3, 2))
    program, model = _compile(fn, examples, ({0: batch, 2: height}, {0: batch}), tmp_path)
    for n, h in ((1, 2), (2, 5), (3, 17)):
        rng = np.random.default_rng(n * h)
        x = rng.standard_normal((n, 3, h, 6)).astype(np.float32)
        grid = rng.uniform(-3, 3, (n, 4, 3, 2)).astype(np.float32)
        grid[0, 0, 0] = [np.nan, 0.5]
        grid[0, 0, 1] = [np.inf, -np.inf]
        grid[0, 1, 0] = [1.0, -1.0]  # the corners and the exact middle of a pixel
        grid[0, 1, 1] = [0.0, 0.0]
        got = model(x, grid)
        _check(got, program(x, grid))
        if torch is not None:
            finite = np.isfinite(grid).all(-1, keepdims=True)  # torch's own kernels differ on non-finite points
            safe = np.where(finite, grid, 0.0).astype(np.float32)
            got = model(x, safe)
            for align, result in zip((False, True), got):
                _torch_close(result, torch.ops.aten.grid_sampler_2d(torch.from_numpy(x), torch.from_numpy(safe),
                                                                    interpolation, padding, align))


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_sanitized_scatters_and_gathers_stay_in_bounds(tmp_path):
    """Every kernel kind added here, linked into the deploy runner under ASan + UBSan (two threads): clean and
    correct on good inputs, clean and failing with the op's message on out-of-range indices."""
    from tests.runtime.test_sanitizers import (
        SANITIZER_ENV, SANITIZER_ERRORS, build_sanitized, check_outputs, run_runner, sanitizer_missing,
    )
    reason = sanitizer_missing(tmp_path)
    if reason:
        pytest.skip(reason)
    batch, count = kiln.Dim("batch", max=8), kiln.Dim("count", max=64)

    def fn(x, a, b, idx, src, weight, ind, offs, grid):
        return (call(aten.index.Tensor, x, [None, a, b]),
                call(aten.index_put.default, x, [None, a, b], src[0, 0, :1], True),
                call(aten.scatter_reduce.two, x, 2, idx, src, "mean", include_self=False),
                call(aten.scatter_add.default, x, 2, idx, src),
                *call(aten._embedding_bag.default, weight, ind, offs, False, 2, False, None, False, -1)[::3],
                call(aten.grid_sampler_2d.default, x[:, None], grid, 2, 2, False),
                call(aten._cdist_forward.default, x, x, 2.0, None), call(aten._pdist_forward.default, weight, 2.0))

    rng = np.random.default_rng(8)

    def arrays(n, bad=None):
        values = {"x": rng.standard_normal((n, 4, 5)).astype(np.float32),
                  "a": np.array([[-1], [2]], np.int64), "b": np.array([4, 0, -5], np.int64),
                  "idx": rng.integers(0, 5, (n, 4, 5)).astype(np.int64),
                  "src": rng.standard_normal((n, 4, 6)).astype(np.float32),
                  "weight": rng.standard_normal((10, 6)).astype(np.float32),
                  "ind": rng.integers(0, 10, 9).astype(np.int64), "offs": np.array([0, 4, 4], np.int64),
                  "grid": rng.uniform(-2, 2, (n, 3, 3, 2)).astype(np.float32)}
        if bad:
            values[bad[0]].flat[-1] = bad[1]
        return values

    example = arrays(2)
    dynamic = ({0: batch}, None, None, {0: batch}, {0: batch}, None, {0: count}, None, {0: batch})
    program, compiled = _compile(fn, tuple(map(kiln.tensor, example.values())), dynamic, tmp_path)
    package = tmp_path / "model"
    binary = [str(build_sanitized(package, tmp_path))]
    names = program.graph_signature.user_inputs
    for n in (1, 3, 8):
        values = dict(zip(names, arrays(n).values()))
        result = run_runner(binary, package, values, tmp_path, SANITIZER_ENV)
        assert not any(marker in result.stderr for marker in SANITIZER_ERRORS), result.stderr[-8000:]
        assert result.returncode == 0, result.stderr[-8000:]
        check_outputs(result.stdout, compiled, program, values)
    for bad, op in ((("idx", 5), "aten.scatter_reduce.two"), (("b", 5), "aten.index.Tensor"),
                    (("ind", -1), "aten._embedding_bag.default"), (("offs", 10), "aten._embedding_bag.default")):
        values = dict(zip(names, arrays(3, bad).values()))
        result = run_runner(binary, package, values, tmp_path, SANITIZER_ENV)
        assert not any(marker in result.stderr for marker in SANITIZER_ERRORS), result.stderr[-8000:]
        assert result.returncode == 3 and op in result.stderr, result.stderr[-2000:]


def test_masked_scatter_takes_the_source_in_mask_order(tmp_path):
    # C computes masked_scatter through its registered decomposition: each masked position's running count picks
    # the source element, with every shape fixed (how vision-language models put image features into the prompt)
    rows = kiln.Dim("rows", max=32)

    def fn(x, mask, source):
        return call(aten.masked_scatter.default, x, mask, source)

    examples = (kiln.randn(4, 3, 5), kiln.tensor(np.ones((4, 1, 5), bool)), kiln.randn(7, 11))
    program, model = _compile(fn, examples, ({0: rows}, {0: rows}, None), tmp_path)
    rng = np.random.default_rng(5)
    for n, density in ((4, 0.5), (1, 0.0), (5, 1.0), (32, 0.2)):  # the mask broadcasts along dim 1
        x, mask = rng.standard_normal((n, 3, 5)).astype(np.float32), rng.random((n, 1, 5)) < density
        source = rng.standard_normal((7, 11)).astype(np.float32)
        if 3 * mask.sum() > source.size:
            continue
        _exact(model(x, mask, source), program(x, mask, source))
        if torch is not None:
            _exact(model(x, mask, source), torch.from_numpy(x).masked_scatter(torch.from_numpy(mask),
                                                                              torch.from_numpy(source)).numpy())
    x, mask = np.zeros((9, 3, 5), np.float32), np.ones((9, 1, 5), bool)  # 135 positions, 77 source elements
    with pytest.raises(KilnError, match="number of elements of source"):
        program(x, mask, source)
    with pytest.raises(KilnError, match="index 78 is out of bounds for dimension 0 with size 78"):
        model(x, mask, source)
