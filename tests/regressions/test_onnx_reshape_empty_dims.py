"""diagonal of a tensor with an empty dim, in ONNX: its Reshape to [rest..., rows * columns] had a 0 in the target
shape, which ONNX's Reshape reads as "copy the input's dim" by default (the result came out [0, 0] for [3, 0]), and
beside a -1 as an error. Every Reshape kiln emits now sets allowzero=1 (kiln/codegen/onnx/graph.py)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("shape, offset", [([5, 0, 3], 5), ([0, 4, 3], 0), ([2, 3, 0], -1)])
def test_diagonal_with_an_empty_dim(shape, offset):
    builder = GraphBuilder()
    s0 = builder.shape_env.create_symbol(shape[2], name='s0', min=0, max=8)
    x0 = builder.add_input('x0', TensorType.of([shape[0], shape[1], s0], kiln.int8))
    with builder:
        v0 = aten.diagonal.default(aten.ones_like.default(x0), offset)
        v1 = aten.reshape.default(x0, [-1, shape[1]]) if shape[1] else aten.clone.default(x0)
    program = builder.build([v0, v1])
    check_program(program, [np.zeros(shape, np.int8)], backends=("onnx", "torch"))
