"""Samples for kiln/ir/ops/shape.py."""

from __future__ import annotations

import numpy as np

from tests.ir.samples import Sample, positive, rand, samples  # noqa: F401

DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64", "int8", "uint8", "bool")


def _arange(*shape, dtype="float32"):
    """Distinct values, so that a wrong element order is visible."""
    return np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape).astype(dtype)


@samples("aten.view.default", "aten.reshape.default", "aten._unsafe_view.default")
def _view(rng):
    yield Sample((rand(rng, 3, 4), [12]))
    yield Sample((rand(rng, 3, 4), [-1, 2]), note="inferred leading dim")
    yield Sample((rand(rng, 2, 3, 4, dtype="int32"), [4, -1]))
    yield Sample((rand(rng, 2, 3, dtype="bfloat16"), [3, 1, 2]))
    yield Sample((rand(rng, 6, dtype="bool"), [2, 1, 3, 1]), note="bool, unit dims")
    yield Sample((rand(rng), [1, 1]), note="0-d to [1, 1]")
    yield Sample((rand(rng, 1, 1), []), note="[1, 1] to 0-d")
    yield Sample((rand(rng), [-1]), note="0-d to [-1]")
    yield Sample((rand(rng, 0, 4), [-1, 2]), note="empty, inferred 0")
    yield Sample((rand(rng, 0, 4), [2, 0, 2]), note="empty to other empty shape")


@samples("aten.view_as.default")
def _view_as(rng):
    yield Sample((rand(rng, 3, 4), rand(rng, 2, 6, dtype="int64")), note="other's dtype is irrelevant")
    yield Sample((rand(rng, 1, dtype="float16"), rand(rng)), note="to 0-d")
    yield Sample((rand(rng, 0, 3), rand(rng, 3, 0, 5)), note="empty")


@samples("aten.reshape_as.default")
def _reshape_as(rng):
    yield Sample((rand(rng, 3, 4), rand(rng, 2, 6, dtype="int64")), note="other's dtype is irrelevant")
    yield Sample((rand(rng, 2, 3, 4), rand(rng, 4, 6)), note="fewer dims")
    yield Sample((rand(rng, 1, dtype="float16"), rand(rng)), note="to 0-d")


@samples("aten.flatten.using_ints")
def _flatten(rng):
    yield Sample((rand(rng, 2, 3, 4),))
    yield Sample((rand(rng, 2, 3, 4, 5, dtype="int64"), 1, 2))
    yield Sample((rand(rng, 2, 3, 4, 5, dtype="float16"), -3, -2), note="negative dims")
    yield Sample((rand(rng, 2, 3, 4), 1, 1), note="start == end is the input itself")
    yield Sample((rand(rng, 2, 3, 4, dtype="bool"), 1), note="to the end")
    yield Sample((rand(rng),), note="0-d becomes [1]")
    yield Sample((rand(rng, 2, 0, 3), 0, 1), note="empty")


@samples("aten.unflatten.int")
def _unflatten(rng):
    yield Sample((rand(rng, 3, 12), 1, [3, 4]))
    yield Sample((rand(rng, 3, 12, dtype="int32"), -1, [2, -1, 3]), note="inferred, negative dim")
    yield Sample((rand(rng, 6, 2, dtype="bfloat16"), 0, [6]), note="one size")
    yield Sample((rand(rng, 2, 0), 1, [5, 0]), note="empty")
    yield Sample((rand(rng, 4), 0, [1, 4, 1]), note="unit dims")


