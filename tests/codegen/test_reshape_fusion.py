"""How the scheduler re-indexes pointwise expressions across a reshape (hand-computed expectations)."""

from __future__ import annotations

import sympy

from kiln.codegen.kernels import Buffer, Load
from kiln.codegen.schedule import _reshape_groups, _respace
from kiln.ir import dtypes

b, t = sympy.symbols("b t", integer=True, positive=True)


def test_reshape_groups_pair_runs_with_equal_products():
    assert _reshape_groups([b * t, 64], [b, t, 64]) == [([0], [0, 1]), ([1], [2])]
    assert _reshape_groups([b, 4, t, t], [4 * b, t, t]) == [([0, 1], [0]), ([2], [1]), ([3], [2])]
    assert _reshape_groups([t], [1, t, 1]) == [([0], [0, 1]), ([], [2])]
    assert _reshape_groups([6, 4], [4, 6]) is None  # 6 and 4 do not nest: not a run-for-run reshape


def test_respace_rewrites_strides_per_group():
    buffer = Buffer(0, "x", dtypes.float32, [b, t, 64])
    contiguous = Load(buffer, [64 * t, 64, 1], 0)
    assert _respace(contiguous, [b, t, 64], [b * t, 64]).strides == [64, 1]
    bias = Load(buffer, [0, 0, 1], 5)  # broadcast over the merged dims
    converted = _respace(bias, [b, t, 64], [b * t, 64])
    assert converted.strides == [0, 1] and converted.offset == 5
    per_head = Load(buffer, [0, 1, 0, 0], 0)  # varies inside the merged (b, 4) group: not expressible
    assert _respace(per_head, [b, 4, t, t], [4 * b, t, t]) is None
    split = Load(buffer, [t * t, t, 1], 0)  # [4b, t, t] -> [b, 4, t, t]: the merged dim splits
    assert _respace(split, [4 * b, t, t], [b, 4, t, t]).strides == [4 * t * t, t * t, t, 1]
