"""Bicubic, bilinear and linear upsampling of float32 images placed their source positions where ATen does not:
kiln computed bicubic positions in float64 (ATen: float32 opmath), and every half-pixel position ratio * (i + 0.5)
- 0.5 with two roundings where ATen's CPU kernels, compiled with FMA contraction, round once. A position an ulp off
moves the taps' weights, and results moved by up to 1e-5, past assert_close's tolerance: CLAP's 64 -> 256
spectrogram resize (align_corners=True) failed in every kiln stage. The kernels, the bicubic decomposition and C's
bilinear kernel now place them as ATen does."""

import numpy as np
import pytest

import kiln
from kiln.ir.ops.nn import _bicubic_decomposition
from kiln.ir.program import GraphBuilder
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program
from tests.serde.support import assert_same

torch = pytest.importorskip("torch")
aten = kiln.ops.aten

IMAGE = np.random.default_rng(0).uniform(-4, 4, (2, 4, 64, 64)).astype(np.float32)
RESIZES = [(True, [256, 256], None), (False, [200, 250], None), (False, None, [3.7, 3.3])]


@pytest.mark.parametrize("align_corners, size, scales", RESIZES)
def test_bicubic_places_source_positions_as_aten_does(align_corners, size, scales):
    expected = torch.ops.aten.upsample_bicubic2d.vec(torch.from_numpy(IMAGE), size, align_corners, scales)
    assert_same(aten.upsample_bicubic2d.vec(IMAGE, size, align_corners, scales), expected)
    assert_same(np.asarray(_bicubic_decomposition(IMAGE, size, align_corners, scales)), expected)


@pytest.mark.parametrize("align_corners, size, scales", RESIZES)
def test_bilinear_places_source_positions_as_aten_does_in_every_backend(align_corners, size, scales):
    expected = torch.ops.aten.upsample_bilinear2d.vec(torch.from_numpy(IMAGE), size, align_corners, scales)
    assert_same(aten.upsample_bilinear2d.vec(IMAGE, size, align_corners, scales), expected)
    builder = GraphBuilder()
    x = builder.add_input("x", TensorType.of(IMAGE.shape, kiln.float32))
    with builder:
        y = aten.upsample_bilinear2d.vec(x, size, align_corners, scales)
    # not ONNX: float32 interpolation is onnxruntime's Resize there, which places positions its own way (docs/onnx.md)
    check_program(builder.build([y]), [IMAGE], backends=("c",))


def test_linear_places_source_positions_as_aten_does():
    line = IMAGE[:, :, 0] * 10  # larger values, so a misplaced position moves an output past the tolerance
    for size in ([250], [1000]):
        expected = torch.ops.aten.upsample_linear1d.vec(torch.from_numpy(line), size, False, None)
        assert_same(aten.upsample_linear1d.vec(line, size, False, None), expected)
