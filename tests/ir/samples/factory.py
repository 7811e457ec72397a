"""Samples for kiln/ir/ops/factory.py."""

from __future__ import annotations

import numpy as np  # noqa: F401

from kiln.ir import dtypes
from tests.ir.samples import Sample, positive, rand, samples  # noqa: F401

F16, BF16, F32, F64 = dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64
I8, I32, I64, U8, BOOL = dtypes.int8, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.bool_


@samples("aten.full.default")
def _full(rng):
    yield Sample(([2, 3], 1.5), note="float fill → float32")
    yield Sample(([2, 3], 7), note="int fill → int64")
    yield Sample(([4], True), note="bool fill → bool")
    yield Sample(([2, 2], -3.7), {"dtype": I32}, note="float into int truncates toward zero")
    yield Sample(([3], -1), {"dtype": U8}, note="negative int wraps into uint8")
    yield Sample(([3], 2.5), {"dtype": BOOL}, note="nonzero → True")
    yield Sample(([2], float("inf")), {"dtype": F16}, note="inf is not an overflow")
    yield Sample(([2], 65504.0), {"dtype": F16}, note="largest float16")
    yield Sample(([2, 1], 0.1), {"dtype": BF16})
    yield Sample(([3], float("nan")), note="nan")
    yield Sample(([2], 2 ** 40), {"dtype": F64})
    yield Sample(([], 4.0), note="0-d")
    yield Sample(([0, 3], 1), note="empty")


@samples("aten.full_like.default")
def _full_like(rng):
    yield Sample((rand(rng, 2, 3), 4.5))
    yield Sample((rand(rng, 2, 3, dtype="int32"), 2.7), note="int self keeps its dtype; fill truncates")
    yield Sample((rand(rng, 3, dtype="bool"), 5), note="bool self")
    yield Sample((rand(rng, 2, 2, dtype="float16"), -1), {"dtype": F64}, note="dtype override")
    yield Sample((rand(rng, 4, dtype="uint8"), -2), note="wraps into uint8")
    yield Sample((rand(rng), 3), note="0-d")
    yield Sample((rand(rng, 0, 2, dtype="bfloat16"), 1.25), note="empty")


@samples("aten.scalar_tensor.default")
def _scalar_tensor(rng):
    yield Sample((3,), note="int → the default float dtype")
    yield Sample((True,), note="bool → the default float dtype")
    yield Sample((2.5,), {"dtype": I32}, note="truncates")
    yield Sample((-1,), {"dtype": U8}, note="wraps")
    yield Sample((70000,), {"dtype": F16}, note="float16 overflow rounds to inf (unchecked in ATen)")
    yield Sample((0.1,), {"dtype": F64})
    yield Sample((0,), {"dtype": BOOL})


@samples("aten.empty.memory_format")
def _empty(rng):
    yield Sample(([2, 3],), check_values=False)
    yield Sample(([4],), {"dtype": I64}, check_values=False)
    yield Sample(([],), {"dtype": BF16}, check_values=False, note="0-d")
    yield Sample(([0, 5],), {"dtype": BOOL}, check_values=False, note="empty")


@samples("aten.empty_strided.default")
def _empty_strided(rng):
    yield Sample(([2, 3], [3, 1]), check_values=False)
    yield Sample(([2, 3], [1, 2]), {"dtype": F16}, check_values=False, note="column-major strides")
    yield Sample(([], []), {"dtype": I32}, check_values=False, note="0-d")
    yield Sample(([0, 4], [4, 1]), check_values=False, note="empty")


