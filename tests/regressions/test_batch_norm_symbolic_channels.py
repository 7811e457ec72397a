"""Batch norm on the batch's statistics with a symbolic channel count: the C backend legalizes it to a group norm
with one group per channel, whose meta rule compared the (symbolic) group count with `> 0` and crashed with sympy's
TypeError. The check goes through a guard now (kiln/ir/ops/nn.py), and C reports the form it does not compile."""

import numpy as np
import pytest

import kiln
from kiln.ir.errors import UnsupportedError
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


def test_batch_statistics_over_symbolic_channels():
    builder = GraphBuilder()
    s0 = builder.shape_env.create_symbol(3, name='s0', min=1, max=16)
    x = builder.add_input('x', TensorType.of([2, s0, 4], kiln.float32))
    with builder:
        y = aten.batch_norm.default(x, None, None, None, None, True, 0.1, 1e-05, True)
    program = builder.build([y])
    inputs = [np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)]
    with pytest.raises(UnsupportedError, match="static channel count"):
        kiln.compile(program)
    check_program(program, inputs, backends=("onnx", "pt2", "torch"))
