"""as_strided of a permuted value, or of an elementwise result of one, through the .pt2 file in torch: kiln's
as_strided indexes its input's elements in row-major order (kiln's values are contiguous), torch's indexes the
storage under the input, which a permute (or an add whose operand was permuted, since TensorIterator keeps its
operand's layout) leaves in another order, so torch read other elements. The writer now gives torch's as_strided a
contiguous copy of its input. Found by the differential fuzzer (seed 9000, 18 programs)."""

import numpy as np

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


def test_as_strided_of_permuted_and_elementwise_values():
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of([2, 3, 4], kiln.float32))
    x1 = builder.add_input('x1', TensorType.of([5, 1, 2, 2], kiln.int8))
    with builder:
        permuted = aten.permute.default(x0, [2, 0, 1])
        picked = aten.as_strided.default(permuted, [4], [5])
        swapped = aten.swapaxes.default(x1, -1, 0)
        summed = aten.add.Tensor(swapped, aten.argmin.default(swapped, -1, True))
        window = aten.as_strided.default(summed, [2, 2], [2, 1], 1)
    program = builder.build([picked, window])
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((2, 3, 4)).astype(np.float32), rng.integers(-5, 5, (5, 1, 2, 2)).astype(np.int8)]
    check_program(program, inputs, backends=("torch", "pt2"))