@samples("aten.as_strided.default")
def _as_strided(rng):
    x = _arange(3, 4)
    yield Sample((x, [2, 2], [4, 1]), note="top-left block")
    yield Sample((x, [2, 2], [4, 1], 5), note="storage offset")
    yield Sample((x, [3, 3], [1, 1], 2), note="overlapping windows")
    yield Sample((x, [4, 3], [1, 4]), note="transposed")
    yield Sample((x, [2, 3, 2], [0, 2, 1]), note="zero stride broadcasts")
    yield Sample((x, [], [], 11), note="0-d at the last element")
    yield Sample((x, [0, 5], [100, 100], 100), note="empty result ignores bounds")
    yield Sample((_arange(2, 5, dtype="int64").T, [5], [2]), note="non-contiguous input uses its contiguous storage")
    yield Sample((rand(rng, 4, 4, dtype="bfloat16"), [4], [5]), note="diagonal of bfloat16")
    yield Sample((rand(rng, 6, dtype="bool"), [2, 2], [2, 1], 1), note="bool")


@samples("aten.permute.default")
def _permute(rng):
    yield Sample((rand(rng, 2, 3, 4), [2, 0, 1]))
    yield Sample((rand(rng, 2, 3, 4, dtype="int64"), [-1, -3, 1]), note="negative dims")
    yield Sample((rand(rng, 2, 3, dtype="float16"), [0, 1]), note="identity")
    yield Sample((rand(rng), []), note="0-d")
    yield Sample((rand(rng, 0, 3, dtype="bool"), [1, 0]), note="empty")
    yield Sample((rand(rng, 2, 3, 4), [-1, 0, -2]), note="negative dims, float")


@samples("aten.transpose.int", "aten.swapaxes.default")
def _transpose(rng):
    yield Sample((rand(rng, 2, 3), 0, 1))
    yield Sample((rand(rng, 2, 3, 4, dtype="int32"), -1, 0), note="negative dim")
    yield Sample((rand(rng, 2, 3, 4, dtype="bfloat16"), 1, 1), note="same dim")
    yield Sample((rand(rng), 0, -1), note="0-d")
    yield Sample((rand(rng, 0, 3), 0, 1), note="empty")


@samples("aten.t.default")
def _t(rng):
    yield Sample((rand(rng, 2, 3),))
    yield Sample((rand(rng, 3, dtype="int64"),), note="1-d is unchanged")
    yield Sample((rand(rng, dtype="float16"),), note="0-d")
    yield Sample((rand(rng, 0, 4, dtype="bool"),), note="empty")


@samples("aten.numpy_T.default")
def _numpy_t(rng):
    yield Sample((rand(rng, 2, 3),))
    yield Sample((rand(rng, 2, 3, 4, dtype="int64"),), note="3-d: every dim reversed")
    yield Sample((rand(rng, 3),), note="1-d is unchanged")
    yield Sample((rand(rng, dtype="float16"),), note="0-d")


@samples("aten.movedim.int")
def _movedim(rng):
    yield Sample((rand(rng, 2, 3, 4), 0, -1))
    yield Sample((rand(rng, 2, 3, 4, 5, dtype="int32"), -1, 1), note="last to second")
    yield Sample((rand(rng, 2, 3), 1, 1), note="no move")
    yield Sample((rand(rng), 0, 0), note="0-d")


@samples("aten.expand.default")
def _expand(rng):
    yield Sample((rand(rng, 3, 1), [3, 4]))
    yield Sample((rand(rng, 3, 1, dtype="int64"), [2, -1, 5]), note="new leading dim, -1 keeps size")
    yield Sample((rand(rng, dtype="bfloat16"), [2, 3]), note="0-d")
    yield Sample((rand(rng, 1, 4, dtype="bool"), [0, 4]), note="expand 1 to 0")
    yield Sample((rand(rng, 2, 3), [2, 3]), note="same size")
    yield Sample((rand(rng, 0, 1), [4, 0, 3]), note="empty")
    yield Sample((rand(rng, 1, dtype="float16"), [3, 1]), {"implicit": True}, note="implicit flag")
    yield Sample((rand(rng, 1, 3, 1), [2, 4, -1, 5]), note="new leading dim and two stretched dims, float")


