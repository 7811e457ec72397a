"""Samples for kiln/ir/ops/indexing.py.

Where several source elements land on one position and the result would depend on the write order
(scatter, index_put without accumulate, scatter_reduce's order-sensitive float sums), indices are
made distinct; accumulating samples use duplicates on purpose.
"""

from __future__ import annotations

import numpy as np  # noqa: F401

from tests.ir.samples import Sample, positive, rand, samples  # noqa: F401


def _index(values, dtype="int64"):
    return np.array(values, dtype=dtype)


def _distinct_positions(rng, size: int, count: int, dtype="int64"):
    """`count` different positions in [0, size): a permutation prefix."""
    return rng.permutation(size)[:count].astype(dtype)


def _scatter_index(rng, index_shape, dim: int, dim_size: int, dtype="int64"):
    """An index whose entries along `dim` are distinct within each line, so no two sources collide."""
    lines = int(np.prod([n for i, n in enumerate(index_shape) if i != dim]))
    picks = np.stack([_distinct_positions(rng, dim_size, index_shape[dim]) for _ in range(lines)])
    moved = picks.reshape([n for i, n in enumerate(index_shape) if i != dim] + [index_shape[dim]])
    return np.moveaxis(moved, -1, dim).astype(dtype)


@samples("aten.gather.default")
def _gather(rng):
    x = rand(rng, 3, 5)
    yield Sample((x, 1, rng.integers(0, 5, (3, 4))), note="repeats allowed")
    yield Sample((x, 0, rng.integers(0, 3, (2, 5)).astype(np.int32)), note="int32 index, smaller than self")
    yield Sample((rand(rng, 2, 3, 4, dtype="int64"), -1, rng.integers(0, 4, (2, 2, 6))),
                 note="negative dim, wider index")
    yield Sample((rand(rng, 4, 3, dtype="bfloat16"), 0, rng.integers(0, 4, (1, 2))),
                 note="bfloat16, index off dim smaller")
    yield Sample((rand(rng, 3, dtype="bool"), 0, _index([2, 0, 2, 1])), note="bool")
    yield Sample((np.array(2.5, np.float32), 0, _index(0)), note="0-d")
    yield Sample((np.array(2.5, np.float32), 0, _index([0, 0])), note="0-d self, 1-d index")
    yield Sample((rand(rng, 3, 4), 1, np.zeros((3, 0), np.int64)), note="empty index")
    yield Sample((rand(rng, 3, 4, dtype="float16"), 1, np.zeros((0,), np.int16)), note="empty index of any dtype")


@samples("aten.scatter.src")
def _scatter_src(rng):
    # A src larger than the index is int here: torch's backward refuses it (its src gradient has the index's shape).
    yield Sample((rand(rng, 3, 5, dtype="int16"), 1, _scatter_index(rng, (3, 2), 1, 5), rand(rng, 3, 4, dtype="int16")),
                 note="src larger than index")
    yield Sample((rand(rng, 3, 5), 1, _scatter_index(rng, (3, 2), 1, 5), rand(rng, 3, 2)),
                 note="src of the index's shape")
    yield Sample((rand(rng, 4, 3, dtype="int64"), 0, _scatter_index(rng, (2, 3), 0, 4, "int32"),
                  rand(rng, 2, 3, dtype="int64")), note="int32 index")
    yield Sample((rand(rng, 2, 3, 4, dtype="float16"), -1, _scatter_index(rng, (2, 2, 3), 2, 4),
                  rand(rng, 2, 2, 3, dtype="float16")), note="negative dim, index smaller off dim")
    yield Sample((rand(rng, 4, dtype="bool"), 0, _index([3, 0]), rand(rng, 2, dtype="bool")), note="bool")
    yield Sample((np.array(1.5, np.float32), 0, _index(0), np.array(-2.0, np.float32)), note="0-d")
    yield Sample((rand(rng, 3, 4), 1, np.zeros((3, 0), np.int64), rand(rng, 3, 1)), note="empty index")


