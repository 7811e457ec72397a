"""_weight_norm with a g that is not norm_except_dim's shape: ATen's fused kernel (dim 0 or the last) gives v's shape
and scales the i-th slice along `dim` by g's i-th element, whatever g's shape, while kiln broadcast v * (g / norm):
a [4, 1, 1] g made a [4, 2, 2] result where torch gave [2, 2]. kiln/ir/ops/nn.py now requires g to have the norm's
shape (left-padded with 1s), where the two readings agree, and says so with a ShapeError otherwise."""

import numpy as np
import pytest

import kiln
from kiln.ir.errors import ShapeError
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


def weight_norm_program(v_shape, g_shape, dim):
    builder = GraphBuilder()
    v = builder.add_input('v', TensorType.of(v_shape, kiln.float32))
    g = builder.add_input('g', TensorType.of(g_shape, kiln.float32))
    with builder:
        w = aten._weight_norm.default(v, g, dim)
    return builder.build([w])


@pytest.mark.parametrize("g_shape,dim", [([4, 1, 1], 0), ([2], 0), ([1, 1], 0), ([2, 2], 1)])
def test_a_g_of_another_shape_is_refused(g_shape, dim):
    with pytest.raises(ShapeError, match=r"g must have the shape of norm_except_dim\(v, 2, \d\)"):
        weight_norm_program([2, 2], g_shape, dim)


@pytest.mark.parametrize("g_shape,dim", [([2, 1], 0), ([1, 2], 1), ([2], 1)])
def test_a_g_of_the_norm_shape_agrees_with_torch(g_shape, dim):
    program = weight_norm_program([2, 2], g_shape, dim)
    v = np.array([[0.25, -0.26], [1.28, 0.21]], np.float32)
    g = np.array([-1.07, 0.72], np.float32).reshape(g_shape)
    expected = v * (g.reshape([2, 1] if dim == 0 else [1, 2]) / np.linalg.norm(v, axis=1 - dim, keepdims=True))
    np.testing.assert_allclose(program(v, g), expected, rtol=1.3e-6, atol=1e-5)
    check_program(program, [v, g], backends=("onnx", "c", "torch"))


@pytest.mark.parametrize("dim", [-1, 0])
def test_a_0d_v_is_refused_as_aten_refuses_it(dim):  # found by the differential fuzzer (seed 900)
    torch = pytest.importorskip("torch")
    with pytest.raises(IndexError, match="tensor has no dimensions"):
        torch.ops.aten._weight_norm.default(torch.tensor(2.0), torch.tensor(2.0), dim)
    with pytest.raises(ShapeError, match="v must have dims"):
        weight_norm_program([], [], dim)
