"""An index_put whose index is empty (`x[:, empty] += x`) crashed in onnxruntime: its updates are `values` expanded
to [2, 0], and onnxruntime 1.32's optimizer drops an Expand to a constant shape with a 0 when it infers the input's
shape ([2, 1] to [2, 0] looks like a no-op to it), so ScatterND got updates of [1, 2]. kiln's ONNX cleanup now
writes every such Expand as an Expand with 1 there, sliced to nothing (one rule, which also replaced group_norm's
own workaround). Found by the long differential test."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("accumulate", [True, False])
def test_index_put_with_an_empty_index_of_a_computed_value(accumulate):
    builder = GraphBuilder()
    a = builder.add_input('a', TensorType.of([2, 12], kiln.float32))
    b = builder.add_input('b', TensorType.of([12, 1], kiln.float32))
    with builder:
        product = aten.mm.default(a, b)  # computed, so onnxruntime infers its shape
        empty = aten.arange.start_step(0, 0)
        put = aten.index_put.default(product, [None, empty], product, accumulate)
        grown = aten.expand.default(aten.unsqueeze.default(product, 0), [0, 2, 1])
        bools = aten.expand.default(aten.unsqueeze.default(aten.gt.Scalar(product, 0.5), 0), [0, 2, 1])
    program = builder.build([put, grown, bools])
    rng = np.random.default_rng(0)
    check_program(program, [rng.standard_normal((2, 12)).astype(np.float32),
                            rng.standard_normal((12, 1)).astype(np.float32)], backends=("onnx",))