@samples("aten.scatter.value")
def _scatter_value(rng):
    yield Sample((rand(rng, 3, 5), 1, _scatter_index(rng, (3, 2), 1, 5), 7.5))
    yield Sample((rand(rng, 3, 5, dtype="int32"), 0, _scatter_index(rng, (2, 5), 0, 3), 2.7),
                 note="float value truncated into int")
    yield Sample((rand(rng, 3, 5, dtype="uint8"), 0, _scatter_index(rng, (2, 2), 0, 3), -1), note="uint8 wraps -1")
    yield Sample((rand(rng, 3, 5, dtype="bfloat16"), -1, _scatter_index(rng, (3, 3), 1, 5, "int32"), float("nan")),
                 note="nan, int32 index")
    yield Sample((rand(rng, 2, 2, dtype="bool"), 1, _index([[1], [0]]), True), note="bool")
    yield Sample((np.array(1.5, np.float32), 0, _index([0]), 4), note="0-d self")


@samples("aten.scatter_add.default")
def _scatter_add(rng):
    yield Sample((rand(rng, 3, 5), 1, rng.integers(0, 5, (3, 6)), rand(rng, 3, 6)), note="duplicates add up")
    yield Sample((rand(rng, 4, 3, dtype="int64"), 0, rng.integers(0, 4, (5, 3)).astype(np.int32),
                  rand(rng, 6, 3, dtype="int64")), note="int32 index, src larger")
    yield Sample((rand(rng, 2, 3, 4, dtype="float64"), -2, rng.integers(0, 3, (2, 4, 4)),
                  rand(rng, 2, 4, 4, dtype="float64")), note="negative dim")
    yield Sample((rand(rng, 4, dtype="bool"), 0, _index([3, 3, 0]), rand(rng, 3, dtype="bool")), note="bool or")
    yield Sample((np.array(1.5, np.float32), 0, _index([0, 0]), np.array([1.0, 2.0], np.float32)),
                 note="0-d self")


def _reduce_samples(rng, reduce: str, include_self: bool):
    kwargs = {"include_self": include_self}
    note = f"{reduce}, include_self={include_self}"
    # Integers: exact whatever the order, so duplicates are fine.
    yield Sample((rand(rng, 3, 5, dtype="int64", low=-9, high=9), 1, rng.integers(0, 5, (3, 7)),
                  rand(rng, 3, 7, dtype="int64", low=-9, high=9), reduce), kwargs, note=f"{note}, int64 duplicates")
    yield Sample((rand(rng, 4, 3, dtype="int32", low=-9, high=9), 0, rng.integers(0, 4, (6, 3)).astype(np.int32),
                  rand(rng, 6, 3, dtype="int32", low=-9, high=9), reduce), kwargs,
                 note=f"{note}, int32 index, some positions untouched")
    # Floats: max/min are exact in any order; sum/prod/mean use few duplicates, well inside tolerance.
    yield Sample((rand(rng, 3, 5, dtype="int64", low=-9, high=9), 1, rng.integers(0, 5, (3, 4)),
                  rand(rng, 3, 6, dtype="int64", low=-9, high=9), reduce), kwargs,
                 note=f"{note}, src larger than index (int: torch's backward refuses it)")
    yield Sample((rand(rng, 2, 6, dtype="float32"), -1, rng.integers(0, 6, (2, 4)), rand(rng, 2, 4), reduce), kwargs,
                 note=f"{note}, float32 negative dim")
    yield Sample((rand(rng, 6, dtype="float64"), 0, _index([1, 1, 4, 0]), rand(rng, 4, dtype="float64"), reduce),
                 kwargs, note=f"{note}, float64")
    if reduce in ("amax", "amin"):
        yield Sample((np.array([1.0, np.nan, 3.0, 0.0], np.float32), 0, _index([0, 2, 2, 1]),
                      np.array([np.nan, 5.0, -1.0, 2.0], np.float32), reduce), kwargs, note=f"{note}, NaN propagates")
        yield Sample((rand(rng, 5, dtype="bfloat16"), 0, _index([4, 4, 1]), rand(rng, 3, dtype="bfloat16"), reduce),
                     kwargs, note=f"{note}, bfloat16")
    if reduce != "mean":
        yield Sample((rand(rng, 4, dtype="bool"), 0, _index([1, 1, 3]), rand(rng, 3, dtype="bool"), reduce), kwargs,
                     note=f"{note}, bool")
    yield Sample((np.array(2.0, np.float32), 0, _index([0, 0]), np.array([3.0, -1.0], np.float32), reduce), kwargs,
                 note=f"{note}, 0-d self")


