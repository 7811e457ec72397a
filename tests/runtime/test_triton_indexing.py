"""The Triton backend's scatters and embedding bags (kiln/codegen/triton/indexing.py) on CPU through Triton's
interpreter: duplicate indices combine in the interpreter's order for every reduction, index_put accumulates in
order, embedding_bag's modes, padding_idx and per-sample weights match torch, and bad indices fail the run."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")  # tests/conftest.py sets it before triton's first import
torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import kiln  # noqa: E402
from kiln.frontend.tensor import dispatch as call  # noqa: E402
from tests.runtime.support import assert_outputs_close, compile_function  # noqa: E402

aten = kiln.ops.aten


def _compile(fn, arrays, tmp_path, dynamic=None):
    return compile_function(fn, arrays, tmp_path / "model", "triton", dynamic)


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_with_duplicates(reduce, include_self, tmp_path):
    """float32 along the last dim (a NaN in self), int64 along dim 0 (mean floors negative sums), int8 (amax's
    and amin's identities are the int8 limits) and float16 (every step rounds to half)."""
    def fn(x, index, src, k, kindex, ksrc, small, sindex, ssrc, half, hsrc):
        return (call(aten.scatter_reduce.two, x, 1, index, src, reduce, include_self=include_self),
                call(aten.scatter_reduce.two, k, 0, kindex, ksrc, reduce, include_self=include_self),
                call(aten.scatter_reduce.two, small, 1, sindex, ssrc, reduce, include_self=include_self),
                call(aten.scatter_reduce.two, half, 1, index, hsrc, reduce, include_self=include_self))

    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 6)).astype(np.float32)
    x[0, 2] = np.nan
    index = rng.integers(0, 4, (3, 9)).astype(np.int64)  # 9 writes into 4 columns: duplicates everywhere
    src = rng.standard_normal((3, 9)).astype(np.float32)
    k = rng.integers(-9, 9, (4, 3)).astype(np.int64)
    kindex = rng.integers(0, 3, (7, 3)).astype(np.int64)
    ksrc = rng.integers(-9, 9, (7, 3)).astype(np.int64)
    small = rng.integers(-100, 100, (2, 5)).astype(np.int8)
    sindex = rng.integers(0, 3, (2, 6)).astype(np.int64)
    ssrc = rng.integers(-120, -100, (2, 6)).astype(np.int8)  # all below self: an identity of 0 would show
    half = (rng.standard_normal((3, 6)) * 4).astype(np.float16)
    hsrc = (rng.standard_normal((3, 9)) * 4).astype(np.float16)
    arrays = (x, index, src, k, kindex, ksrc, small, sindex, ssrc, half, hsrc)
    program, model = _compile(fn, arrays, tmp_path)
    got = model(*arrays)
    assert_outputs_close(got, program(*arrays))
    t = list(map(torch.from_numpy, arrays))
    assert_outputs_close(got[:3], (t[0].scatter_reduce(1, t[1], t[2], reduce, include_self=include_self),
                     t[3].scatter_reduce(0, t[4], t[5], reduce, include_self=include_self),
                     t[6].scatter_reduce(1, t[7], t[8], reduce, include_self=include_self)))


