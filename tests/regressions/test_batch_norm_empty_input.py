"""Batch norm of an empty input, as ATen treats it: the core ops that compute batch statistics
(`_native_batch_norm_legit` training, `.no_stats`) refuse it ("input tensor must have at least one element"), while
the composite `batch_norm` returns it as it is. kiln checked only shapes with every size static, so [0, s2, s0] ran
in the interpreter, and it refused the composite's empty input. Found by the differential fuzzer (seed 900)."""

import numpy as np
import pytest
import torch

import kiln
from kiln.ir.errors import ShapeError
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("shape", [[0, 2, 9, 6], [2, 0, 9, 6], [2, 3, 0, 6]])
def test_the_composite_returns_an_empty_input(shape):
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of(shape, kiln.float32))
    with builder:
        v0 = aten.batch_norm.default(x0, None, None, None, None, True, 0.1, 1e-5, True)
    program = builder.build([v0])
    check_program(program, [np.zeros(shape, np.float32)], backends=("onnx", "pt2", "torch"))


def test_batch_statistics_of_an_empty_input_are_refused():
    with pytest.raises(RuntimeError, match="at least one element"):
        torch.ops.aten._native_batch_norm_legit.no_stats(torch.zeros(0, 2, 5), None, None, True, 0.1, 0.01)
    builder = GraphBuilder()
    s0 = builder.shape_env.create_symbol(5, name='s0', min=2, max=8)
    x0 = builder.add_input('x0', TensorType.of([0, 2, s0], kiln.float32))
    with pytest.raises(ShapeError, match="at least one element"), builder:
        aten._native_batch_norm_legit.no_stats(x0, None, None, True, 0.1, 0.01)


def test_an_input_empty_at_run_time_is_refused():
    builder = GraphBuilder()
    s0 = builder.shape_env.create_symbol(2, name='s0', min=0, max=8)
    x0 = builder.add_input('x0', TensorType.of([s0, 2, 3], kiln.float32))
    with builder:
        v0 = aten._native_batch_norm_legit.no_stats(x0, None, None, True, 0.1, 0.01)[0]
    program = builder.build([v0])
    assert program(np.ones((2, 2, 3), np.float32)).shape == (2, 2, 3)
    with pytest.raises(ShapeError, match="at least one element"):
        program(np.ones((0, 2, 3), np.float32))
