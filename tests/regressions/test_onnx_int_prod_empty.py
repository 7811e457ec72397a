"""The ONNX export of an integer prod over an empty dim never finished: the pairwise-product tree padded 0 elements to
1 and then halved it to 0 again, forever, growing the graph until memory ran out (fixed in
kiln/codegen/onnx/lowerings.py _wrapping_product: no elements give the identity 1 at once)."""

import numpy as np

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


def test_int_prod_over_an_empty_dim():
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of([0, 4, 2], kiln.int64))
    with builder:
        v0 = aten.prod.dim_int(x0, 0)
        v1 = aten.prod.default(x0)
    program = builder.build([v0, v1])
    check_program(program, [np.zeros((0, 4, 2), np.int64)], backends=("onnx",))
