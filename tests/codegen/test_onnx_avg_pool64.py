"""float64 average pooling in ONNX: onnxruntime has no float64 AveragePool kernel, so kiln sums each window's taps
with strided slices in float64 and divides as ATen does (the override, the window's part inside the padded input,
or its part inside the input). Checked against torch eager at float64's default tolerances over every argument
form, including ceil-mode windows that reach past the padding; the differential fuzzer found the float32 path's
error (2e-7, over float64's rtol 1e-7) in an avg_pool3d with a divisor override."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
aten = ops.aten

CASES = [  # shape, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override
    ((2, 3, 7, 6), [3, 3], [2, 2], [1, 1], False, True, None),
    ((2, 3, 7, 6), [3, 2], [2, 1], [1, 0], True, False, None),
    ((2, 3, 8, 8), [3, 3], [3, 3], [1, 1], True, True, None),
    ((3, 9, 9), [2, 2], [], [0, 0], True, True, None),
    ((1, 1, 5, 5, 5), [3, 3, 3], [2, 2, 2], [1, 1, 1], False, True, 7),
    ((1, 2, 6, 5, 4), [2, 3, 2], [2, 2, 1], [1, 1, 0], True, False, None),
]


@pytest.mark.parametrize("shape,kernel,stride,padding,ceil_mode,include_pad,divisor", CASES)
def test_float64_average_pools_match_torch(shape, kernel, stride, padding, ceil_mode, include_pad, divisor):
    pool = aten.avg_pool3d.default if len(kernel) == 3 else aten.avg_pool2d.default
    builder = GraphBuilder()
    x = builder.add_input('x', TensorType.of(list(shape), kiln.float64))
    with builder:
        y = pool(x, kernel, stride, padding, ceil_mode, include_pad, divisor)
    program = builder.build([y])
    onnx_program = kiln.onnx.export(program)
    assert "AveragePool" not in {node.op_type for node in onnx_program.model_proto.graph.node}
    values = np.random.default_rng(len(shape)).standard_normal(shape) * 100
    torch_pool = torch.nn.functional.avg_pool3d if len(kernel) == 3 else torch.nn.functional.avg_pool2d
    expected = torch_pool(torch.from_numpy(values), kernel, stride or None, padding, ceil_mode, include_pad, divisor)
    torch.testing.assert_close(torch.from_numpy(onnx_program.run([values])[0]), expected)