@samples("aten.broadcast_to.default")
def _broadcast_to(rng):
    yield Sample((rand(rng, 3, 1), [3, 4]))
    yield Sample((rand(rng, 3, 1, dtype="int64"), [2, -1, 5]), note="new leading dim, -1 keeps size")
    yield Sample((rand(rng, dtype="bfloat16"), [2, 3]), note="0-d")
    yield Sample((rand(rng, 0, 1), [4, 0, 3]), note="empty")


@samples("aten.expand_as.default")
def _expand_as(rng):
    yield Sample((rand(rng, 3, 1), rand(rng, 2, 3, 4, dtype="int64")))
    yield Sample((rand(rng, dtype="float16"), rand(rng, 2)), note="0-d")


@samples("aten.tile.default")
def _tile(rng):
    yield Sample((rand(rng, 2, 3), [2, 2]))
    yield Sample((rand(rng, 2, 3, dtype="int32"), [3]), note="fewer dims repeat the trailing ones")
    yield Sample((rand(rng, 2, 3), [2, 1, 3]), note="extra leading dim")
    yield Sample((rand(rng, dtype="bfloat16"), [4]), note="0-d")
    yield Sample((rand(rng, 3, dtype="bool"), [0]), note="zero repeat")
    yield Sample((rand(rng, 2, 3), []), note="no dims")


@samples("aten.unfold.default")
def _unfold(rng):
    yield Sample((rand(rng, 10), 0, 3, 2), note="overlapping windows")
    yield Sample((rand(rng, 2, 7, 3, dtype="int64"), 1, 2, 3), note="middle dim, gaps between windows")
    yield Sample((rand(rng, 4, 5), -1, 5, 1), note="one whole window")
    yield Sample((rand(rng, 3, 8, dtype="float16"), 1, 0, 2), note="empty windows")
    yield Sample((rand(rng, 6, 2), 0, 2, 2), note="first dim")
    yield Sample((rand(rng), 0, 1, 1), note="0-d")


@samples("aten.repeat.default")
def _repeat(rng):
    yield Sample((rand(rng, 2, 3), [2, 2]))
    yield Sample((rand(rng, 2, 3, dtype="int32"), [3, 1, 2]), note="extra leading dim")
    yield Sample((rand(rng, dtype="bfloat16"), [4]), note="0-d")
    yield Sample((rand(rng, 3, dtype="bool"), [0, 2]), note="zero repeat")
    yield Sample((rand(rng, 0, 2), [2, 2]), note="empty")
    yield Sample((rand(rng, 2), [1]), note="identity")
    yield Sample((rand(rng, 2, 3), [2, 1, 3]), note="extra leading dim and a repeat of 1, float")


@samples("aten.repeat_interleave.self_int")
def _repeat_interleave(rng):
    yield Sample((rand(rng, 2, 3), 2), note="flattened")
    yield Sample((rand(rng, 2, 3, dtype="int64"), 3, 0))
    yield Sample((rand(rng, 2, 3, dtype="float16"), 2, -1), note="negative dim")
    yield Sample((rand(rng, 2, 3, dtype="bool"), 0, 1), note="zero repeats")
    yield Sample((rand(rng), 3), note="0-d flattened")
    yield Sample((rand(rng, 0, 3), 2, 1), note="empty")
    yield Sample((rand(rng, 4), 2, 0), {"output_size": 8}, note="output_size")


@samples("aten.squeeze.dim")
def _squeeze_dim(rng):
    yield Sample((rand(rng, 3, 1, 4), 1))
    yield Sample((rand(rng, 3, 1, 4, dtype="int64"), -2), note="negative dim")
    yield Sample((rand(rng, 3, 1, 4, dtype="bfloat16"), 0), note="not 1: unchanged")
    yield Sample((rand(rng), 0), note="0-d")
    yield Sample((rand(rng), -1), note="0-d, dim -1")
    yield Sample((rand(rng, 1, 0, dtype="bool"), 0), note="empty")
    yield Sample((rand(rng, 3, 1, 4), -2), note="negative dim, float")


