"""Samples for kiln/ir/ops/linalg.py."""

from __future__ import annotations

import numpy as np

from tests.ir.samples import Sample, rand, samples

NAN, INF = float("nan"), float("inf")


@samples("aten.mm.default")
def _mm(rng):
    yield Sample((rand(rng, 3, 4), rand(rng, 4, 5)))
    yield Sample((rand(rng, 3, 4, dtype="float64"), rand(rng, 4, 2, dtype="float64")))
    yield Sample((rand(rng, 2, 3, dtype="int64"), rand(rng, 3, 2, dtype="int64")))
    yield Sample((rand(rng, 0, 4), rand(rng, 4, 5)), note="empty")
    yield Sample((rand(rng, 3, 0), rand(rng, 0, 5)), note="empty inner dim gives zeros")
    yield Sample((rand(rng, 4, 6, dtype="float16"), rand(rng, 6, 3, dtype="float16")), note="float16")
    yield Sample((rand(rng, 4, 6, dtype="bfloat16"), rand(rng, 6, 3, dtype="bfloat16")), note="bfloat16")
    yield Sample((rand(rng, 3, 4, dtype="uint8", high=200), rand(rng, 4, 2, dtype="uint8", high=200)),
                 note="uint8 wraps around")
    yield Sample((np.array([[NAN, 1.0], [INF, 2.0]], np.float32), rand(rng, 2, 3)), note="nan/inf")


@samples("aten.bmm.default")
def _bmm(rng):
    yield Sample((rand(rng, 2, 3, 4), rand(rng, 2, 4, 5)))
    yield Sample((rand(rng, 3, 2, 4, dtype="float64"), rand(rng, 3, 4, 1, dtype="float64")), note="float64")
    yield Sample((rand(rng, 2, 3, 4, dtype="int32"), rand(rng, 2, 4, 2, dtype="int32")), note="int32")
    yield Sample((rand(rng, 2, 5, 7, dtype="bfloat16"), rand(rng, 2, 7, 3, dtype="bfloat16")), note="bfloat16")
    yield Sample((rand(rng, 0, 3, 4), rand(rng, 0, 4, 5)), note="empty batch")
    yield Sample((rand(rng, 2, 3, 0), rand(rng, 2, 0, 5)), note="empty inner dim")


@samples("aten.addmm.default")
def _addmm(rng):
    yield Sample((rand(rng, 5), rand(rng, 3, 4), rand(rng, 4, 5)), note="row bias")
    yield Sample((rand(rng, 3, 1), rand(rng, 3, 4), rand(rng, 4, 5)), {"beta": 0.5, "alpha": 2.0},
                 note="column bias, beta/alpha")
    yield Sample((rand(rng), rand(rng, 3, 4), rand(rng, 4, 5)), note="0-d self")
    yield Sample((np.full((3, 5), NAN, np.float32), rand(rng, 3, 4), rand(rng, 4, 5)), {"beta": 0},
                 note="beta=0 ignores NaN in self")
    yield Sample((rand(rng, 3, 5), rand(rng, 3, 4), np.full((4, 5), NAN, np.float32)), {"alpha": 0},
                 note="alpha=0 ignores NaN in the product")
    yield Sample((rand(rng, 2, 3, dtype="float64"), rand(rng, 2, 4, dtype="float64"), rand(rng, 4, 3, dtype="float64")),
                 {"beta": -1.5, "alpha": 0.25}, note="float64")
    yield Sample((rand(rng, 2, 3, dtype="int64"), rand(rng, 2, 4, dtype="int64"), rand(rng, 4, 3, dtype="int64")),
                 {"beta": 2, "alpha": 3}, note="int64")
    yield Sample((rand(rng, 2, 3, dtype="int32"), rand(rng, 2, 4, dtype="int32"), rand(rng, 4, 3, dtype="int32")),
                 {"beta": 2.7, "alpha": 1.5}, note="int32 truncates float beta/alpha")
    yield Sample((rand(rng, 3, dtype="bfloat16"), rand(rng, 2, 8, dtype="bfloat16"), rand(rng, 8, 3, dtype="bfloat16")),
                 note="bfloat16")
    yield Sample((rand(rng, 3, dtype="float16"), rand(rng, 2, 8, dtype="float16"), rand(rng, 8, 3, dtype="float16")),
                 {"alpha": 0.5}, note="float16")
    yield Sample((rand(rng, 3, 5), rand(rng, 3, 0), rand(rng, 0, 5)), {"beta": 2}, note="empty inner dim")


