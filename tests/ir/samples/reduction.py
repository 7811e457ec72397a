"""Samples for kiln/ir/ops/reduction.py: reductions, scans, sorting, softmax, logsumexp and vector norms.

Every generator covers dims given as lists, negative dims, `None`/`[]` (all dims), keepdim, 0-d and empty
inputs, float32 plus float64/float16/bfloat16/integer/bool where the op accepts them, and NaN/inf where the
op has a rule for them. Index results are compared exactly, so ties appear only where ATen defines the tie
order (first occurrence for argmax/max.dim, input order for stable sorts).
"""

from __future__ import annotations

import numpy as np

from kiln.ir import dtypes
from tests.ir.samples import Sample, positive, rand, samples

NAN, INF = np.nan, np.inf


def _distinct(rng, *shape, dtype="float32"):
    """A random permutation of 0..n-1 (shifted and scaled): no ties, exactly representable in every dtype."""
    count = int(np.prod(shape))
    values = (rng.permutation(count).astype(np.float32) - count // 2) * 0.5
    return values.reshape(shape).astype(dtypes.dtype(dtype).numpy)


def _dim_variants(x):
    """The dim/keepdim combinations a dims-list reduction is checked with on a rank-3 input."""
    yield Sample((x, [1]), note="one dim")
    yield Sample((x, [-1, 0], True), note="negative dims, keepdim")
    yield Sample((x, None), note="dim=None reduces everything")
    yield Sample((x, [], True), note="dim=[] reduces everything, keepdim")


@samples("aten.sum.dim_IntList")
def _sum_dim(rng):
    yield from _dim_variants(rand(rng, 3, 4, 5))
    yield Sample((rand(rng, 4, 1000), [1]), note="long float32 rows")
    yield Sample((rand(rng, 3, 4, dtype="float64"), [0]), note="float64")
    yield Sample((rand(rng, 2, 600, dtype="float16"), [1]), note="float16 accumulates in float32")
    yield Sample((rand(rng, 2, 600, dtype="bfloat16"), [-1]), note="bfloat16 accumulates in float32")
    yield Sample((rand(rng, 3, 4, dtype="int32", low=-100, high=100), [1]), note="int32 -> int64")
    yield Sample((rand(rng, 3, 4, dtype="bool"), [0]), note="bool -> int64")
    yield Sample((rand(rng, 3, 40, dtype="uint8", high=250), [1]), {"dtype": dtypes.uint8}, note="uint8 wraps")
    yield Sample((rand(rng, 3, 4, dtype="int64"), [1]), {"dtype": dtypes.float16}, note="dtype casts the input")
    yield Sample((rand(rng, 3, 4, low=-5, high=5), [1]), {"dtype": dtypes.int32}, note="float -> int32 truncates first")
    yield Sample((rand(rng, 3, 4), [0]), {"dtype": dtypes.bool_}, note="dtype=bool")
    yield Sample((rand(rng, 3, 4), [1]), {"dtype": dtypes.float64}, note="dtype=float64")
    yield Sample((rand(rng), [0]), note="0-d, dim 0")
    yield Sample((rand(rng), [-1], True), note="0-d, dim -1, keepdim")
    yield Sample((rand(rng, 0, 3), [0]), note="empty dim sums to 0")
    yield Sample((rand(rng, 0, 3), [1], True), note="empty non-reduced dim")
    yield Sample((np.array([[1.0, NAN, 2.0], [INF, 1.0, -1.0], [INF, -INF, 0.0]], np.float32), [1]), note="nan/inf")


@samples("aten.sum.default")
def _sum(rng):
    yield Sample((rand(rng, 3, 4, 5),))
    yield Sample((rand(rng, 2, 600, dtype="float16"),), note="float16")
    yield Sample((rand(rng, 3, 4, dtype="int8"),), note="int8 -> int64")
    yield Sample((rand(rng, 5, dtype="bool"),), note="bool -> int64")
    yield Sample((rand(rng, 3, 4),), {"dtype": dtypes.float64}, note="dtype")
    yield Sample((rand(rng),), note="0-d")
    yield Sample((rand(rng, 2, 0),), note="empty")


def _small_factors(rng, *shape, dtype="float32"):
    """Factors in ±[0.5, 1.5] so products of a few stay well inside every float dtype's range."""
    magnitude = rng.uniform(0.5, 1.5, shape) * rng.choice([-1.0, 1.0], shape)
    return magnitude.astype(np.float32).astype(dtypes.dtype(dtype).numpy)


# Rows with one zero, two zeros and none: the gradient of a product is the product of the others.
_WITH_ZEROS = np.array([[2.0, 0.0, 3.0, 0.5], [0.0, 4.0, 0.0, 1.5], [1.0, 2.0, -3.0, 4.0]], np.float32)


@samples("aten.prod.dim_int")
def _prod_dim(rng):
    yield Sample((_small_factors(rng, 3, 4, 5), 1))
    yield Sample((_small_factors(rng, 3, 4, 5), -1, True), note="negative dim, keepdim")
    yield Sample((_small_factors(rng, 4, 3, dtype="float64"), 0), note="float64")
    yield Sample((_small_factors(rng, 6, 3, dtype="float16"), 0), note="float16 rounds every step")
    yield Sample((_small_factors(rng, 3, 6, dtype="bfloat16"), 1), note="bfloat16 rounds every step")
    yield Sample((rand(rng, 3, 4, dtype="int32", low=-9, high=9), 1), note="int32 -> int64")
    yield Sample((rand(rng, 3, 30, dtype="int64", low=-1000, high=1000), 1), note="int64 wraps")
    yield Sample((rand(rng, 3, 4, dtype="bool"), 0), note="bool -> int64")
    yield Sample((rand(rng, 3, 4, dtype="uint8", high=9), 1), {"dtype": dtypes.float64}, note="dtype")
    yield Sample((np.array([[1e30, 1e30, 1e-30], [2.0, NAN, 0.0]], np.float32), 1), note="overflow, nan")
    yield Sample((rand(rng), 0), note="0-d")
    yield Sample((rand(rng), -1, True), note="0-d keepdim")
    yield Sample((rand(rng, 0, 3), 0), note="empty dim gives 1")
    yield Sample((_WITH_ZEROS, 1), note="one zero, two zeros and none in a row: the gradient's zero cases")
    yield Sample((_WITH_ZEROS, 0, True), note="zeros along dim 0, keepdim")


@samples("aten.prod.default")
def _prod(rng):
    yield Sample((_small_factors(rng, 3, 4),))
    yield Sample((_small_factors(rng, 2, 3, dtype="float16"),), note="float16")
    yield Sample((rand(rng, 2, 5, dtype="int16", low=-5, high=5),), note="int16 -> int64")
    yield Sample((rand(rng, 4, dtype="bool"),), note="bool")
    yield Sample((_small_factors(rng, 3, 4),), {"dtype": dtypes.float64}, note="dtype")
    yield Sample((rand(rng),), note="0-d")
    yield Sample((rand(rng, 0),), note="empty")
    yield Sample((_WITH_ZEROS[2:],), note="no zero")
    yield Sample((_WITH_ZEROS[:1],), note="one zero")
    yield Sample((_WITH_ZEROS[1:2],), note="two zeros")


@samples("aten.mean.dim")
def _mean_dim(rng):
    yield from _dim_variants(rand(rng, 3, 4, 5))
    yield Sample((rand(rng, 3, 4, dtype="float64"), [0]), note="float64")
    yield Sample((rand(rng, 4, 300, dtype="float16"), [1]), note="float16 sums in float32")
    yield Sample((rand(rng, 4, 300, dtype="bfloat16"), [-1], True), note="bfloat16")
    yield Sample((rand(rng, 3, 4, dtype="int32"), [1]), {"dtype": dtypes.float32}, note="int input with dtype")
    yield Sample((rand(rng, 3, 40), [1]), {"dtype": dtypes.float16}, note="dtype=float16 does not round inputs first")
    yield Sample((rand(rng, 3, 4, dtype="float16"), [0]), {"dtype": dtypes.float64}, note="dtype widens")
    yield Sample((rand(rng), [0]), note="0-d")
    yield Sample((rand(rng, 0, 3), [0]), note="empty dim gives nan")
    yield Sample((np.array([[1.0, NAN], [INF, 1.0], [INF, -INF]], np.float32), [1]), note="nan/inf")


@samples("aten.mean.default")
def _mean(rng):
    yield Sample((rand(rng, 3, 4, 5),))
    yield Sample((rand(rng, 2, 300, dtype="bfloat16"),), note="bfloat16")
    yield Sample((rand(rng, 3, 4, dtype="int64"),), {"dtype": dtypes.float64}, note="int input with dtype")
    yield Sample((rand(rng),), note="0-d")
    yield Sample((rand(rng, 0, 2),), note="empty gives nan")


def _variance_samples(rng, *, unbiased_overload: bool, infinities: bool = True):
    """var/std: correction (or unbiased) variants, dims, dtypes, 0-d, empty and non-finite values.

    `infinities=False` leaves out inf inputs: var_mean's mean then depends on ATen's Welford update order
    (inf followed by a finite value gives nan rather than inf), which kiln does not imitate."""
    def correction(value):
        if unbiased_overload:
            return {} if value == 1 else {"unbiased": bool(value)}
        return {"correction": value}

    x = rand(rng, 3, 4, 5)
    yield Sample((x, [1]), correction(1), note="unbiased")
    yield Sample((x, [-1, 0]), {**correction(0), "keepdim": True}, note="population, keepdim")
    yield Sample((x, None), correction(1), note="dim=None")
    yield Sample((x, []), correction(0), note="dim=[] reduces everything")
    yield Sample((rand(rng, 4, 6, dtype="float64"), [1]), correction(1), note="float64")
    yield Sample((rand(rng, 4, 200, dtype="float16"), [1]), correction(1), note="float16 computes in float32")
    yield Sample((rand(rng, 4, 200, dtype="bfloat16"), [0]), correction(0), note="bfloat16")
    yield Sample((rand(rng, 3000) + 1000.0, [0]), correction(1), note="large mean: needs a stable algorithm")
    yield Sample((rand(rng), [0]), correction(1), note="0-d: 0/0 is nan")
    yield Sample((rand(rng), None), correction(0), note="0-d population")
    yield Sample((rand(rng, 0, 3), [0]), correction(1), note="empty dim is nan")
    yield Sample((rand(rng, 1, 3), [0]), correction(1), note="one element is nan")
    non_finite = INF if infinities else NAN
    yield Sample((np.array([[1.0, NAN, 2.0], [1.0, non_finite, 2.0]], np.float32), [1]), correction(1),
                 note="nan/inf")
    if not unbiased_overload:
        yield Sample((x, [1]), {"correction": 2.5}, note="fractional correction")
        yield Sample((x, [1]), {"correction": 4}, note="correction = N: divides by 0")
        yield Sample((x, [1]), {"correction": 7}, note="correction > N: divisor clamps to 0")
        yield Sample((x, [2]), {"correction": -1}, note="negative correction")
        yield Sample((x, [0]), {}, note="correction=None means 1")
        yield Sample((x,), {"correction": True, "keepdim": True}, note="bool correction, default dim")


@samples("aten.var.correction", "aten.std.correction")
def _var_correction(rng):
    yield from _variance_samples(rng, unbiased_overload=False)


@samples("aten.var_mean.correction")
def _var_mean(rng):
    yield from _variance_samples(rng, unbiased_overload=False, infinities=False)


@samples("aten.var.dim", "aten.std.dim")
def _var_dim(rng):
    yield from _variance_samples(rng, unbiased_overload=True)
    yield Sample((rand(rng, 3, 4), [1], False, True), note="positional unbiased=False, keepdim")


# Float rows with tied maxima and minima: amax/amin split the gradient among them, max.dim/min.dim give it to
# the first.
_TIES = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 1.0, 2.0], [-1.0, 5.0, -1.0, 5.0]], np.float32)


