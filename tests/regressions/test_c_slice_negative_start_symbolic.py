"""slice with a negative start along a symbolic dim smaller than |start| at run time (x[-3::3] of 1 element): ATen
wraps the start and clamps it to 0; the C scheduler wrapped it (s0 - 3) without the clamp, so the view began
before its buffer and the compiled model read memory outside it (garbage values). The view's offset takes the
registry's slice arithmetic, Max/Min included (kiln/codegen/schedule.py)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("size", [1, 2, 3, 7])
@pytest.mark.parametrize("start,end,step", [(-3, 4, 3), (-4, None, 3), (-2, None, 1), (1, -1, 2)])
def test_slice_with_a_negative_start_over_a_symbolic_size(size, start, end, step):
    builder = GraphBuilder()
    s0 = builder.shape_env.create_symbol(3, name='s0', min=1, max=8)
    x = builder.add_input('x', TensorType.of([s0, 2], kiln.int64))
    with builder:
        y = aten.mul.Scalar(aten.slice.Tensor(x, 0, start, end, step), 2)
    program = builder.build([y])
    values = np.arange(10, 10 + 2 * size, dtype=np.int64).reshape(size, 2)
    np.testing.assert_array_equal(program(values), values[slice(start, end, step)] * 2)
    check_program(program, [values], backends=("c", "onnx"))
