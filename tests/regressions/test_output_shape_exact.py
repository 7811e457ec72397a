"""A compiled model's output size floor(s0/3 - Max(0, s0 - 4)/3 + 2/3) (x[-4::3] along s0): the loader evaluated
output shapes with sympy.lambdify in floating point, which gave 1.999... -> 1 at s0 = 7 where the size is 2, so it
allocated one row while the generated code wrote two (heap corruption). Output shapes are evaluated in exact integer
arithmetic now (kiln/ir/symbolic.py, dims_function; kiln/runtime/package.py)."""

import itertools

import numpy as np

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.symbolic import dims_function, evaluate_dim, parse_dim, symbol
from kiln.ir.types import TensorType

aten = ops.aten


def test_dims_function_is_exact():
    s0, s1 = symbol("s0"), symbol("s1")
    dims = [parse_dim(text) for text in ("floor(s0/3 - Max(0, s0 - 4)/3 + 2/3)", "ceiling(s0/7)", "Mod(s0*s1, 5)",
                                         "Min(s0, s1) - 1", "s0**2 + 3", "floor((s0 + 2*s1)/(s1 + 1))")] + [4, s0 * s1]
    function = dims_function([s0, s1], dims)
    for a, b in itertools.product(range(0, 40), range(1, 12)):
        assert function(a, b) == tuple(evaluate_dim(d, {s0: a, s1: b}) for d in dims), (a, b)


def test_compiled_strided_slice_of_a_symbolic_size(tmp_path):
    builder = GraphBuilder()
    s0 = builder.shape_env.create_symbol(3, name='s0', min=1, max=8)
    x = builder.add_input('x', TensorType.of([s0, 2], kiln.int64))
    with builder:
        y = aten.mul.Scalar(aten.slice.Tensor(x, 0, -4, None, 3), 2)
    model = kiln.compile(builder.build([y]), output=tmp_path / "model")
    for size in range(1, 9):
        values = np.arange(2 * size, dtype=np.int64).reshape(size, 2)
        np.testing.assert_array_equal(model(values), values[-4::3] * 2)