@samples("aten.squeeze.dims")
def _squeeze_dims(rng):
    yield Sample((rand(rng, 1, 3, 1, 4, 1), [0, 2]))
    yield Sample((rand(rng, 1, 3, 1, dtype="int32"), [-1, 1]), note="negative dims, one not 1")
    yield Sample((rand(rng, 1, 3, 1), []), note="no dims: unchanged")
    yield Sample((rand(rng, dtype="float16"), [0]), note="0-d")
    yield Sample((rand(rng, 1, 0, 1), [0, 1, 2]), note="empty")
    yield Sample((rand(rng, 1, 3, 1), [-1, 1]), note="negative dims, one not 1, float")


@samples("aten.squeeze.default")
def _squeeze(rng):
    yield Sample((rand(rng, 1, 3, 1, 4, 1),))
    yield Sample((rand(rng, 2, 3, dtype="int64"),), note="no unit dims")
    yield Sample((rand(rng, 1, 1, dtype="bool"),), note="to 0-d")
    yield Sample((rand(rng),), note="0-d")
    yield Sample((rand(rng, 1, 0),), note="empty")


@samples("aten.unsqueeze.default")
def _unsqueeze(rng):
    yield Sample((rand(rng, 3, 4), 0))
    yield Sample((rand(rng, 3, 4, dtype="int64"), 2), note="at the end")
    yield Sample((rand(rng, 3, 4, dtype="float16"), -1), note="-1 appends")
    yield Sample((rand(rng, 3, 4), -3), note="-rank-1 prepends")
    yield Sample((np.array(True), 0), note="0-d")
    yield Sample((rand(rng, 0), 1), note="empty")


@samples("aten.contiguous.default")
def _contiguous(rng):
    yield Sample((rand(rng, 3, 4),))
    yield Sample((_arange(3, 4, dtype="int64").T,), note="non-contiguous numpy input")
    yield Sample((rand(rng, dtype="bfloat16"),), note="0-d")
    yield Sample((rand(rng, 0, 2, dtype="bool"),), note="empty")


@samples("aten.select.int")
def _select(rng):
    yield Sample((rand(rng, 3, 4), 0, 1))
    yield Sample((rand(rng, 3, 4, dtype="int64"), 1, -1), note="negative index")
    yield Sample((rand(rng, 3, 4, dtype="float16"), -1, -4), note="negative dim, index -size")
    yield Sample((rand(rng, 5, dtype="bool"), 0, 4), note="1-d to 0-d")
    yield Sample((rand(rng, 2, 0), 0, 1), note="empty")
    yield Sample((rand(rng, 3, 4), 1, -1), note="negative index, float")


@samples("aten.select_scatter.default")
def _select_scatter(rng):
    yield Sample((rand(rng, 3, 4), rand(rng, 4), 0, 1))
    yield Sample((rand(rng, 3, 4, dtype="int64"), rand(rng, 3, dtype="int64"), -1, -1), note="negative dim/index")
    yield Sample((rand(rng, 5, dtype="bfloat16"), rand(rng, dtype="bfloat16"), 0, 2), note="0-d src")
    yield Sample((rand(rng, 3, 4), rand(rng, 4, dtype="int32"), 0, 2), note="src of another dtype is cast")
    yield Sample((rand(rng, 2, 0, dtype="bool"), rand(rng, 0, dtype="bool"), 0, 1), note="empty")
    yield Sample((rand(rng, 3, 4), rand(rng, 3), -1, -1), note="negative dim/index, float")


@samples("aten.slice.Tensor")
def _slice(rng):
    x = _arange(7, 3)
    yield Sample((x, 0, 1, 5), note="plain")
    yield Sample((x,), note="all defaults")
    yield Sample((x, 0, None, None, 2), note="step 2")
    yield Sample((x, 0, 1, None, 3), note="step 3, to the end")
    yield Sample((x, 0, -5, -1), note="negative start/end")
    yield Sample((x, 0, -100, 100), note="start before 0, end beyond size")
    yield Sample((x, 0, 5, 2), note="end < start: empty")
    yield Sample((x, 0, 9, 12), note="start beyond size: empty")
    yield Sample((x, 0, 2, 9223372036854775807, 4), note="INT64_MAX end with step")
    yield Sample((x, -1, 1, 2), note="negative dim")
    yield Sample((rand(rng, 6, dtype="bfloat16"), 0, -4, None, 3), note="bfloat16, negative start, step")
    yield Sample((rand(rng, 4, 5, dtype="bool"), 1, 0, 5, 2), note="bool")
    yield Sample((rand(rng, 0, 3, dtype="int64"), 0, 1, 3), note="empty")


