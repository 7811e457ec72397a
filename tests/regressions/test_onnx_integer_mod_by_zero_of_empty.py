"""remainder / fmod of an empty integer tensor by the scalar 0: ATen returns the empty result (and raises only for a
non-empty one), while onnxruntime refused the whole model when it created the Mod kernel ("Integer modulo by zero"),
so a graph holding such an op on a tensor that is empty could not run at all. The ONNX lowering now writes a * 0
there. Found by a differential fuzz run (seed 10000)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program
from tests.torch_oracle import requires_torch, torch

aten = ops.aten


@requires_torch
@pytest.mark.parametrize("op", ["remainder", "fmod"])
@pytest.mark.parametrize("dtype", ["int32", "int64", "bool"])
def test_integer_mod_of_an_empty_tensor_by_zero(op, dtype):
    builder = GraphBuilder()
    x = builder.add_input("x", TensorType.of([3, 0], getattr(kiln, dtype)))
    other = builder.add_input("other", TensorType.of([3], kiln.int32))
    with builder:
        empty = getattr(aten, op).Scalar(x, 0)
        kept = getattr(aten, op).Scalar(other, 3)  # a nonzero divisor still takes Mod
    program = builder.build([empty, kept])
    inputs = [np.zeros((3, 0), dtype), np.array([-7, 5, 9], np.int32)]
    expected = getattr(torch, op)(torch.from_numpy(inputs[0]), 0)
    got = program(*inputs)
    assert got[0].shape == tuple(expected.shape) and got[0].dtype == expected.numpy().dtype
    np.testing.assert_array_equal(got[1], getattr(torch, op)(torch.from_numpy(inputs[1]), 3).numpy())
    check_program(program, inputs, backends=["onnx"])
