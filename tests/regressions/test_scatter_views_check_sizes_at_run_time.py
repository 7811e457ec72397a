"""select_scatter / slice_scatter whose slice has a size only known at run time (nonzero's count): the meta rule
cannot compare it with src's static size, and the reference kernel then failed inside numpy ("could not broadcast
input array from shape (3,) into shape (9,)"). The kernels now check the sizes as ATen does and raise its error.
Found by the differential fuzzer (seed 9100)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType

aten = ops.aten


@pytest.mark.parametrize("scatter", ["select", "slice"])
def test_src_of_another_size_than_a_run_time_slice_is_refused(scatter):
    builder = GraphBuilder()
    mask = builder.add_input('mask', TensorType.of([3, 4], kiln.bool))
    src = builder.add_input('src', TensorType.of([3], kiln.int64))
    with builder:
        found = aten.nonzero.default(mask)  # [count, 2], count known at run time only
        if scatter == "select":
            result = aten.select_scatter.default(found, src, -1, -1)
        else:
            result = aten.slice_scatter.default(found, aten.unsqueeze.default(src, 1), 1, 1, 2)
    program = builder.build([result])
    three = np.zeros((3, 4), bool)
    three[0, :3] = True
    got = np.asarray(program(three, np.arange(3)))
    expected = np.array([[0, 0], [0, 1], [0, 2]])
    expected[:, -1] = np.arange(3)
    np.testing.assert_array_equal(got, expected)  # hand-computed: the count matches, src lands in the last column
    with pytest.raises(kiln.KilnError, match="expected src to have a size equal to the slice of self"):
        program(np.ones((3, 4), bool), np.arange(3))  # 12 found, 3 given
