"""Batch norm on the batch's statistics over zero channels and a symbolic batch (so the meta rule's check for an
empty input cannot decide it): the C backend legalizes it to a group norm with one
group per channel, and zero groups failed group norm's check (an OpArgumentError inside compile). With no channel
the legalization returns the empty results directly (kiln/codegen/legalize.py)."""

import numpy as np

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


def test_batch_statistics_over_no_channels():
    builder = GraphBuilder()
    s0 = builder.shape_env.create_symbol(3, name='s0', min=1, max=8)
    x = builder.add_input('x', TensorType.of([s0, 0, 4], kiln.float32))
    with builder:
        y = aten.batch_norm.default(x, None, None, None, None, True, 0.1, 1e-05, True)
    program = builder.build([y])
    inputs = [np.zeros((3, 0, 4), np.float32)]
    assert program(*inputs).shape == (3, 0, 4)
    check_program(program, inputs, backends=("c", "onnx"))
