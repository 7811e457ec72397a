"""addmv with a self that broadcasts ([1] or 0-d against a [3] product): its decomposition viewed self as [rows, 1]
and failed ("shape [3, 1] is invalid for input of size 1") in ONNX and C. It now views self as a column of its own
length, which addmm broadcasts. Found by the differential fuzzer (seed 1000)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("self_shape", [[1], [], [3]])
def test_addmv_broadcasts_self(self_shape):
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of(self_shape, kiln.float32))
    x1 = builder.add_input('x1', TensorType.of([3, 4], kiln.float32))
    x2 = builder.add_input('x2', TensorType.of([4], kiln.float32))
    with builder:
        v0 = aten.addmv.default(x0, x1, x2, beta=0.5, alpha=2)
    program = builder.build([v0])
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(self_shape).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32),
              rng.standard_normal(4).astype(np.float32)]
    check_program(program, inputs, backends=("onnx", "c[AVX2]", "pt2", "torch"))