@samples("aten.scatter_reduce.two")
def _scatter_reduce(rng):
    # First, the gradients' hard cases (torch's scatter_reduce_backward): zeros in prod, ties in amax/amin.
    yield Sample((np.array([2.0, 0.0, 3.0, 1.5, -1.0], np.float32), 0, _index([0, 0, 1, 2, 2, 3]),
                  np.array([0.0, 2.0, 1.5, 0.0, 0.0, 4.0], np.float32), "prod"),
                 note="prod: one zero, a zero in self, two zeros, none")
    yield Sample((np.array([1.0, 2.0, 5.0, 0.5], np.float32), 0, _index([0, 0, 1, 1, 2, 3]),
                  np.array([2.0, 2.0, 2.0, 1.0, 4.0, 0.5], np.float32), "amax"), note="amax: ties share the gradient")
    yield Sample((np.array([[1.0, 2.0], [5.0, 0.5]], np.float32), 1, _index([[0, 0, 1], [1, 1, 0]]),
                  np.array([[1.0, 0.0, 2.0], [0.5, 0.5, 7.0]], np.float32), "amin"), {"include_self": False},
                 note="amin without self: ties share the gradient, self gets none")
    yield Sample((np.array([1.0, 0.0, 2.0], np.float32), 0, _index([1, 1, 0]), np.array([0.0, 3.0, 5.0], np.float32),
                  "prod"), {"include_self": False}, note="prod without self: a zero in self is skipped")
    for reduce in ("sum", "prod", "mean", "amax", "amin"):
        for include_self in (True, False):
            yield from _reduce_samples(rng, reduce, include_self)
    yield Sample((rand(rng, 3, 4), 1, np.zeros((3, 0), np.int64), rand(rng, 3, 1), "mean"), note="empty index")


@samples("aten.index_add.default")
def _index_add(rng):
    yield Sample((rand(rng, 3, 4), 1, np.array([0, 3]), rand(rng, 3, 2)))
    yield Sample((rand(rng, 5, 2, dtype="int64"), 0, np.array([1, 1, 4], np.int32), rand(rng, 3, 2, dtype="int64")),
                 kwargs={"alpha": 2}, note="repeated index, alpha")
    yield Sample((rand(rng, 4, 3, dtype="float64"), -1, np.array([2, 0, 2, 1]), rand(rng, 4, 4, dtype="float64")),
                 note="negative dim, repeats add in order")
    yield Sample((rand(rng), 0, np.array([0]), rand(rng)), note="0-d")
    yield Sample((rand(rng, 3, 2), 0, np.zeros(0, np.int64), rand(rng, 0, 2)), note="no indices")


@samples("aten.index_copy.default")
def _index_copy(rng):
    cache = rand(rng, 1, 2, 8, 4)  # a static KV cache (batch, heads, positions, head dim) and two new positions
    yield Sample((cache, 2, np.array([3, 4]), rand(rng, 1, 2, 2, 4)), note="the KV cache update")
    yield Sample((rand(rng, 5, 2, dtype="int64"), 0, np.array([1, 1, 4]), rand(rng, 3, 2, dtype="int64")),
                 note="repeated index: the last copy wins")
    yield Sample((rand(rng, 4, 3, dtype="bfloat16"), -1, np.array([2, 0]), rand(rng, 4, 2, dtype="bfloat16")),
                 note="negative dim")
    yield Sample((rand(rng, 3, 4), 0, _index(2), rand(rng, 1, 4)), note="0-d index")
    yield Sample((rand(rng), 0, np.array([0]), rand(rng)), note="0-d")
    yield Sample((rand(rng, 3), 0, np.array([1]), rand(rng)), note="0-d source into a vector")
    yield Sample((rand(rng), 0, np.array([0]), rand(rng, 1)), note="one-element source into a 0-d self")
    yield Sample((rand(rng, 3, 2, dtype="bool"), 0, np.zeros(0, np.int64), rand(rng, 0, 2, dtype="bool")),
                 note="no indices")


