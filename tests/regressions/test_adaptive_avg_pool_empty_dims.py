"""adaptive average pooling and empty dims, as ATen checks them: the 2-D pool refuses an empty spatial dim but takes
zero channels, the 3-D pool refuses every empty dim after the first. kiln refused zero channels (ATen takes them),
and over a symbolic size that was 0 at run time the interpreter computed a result where ATen refuses (onnxruntime
then failed on it). The meta rule now checks ATen's dims and runs again on the run-time shape
(kiln/ir/ops/nn.py _adaptive_avg_pool_meta). Found by the differential fuzzer (seed 900)."""

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


@pytest.mark.parametrize("shape", [[0, 4, 5], [2, 0, 4, 5], [0, 3, 4, 5]])
def test_zero_channels_or_batch_are_taken(shape):
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of(shape, kiln.float32))
    with builder:
        v0 = aten.adaptive_avg_pool2d.default(x0, [2, 1])
    program = builder.build([v0])
    check_program(program, [np.zeros(shape, np.float32)], backends=("onnx", "c[AVX2]", "torch"))


@pytest.mark.parametrize("n, shape", [(2, [3, 4, 0]), (2, [2, 3, 0, 5]), (3, [2, 0, 3, 5, 5]), (3, [2, 3, 0, 5])])
def test_empty_dims_are_refused_like_aten(n, shape):
    with pytest.raises(RuntimeError):
        getattr(torch.ops.aten, f"_adaptive_avg_pool{n}d")(torch.zeros(shape), [1] * n)
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of(shape, kiln.float32))
    with pytest.raises(ShapeError, match="non-zero dimensions"), builder:
        getattr(aten, f"_adaptive_avg_pool{n}d").default(x0, [1] * n)


def test_an_empty_dim_at_run_time_is_refused():
    builder = GraphBuilder()
    s0 = builder.shape_env.create_symbol(2, name='s0', min=0, max=8)
    x0 = builder.add_input('x0', TensorType.of([3, 4, s0], kiln.float32))
    with builder:
        v0 = aten.adaptive_avg_pool2d.default(x0, [1, 1])
    program = builder.build([v0])
    np.testing.assert_allclose(program(np.ones((3, 4, 2), np.float32)), np.ones((3, 1, 1), np.float32))
    with pytest.raises(ShapeError, match="non-zero dimensions"):
        program(np.ones((3, 4, 0), np.float32))
