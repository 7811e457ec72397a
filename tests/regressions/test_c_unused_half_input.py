"""An input of a dtype the C backend has no element type for, which nothing reads: legalizing refuses ops on such
values, but an unused input reached the renderer and failed with a KeyError. It is an UnsupportedError now
(kiln/codegen/c/ctext.py, c_type). float16 and bfloat16, once such dtypes, are stored now, so an unused one is
passed over like any other input."""

import numpy as np
import pytest

import kiln
from kiln.ir.errors import UnsupportedError
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType

aten = ops.aten


def _unused_input_program(dtype):
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of([2, 2], kiln.float32))
    builder.add_input('x1', TensorType.of([2, 2], dtype))
    with builder:
        v0 = aten.add.Tensor(x0, x0)
    return builder.build([v0])


def test_unused_complex_input_is_unsupported_in_c():
    with pytest.raises(UnsupportedError, match="no complex64 tensors"):
        kiln.compile(_unused_input_program(kiln.complex64))


@pytest.mark.parametrize("dtype", [kiln.float16, kiln.bfloat16])
def test_unused_half_input_compiles_in_c(dtype):
    x0 = np.arange(4, dtype=np.float32).reshape(2, 2)
    x1 = np.ones((2, 2), dtype=dtype.numpy)
    out = kiln.compile(_unused_input_program(dtype))(x0, x1)
    np.testing.assert_array_equal(out, x0 + x0)