@samples("aten.index_select.default")
def _index_select(rng):
    x = rand(rng, 3, 5)
    yield Sample((x, 1, _index([4, 0, 4, 2])), note="repeats")
    yield Sample((x, 0, _index([2, 0], "int32")), note="int32 index")
    yield Sample((rand(rng, 2, 3, 4, dtype="bfloat16"), -1, _index([3])), note="negative dim")
    yield Sample((rand(rng, 4, dtype="bool"), 0, _index(2)), note="0-d index")
    yield Sample((np.array(1.5, np.float32), 0, _index([0])), note="0-d self")
    yield Sample((rand(rng, 3, 4, dtype="int64"), 1, np.zeros(0, np.int64)), note="empty index")
    yield Sample((rand(rng, 0, 4), 1, _index([1, 1])), note="empty self")
    yield Sample((rand(rng, 4), 0, _index(2)), note="0-d index, float")


@samples("aten.index.Tensor")
def _index_tensor(rng):
    x = rand(rng, 3, 4, 5)
    yield Sample((x, [_index([2, 0, 2])]), note="first dim, repeats")
    yield Sample((x, [None, _index([-1, 0], "int32")]), note="None then int32 with a negative index")
    yield Sample((x, [_index([[0], [2]]), _index([1, 3, 0])]), note="two broadcasting indices, adjacent")
    yield Sample((x, [_index([0, 2]), None, _index([1, 4])]), note="non-adjacent: broadcast dims go first")
    yield Sample((x, [None, _index([[3, 1]]), _index([[0], [4]])]), note="adjacent after a slice: in place")
    yield Sample((x, [rand(rng, 3, dtype="bool")]), note="bool mask on one dim")
    yield Sample((x, [None, rand(rng, 4, 5, dtype="bool")]), note="2-d mask after a slice")
    yield Sample((x, [rand(rng, 3, 4, dtype="bool"), _index([1])]), note="mask with a broadcast index")
    yield Sample((x, [np.array([1, 0, 1], np.uint8)]), note="uint8 mask (deprecated in torch)")
    yield Sample((rand(rng, 3, 4, dtype="int64"), [_index(1), None]), note="0-d index")
    yield Sample((rand(rng, 3, 4, dtype="bfloat16"), [_index([], "int64").reshape(0)]), note="empty index")
    yield Sample((rand(rng, 0, 4, dtype="bool"), [None, _index([3, 3])]), note="empty self")
    yield Sample((rand(rng, 5, dtype="float16"), [np.zeros(5, bool)]), note="all-false mask")
    yield Sample((rand(rng, 3, 4), [_index(1), None]), note="0-d index, float")
    yield Sample((rand(rng, 3, 4), [_index([[0, 2], [2, 2]]), _index([3, 3])]), note="duplicates add up, float")


@samples("aten.index_put.default")
def _index_put(rng):
    x = rand(rng, 3, 4, 5)
    yield Sample((x, [_distinct_positions(rng, 3, 2)], rand(rng, 2, 4, 5)), note="rows")
    yield Sample((x, [None, _index([-1, 0], "int32")], rand(rng, 5)), note="int32 negative index, broadcast value")
    yield Sample((x, [_index([0, 2]), None, _index([1, 4])], rand(rng, 2, 4)), note="non-adjacent indices")
    yield Sample((x, [rand(rng, 3, 4, dtype="bool")], np.array(9.0, np.float32)), note="mask with a 0-d value")
    yield Sample((rand(rng, 2, 3), [np.array([True, False])], rand(rng, 3)), note="mask, value per column")
    yield Sample((rand(rng, 6, dtype="int64"), [_index([1, 1, 4, 1])], rand(rng, 4, dtype="int64")),
                 {"accumulate": True}, note="accumulate duplicates")
    yield Sample((rand(rng, 3, 4), [None, _index([0, 0, 3])], rand(rng, 3, 1)), {"accumulate": True},
                 note="accumulate with broadcast values")
    yield Sample((rand(rng, 4, dtype="float16"), [_index([2, 2])], np.array([1000.0, 0.25], np.float16)),
                 {"accumulate": True}, note="float16 accumulates in float16, in order")
    yield Sample((rand(rng, 3, dtype="bool"), [_index([0, 0])], np.array(True)), {"accumulate": True},
                 note="bool accumulate is or")
    yield Sample((rand(rng, 3, 2, dtype="bfloat16"), [rand(rng, 3, dtype="bool")], rand(rng, 1, 2, dtype="bfloat16")),
                 {"accumulate": True}, note="mask, accumulate")
    yield Sample((rand(rng, 3, 4), [_index([], "int64")], rand(rng, 4)), note="empty index")
    yield Sample((rand(rng, 6), [_index([1, 1, 4, 1])], rand(rng, 4)), {"accumulate": True},
                 note="accumulate duplicates, float")
    yield Sample((rand(rng, 3, 4), [rand(rng, 3, 4, dtype="bool")], rand(rng, 1)), {"accumulate": True},
                 note="mask, accumulate a broadcast value")