def test_scatter_src_value_and_add_with_duplicates(tmp_path):
    """scatter.src: the last write of duplicates wins (the interpreter's order); scatter_add sums large values in
    order, and a bool scatter_add is `or`."""
    def fn(x, index, src, flags, findex, fsrc):
        return (call(aten.scatter.src, x, 1, index, src), call(aten.scatter.value, x, 0, index[:, :5], -3.5),
                call(aten.scatter_add.default, x, 1, index, src), call(aten.scatter.src, x[0], 0, index[0], src[0]),
                call(aten.scatter_add.default, flags, 0, findex, fsrc))

    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 5)).astype(np.float32)
    index = rng.integers(0, 2, (4, 7)).astype(np.int64)
    src = (rng.standard_normal((4, 8)) * 1e4).astype(np.float32)
    flags, fsrc = rng.random(6) > 0.7, rng.random(9) > 0.5
    findex = rng.integers(0, 6, 9).astype(np.int64)
    arrays = (x, index, src, flags, findex, fsrc)
    program, model = _compile(fn, arrays, tmp_path)
    got = model(*arrays)
    assert_outputs_close(got, program(*arrays))
    tx, ti, ts = map(torch.from_numpy, (x, index, src))
    assert_outputs_close(got[2], tx.scatter_add(1, ti, ts))
    last = x[0].copy()
    for position, column in enumerate(index[0]):  # written in order: the last one stays
        last[column] = src[0, position]
    assert_outputs_close(got[3], last)


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put_with_duplicates(accumulate, tmp_path):
    """Rows picked by an index with duplicates (negative ones wrap), over more columns than one program's block."""
    rows = kiln.Dim("rows", max=64)

    def fn(x, picked, values, grid, columns):
        return (call(aten.index_put.default, x, [picked], values, accumulate),
                call(aten.index_put.default, grid, [picked[:, None], None, columns], values[:, :1, None], accumulate))

    rng = np.random.default_rng(2)
    # whole numbers: their float32 sums are exact in any order (torch's CPU accumulation does not keep index order)
    x = rng.integers(-1000, 1000, (5, 1500)).astype(np.float32)
    values = rng.integers(-1000, 1000, (30, 1500)).astype(np.float32)
    grid = rng.standard_normal((5, 3, 4)).astype(np.float32)
    picked = rng.integers(-5, 5, 30).astype(np.int64)
    columns = rng.integers(-4, 4, 6).astype(np.int64)
    arrays = (x, picked, values, grid, columns)
    program, model = _compile(fn, arrays, tmp_path, dynamic=(None, {0: rows}, {0: rows}, None, None))
    for n in (30, 7):
        arrays = (x, picked[:n], values[:n], grid, columns)
        got = model(*arrays)
        assert_outputs_close(got, program(*arrays))
        if accumulate:  # without accumulate torch leaves the winner of duplicates unspecified
            t = list(map(torch.from_numpy, arrays))
            assert_outputs_close(got[0], torch.ops.aten.index_put.default(t[0], [t[1]], t[2], True))


@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("include_last_offset", [False, True])
def test_embedding_bag(mode, include_last_offset, tmp_path):
    """Every output in every mode, with padding_idx, an empty bag and (sum) per-sample weights, against torch and
    the interpreter."""
    padding_idx = 3
    weighted = mode == 0

    def fn(weight, indices, offsets, scales):
        return call(aten._embedding_bag.default, weight, indices, offsets, False, mode, False,
                    scales if weighted else None, include_last_offset, padding_idx)

    rng = np.random.default_rng(7)
    weight = rng.standard_normal((10, 6)).astype(np.float32)
    weight[5, 2] = np.nan  # max propagates NaN
    indices = np.array([1, 3, 4, 3, 9, 5, 2, 2, 7, 0, 3, 3], np.int64)
    offsets = np.array([0, 3, 3, 5, 10] + ([12] if include_last_offset else []), np.int64)  # bag 1 is empty
    scales = rng.standard_normal(12).astype(np.float32)
    arrays = (weight, indices, offsets, scales)
    program, model = _compile(fn, arrays, tmp_path)
    got = model(*arrays)
    assert_outputs_close(got, program(*arrays))
    t = list(map(torch.from_numpy, arrays))
    expected = torch.ops.aten._embedding_bag.default(t[0], t[1], t[2], False, mode, False,
                                                     t[3] if weighted else None, include_last_offset, padding_idx)
    assert_outputs_close(got[0], expected[0])
    if mode == 2:  # where a NaN is the maximum, torch names its row and the reference the bag's last index
        assert_outputs_close(np.delete(got[3], 2, axis=1), expected[3][:, [0, 1, 3, 4, 5]])