def _extremum_samples(rng):
    yield Sample((rand(rng, 3, 4, 5), [1]), note="one dim")
    yield Sample((rand(rng, 3, 4, 5), [-1, 0], True), note="negative dims, keepdim")
    yield Sample((rand(rng, 3, 4, 5),), note="default dim=[] reduces everything")
    yield Sample((rand(rng, 3, 4, dtype="float64"), 1), note="float64, int dim")
    yield Sample((rand(rng, 3, 4, dtype="float16"), [0]), note="float16")
    yield Sample((rand(rng, 3, 4, dtype="bfloat16"), [1]), note="bfloat16")
    yield Sample((rand(rng, 3, 4, dtype="int8"), [1]), note="int8")
    yield Sample((rand(rng, 3, 4, dtype="uint8", high=200), [0]), note="uint8")
    yield Sample((rand(rng, 3, 4, dtype="bool"), [1]), note="bool")
    yield Sample((np.array([[1.0, NAN, 3.0], [-INF, 2.0, INF], [NAN, NAN, 0.0]], np.float32), [1]),
                 note="NaN wins, inf")
    yield Sample((np.array([0.0, -0.0], np.float32), [0]), note="signed zeros")
    yield Sample((_TIES, [1]), note="ties share the gradient evenly")
    yield Sample((_TIES,), note="ties over all dims")
    yield Sample((rand(rng), [0]), note="0-d")
    yield Sample((rand(rng), [], True), note="0-d, all dims, keepdim")
    yield Sample((rand(rng, 0, 3), [1]), note="empty non-reduced dim")