@samples("aten.masked_scatter.default")
def _masked_scatter(rng):
    yield Sample((rand(rng, 3, 4), rand(rng, 3, 4, dtype="bool"), rand(rng, 12)))
    yield Sample((rand(rng, 4, dtype="int64"), rand(rng, 2, 4, dtype="bool"), rand(rng, 3, 5, dtype="int64")),
                 note="mask broadcasts self, 2-d source")
    yield Sample((rand(rng, 2, 1, dtype="bfloat16"), rand(rng, 3, dtype="bool"), rand(rng, 6, dtype="bfloat16")),
                 note="both broadcast")
    yield Sample((rand(rng, 3, dtype="bool"), np.array([True, False, True]), np.array([False, True, True, True])),
                 note="bool")
    yield Sample((np.array(1.0, np.float32), np.array(True), np.array([5.0], np.float32)), note="0-d")
    yield Sample((rand(rng, 0, 3), rand(rng, 3, dtype="bool"), rand(rng, 0)), note="empty")
    yield Sample((rand(rng, 4), rand(rng, 2, 4, dtype="bool"), rand(rng, 3, 5)),
                 note="mask broadcasts self, 2-d source, float")
    yield Sample((rand(rng, 3), np.zeros(3, bool), rand(rng, 2)), note="nothing selected")


@samples("aten.bucketize.Tensor")
def _bucketize(rng):
    edges = np.array([-1.0, 0.0, 0.0, 0.5, 2.0], np.float32)  # sorted, with a repeated edge
    x = np.concatenate([rand(rng, 9), [-1.0, 0.0, 0.5, 2.0, np.nan, np.inf, -np.inf]]).astype(np.float32)
    yield Sample((x, edges), note="left: an edge belongs to the bucket it ends; NaN past the end")
    yield Sample((x.reshape(4, 4), edges), {"right": True}, note="right: an edge starts its bucket")
    yield Sample((rand(rng, 3, 5, dtype="int64", low=-3, high=4), edges), {"out_int32": True},
                 note="integers against float edges, int32 result")
    yield Sample((np.array(0.25, np.float32), edges), note="0-d")
    yield Sample((rand(rng, 6), np.zeros(0, np.float32)), note="no edges: bucket 0")
    yield Sample((rand(rng, 6), rand(rng, 7)), note="unsorted edges: ATen's search, step for step")
    yield Sample((rand(rng, 2, 3, dtype="float64"), np.sort(rand(rng, 64))), {"right": True},
                 note="64 edges: seven halvings")


@samples("aten.nonzero.default")
def _nonzero(rng):
    yield Sample((rand(rng, 3, 4, dtype="int64", low=-1, high=2),))
    yield Sample((rand(rng, 2, 3, 2, dtype="bool"),), note="bool")
    yield Sample((np.array([0.0, np.nan, -0.0, np.inf], np.float32),), note="NaN is nonzero, -0.0 is zero")
    yield Sample((rand(rng, 5, dtype="bfloat16"),), note="bfloat16")
    yield Sample((np.array(3.0, np.float32),), note="0-d nonzero")
    yield Sample((np.array(0, np.int32),), note="0-d zero")
    yield Sample((np.zeros((0, 3), np.float32),), note="empty")
