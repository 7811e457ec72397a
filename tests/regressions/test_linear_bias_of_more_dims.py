"""linear with a bias of more than one dim, which broadcasts to the output ([2, 0, 1] against [2, 0, 5]): the
decomposition ONNX export and the C backend use put every bias in addmm, which broadcasts it to the flattened rows
([0, 5]) and refused it (a ShapeError inside the decompose pass). A bias of two or more dims is added to the output
now (kiln/ir/ops/composite.py)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("x_shape,bias_shape", [([2, 0, 1], [2, 0, 1]), ([2, 3, 1], [2, 3, 5]),
                                                ([2, 2, 0, 1], [2, 0, 1]), ([2, 2, 3, 1], [2, 3, 5]), ([4, 1], [4, 5]),
                                                ([2, 3, 1], [1, 5])])
def test_linear_with_a_broadcast_bias(x_shape, bias_shape):
    builder = GraphBuilder()
    x = builder.add_input('x', TensorType.of(x_shape, kiln.float32))
    w = builder.add_input('w', TensorType.of([5, 1], kiln.float32))
    b = builder.add_input('b', TensorType.of(bias_shape, kiln.float32))
    with builder:
        y = aten.linear.default(x, w, b)
    program = builder.build([y])
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(s).astype(np.float32) for s in (x_shape, [5, 1], bias_shape)]
    np.testing.assert_allclose(program(*inputs), inputs[0] @ inputs[1].T + inputs[2], rtol=1.3e-6, atol=1e-5)
    check_program(program, inputs, backends=("onnx", "c", "torch"))