def _distinct_points(rng, *shape, dtype="float32"):
    """Points on a coarse grid plus jitter, far enough apart that the euclidean matrix-product formula's
    cancellation error stays well inside float32 tolerance."""
    return (rng.integers(-4, 5, size=shape) + rng.uniform(-0.2, 0.2, size=shape)).astype(dtype)


# Points that repeat (zero distances) or share coordinates (zero differences), and a tie for the inf-norm.
_SHARED_POINTS = np.array([[0.0, 1.0, 2.0], [1.0, 1.0, 1.0], [1.0, 0.0, 3.0], [2.0, 3.0, 1.0]], np.float32)


@samples("aten._cdist_forward.default")
def _cdist(rng):
    for p in (2.0, 1.0, 0.0, 3.0, 0.5, INF):
        yield Sample((rand(rng, 4, 3), rand(rng, 5, 3), p, None), note=f"p={p}")
    yield Sample((rand(rng, 2, 4, 3, dtype="float64"), rand(rng, 1, 5, 3, dtype="float64"), 2.0, 2),
                 note="broadcast batch, float64, no matrix product")
    yield Sample((rand(rng, 3, 4, 2), rand(rng, 2, 2), 1.5, None), note="batched x1, unbatched x2")
    yield Sample((_distinct_points(rng, 30, 4), _distinct_points(rng, 6, 4), 2.0, None),
                 note="more than 25 rows: matrix-product formula")
    yield Sample((_distinct_points(rng, 2, 5, 3), _distinct_points(rng, 2, 4, 3), 2.0, 1),
                 note="compute_mode=1 forces the matrix-product formula")
    yield Sample((rand(rng, 0, 3), rand(rng, 4, 3), 2.0, None), note="empty")
    yield Sample((rand(rng, 2, 0), rand(rng, 3, 0), 1.0, None), note="zero columns")
    nan_rows = np.array([[NAN, 1.0, 5.0], [0.0, 3.0, 1.0], [INF, 0.0, 1.0]], np.float32)
    for p in (0.0, 1.0, 2.0, INF):
        yield Sample((nan_rows, nan_rows[::-1].copy(), p, 2), note=f"nan/inf, p={p} (inf-norm ignores NaN)")
    yield Sample((nan_rows, nan_rows[::-1].copy(), 2.0, 1), note="nan/inf through the matrix-product formula")
    for p in (2.0, 1.0, 0.5, 1.5, 3.0, INF):
        yield Sample((_SHARED_POINTS[:2], _SHARED_POINTS[1:], p, None),
                     note=f"p={p}: a zero distance and equal coordinates (the gradient's special cases)")


@samples("aten._pdist_forward.default")
def _pdist(rng):
    for p in (2.0, 1.0, 0.0, 3.0, 0.5, INF):
        yield Sample((rand(rng, 5, 3), p), note=f"p={p}")
    yield Sample((rand(rng, 4, 6, dtype="float64"),), note="float64, default p")
    yield Sample((rand(rng, 1, 3),), note="one row: no pairs")
    yield Sample((rand(rng, 3, 0), 2.0), note="zero columns")
    nan_rows = np.array([[NAN, 1.0, 5.0], [0.0, 3.0, 1.0], [1.0, 1.0, 1.0], [INF, 0.0, 2.0]], np.float32)
    for p in (0.0, 2.0, INF):
        yield Sample((nan_rows, p), note=f"nan/inf, p={p} (inf-norm propagates NaN here)")
    repeated = np.concatenate([_SHARED_POINTS, _SHARED_POINTS[1:2]])
    for p in (2.0, 1.0, 0.5, 1.5, 3.0, INF):
        yield Sample((repeated, p), note=f"p={p}: a repeated row and equal coordinates")


