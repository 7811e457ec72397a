"""layer_norm and rms_norm over an empty normalized shape: onnxruntime's LayerNormalization (and the
SimplifiedLayerNormalization it fuses rms_norm's pattern into) refuse it ("Size of X.shape[axis:] must be at least 1,
got 0"). Fixed in kiln/codegen/onnx: a normalized shape that is not static and non-empty takes the reductions."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("shape, normalized", [([2, 0], [0]), ([2, 0, 3], [0, 3])])
def test_norms_over_an_empty_normalized_shape(shape, normalized):
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of(shape, kiln.float32))
    x1 = builder.add_input('x1', TensorType.of(normalized, kiln.float32))
    with builder:
        v0 = aten.layer_norm.default(x0, normalized, x1, x1)
        v1 = aten.rms_norm.default(x0, normalized, x1)
    program = builder.build([v0, v1])
    check_program(program, [np.zeros(shape, np.float32), np.ones(normalized, np.float32)], backends=("onnx",))


def test_layer_norm_over_a_symbolic_dim_that_is_zero():
    builder = GraphBuilder()
    s0 = builder.shape_env.create_symbol(2, name='s0', min=0, max=8)
    x0 = builder.add_input('x0', TensorType.of([3, s0], kiln.float32))
    with builder:
        v0 = aten.layer_norm.default(x0, [s0])
        v1 = aten.rms_norm.default(x0, [s0])
    program = builder.build([v0, v1])
    check_program(program, [np.zeros((3, 0), np.float32)], backends=("onnx",))