@samples("aten.slice_scatter.default")
def _slice_scatter(rng):
    yield Sample((rand(rng, 7, 3), rand(rng, 2, 3), 0, 1, 5, 2), note="step 2")
    yield Sample((rand(rng, 7, 3, dtype="int64"), rand(rng, 7, 1, dtype="int64"), -1, -1), note="negative dim/start")
    yield Sample((rand(rng, 5, dtype="float16"), rand(rng, 5, dtype="float16")), note="whole tensor")
    yield Sample((rand(rng, 5), rand(rng, 0), 0, 4, 2), note="empty slice")
    yield Sample((rand(rng, 6, 2), rand(rng, 2, 2, dtype="int32"), 0, -100, 100, 3), note="clamped, cast src")
    yield Sample((rand(rng, 7, 3), rand(rng, 7, 1), -1, -1), note="negative dim/start, float")
    yield Sample((rand(rng, 6, 2), rand(rng, 2, 2), 0, -100, 100, 3), note="clamped, float")


@samples("aten.diff.default")
def _diff(rng):
    yield Sample((rand(rng, 3, 5),), note="last dim")
    yield Sample((rand(rng, 4, 3), 2, 0), note="second order over dim 0")
    yield Sample((rand(rng, 3, 4, dtype="int64", low=-50, high=50), 1, -1, rand(rng, 3, 2, dtype="int64"),
                  rand(rng, 3, 1, dtype="int64")), note="prepend and append")
    yield Sample((rand(rng, 2, 4, dtype="int32", low=0, high=9), 1, 1, rand(rng, 2, 1)), note="int prepended by float")
    yield Sample((rand(rng, 6, dtype="bool"),), note="bool: xor")
    yield Sample((rand(rng, 6, dtype="uint8", low=0, high=200),), note="uint8 wraps")
    yield Sample((rand(rng, 3, dtype="float16"), 5), note="order beyond the length: empty")
    yield Sample((rand(rng, 4, dtype="bfloat16"), 0), note="order 0: a copy")
    yield Sample((rand(rng, 2, 0),), note="empty")


@samples("aten.narrow.default")
def _narrow(rng):
    yield Sample((rand(rng, 3, 4), 1, 1, 2))
    yield Sample((rand(rng, 3, 4, dtype="int32"), -1, -2, 2), note="negative dim and start")
    yield Sample((rand(rng, 5, dtype="bool"), 0, 5, 0), note="empty at the end")
    yield Sample((rand(rng, 5, dtype="float16"), 0, 0, 5), note="whole")


@samples("aten.diagonal.default")
def _diagonal(rng):
    yield Sample((rand(rng, 3, 4),))
    yield Sample((rand(rng, 3, 4, dtype="int64"), 1), note="above")
    yield Sample((rand(rng, 3, 4, dtype="float16"), -2), note="below")
    yield Sample((rand(rng, 2, 3, 4), 0, -1, 0), note="dims reversed, batch first")
    yield Sample((rand(rng, 2, 3, 4, dtype="bool"), 1, 2, 0), note="offset across dims")
    yield Sample((rand(rng, 2, 3), 5), note="offset past the end: empty")
    yield Sample((rand(rng, 2, 3), -5), note="negative offset past the end: empty")
    yield Sample((rand(rng, 0, 3), 1), note="empty")
    yield Sample((rand(rng, 3, 4), 1), note="above, float")
    yield Sample((rand(rng, 2, 3, 4), 1, 2, 0), note="offset across dims, float")
    yield Sample((rand(rng, 3, 4, 2), -1, 1, 0), note="below, dims reversed, float")


