"""adaptive average pooling in ONNX over channels that are 0 at run time (a symbolic size) and in float64:
onnxruntime's pools refuse an empty channel dim ("Only N can be zero. Got:{1,0,3,4}") and its GlobalAveragePool has
no float64 kernel at every rank. Symbolic channels now fold into the batch (each channel is pooled alone) and
float64 averages with ReduceMean. Found by the differential fuzzer (seed 1300)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("channels", [0, 3])
@pytest.mark.parametrize("output_size", [[1, 1], [3, 2], [2, 3]])
def test_symbolic_channels(channels, output_size):
    builder = GraphBuilder()
    s0 = builder.shape_env.create_symbol(3, name='s0', min=0, max=8)
    x0 = builder.add_input('x0', TensorType.of([s0, 6, 4], kiln.float32))
    x1 = builder.add_input('x1', TensorType.of([2, s0, 6, 4], kiln.float32))
    with builder:
        results = [aten.adaptive_avg_pool2d.default(x0, output_size), aten.adaptive_avg_pool2d.default(x1, output_size)]
    program = builder.build(results)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((channels, 6, 4)).astype(np.float32),
              rng.standard_normal((2, channels, 6, 4)).astype(np.float32)]
    check_program(program, inputs, backends=("onnx", "torch"))


@pytest.mark.parametrize("n, output_size", [(2, [1, 1]), (3, [1, 1, 1]), (2, [3, 2]), (3, [2, 1, 2])])
def test_float64(n, output_size):
    shape = [2, 3] + [4] * n
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of(shape, kiln.float64))
    with builder:
        v0 = getattr(aten, f"_adaptive_avg_pool{n}d").default(x0, output_size)
    program = builder.build([v0])
    check_program(program, [np.random.default_rng(0).standard_normal(shape)], backends=("onnx", "torch"))
