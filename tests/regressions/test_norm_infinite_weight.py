"""Batch and group norm with an infinite weight: ATen computes x * alpha + (bias - mean * alpha), alpha = weight *
invstd, so an infinite weight gives inf - inf = NaN, where the interpreter's (x - mean) * invstd * weight + bias gave
-inf; torch and onnxruntime agreed on NaN. The interpreter and C's batch norm now use ATen's form. Found by the
differential fuzzer (seed 1400)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("norm", ["batch-eval", "batch-train", "group"])
def test_an_infinite_weight_gives_what_aten_gives(norm):
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of([4, 2, 3], kiln.float32))
    w = builder.add_input('w', TensorType.of([2], kiln.float32))
    b = builder.add_input('b', TensorType.of([2], kiln.float32))
    with builder:
        if norm == "group":
            v0 = aten.group_norm.default(x0, 2, w, b)
        else:
            mean = aten.full.default([2], 0.25)
            var = aten.full.default([2], 0.5)
            v0 = aten.batch_norm.default(x0, w, b, mean, var, norm == "batch-train", 0.1, 1e-5, True)
    program = builder.build([v0])
    x = np.random.default_rng(0).standard_normal((4, 2, 3)).astype(np.float32)
    backends = ("onnx", "torch") if norm == "batch-train" else ("onnx", "c[AVX2]", "c[DEFAULT]", "torch")  # (C has
    # no training batch norm)
    check_program(program, [x, np.array([-np.inf, 2.0], np.float32), np.array([1.75, -1.0], np.float32)],
                  backends=backends)
