"""adaptive average pooling of an input holding NaN (or inf): kiln's reference kernel averaged through a matrix of
window weights, so NaN * 0 spread the NaN into every window, where C, ONNX and torch keep it in the windows that
hold it (fixed in kiln/ir/ops/nn.py: the kernel averages window by window)."""

import numpy as np

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten
nan, inf = float("nan"), float("inf")


def test_adaptive_avg_pool_keeps_nan_in_its_windows():
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of([1, 2, 5, 7, 6], kiln.float32))
    x1 = builder.add_input('x1', TensorType.of([3, 4, 5], kiln.float32))
    with builder:
        v0 = aten._adaptive_avg_pool3d.default(x0, [2, 3, 4])
        v1 = aten.adaptive_avg_pool2d.default(x1, [3, 4])
    program = builder.build([v0, v1])
    x = np.linspace(-3, 3, 420, dtype=np.float32).reshape(1, 2, 5, 7, 6)
    x[0, 0, 0, 0, 2], x[0, 1, 4, 6, 5] = nan, inf
    y = np.linspace(-1, 1, 60, dtype=np.float32).reshape(3, 4, 5)
    y[0, 0, 0] = nan
    check_program(program, [x, y], backends=("c", "onnx", "torch"))
