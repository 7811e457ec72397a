"""Two Triton crashes (its interpreter), found by the differential fuzzer (seed 9000):
- constant_pad_nd of a broadcast value (an expanded 0-d tensor: every stride 0) loaded through a scalar pointer with a
  block mask ("Mask argument cannot be block type if pointer argument is not a block"); such an input is now read
  as one element broadcast to the block, as a 0-d one was;
- logical_or of a bfloat16 value compared the bfloat16 block with 0, which Triton's interpreter cannot do ("cannot
  reshape array of size 512 into shape (1024,)"); a float16/bfloat16 operand's truth is now tested in float32
  (exact)."""

import ml_dtypes
import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("pad,value", [([0, 0, 1, 1], -float("inf")), ([1, 1], 2.5)])
def test_pad_of_an_expanded_scalar(pad, value):
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of([], kiln.float32))
    with builder:
        padded = aten.constant_pad_nd.default(aten.expand.default(x0, [3, 1]), pad, value)
    program = builder.build([padded])
    check_program(program, [np.array(2.0, np.float32)], backends=("triton",))


@pytest.mark.parametrize("dtype", [kiln.bfloat16, kiln.float16])
def test_logical_ops_of_half_precision_values(dtype):
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of([3, 4], dtype))
    x1 = builder.add_input('x1', TensorType.of([4], kiln.float64))
    with builder:
        either = aten.logical_or.default(aten.view.default(x0, [3, 1, 4]), x1)
        results = [aten.rsqrt.default(either), aten.logical_not.default(x0), aten.logical_xor.default(x0, x0)]
    program = builder.build(results)
    rng = np.random.default_rng(0)
    values = rng.standard_normal((3, 4))
    values[0, :2] = 0.0
    numpy_dtype = ml_dtypes.bfloat16 if dtype == kiln.bfloat16 else np.float16
    check_program(program, [values.astype(numpy_dtype), rng.standard_normal(4)], backends=("triton",))