@samples("aten.arange.start_step")
def _arange(rng):
    yield Sample((0, 10, 3), note="ints → int64, last step partial")
    yield Sample((10, 0, -3), note="negative step")
    yield Sample((0, 1, 0.1), note="float step → float32")
    yield Sample((-7, 200.5, 1.3), note="float end")
    yield Sample((0.5, 3.0, 1), {"dtype": I64}, note="int64: bounds truncate before the length")
    yield Sample((-2.5, 3.0, 0.7), {"dtype": I32}, note="int32: length from doubles, values from the "
                                                        "truncated start and step (all -2)")
    yield Sample((0, 300, 1), {"dtype": I8}, note="int8 wraps past 127")
    yield Sample((-2.5, 3.0, 0.7), {"dtype": U8}, note="uint8 wraps negatives")
    yield Sample((0, 100, 0.37), {"dtype": F64})
    yield Sample((0, 20, 0.5), {"dtype": F16})
    yield Sample((-3, 3, 0.25), {"dtype": BF16})
    yield Sample((True, 3, 1), note="bool start counts as an int")
    yield Sample((0, 0, 1), note="empty")
    yield Sample((3, -5, -0.25), note="negative float step")


@samples("aten.rand.default", "aten.randn.default")
def _rand(rng):
    yield Sample(([2, 3],), check_values=False)
    yield Sample(([4],), {"dtype": F64}, check_values=False)
    yield Sample(([3, 2],), {"dtype": F16}, check_values=False)
    yield Sample(([5],), {"dtype": BF16}, check_values=False)
    yield Sample(([],), check_values=False, note="0-d")
    yield Sample(([0, 3],), check_values=False, note="empty")


@samples("aten.randperm.default")
def _randperm(rng):
    yield Sample((10,), check_values=False)
    yield Sample((0,), check_values=False, note="empty")
    yield Sample((1,), check_values=False)
    yield Sample((6,), {"dtype": I32}, check_values=False)
    yield Sample((256,), {"dtype": U8}, check_values=False, note="largest n for uint8")
    yield Sample((7,), {"dtype": F32}, check_values=False)
    yield Sample((2049,), {"dtype": F16}, check_values=False, note="largest n for float16")


@samples("aten.zeros.default", "aten.ones.default")
def _zeros(rng):
    yield Sample(([2, 3],), note="default float32")
    yield Sample(([4],), {"dtype": I32})
    yield Sample(([2, 2],), {"dtype": BOOL})
    yield Sample(([3],), {"dtype": BF16})
    yield Sample(([],), note="0-d")
    yield Sample(([0, 2],), {"dtype": I64}, note="empty")


@samples("aten.zeros_like.default", "aten.ones_like.default")
def _zeros_like(rng):
    yield Sample((rand(rng, 2, 3),))
    yield Sample((rand(rng, 4, dtype="int32"),), note="keeps int32")
    yield Sample((rand(rng, 2, 2, dtype="bool"),), note="keeps bool")
    yield Sample((rand(rng, 3, dtype="float16"),), {"dtype": I64}, note="dtype override")
    yield Sample((rand(rng),), note="0-d")
    yield Sample((rand(rng, 0, 3, dtype="bfloat16"),), note="empty")


@samples("aten.empty_like.default")
def _empty_like(rng):
    yield Sample((rand(rng, 2, 3),), check_values=False)
    yield Sample((rand(rng, 4, dtype="int8"),), check_values=False)
    yield Sample((rand(rng, 2, dtype="float16"),), {"dtype": F64}, check_values=False, note="dtype override")
    yield Sample((rand(rng, 0, 2),), check_values=False, note="empty")


@samples("aten.new_zeros.default", "aten.new_ones.default")
def _new_constant(rng):
    yield Sample((rand(rng, 2, 3), [4, 5]), note="self's dtype")
    yield Sample((rand(rng, 3, dtype="int32"), [2]), note="int32 self")
    yield Sample((rand(rng, 3, dtype="bool"), [2, 2]), note="bool self")
    yield Sample((rand(rng, 2, dtype="float16"), [3]), {"dtype": BF16}, note="dtype override")
    yield Sample((rand(rng, 2), []), note="0-d result")
    yield Sample((rand(rng, 2), [0, 3]), note="empty result")


