"""A size with a ceiling division, s2 - ceiling(s2/2) (the second chunk of a dim split in two), as an argument
(layer_norm's normalized_shape): the .pt2 writer had no SymInt arithmetic for ceiling and refused the program. It
now writes (n + d - 1) // d. Found by the differential fuzzer (seed 2000)."""

import numpy as np

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program
from tests.fuzz.programs import flat

aten = ops.aten


def test_a_ceiling_size_argument_round_trips():
    builder = GraphBuilder()
    s0 = builder.shape_env.create_symbol(5, name='s0', min=2, max=64)
    x0 = builder.add_input('x0', TensorType.of([s0, 3], kiln.float32))
    with builder:
        first, second = flat(aten.chunk.default(x0, 2, 0))
        normalized = aten.layer_norm.default(second, list(second.type.shape))
    program = builder.build([first, normalized])
    check_program(program, [np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)],
                  backends=("pt2", "torch"))