@samples("aten.matmul.default")
def _matmul(rng):
    yield Sample((rand(rng, 4), rand(rng, 4)), note="1-D . 1-D")
    yield Sample((rand(rng, 3, 4), rand(rng, 4)), note="2-D . 1-D")
    yield Sample((rand(rng, 4), rand(rng, 4, 5)), note="1-D . 2-D")
    yield Sample((rand(rng, 3, 4), rand(rng, 4, 5)), note="2-D . 2-D")
    yield Sample((rand(rng, 2, 3, 4), rand(rng, 4, 5)), note="3-D . 2-D folds into mm")
    yield Sample((rand(rng, 2, 2, 3, 4), rand(rng, 4)), note="4-D . 1-D")
    yield Sample((rand(rng, 4), rand(rng, 2, 4, 5)), note="1-D . 3-D")
    yield Sample((rand(rng, 3, 4), rand(rng, 2, 4, 5)), note="2-D . 3-D")
    yield Sample((rand(rng, 2, 1, 3, 4), rand(rng, 5, 4, 2)), note="broadcast batch dims")
    yield Sample((rand(rng, 2, 3, 4, dtype="float64"), rand(rng, 2, 4, 5, dtype="float64")), note="float64 bmm")
    yield Sample((rand(rng, 2, 3, 4, dtype="int64"), rand(rng, 1, 4, 2, dtype="int64")), note="int64")
    yield Sample((rand(rng, 3, 8, dtype="bfloat16"), rand(rng, 2, 8, 2, dtype="bfloat16")), note="bfloat16")
    yield Sample((rand(rng, 0, 3, 4), rand(rng, 4, 2)), note="empty batch")


@samples("aten.baddbmm.default")
def _baddbmm(rng):
    yield Sample((rand(rng, 2, 3, 5), rand(rng, 2, 3, 4), rand(rng, 2, 4, 5)))
    yield Sample((rand(rng, 5), rand(rng, 2, 3, 4), rand(rng, 2, 4, 5)), {"beta": 0.5, "alpha": -2.0},
                 note="broadcast self, beta/alpha")
    yield Sample((np.full((2, 3, 5), NAN, np.float32), rand(rng, 2, 3, 4), rand(rng, 2, 4, 5)), {"beta": 0},
                 note="beta=0 ignores NaN in self")
    yield Sample((rand(rng, 3, 1, dtype="float64"), rand(rng, 2, 3, 4, dtype="float64"),
                  rand(rng, 2, 4, 2, dtype="float64")), {"alpha": 0}, note="alpha=0")
    yield Sample((rand(rng, 1, 3, 2, dtype="int64"), rand(rng, 2, 3, 4, dtype="int64"),
                  rand(rng, 2, 4, 2, dtype="int64")), {"beta": 2.7, "alpha": 1.5}, note="int64 truncates beta/alpha")
    yield Sample((rand(rng, 2, 2, 3, dtype="bfloat16"), rand(rng, 2, 2, 8, dtype="bfloat16"),
                  rand(rng, 2, 8, 3, dtype="bfloat16")), note="bfloat16")


@samples("aten.dot.default", "aten.vdot.default")
def _dot(rng):
    yield Sample((rand(rng, 5), rand(rng, 5)))
    yield Sample((rand(rng, 3, dtype="float64"), rand(rng, 3, dtype="float64")), note="float64")
    yield Sample((rand(rng, 4, dtype="int64"), rand(rng, 4, dtype="int64")), note="int64")
    yield Sample((rand(rng, 0), rand(rng, 0)), note="empty")


@samples("aten.mv.default")
def _mv(rng):
    yield Sample((rand(rng, 3, 4), rand(rng, 4)))
    yield Sample((rand(rng, 2, 5, dtype="float64"), rand(rng, 5, dtype="float64")), note="float64")
    yield Sample((rand(rng, 0, 5), rand(rng, 5)), note="empty")


