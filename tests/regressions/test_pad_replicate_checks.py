"""pad(mode='replicate') applies replication_pad's checks, as ATen runs it: an empty non-batch dim is refused
(a [3, 0] input, padded along its empty last dim, crashed the interpreter in numpy's pad), statically and on the
run-time shape. Found by the differential fuzzer (seed 1300)."""

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


@pytest.mark.parametrize("shape, pad", [([3, 0], [2, 1]), ([0, 4], [1, 1]), ([2, 3, 0, 2], [1, 1, 1, 1]),
                                        ([1, 0, 2, 2, 2], [1, 0, 0, 1, 1, 1])])
def test_empty_dims_are_refused_like_aten(shape, pad):
    with pytest.raises(RuntimeError):
        torch.nn.functional.pad(torch.zeros(shape), pad, mode="replicate")
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of(shape, kiln.float32))
    with pytest.raises(ShapeError, match="non-zero dimensions"), builder:
        aten.pad.default(x0, pad, "replicate")


def test_an_empty_dim_at_run_time_is_refused():
    builder = GraphBuilder()
    s0 = builder.shape_env.create_symbol(2, name='s0', min=0, max=8)
    x0 = builder.add_input('x0', TensorType.of([3, s0], kiln.float32))
    with builder:
        v0 = aten.pad.default(x0, [2, 1], "replicate")
    program = builder.build([v0])
    check_program(program, [np.arange(6, dtype=np.float32).reshape(3, 2)], backends=("onnx", "torch"))
    with pytest.raises(ShapeError, match="non-zero dimensions"):
        program(np.zeros((3, 0), np.float32))
