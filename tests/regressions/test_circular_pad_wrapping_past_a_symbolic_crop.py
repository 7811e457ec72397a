"""Circular padding `[-1, 2]` of a symbolic dim s0 >= 2: ATen checks the pads against the uncropped size, so for
s0 = 2 the right pad of 2 wraps more than once around the 1 element the crop leaves. The decomposition took the
single-wrap form (slices and a cat) whenever a size was symbolic, whose slice `[0:2]` of s0 - 1 elements has
Min(2, s0 - 1): ONNX and C computed a [.., 2] result where [.., 3] was due (and a matmul after it failed to
decompose). The form is now chosen by what the ranges prove, else positions modulo the cropped size. Triton
then met its first pointwise op with a symbolic scalar (`remainder(positions, s0 - 1)`) and rendered the bare
symbol; symbolic scalars are now launcher-computed kernel arguments. Found by the differential fuzzer (seed 10100,
7 pairs)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import available_backends, check_program

aten = ops.aten


def _padded(pad):
    builder = GraphBuilder()
    s0 = builder.shape_env.create_symbol(2, name="s0", min=2, max=16)
    x = builder.add_input("x", TensorType.of([2, 3, s0], kiln.float32))
    with builder:
        padded = aten.pad.default(x, pad, "circular")
    return builder.build([padded])


@pytest.mark.parametrize("pad", [[-1, 2], [2, -1], [1, 1]])
@pytest.mark.parametrize("size", [2, 3, 7])
def test_every_backend_agrees_with_the_interpreter(pad, size):
    backends = [b.name for b in available_backends()]
    if pad == [2, -1] and size == 2:  # torch's eager kernel reads memory it never wrote for this left pad (its
        backends.remove("torch")      # result for [[[0, 1]]] is [[[4.6e-41, 0, 0]]]; the mirrored [-1, 2] is right)
    check_program(_padded(pad), [np.random.default_rng(size).standard_normal((2, 3, size)).astype(np.float32)],
                  backends=backends)


def test_a_pointwise_op_with_a_symbolic_scalar():
    builder = GraphBuilder()
    s0 = builder.shape_env.create_symbol(3, name="s0", min=1, max=16)
    x = builder.add_input("x", TensorType.of([s0, 4], kiln.float32))
    with builder:
        scaled = aten.mul.Scalar(aten.remainder.Scalar(x, s0 + 1), s0)
    program = builder.build([scaled])
    for size in (1, 3, 5):
        check_program(program, [np.random.default_rng(size).uniform(-9, 9, (size, 4)).astype(np.float32)])
