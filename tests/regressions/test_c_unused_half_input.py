"""An unused float16 (or bfloat16) input: the C backend, which has no half-precision tensors, refuses ops on them when
it legalizes the program, but an input nothing reads reached the renderer and failed with a KeyError. It is an
UnsupportedError now (kiln/codegen/c/render.py, c_type)."""

import pytest

import kiln
from kiln.ir.errors import UnsupportedError
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType

aten = ops.aten


@pytest.mark.parametrize("dtype", [kiln.float16, kiln.bfloat16])
def test_unused_half_input_is_unsupported_in_c(dtype):
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of([2, 2], kiln.float32))
    builder.add_input('x1', TensorType.of([2, 2], dtype))
    with builder:
        v0 = aten.add.Tensor(x0, x0)
    program = builder.build([v0])
    with pytest.raises(UnsupportedError, match=f"no {dtype.name} tensors"):
        kiln.compile(program)
