"""A size that is a power of a symbol (flattening [s0, s0] gives s0**2): the .pt2 writer knew sums, products, floor
division, modulo, min and max, and refused the power with a SerdeError. It writes s0**n as SymInt products now
(kiln/ir/serde/writer.py), which kiln and torch.export.load read back."""

import numpy as np

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


def test_a_squared_size_round_trips_through_pt2(tmp_path):
    builder = GraphBuilder()
    s0 = builder.shape_env.create_symbol(3, name='s0', min=1, max=16)
    x = builder.add_input('x', TensorType.of([2, s0, s0, s0], kiln.float32))
    with builder:
        flat = aten.flatten.using_ints(x, 1, 3)
        y = aten.mul.Scalar(flat, 2.0)
    program = builder.build([y])
    kiln.save(program, tmp_path / "power.pt2")
    loaded = kiln.load(tmp_path / "power.pt2")
    for size in (2, 3):  # the size stays symbolic
        x = np.arange(2 * size**3, dtype=np.float32).reshape(2, size, size, size)
        [y] = loaded(x)  # torch's out spec: a tuple of outputs
        np.testing.assert_array_equal(y, x.reshape(2, size**3) * 2)
    inputs = [np.arange(2 * 27, dtype=np.float32).reshape(2, 3, 3, 3)]
    check_program(program, inputs, backends=("pt2", "torch"))