def test_embedding_bag_in_float64_with_dynamic_counts(tmp_path):
    count, bags = kiln.Dim("count", max=64), kiln.Dim("bags", max=16)

    def fn(weight, indices, offsets, scales):
        return call(aten._embedding_bag.default, weight, indices, offsets, False, 0, False, scales, False, -1)

    rng = np.random.default_rng(8)
    weight = rng.standard_normal((10, 40)).astype(np.float64)
    arrays = (weight, np.zeros(8, np.int64), np.array([0, 3, 3], np.int64), np.ones(8))
    program, model = _compile(fn, arrays, tmp_path, dynamic=(None, {0: count}, {0: bags}, {0: count}))
    for n, b in ((2, 2), (40, 16)):
        offsets = np.sort(rng.integers(0, n + 1, b))
        offsets[0] = 0
        arrays = (weight, rng.integers(0, 10, n), offsets, rng.standard_normal(n))
        assert_outputs_close(model(*arrays), program(*arrays))


@pytest.mark.parametrize("case", ["scatter", "scatter_reduce", "index_put", "embedding_bag"])
def test_out_of_range_index_is_a_clear_error(case, tmp_path):
    ops = {"scatter": lambda x, i: call(aten.scatter.src, x, 1, i, x),
           "scatter_reduce": lambda x, i: call(aten.scatter_reduce.two, x, 1, i, x, "mean", include_self=False),
           "index_put": lambda x, i: call(aten.index_put.default, x, [None, i[0]], x[:, :1], True),
           "embedding_bag": lambda x, i: call(aten._embedding_bag.default, x, i[0], i[1, :2], False, 0, False, None,
                                              False, -1)[0]}
    name = {"scatter": "aten.scatter.src", "scatter_reduce": "aten.scatter_reduce.two",
            "index_put": "aten.index_put.default", "embedding_bag": "aten._embedding_bag.default"}[case]
    x = np.random.default_rng(5).standard_normal((3, 3)).astype(np.float32)
    good = np.zeros((3, 3), np.int64)
    program, model = _compile(ops[case], (x, good), tmp_path)
    assert_outputs_close(model(x, good), program(x, good))
    dim = 0 if case == "embedding_bag" else 1
    for value in (3, -4 if case == "index_put" else -1):  # index_put wraps negative indices; the others refuse them
        bad = good.copy()
        bad[0, 1] = value
        with pytest.raises(kiln.KilnError, match=rf"index {value} is out of bounds for dimension {dim} with size 3 "
                                                 rf"in {name}"):
            model(x, bad)
    assert_outputs_close(model(x, good), program(x, good))  # the failed run leaves no state behind
    if case == "embedding_bag":
        bad = good.copy()
        bad[1, :2] = [0, 5]  # an offset past the indices
        with pytest.raises(kiln.KilnError, match=r"aten._embedding_bag.default offsets \(they must start at 0"):
            model(x, bad)


def test_index_put_with_a_mask_and_0d_scatters(tmp_path):
    """A boolean mask writes each selected element once (every position is a parallel lane); 0-d operands of
    scatter act as 1-element 1-d ones."""
    def fn(x, mask, row, value, scalar, where):
        return (call(aten.index_put.default, x, [mask], value), call(aten.index_put.default, x, [mask], row, True),
                call(aten.index_put.default, x, [None, mask[0]], value, True),
                call(aten.scatter.src, scalar, 0, where, scalar * 2.0),
                call(aten.scatter_reduce.two, scalar, 0, where, scalar, "amax", include_self=False))

    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    mask, row, value = rng.random((3, 4)) > 0.5, rng.standard_normal(1).astype(np.float32), np.array(7.5, np.float32)
    arrays = (x, mask, row, value, np.array(1.5, np.float32), np.array(0, np.int64))
    program, model = _compile(fn, arrays, tmp_path)
    got = model(*arrays)
    assert_outputs_close(got, program(*arrays))
    t = list(map(torch.from_numpy, arrays))
    assert_outputs_close(got[:2], (torch.ops.aten.index_put.default(t[0], [t[1]], t[3]),
                     torch.ops.aten.index_put.default(t[0], [t[1]], t[2], True)))