@samples("aten.flip.default")
def _flip(rng):
    yield Sample((rand(rng, 3, 4), [0]))
    yield Sample((rand(rng, 2, 3, 4, dtype="int64"), [-1, 0]), note="several, negative")
    yield Sample((rand(rng, 3, dtype="bfloat16"), []), note="no dims")
    yield Sample((rand(rng), [0]), note="0-d")
    yield Sample((rand(rng, 0, 2, dtype="bool"), [0, 1]), note="empty")
    yield Sample((rand(rng, 2, 3, 4), [-1, 0]), note="several, negative, float")


@samples("aten.cat.default")
def _cat(rng):
    yield Sample(([rand(rng, 2, 3), rand(rng, 4, 3)],))
    yield Sample(([rand(rng, 2, 3), rand(rng, 2, 1), rand(rng, 2, 2)], -1), note="negative dim, three")
    yield Sample(([rand(rng, 2, dtype="int32"), rand(rng, 3, dtype="float16")],), note="promotes to float16")
    yield Sample(([rand(rng, 2, dtype="bool"), rand(rng, 2, dtype="uint8"), rand(rng, 1, dtype="int8")],),
                 note="bool/uint8/int8 promote to int16")
    yield Sample(([rand(rng, 0, dtype="float64"), rand(rng, 2, 3, dtype="int32")], 1),
                 note="legacy: [0]-shaped input skipped but promotes")
    yield Sample(([rand(rng, 0, dtype="int32"), rand(rng, 0, dtype="int64")], 3),
                 note="all skipped: [0] of the promoted dtype, dim unchecked")
    yield Sample(([rand(rng, 0, 3), rand(rng, 2, 3)],), note="empty with a real shape")
    yield Sample(([rand(rng, 2, 3, dtype="bfloat16")], 1), note="single input")


@samples("aten.stack.default")
def _stack(rng):
    yield Sample(([rand(rng, 2, 3), rand(rng, 2, 3)],))
    yield Sample(([rand(rng, 2, 3), rand(rng, 2, 3), rand(rng, 2, 3)], -1), note="at the end")
    yield Sample(([rand(rng, 2, dtype="int32"), rand(rng, 2, dtype="float16")], 1), note="promotes")
    yield Sample(([rand(rng), rand(rng)],), note="0-d")
    yield Sample(([rand(rng, 0, dtype="bool"), rand(rng, 0, dtype="bool")], 1), note="empty")


@samples("aten.split_with_sizes.default")
def _split_with_sizes(rng):
    yield Sample((rand(rng, 6, 3), [1, 2, 3]))
    yield Sample((rand(rng, 2, 5, dtype="int64"), [2, 0, 3], -1), note="a 0-size piece")
    yield Sample((rand(rng, 4, dtype="bfloat16"), [4]), note="one piece")
    yield Sample((rand(rng, 0, 2, dtype="bool"), [0, 0]), note="empty")
    yield Sample((rand(rng, 2, 5), [2, 0, 3], -1), note="a 0-size piece, float")
    yield Sample((rand(rng, 5), [0, 2, 3]), note="1-d with a 0-size piece, float")


@samples("aten.split.Tensor")
def _split_tensor(rng):
    yield Sample((rand(rng, 7, 3), 3), note="shorter last piece")
    yield Sample((rand(rng, 2, 6, dtype="int32"), 2, -1), note="even")
    yield Sample((rand(rng, 3, dtype="float16"), 5), note="larger than the dim: one piece")
    yield Sample((rand(rng, 0, 2), 2), note="empty dim: one empty piece")
    yield Sample((rand(rng, 0, 2, dtype="bool"), 0), note="split_size 0 on an empty dim")


