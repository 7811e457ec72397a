"""Linear 1-D upsampling of a row holding an infinity ran in C as the 2-D op over a plane of height 1, whose
zero-weight row tap multiplied -inf by 0: NaN where ATen's 1-D kernel returns -inf. Found by the differential fuzzer
as soon as the op joined the registry (an align_corners resize from 7 to 3 samples lands exactly on the -inf). Static
lengths now gather ATen's two taps."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

torch = pytest.importorskip("torch")
aten = kiln.ops.aten


@pytest.mark.parametrize("align_corners, size, scales", [(True, [3], None), (False, [14], None),
                                                          (False, None, [2.0]), (True, [7], None)])
def test_linear1d_keeps_an_infinity_on_a_tap_in_every_backend(align_corners, size, scales):
    row = np.array([[[0.25, -4.5, np.nan, 0.0, 0.5, 2.0, -0.0], [-np.inf, -1.0, 3.0, 0.0, np.inf, -0.5, 1.0]]],
                   np.float32)
    expected = torch.ops.aten.upsample_linear1d.vec(torch.from_numpy(row), size, align_corners, scales)
    torch.testing.assert_close(torch.from_numpy(aten.upsample_linear1d.vec(row, size, align_corners, scales)), expected,
                               equal_nan=True)
    builder = GraphBuilder()
    x = builder.add_input("x", TensorType.of(row.shape, kiln.float32))
    with builder:
        y = aten.upsample_linear1d.vec(x, size, align_corners, scales)
    check_program(builder.build([y]), [row], backends=("c", "onnx"))
