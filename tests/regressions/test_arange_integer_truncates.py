"""arange with float start and step into an integer dtype (arange(-2.5, 0, 0.7, dtype=int32)): ATen takes its length
from the doubles but counts from the truncated start and step (-2 + 0 * i), and the C backend computed
start + i * step in double and truncated each value. C counts as ATen does now (kiln/codegen/schedule.py; ONNX
folds the static values, and symbolic bounds take integers only)."""

import numpy as np
import pytest
import torch

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("start,end,step", [(-2.5, -0.0, 0.7), (0.5, 7.0, 1.5), (-1.0, 5.5, 2.0), (3, -4, -2.5)])
def test_arange_into_int32(start, end, step):
    builder = GraphBuilder()
    with builder:
        y = aten.add.Scalar(aten.arange.start_step(start, end, step, dtype=kiln.int32), -3)
    program = builder.build([y])
    expected = torch.arange(start, end, step, dtype=torch.int32).numpy() - 3
    np.testing.assert_array_equal(program(), expected)
    check_program(program, [], backends=("c", "onnx", "torch"))

