"""upsample_bicubic2d with symbolic spatial sizes: its decomposition (which ONNX export and the C backend use) only
handles static sizes and said so with a ShapeError, as if the program were wrong; it is a limit of kiln's, now an
UnsupportedError, which the exporters report as such (kiln/ir/ops/nn.py)."""

import pytest

import kiln
from kiln.codegen.onnx import export_program
from kiln.ir.errors import UnsupportedError
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType

aten = ops.aten


def test_bicubic_with_symbolic_sizes_is_unsupported_not_wrong():
    builder = GraphBuilder()
    s0 = builder.shape_env.create_symbol(2, name='s0', min=2, max=8)
    x0 = builder.add_input('x0', TensorType.of([1, 2, 6, s0], kiln.float32))
    with builder:
        v0 = aten.upsample_bicubic2d.vec(x0, [3, 2], False, None)
    program = builder.build([v0])
    with pytest.raises(UnsupportedError, match="static spatial sizes"):
        export_program(program)