@samples("aten.amax.default", "aten.amin.default")
def _amax(rng):
    yield from _extremum_samples(rng)


@samples("aten.max.default", "aten.min.default")
def _max(rng):
    yield Sample((rand(rng, 3, 4, 5),))
    yield Sample((rand(rng, 3, 4, dtype="int32"),), note="int32")
    yield Sample((rand(rng, 4, dtype="bool"),), note="bool")
    yield Sample((rand(rng, 3, 4, dtype="float16"),), note="float16")
    yield Sample((np.array([[1.0, NAN], [INF, -INF]], np.float32),), note="NaN wins")
    yield Sample((rand(rng),), note="0-d")


@samples("aten.argmax.default", "aten.argmin.default")
def _argmax(rng):
    yield Sample((rand(rng, 3, 4, 5), 1), note="one dim")
    yield Sample((rand(rng, 3, 4, 5), -1, True), note="negative dim, keepdim")
    yield Sample((rand(rng, 3, 4, 5),), note="dim=None: index into the flattened input")
    yield Sample((rand(rng, 3, 4), None, True), note="dim=None, keepdim keeps the rank")
    yield Sample((rand(rng, 3, 4, dtype="float64"), 0), note="float64")
    yield Sample((rand(rng, 3, 4, dtype="float16"), 1), note="float16")
    yield Sample((rand(rng, 3, 4, dtype="bfloat16"), 0), note="bfloat16")
    yield Sample((rand(rng, 4, 6, dtype="int32", low=-2, high=2), 1), note="ties: first occurrence")
    yield Sample((rand(rng, 4, 6, dtype="uint8", high=3), 0), note="uint8 ties")
    yield Sample((np.array([[1.0, NAN, 3.0, NAN], [-INF, 2.0, INF, 0.0]], np.float32), 1),
                 note="first NaN wins, inf")
    yield Sample((np.array([[2.0, NAN], [1.0, 3.0]], np.float32),), note="NaN, flattened")
    yield Sample((rand(rng), 0), note="0-d, dim 0")
    yield Sample((rand(rng), -1, True), note="0-d, dim -1, keepdim")
    yield Sample((rand(rng),), note="0-d, dim=None")
    yield Sample((rand(rng, 0, 3), 1), note="empty non-reduced dim")


