"""select_scatter / slice_scatter of a source in another dtype (a bool row written into a float image): ATen copies
the source in, converting it, and the interpreter does; C's legalization into scatter.src passed the bool source on
and failed to compile ("expected self.dtype to be equal to src.dtype"). Found by the differential fuzzer (long run)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program
from tests.serde.support import assert_same

torch = pytest.importorskip("torch")
aten = kiln.ops.aten


def test_scatter_views_convert_their_source_in_c():
    image = np.arange(20, dtype=np.float32).reshape(4, 5)
    row = np.array([True, False, True, True, False])
    rows = np.array([[3, -1, 7, 0, 2], [1, 1, -4, 9, 5]], np.int32)
    assert_same(aten.select_scatter.default(image, row, 0, 1),
                torch.select_scatter(torch.from_numpy(image), torch.from_numpy(row), 0, 1))
    assert_same(aten.slice_scatter.default(image, rows, 0, 1, 3),
                torch.slice_scatter(torch.from_numpy(image), torch.from_numpy(rows), 0, 1, 3))
    builder = GraphBuilder()
    x = builder.add_input("x", TensorType.of([4, 5], kiln.float32))
    r = builder.add_input("r", TensorType.of([5], kiln.bool))
    s = builder.add_input("s", TensorType.of([2, 5], kiln.int32))
    with builder:
        selected = aten.select_scatter.default(x, r, 0, 1)
        sliced = aten.slice_scatter.default(x, s, 0, 1, 3)
    check_program(builder.build([selected, sliced]), [image, row, rows], backends=("c",))
