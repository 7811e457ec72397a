"""upsample_nearest2d / upsample_bilinear2d (the output_size + scales overloads) over a size that is 0 at run time:
ATen refuses ("Input and output sizes should be greater than 0"), the interpreter indexed an empty axis and crashed
with an IndexError. Their kernels now run the meta rule's checks on the run-time shape. Found by the differential
fuzzer (seed 1500)."""

import numpy as np
import pytest

import kiln
from kiln.ir.errors import ShapeError
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType

aten = ops.aten


@pytest.mark.parametrize("op", ["nearest", "bilinear"])
def test_an_empty_input_at_run_time_is_refused(op):
    builder = GraphBuilder()
    s0 = builder.shape_env.create_symbol(2, name='s0', min=0, max=8)
    x0 = builder.add_input('x0', TensorType.of([1, 1, 3, s0], kiln.float32))
    with builder:
        if op == "nearest":
            v0 = aten.upsample_nearest2d.default(x0, [5, 10], 1.7, 2.5)
        else:
            v0 = aten.upsample_bilinear2d.default(x0, [5, 10], True)
    program = builder.build([v0])
    assert program(np.ones((1, 1, 3, 2), np.float32)).shape == (1, 1, 5, 10)
    with pytest.raises(ShapeError, match="sizes should be greater than 0"):
        program(np.ones((1, 1, 3, 0), np.float32))
