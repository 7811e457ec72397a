"""float64 upsampling of an image with a symbolic width went to onnxruntime's Resize, which has no float64 kernel:
the model failed to load ("Could not find an implementation for Resize(19)"). kiln's float64 lowering gathers
ATen's taps for static sizes; a symbolic size is now refused at export with UnsupportedError and a fix, and static
sizes still match. Found by the differential fuzzer (seed 10100, 7 programs)."""

import numpy as np
import pytest

import kiln
from kiln.codegen.onnx import export_program
from kiln.ir.errors import UnsupportedError
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


def _program(width):
    builder = GraphBuilder()
    if width is None:
        width = builder.shape_env.create_symbol(5, name='s0', min=1, max=16)
    x = builder.add_input('x', TensorType.of([1, 2, 1, width], kiln.float64))
    with builder:
        y = aten.upsample_bilinear2d.vec(x, [7, 5], False, None)
    return builder.build([y])


def test_symbolic_width_is_refused_with_a_fix():
    with pytest.raises(UnsupportedError, match="float64 image with symbolic height or width") as caught:
        export_program(_program(None))
    assert "static image size" in caught.value.fix


def test_static_width_still_runs():
    check_program(_program(5), [np.random.default_rng(0).standard_normal((1, 2, 1, 5))], backends=("onnx",))
