"""float64 upsampling in ONNX with an infinity in the input: kiln interpolated with two dense matrix products
(onnxruntime's Resize has no float64 kernel), whose zero weights multiplied the infinity into NaN over its whole
row; 26 of 35 outputs were NaN where ATen's are finite. The lowering now gathers ATen's two taps per axis
(kiln/codegen/onnx/lowerings.py _resample_gathered). Found by the differential fuzzer (seed 800)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten

INF = np.inf


@pytest.mark.parametrize("mode", ["bilinear", "bilinear-corners", "nearest", "bilinear-scales"])
@pytest.mark.parametrize("size", [[7, 5], [2, 9], [3, 5]])
def test_float64_upsample_keeps_infinities_local(mode, size):
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of([1, 2, 3, 5], kiln.float64))
    with builder:
        if mode == "nearest":
            v0 = aten.upsample_nearest2d.vec(x0, size, None)
        elif mode == "bilinear-scales":
            v0 = aten.upsample_bilinear2d.vec(x0, None, False, [size[0] / 3, size[1] / 5])
        else:
            v0 = aten.upsample_bilinear2d.vec(x0, size, mode == "bilinear-corners", None)
    program = builder.build([v0])
    x = np.random.default_rng(0).standard_normal((1, 2, 3, 5))
    x[0, 0, 0, 3] = x[0, 0, 1, 1] = -INF
    x[0, 1, 2, 0] = INF
    check_program(program, [x], backends=("onnx", "torch"))