@samples("aten.max.dim", "aten.min.dim")
def _max_dim(rng):
    yield Sample((rand(rng, 3, 4, 5), 1), note="one dim")
    yield Sample((rand(rng, 3, 4, 5), -1, True), note="negative dim, keepdim")
    yield Sample((rand(rng, 3, 4, dtype="float64"), 0), note="float64")
    yield Sample((rand(rng, 3, 4, dtype="float16"), 1), note="float16")
    yield Sample((rand(rng, 3, 4, dtype="bfloat16"), 0), note="bfloat16")
    yield Sample((rand(rng, 4, 6, dtype="int64", low=-2, high=2), 1), note="ties: first occurrence")
    yield Sample((rand(rng, 4, 5, dtype="bool"), 1), note="bool")
    yield Sample((np.array([[1.0, NAN, 3.0, NAN], [-INF, 2.0, INF, 0.0]], np.float32), 1), note="first NaN wins")
    yield Sample((np.array([[0.0, -0.0], [-0.0, 0.0]], np.float32), 1), note="signed zeros tie")
    yield Sample((_TIES, 1), note="float ties: the first index gets the gradient")
    yield Sample((_TIES, 0, True), note="float ties along dim 0, keepdim")
    yield Sample((rand(rng), 0), note="0-d")
    yield Sample((rand(rng), -1, True), note="0-d keepdim")
    yield Sample((rand(rng, 0, 3), 1), note="empty non-reduced dim")


