"""Triton: addmm with alpha=0 multiplied the product by 0, so an inf in it gave NaN where ATen (BLAS) ignores the
term (beta=0 likewise ignores the input); and an adaptive pool over an unbatched input with a symbolic spatial size
passed the Triton target's static-size check (which looked at dims 2: instead of the trailing two) and crashed the
renderer. A zero factor now drops its term, and the check reads the trailing dims, refusing clearly. Found by the
fuzzer."""

import numpy as np
import pytest

import kiln
from kiln.compiler import compile as compile_program
from kiln.ir.errors import UnsupportedError
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


def test_a_zero_factor_drops_its_term():
    builder = GraphBuilder()
    bias = builder.add_input('bias', TensorType.of([5], kiln.float32))
    a = builder.add_input('a', TensorType.of([3, 4], kiln.float32))
    b = builder.add_input('b', TensorType.of([4, 5], kiln.float32))
    with builder:
        v0 = aten.addmm.default(bias, a, b, alpha=0)
        v1 = aten.addmm.default(bias, a, b, beta=0)
    program = builder.build([v0, v1])
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((4, 5)).astype(np.float32)
    y[1, 1] = np.inf
    check_program(program, [np.array([1.0, np.nan, 3.0, np.inf, 5.0], np.float32), x, y])


def test_adaptive_pool_over_a_symbolic_unbatched_input_is_refused(tmp_path):
    builder = GraphBuilder()
    s1 = builder.shape_env.create_symbol(5, name='s1', min=2)
    x1 = builder.add_input('x1', TensorType.of([1, s1, 4], kiln.float32))
    with builder:
        v0 = aten.adaptive_avg_pool2d.default(x1, [1, 1])
    program = builder.build([v0])
    with pytest.raises(UnsupportedError, match="only adaptive pooling over static spatial sizes"):
        compile_program(program, target="triton", output=tmp_path / "pkg")
