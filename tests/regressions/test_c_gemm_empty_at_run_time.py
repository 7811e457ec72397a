"""A matmul whose N is a symbol that is 0 at run time: the C GEMM split its rows into `(wanted + units - 1) / units`
chunks with units = batch x column panels = 0, an integer division by zero that killed the process (SIGFPE). No
units now means one chunk (kiln/codegen/c/render.py)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("n,k", [(0, 0), (0, 3), (5, 0)])
def test_bmm_with_sizes_that_are_zero_at_run_time(n, k):
    builder = GraphBuilder()
    s0 = builder.shape_env.create_symbol(2, name='s0', min=0, max=8)
    s1 = builder.shape_env.create_symbol(2, name='s1', min=1, max=16)
    s2 = builder.shape_env.create_symbol(2, name='s2', min=0, max=8)
    a = builder.add_input('a', TensorType.of([2, s1, s2], kiln.float32))
    b = builder.add_input('b', TensorType.of([2, s2, s0], kiln.float32))
    with builder:
        y = aten.bmm.default(a, b)
        norm = aten.linalg_vector_norm.default(y)
    program = builder.build([y, norm])
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((2, 4, k)).astype(np.float32), rng.standard_normal((2, k, n)).astype(np.float32)]
    check_program(program, inputs, backends=("c", "onnx"))