def _truthy_inputs(rng):
    """Inputs for any/all: zeros mixed in, NaN (truthy), bools, uint8 (keeps uint8), 0-d and empty."""
    floats = rand(rng, 3, 4, 5) * (rng.random((3, 4, 5)) < 0.7)
    yield floats, "float32 with zeros"
    yield rand(rng, 3, 4, dtype="bool"), "bool"
    yield rand(rng, 3, 4, dtype="uint8", high=2), "uint8 stays uint8"
    yield rand(rng, 3, 4, dtype="int32", low=-1, high=2), "int32"
    yield np.array([[0.0, NAN], [0.0, -0.0], [1.0, 1.0]], np.float32), "NaN is true, -0 is false"
    yield np.ones((2, 3), np.float16), "all true float16"


@samples("aten.any.default", "aten.all.default")
def _any(rng):
    for x, note in _truthy_inputs(rng):
        yield Sample((x,), note=note)
    yield Sample((np.asarray(rand(rng, dtype="bool")),), note="0-d")
    yield Sample((rand(rng, 0, 3),), note="empty: any=False, all=True")


@samples("aten._is_all_true.default", "aten._is_any_true.default")
def _is_true(rng):
    yield Sample((rand(rng, 3, 4, dtype="bool"),), note="mixed")
    yield Sample((np.ones((2, 3), bool),), note="all true")
    yield Sample((np.asarray(rand(rng, dtype="bool")),), note="0-d")
    yield Sample((np.zeros((0, 3), bool),), note="empty: all=True, any=False")


@samples("aten.any.dim", "aten.all.dim")
def _any_dim(rng):
    for x, note in _truthy_inputs(rng):
        yield Sample((x, 1), note=note)
    yield Sample((rand(rng, 3, 4, dtype="bool"), -1, True), note="negative dim, keepdim")
    yield Sample((rand(rng), 0), note="0-d")
    yield Sample((rand(rng, dtype="uint8"), -1, True), note="0-d uint8 keepdim")
    yield Sample((rand(rng, 0, 3), 0), note="empty reduced dim")


@samples("aten.any.dims", "aten.all.dims")
def _any_dims(rng):
    for x, note in _truthy_inputs(rng):
        yield Sample((x, [0, -1]), note=note)
    yield Sample((rand(rng, 3, 4, dtype="bool"), None, True), note="dim=None reduces everything, keepdim")
    yield Sample((rand(rng, 3, 4, dtype="uint8", high=2),), note="default dim=None")
    yield Sample((rand(rng, 3, 4), []), note="dim=[] reduces nothing")
    yield Sample((rand(rng), [0]), note="0-d")
    yield Sample((rand(rng, 0, 3), [0], True), note="empty reduced dim")


