"""_weight_norm of a float16 v by a 0-d float32 g: ATen computes v * (g / norm) and a 0-d g does not widen v's dtype,
so the result is float16; kiln's meta rule promoted to float32 (the interpreter's answer then disagreed in dtype with
ONNX and torch). For dim != -1 ATen's fused kernel takes one dtype only. Fixed in kiln/ir/ops/nn.py."""

import numpy as np
import pytest

import kiln
from kiln.ir.errors import DTypeError
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


def test_weight_norm_keeps_v_dtype_for_a_0d_g():
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of([3, 1, 4, 3], kiln.float16))
    x1 = builder.add_input('x1', TensorType.of([], kiln.float32))
    with builder:
        v0 = aten._weight_norm.default(x0, x1, -1)
    program = builder.build([v0])
    v = np.linspace(-2, 2, 36).astype(np.float16).reshape(3, 1, 4, 3)
    check_program(program, [v, np.array(0.5, np.float32)], backends=("onnx", "torch"))


def test_weight_norm_along_a_dim_takes_one_dtype():
    with pytest.raises(DTypeError, match="same dtype"):
        aten._weight_norm.default(np.ones((3, 4), np.float16), np.ones((3, 1), np.float32), 0)