@samples("aten.addmv.default")
def _addmv(rng):
    yield Sample((rand(rng, 3), rand(rng, 3, 4), rand(rng, 4)))
    yield Sample((rand(rng), rand(rng, 3, 4), rand(rng, 4)), {"beta": 0.5, "alpha": 2}, note="0-d self")
    yield Sample((np.full(3, NAN, np.float32), rand(rng, 3, 4), rand(rng, 4)), {"beta": 0},
                 note="beta=0 ignores NaN in self")
    yield Sample((rand(rng, 2, dtype="int64"), rand(rng, 2, 3, dtype="int64"), rand(rng, 3, dtype="int64")),
                 {"beta": 3, "alpha": 2}, note="int64")


@samples("aten.outer.default")
def _outer(rng):
    yield Sample((rand(rng, 3), rand(rng, 4)))
    yield Sample((rand(rng, 3, dtype="int32"), rand(rng, 2, dtype="float64")), note="promotes")
    yield Sample((rand(rng, 3, dtype="bool"), rand(rng, 2, dtype="bool")), note="bool")
    yield Sample((rand(rng, 0), rand(rng, 2)), note="empty")


@samples("aten.einsum.default")
def _einsum(rng):
    yield Sample(("ij,jk->ik", [rand(rng, 3, 4), rand(rng, 4, 5)]), note="matrix product")
    yield Sample(("bij,bjk->bik", [rand(rng, 2, 3, 4), rand(rng, 2, 4, 5)]), note="batched")
    yield Sample(("ij,jk", [rand(rng, 3, 4), rand(rng, 4, 2)]), note="implicit output")
    yield Sample(("i,i->", [rand(rng, 5), rand(rng, 5)]), note="dot")
    yield Sample(("i,j->ij", [rand(rng, 3), rand(rng, 4)]), note="outer")
    yield Sample(("ii->i", [rand(rng, 3, 3)]), note="diagonal")
    yield Sample(("ii", [rand(rng, 3, 3)]), note="trace")
    yield Sample(("iij->j", [rand(rng, 3, 3, 2)]), note="diagonal then sum")
    yield Sample(("ij->ji", [rand(rng, 2, 3)]), note="transpose")
    yield Sample(("...ij,...jk->...ik", [rand(rng, 2, 1, 3, 4), rand(rng, 5, 4, 2)]), note="ellipsis broadcast")
    yield Sample(("...ij->ij", [rand(rng, 2, 3, 4)]), note="ellipsis summed")
    yield Sample(("i...j,j...->i...", [rand(rng, 2, 5, 3), rand(rng, 3, 5)]), note="ellipsis in the middle")
    yield Sample(("bhqd,bhkd->bhqk", [rand(rng, 2, 2, 3, 4), rand(rng, 2, 2, 5, 4)]), note="attention scores")
    yield Sample(("ij,kl,jm->im", [rand(rng, 2, 3), rand(rng, 4, 2), rand(rng, 3, 2)]),
                 note="three operands, one summed alone")
    yield Sample(("ij,ij->ij", [rand(rng, 1, 3), rand(rng, 4, 1)]), note="size-1 labels broadcast")
    yield Sample(("Ba,aB", [rand(rng, 2, 3), rand(rng, 3, 2)]), note="upper and lower case labels")
    yield Sample(("bA", [rand(rng, 2, 3)]), note="implicit order puts upper case first")
    yield Sample(("ij,jk->ik", [rand(rng, 2, 3, dtype="float64"), rand(rng, 3, 2, dtype="float64")]), note="float64")
    yield Sample(("ij,jk->ik", [rand(rng, 2, 3, dtype="int32"), rand(rng, 3, 2, dtype="int32")]),
                 note="int32 contraction stays int32")
    yield Sample(("ij,k->i", [rand(rng, 2, 3, dtype="int32"), rand(rng, 4, dtype="int32")]),
                 note="int32 with a summed label widens to int64")
    yield Sample(("ij->", [rand(rng, 1, 1, dtype="int32")]), note="a lone int32 operand is summed: int64")
    yield Sample(("ij,jk->ik", [rand(rng, 2, 8, dtype="bfloat16"), rand(rng, 8, 3, dtype="bfloat16")]),
                 note="bfloat16")
    yield Sample(("ij,jk->ik", [rand(rng, 0, 3), rand(rng, 3, 2)]), note="empty")