def _scan_samples(rng, values):
    """cumsum/cumprod: `values(rng, *shape, dtype=...)` gives inputs whose scans stay in range."""
    yield Sample((values(rng, 3, 4, 5), 1), note="one dim")
    yield Sample((values(rng, 3, 4, 5), -1), note="negative dim")
    yield Sample((values(rng, 40, 3), 0), note="long float32 scan")
    yield Sample((values(rng, 3, 6, dtype="float64"), 1), note="float64")
    yield Sample((values(rng, 3, 6, dtype="float16"), 1), note="float16 accumulates in float32")
    yield Sample((values(rng, 6, 3, dtype="bfloat16"), 0), note="bfloat16")
    yield Sample((rand(rng, 3, 6, dtype="int32", low=-4, high=4), 1), note="int32 -> int64")
    yield Sample((rand(rng, 3, 6, dtype="uint8", high=4), 1), note="uint8 -> int64")
    yield Sample((rand(rng, 3, 6, dtype="bool"), 1), note="bool -> int64")
    yield Sample((rand(rng, 3, 6, dtype="int16", low=-4, high=4), 0), {"dtype": dtypes.float64}, note="dtype")
    yield Sample((values(rng, 3, 6), 1), {"dtype": dtypes.float16}, note="dtype=float16 casts the input first")
    yield Sample((rand(rng, 3, 6, low=-3, high=3), 1), {"dtype": dtypes.int32}, note="float -> int32 truncates first")
    yield Sample((rand(rng), 0), note="0-d")
    yield Sample((rand(rng, dtype="int8"), -1), note="0-d int8")
    yield Sample((rand(rng, 0, 3), 0), note="empty")
    yield Sample((np.array([[1.0, NAN, 2.0], [INF, -INF, 1.0]], np.float32), 1), note="nan/inf")


@samples("aten.cumsum.default")
def _cumsum(rng):
    yield from _scan_samples(rng, rand)
    yield Sample((rand(rng, 3, 300, dtype="int8", low=-128, high=127), 1), {"dtype": dtypes.int8}, note="int8 wraps")


@samples("aten.cumprod.default")
def _cumprod(rng):
    yield from _scan_samples(rng, _small_factors)
    yield Sample((rand(rng, 3, 20, dtype="int32", low=-9, high=9), 1), {"dtype": dtypes.int32}, note="int32 wraps")


@samples("aten.sort.default")
def _sort(rng):
    yield Sample((_distinct(rng, 3, 4, 5),), note="default last dim")
    yield Sample((_distinct(rng, 3, 4, 5), 1, True), note="descending")
    yield Sample((_distinct(rng, 6, 3), -2), note="negative dim")
    yield Sample((_distinct(rng, 3, 50, dtype="float64"), 1, True), note="float64 descending")
    yield Sample((_distinct(rng, 3, 8, dtype="float16"), 1), note="float16")
    yield Sample((_distinct(rng, 3, 8, dtype="bfloat16"), 1, True), note="bfloat16")
    yield Sample((_distinct(rng, 4, 7, dtype="int32"), 1, True), note="int32")
    yield Sample((_distinct(rng, 2, 9, dtype="int8"), 0), note="int8")
    yield Sample((np.array([[True, False], [False, True]]), 1), note="bool")
    yield Sample((np.array([3.0, NAN, 1.0, -INF, INF, 2.0], np.float32),), note="NaN sorts last")
    yield Sample((np.array([3.0, NAN, 1.0, -INF, INF, 2.0], np.float32), 0, True), note="NaN first descending")
    yield Sample((rand(rng), 0), note="0-d")
    yield Sample((rand(rng, 0, 3), 1), note="empty")


def _argsort_stable_samples(rng):
    yield Sample((rand(rng, 4, 30, dtype="int32", low=0, high=4),), {"stable": True}, note="ties keep input order")
    yield Sample((rand(rng, 4, 30, dtype="int32", low=0, high=4),), {"stable": True, "descending": True},
                 note="ties keep input order when descending")
    yield Sample((rand(rng, 30, 3, dtype="bool"),), {"stable": True, "dim": 0}, note="bool")
    yield Sample((np.array([1.0, NAN, 1.0, NAN, -0.0, 0.0, 0.0, -0.0], np.float32),),
                 {"stable": True, "descending": True}, note="NaN and signed-zero ties")
    yield Sample((_distinct(rng, 3, 6),), {"stable": False, "dim": 1}, note="stable=False without ties")
    yield Sample((rand(rng),), {"stable": True}, note="0-d")