@samples("aten.new_full.default")
def _new_full(rng):
    yield Sample((rand(rng, 2, 3), [4, 5], 2.5), note="self's dtype")
    yield Sample((rand(rng, 3, dtype="int32"), [2], 7.9), note="self's dtype even for a float fill")
    yield Sample((rand(rng, 3, dtype="float64"), [2, 2], True), note="bool fill into float64")
    yield Sample((rand(rng, 2, dtype="float16"), [3], -1), {"dtype": U8}, note="dtype override, wraps")
    yield Sample((rand(rng, 2), [], 3), note="0-d result")
    yield Sample((rand(rng, 2), [0, 3], 1.0), note="empty result")


@samples("aten.new_empty.default")
def _new_empty(rng):
    yield Sample((rand(rng, 2, 3), [4, 5]), check_values=False)
    yield Sample((rand(rng, 3, dtype="int32"), [2]), check_values=False)
    yield Sample((rand(rng, 2, dtype="float16"), [3]), {"dtype": F64}, check_values=False)
    yield Sample((rand(rng, 2), [0]), check_values=False, note="empty")


@samples("aten.arange.default")
def _arange_end(rng):
    yield Sample((5,), note="int → int64")
    yield Sample((5.5,), note="float → float32")
    yield Sample((4,), {"dtype": F64})
    yield Sample((6,), {"dtype": BF16})
    yield Sample((0,), note="empty")


@samples("aten.arange.start")
def _arange_start(rng):
    yield Sample((2, 7), note="ints → int64")
    yield Sample((-1.5, 3), note="float start → float32")
    yield Sample((0.5, 4.0), {"dtype": I32}, note="int32 truncates the start")
    yield Sample((3, 3), note="empty")


@samples("aten.linspace.default")
def _linspace(rng):
    yield Sample((0, 1, 5))
    yield Sample((-3.3, 7.7, 100), note="long: both halves")
    yield Sample((10, 0, 7), note="decreasing")
    yield Sample((0, 10, 4), {"dtype": I64}, note="int64 truncates start + step*i")
    yield Sample((-5, 300, 77), {"dtype": I32})
    yield Sample((0.1, 0.2, 33), {"dtype": F64})
    yield Sample((0, 1, 100), {"dtype": F16}, note="float16 step rounded like ATen")
    yield Sample((-1, 1, 65), {"dtype": BF16})
    yield Sample((1, 1, 3), note="start == end")
    yield Sample((2.5, 9, 1), note="one step gives start")
    yield Sample((0, 1, 0), note="empty")


@samples("aten.eye.default")
def _eye(rng):
    yield Sample((3,))
    yield Sample((4,), {"dtype": I32})
    yield Sample((3,), {"dtype": BOOL})
    yield Sample((2,), {"dtype": BF16})
    yield Sample((1,), {"dtype": F64})
    yield Sample((0,), note="empty")


@samples("aten.eye.m")
def _eye_m(rng):
    yield Sample((2, 3))
    yield Sample((4, 2), {"dtype": I32})
    yield Sample((3, 0), note="empty")


@samples("aten.rand_like.default", "aten.randn_like.default")
def _rand_like(rng):
    yield Sample((rand(rng, 2, 3),), check_values=False)
    yield Sample((rand(rng, 4, dtype="float64"),), check_values=False)
    yield Sample((rand(rng, 3, dtype="int32"),), {"dtype": F16}, check_values=False, note="dtype override")
    yield Sample((rand(rng, 0, 2, dtype="bfloat16"),), check_values=False, note="empty")


@samples("aten.lift_fresh_copy.default")
def _lift_fresh_copy(rng):
    yield Sample((rand(rng, 2, 3),))
    yield Sample((rand(rng, 4, dtype="int64"),))
    yield Sample((rand(rng, 3, dtype="bool"),))
    yield Sample((rand(rng, 2, dtype="bfloat16"),))
    yield Sample((rand(rng),), note="0-d")
    yield Sample((rand(rng, 0, 3),), note="empty")
