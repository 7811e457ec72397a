"""Limits of kiln's decompositions reported as errors in the program: cumprod along a symbolic dim (an
OpArgumentError) made ONNX export and the C backend crash instead of reporting an unsupported op. It is an
UnsupportedError now, which the exporters and the fuzzer's differential runner count as a refusal
(kiln/ir/ops/reduction.py; likewise upsample's output_size with scales that give other sizes, kiln/ir/ops/nn.py)."""

import numpy as np
import pytest

import kiln
from kiln.codegen.onnx import export_program
from kiln.ir.errors import UnsupportedError
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType

aten = ops.aten


def test_cumprod_along_a_symbolic_dim_is_unsupported():
    builder = GraphBuilder()
    s0 = builder.shape_env.create_symbol(3, name='s0', min=1, max=8)
    x0 = builder.add_input('x0', TensorType.of([s0, 2], kiln.float32))
    with builder:
        v0 = aten.cumprod.default(x0, 0)
    program = builder.build([v0])
    np.testing.assert_array_equal(program(np.full((3, 2), 2, np.float32)), [[2, 2], [4, 4], [8, 8]])  # valid
    with pytest.raises(UnsupportedError, match="static size along dim 0"):
        export_program(program)
    with pytest.raises(UnsupportedError, match="static size along dim 0"):
        kiln.compile(program)