@samples("aten.argsort.stable")
def _argsort_stable(rng):
    yield from _argsort_stable_samples(rng)


@samples("aten.sort.stable")
def _sort_stable(rng):
    yield from _argsort_stable_samples(rng)
    yield Sample((_distinct(rng, 3, 6),), {"stable": None, "dim": 0}, note="stable=None")


@samples("aten.argsort.default")
def _argsort(rng):
    yield Sample((_distinct(rng, 3, 4, 5),), note="default last dim")
    yield Sample((_distinct(rng, 3, 4, 5), 0, True), note="descending")
    yield Sample((_distinct(rng, 3, 8, dtype="float16"), -1, True), note="float16")
    yield Sample((np.array([3.0, NAN, 1.0, -INF], np.float32),), note="NaN last")
    yield Sample((rand(rng), 0), note="0-d")
    yield Sample((rand(rng, 2, 0),), note="empty")


@samples("aten.topk.default")
def _topk(rng):
    yield Sample((_distinct(rng, 3, 10), 3), note="largest")
    yield Sample((_distinct(rng, 3, 10), 4, -1, False), note="smallest")
    yield Sample((_distinct(rng, 6, 5), 2, 0), note="dim 0")
    yield Sample((_distinct(rng, 3, 7, dtype="float64"), 7), note="k = size")
    yield Sample((_distinct(rng, 3, 7), 0), note="k = 0")
    yield Sample((_distinct(rng, 3, 9, dtype="float16"), 4, 1), note="float16")
    yield Sample((_distinct(rng, 3, 9, dtype="bfloat16"), 4, 1, False), note="bfloat16 smallest")
    yield Sample((_distinct(rng, 4, 9, dtype="int64"), 3), note="int64")
    yield Sample((np.array([3.0, NAN, 1.0, -INF, INF, 2.0], np.float32), 3), note="NaN is the largest")
    yield Sample((np.array([3.0, NAN, 1.0, -INF, INF, 2.0], np.float32), 3, 0, False), note="NaN never smallest")
    yield Sample((_distinct(rng, 3, 10), 4, 1, True, False), check_values=False,
                 note="sorted=False: ATen's order is unspecified")
    yield Sample((rand(rng), 1), note="0-d")
    yield Sample((rand(rng, 0, 5), 2), note="empty non-selected dim")
    yield Sample((rand(rng, 3, 0), 0), note="empty dim, k = 0")


def _softmax_inputs(rng):
    yield rand(rng, 3, 4, 5), 1, "float32"
    yield rand(rng, 3, 4, 5), -1, "negative dim"
    yield rand(rng, 4, 6, dtype="float64"), 0, "float64"
    yield rand(rng, 4, 6, dtype="float16"), 1, "float16"
    yield rand(rng, 4, 6, dtype="bfloat16"), 1, "bfloat16"
    yield (rand(rng, 8, 64, dtype="float16", low=-90, high=90), -1,
           "float16 last dim, large logits: ATen rounds log_softmax's log-sum to float16")
    yield rand(rng, 64, 8, dtype="bfloat16"), 0, "bfloat16, not the last dim"
    yield rand(rng, 3, 4) * 1000.0, 1, "large logits: needs the max shift"
    yield np.array([[-INF, -INF, -INF], [-INF, 0.0, 1.0], [INF, 1.0, 2.0], [NAN, 0.0, 1.0]], np.float32), 1, "inf/nan"
    yield rand(rng), 0, "0-d"
    yield rand(rng), -1, "0-d, dim -1"
    yield rand(rng, 0, 3), 1, "empty"


@samples("aten._softmax.default", "aten._log_softmax.default")
def _softmax(rng):
    for x, dim, note in _softmax_inputs(rng):
        yield Sample((x, dim, False), note=note)


