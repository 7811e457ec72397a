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


def _cumprod_along_a_symbolic_dim():
    builder = GraphBuilder()
    s0 = builder.shape_env.create_symbol(3, name='s0', min=1, max=8)
    x0 = builder.add_input('x0', TensorType.of([s0, 2], kiln.float32))
    with builder:
        v0 = aten.cumprod.default(x0, 0)
    return builder.build([v0]), [np.full((3, 2), 2, np.float32)], "static size along dim 0", True


@pytest.mark.parametrize("make", [_cumprod_along_a_symbolic_dim])
def test_decomposition_limits_are_unsupported(make):
    program, inputs, message, onnx_decomposes = make()
    assert program(*inputs) is not None  # the interpreter runs it: the program itself is valid
    if onnx_decomposes:
        with pytest.raises(UnsupportedError, match=message):
            export_program(program)
    with pytest.raises(UnsupportedError, match=message):
        kiln.compile(program)
