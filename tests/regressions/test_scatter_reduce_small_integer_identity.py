"""scatter_reduce amax/amin with include_self=False on int8: the C backend started excluded elements from
INT32_MIN / INT32_MAX cast to the output dtype, which is 0 or -1 in int8, so an int8 amax over negative values came
out 0. Each dtype now starts from its own limits (kiln/codegen/c/render.py _reduce_identity). Found while writing
the Triton scatter kernels, whose tests compare int8 against torch."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("reduce", ["amax", "amin"])
@pytest.mark.parametrize("dtype", [kiln.int8, kiln.uint8, kiln.int32, kiln.int64])
def test_excluded_self_starts_from_the_dtypes_limits(dtype, reduce):
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of([3], dtype))
    x1 = builder.add_input('x1', TensorType.of([4], kiln.int64))
    x2 = builder.add_input('x2', TensorType.of([4], dtype))
    with builder:
        v0 = aten.scatter_reduce.two(x0, 0, x1, x2, reduce, include_self=False)
    program = builder.build([v0])
    low, high = (0, 255) if dtype == kiln.uint8 else (-128, 127)
    values = np.array([low, low + 1, high, high - 1], dtype.numpy)  # each dtype's extremes, both signs
    check_program(program, [np.array([5, 7, 9], dtype.numpy), np.array([0, 0, 1, 1]), values])