@samples("aten.chunk.default")
def _chunk(rng):
    yield Sample((rand(rng, 5, 2), 3), note="5 rows in 3 chunks: 2, 2, 1")
    yield Sample((rand(rng, 6, 2, dtype="int64"), 4), note="6 rows in 4 chunks: only 3 pieces")
    yield Sample((rand(rng, 2, 6, dtype="bfloat16"), 2, -1), note="negative dim")
    yield Sample((rand(rng, 2, 3), 5), note="more chunks than rows")
    yield Sample((rand(rng, 0, 2, dtype="bool"), 3), note="empty dim: chunks empty pieces")


@samples("aten.meshgrid.indexing")
def _meshgrid_indexing(rng):
    yield Sample(([rand(rng, 3), rand(rng, 4)],), {"indexing": "ij"})
    yield Sample(([rand(rng, 3), rand(rng, 4)],), {"indexing": "xy"}, note="xy swaps the first two axes")
    yield Sample(([rand(rng, 2, dtype="int64"), rand(rng, 3, dtype="int64"), rand(rng, dtype="int64")],),
                 {"indexing": "xy"}, note="three, one 0-d")
    yield Sample(([rand(rng, 5)],), {"indexing": "xy"}, note="one tensor")
    yield Sample(([rand(rng, 0), rand(rng, 2)],), {"indexing": "ij"}, note="empty")


@samples("aten.meshgrid.default")
def _meshgrid(rng):
    yield Sample(([rand(rng, 3), rand(rng, 4)],))
    yield Sample(([rand(rng, 2, dtype="int32"), rand(rng, 3, dtype="int32"), rand(rng, 4, dtype="int32")],))


@samples("aten.unbind.int")
def _unbind(rng):
    yield Sample((rand(rng, 3, 4),))
    yield Sample((rand(rng, 3, 4, dtype="int64"), -1), note="negative dim")
    yield Sample((rand(rng, 2, dtype="bool"),), note="to 0-d")
    yield Sample((rand(rng, 0, 3),), note="no pieces")
    yield Sample((rand(rng, 2, 0, dtype="float16"), 0), note="empty pieces")


@samples("aten.tensor_split.indices")
def _tensor_split_indices(rng):
    yield Sample((rand(rng, 7, 3), [2, 5]))
    yield Sample((rand(rng, 3, 8, dtype="int32"), [3], 1), note="along dim 1")
    yield Sample((rand(rng, 6), [4, 2, 9]), note="decreasing and past the end: empty pieces")
    yield Sample((rand(rng, 6, dtype="bool"), [-2]), note="negative index")
    yield Sample((rand(rng, 5, 2), []), note="no indices: the whole tensor")


@samples("aten.tensor_split.sections")
def _tensor_split_sections(rng):
    yield Sample((rand(rng, 7, 3), 3), note="7 in 3: 3, 2, 2")
    yield Sample((rand(rng, 3, 8, dtype="int64"), 4, -1), note="even")
    yield Sample((rand(rng, 2, dtype="float16"), 5), note="more sections than elements")
    yield Sample((rand(rng, 0, 2), 2), note="empty")


@samples("aten.tril.default", "aten.triu.default")
def _triangle(rng):
    yield Sample((rand(rng, 4, 5),))
    yield Sample((rand(rng, 2, 3, 3, dtype="int32"), 1), note="batched, above the diagonal")
    yield Sample((rand(rng, 5, 3, dtype="bool"), -2), note="below the diagonal")
    yield Sample((np.array([[np.nan, 1.0], [2.0, np.inf]], np.float32),), note="NaN and inf")
    yield Sample((rand(rng, 0, 3),), note="empty")


