"""Circular padding whose pad on one side is longer than what the other side's negative pad left: ATen checks the
pads against the uncropped size and wraps around the cropped values again, (-1, 2) on [a, b] gives [b, b, b].
kiln's decomposition sliced at most the cropped size, so the result was too short and the next op failed
("input shape [5, 2] does not end with in_features=3"). Found by the differential fuzzer (seed 2000)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("shape, pad", [([5, 2], [-1, 2]), ([2, 6], [-2, 3]), ([2, 6], [3, -2]),
                                        ([1, 2, 4, 3], [-2, 3, 1, -3]), ([2, 6], [2, 3])])
def test_circular_pads_wrap_like_aten(shape, pad):
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of(shape, kiln.float32))
    with builder:
        v0 = aten.pad.default(x0, pad, "circular")
    program = builder.build([v0])
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    check_program(program, [x], backends=("onnx", "c[AVX2]", "pt2", "torch"))