@samples("aten.softmax.int", "aten.log_softmax.int")
def _softmax_int(rng):
    for x, dim, note in _softmax_inputs(rng):
        yield Sample((x, dim), note=note)
    yield Sample((rand(rng, 3, 4, dtype="int64"), 1, dtypes.float32), note="int input with dtype")
    yield Sample((rand(rng, 3, 4, dtype="float16"), 1, dtypes.float32), note="float16 computed in float32")
    yield Sample((rand(rng, 3, 4), 0, dtypes.float64), note="dtype widens")
    yield Sample((rand(rng, 3, 4), 1, dtypes.float16), note="dtype narrows")


@samples("aten.logsumexp.default")
def _logsumexp(rng):
    yield Sample((rand(rng, 3, 4, 5), [1]), note="one dim")
    yield Sample((rand(rng, 3, 4, 5), [-1, 0], True), note="negative dims, keepdim")
    yield Sample((rand(rng, 3, 4) * 100.0, 1), note="int dim, large values")
    yield Sample((rand(rng, 4, 6, dtype="float64"), [0]), note="float64")
    yield Sample((rand(rng, 4, 6, dtype="float16"), [1]), note="float16 rounds every step like ATen")
    yield Sample((rand(rng, 4, 6, dtype="bfloat16"), [0], True), note="bfloat16")
    yield Sample((rand(rng, 3, 4, dtype="int32"), [1]), note="int32 -> float32")
    yield Sample((rand(rng, 3, 4, dtype="bool"), [0]), note="bool -> float32")
    yield Sample((np.array([[-INF, -INF], [INF, INF], [INF, -INF], [NAN, INF], [1.0, -INF]], np.float32), [1]),
                 note="infinite maxima")
    yield Sample((rand(rng), [0]), note="0-d")
    yield Sample((rand(rng), []), note="0-d, dim=[]")
    yield Sample((rand(rng, 0, 3), [0]), note="empty dim gives -inf")


@samples("aten.linalg_vector_norm.default")
def _vector_norm(rng):
    x = rand(rng, 3, 4, 5)
    yield Sample((x,), note="2-norm of everything")
    for ord in (1, 0, INF, -INF, 3, -1, 0.5, 2.5):
        yield Sample((x, ord, [1]), note=f"ord={ord}")
    yield Sample((x, 2, [-1, 0], True), note="negative dims, keepdim")
    yield Sample((x, 2, []), note="dim=[] reduces everything")
    yield Sample((rand(rng, 3, 4, dtype="float64"), 2, [1]), note="float64")
    yield Sample((rand(rng, 4, 200, dtype="float16"), 2, [1]), note="float16 computes in float32")
    yield Sample((rand(rng, 4, 200, dtype="bfloat16"), 1, [1]), note="bfloat16")
    yield Sample((rand(rng, 3, 4, dtype="float16"), 2, [1]), {"dtype": dtypes.float32}, note="dtype")
    yield Sample((rand(rng, 3, 4), INF, [1]), {"dtype": dtypes.float64}, note="inf norm with dtype")
    yield Sample((rand(rng, 3, 4), 0, [0]), {"dtype": dtypes.float64}, note="0 norm with dtype")
    yield Sample((np.array([[3.0, -4.0, 0.0], [NAN, 1.0, -2.0], [INF, 1.0, 0.0]], np.float32), 2, [1]),
                 note="nan/inf")
    yield Sample((np.array([[3.0, -4.0, 0.0], [NAN, 1.0, -2.0]], np.float32), -INF, [1]), note="nan in min norm")
    yield Sample((rand(rng, 3, 1), 3, [1]), note="size-1 dim: |x|")
    yield Sample((rand(rng), 2), note="0-d")
    yield Sample((rand(rng, 0, 3), 2), note="empty")
    yield Sample((rand(rng, 0, 3), INF, [1]), note="empty non-reduced dim, inf norm")
    yield Sample((positive(rng, 3, 4), -2, [1]), note="negative ord")