@samples("aten.constant_pad_nd.default")
def _constant_pad_nd(rng):
    yield Sample((rand(rng, 2, 3), [1, 2]))
    yield Sample((rand(rng, 2, 3, 4), [1, 0, 2, 1], 1.5), note="two dims, value")
    yield Sample((rand(rng, 3, 5, dtype="int64"), [-1, 2, 1, -2], -7), note="negative pads crop")
    yield Sample((rand(rng, 2, 3, dtype="int32"), [1, 1], 2.7), note="float value truncated into int")
    yield Sample((rand(rng, 2, 3, dtype="uint8"), [1, 1], -1), note="uint8 wraps -1 like torch")
    yield Sample((rand(rng, 2, 2, dtype="bool"), [1, 0, 0, 1], 1), note="bool")
    yield Sample((rand(rng, 2, 2, dtype="bfloat16"), [0, 0, 1, 1], float("-inf")), note="-inf")
    yield Sample((rand(rng, 3, dtype="float16"), [-3, 0]), note="crop to empty")
    yield Sample((rand(rng), []), note="0-d, no padding")
    yield Sample((rand(rng, 0, 2), [1, 1, 1, 1]), note="empty input")
    yield Sample((rand(rng, 3, 5), [-1, 2, 1, -2]), note="negative pads crop, float")


@samples("aten.pad.default")
def _pad(rng):
    yield Sample((rand(rng, 2, 3), [1, 2]), note="constant default")
    yield Sample((rand(rng, 2, 3, dtype="int64"), [1, -1, 2, 0], "constant", 3.0), note="constant value")
    yield Sample((rand(rng, 1, 2, 5), [2, 3], "reflect"), note="reflect 1d")
    yield Sample((rand(rng, 2, 4, 5), [1, 2, 3, 0], "reflect"), note="reflect 2d, unbatched")
    yield Sample((rand(rng, 1, 1, 3, 4, 5, dtype="float64"), [1, 1, 2, 0, 0, 2], "reflect"), note="reflect 3d")
    yield Sample((rand(rng, 1, 6), [-1, 2], "reflect"), note="reflect with a negative pad")
    yield Sample((rand(rng, 2, 3, 4), [2, 1], "replicate", 0.0), note="replicate 1d, value 0 allowed")
    yield Sample((rand(rng, 1, 2, 3, 4, dtype="int32"), [3, 0, 1, 2], "replicate"), note="replicate 2d, int")
    yield Sample((rand(rng, 2, 3, 3, 3), [1, 0, 0, 1, 2, 2], "replicate"), note="replicate 3d, unbatched")
    yield Sample((rand(rng, 1, 6), [-2, 3], "replicate"), note="replicate with a negative pad")
    yield Sample((rand(rng, 1, 2, 6), [2, 3], "circular"), note="circular 1d")
    yield Sample((rand(rng, 1, 3, 4), [1, 2, 2, 1], "circular"), note="circular 2d, corners")
    yield Sample((rand(rng, 1, 6), [-1, 2], "circular"), note="circular wraps the cropped input")
    yield Sample((rand(rng, 1, 1, 2, 3, 4), [1, 0, 2, 1, 0, 2], "circular"), note="circular 3d")


def _sizes(rng):
    yield Sample((rand(rng, 2, 3, 4), 1))
    yield Sample((rand(rng, 2, 3, 4, dtype="int64"), -1), note="negative dim")
    yield Sample((rand(rng, 2, 1, 3, 5, dtype="bool"), 0))


@samples("aten.sym_size.int")
def _sym_size(rng):
    yield from _sizes(rng)
    yield Sample((rand(rng, 2, 0, 3), 1), note="empty")


@samples("aten.sym_stride.int")
def _sym_stride(rng):
    # No empty inputs here: the oracle's torch.from_numpy keeps numpy's strides, which are 0 around a
    # 0-size dim, while a tensor torch allocates (and kiln) counts a 0 size as 1 (stride 6 for dim 1
    # of [2, 1, 3, 0, 2]).
    yield from _sizes(rng)


@samples("aten.sym_numel.default", "aten.sym_storage_offset.default")
def _sym_numel(rng):
    yield Sample((rand(rng, 2, 3, 4),))
    yield Sample((np.array(7, np.int64),), note="0-d")
    yield Sample((rand(rng, 2, 0, 3),), note="empty")
