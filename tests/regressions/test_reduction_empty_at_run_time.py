"""max of a tensor whose symbolic size is 0 at run time: the meta rule cannot know, and the reference kernel failed
inside numpy ("zero-size array to reduction operation maximum which has no identity"); ATen raises its own error.
Fixed in kiln/ir/ops/reduction.py: the kernels of reductions without an identity check the meta rule on the arrays
(linalg_vector_norm's -inf and inf norms too, found later)."""

import numpy as np
import pytest

import kiln
from kiln.ir.errors import ShapeError
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType

aten = ops.aten


@pytest.mark.parametrize("reduce", [lambda x: aten.max.default(x), lambda x: aten.amax.default(x, [1]),
                                    lambda x: aten.argmin.default(x, 1), lambda x: aten.max.dim(x, 1)[0],
                                    lambda x: aten.linalg_vector_norm.default(x, -float("inf"), [1]),
                                    lambda x: aten.linalg_vector_norm.default(x, float("inf"), [1])])
def test_reducing_a_dim_that_is_empty_at_run_time(reduce):
    builder = GraphBuilder()
    s0 = builder.shape_env.create_symbol(2, name='s0', min=0, max=8)
    x0 = builder.add_input('x0', TensorType.of([2, s0], kiln.float32))
    with builder:
        v0 = reduce(x0)
    program = builder.build([v0])
    assert program(np.ones((2, 3), np.float32)) is not None
    with pytest.raises(ShapeError, match="non-zero size|numel|does not have an identity"):
        program(np.ones((2, 0), np.float32))
