"""pixel_unshuffle of an empty input: ATen returns it as it is (a copy, [2, 0, 2] stays [2, 0, 2]) where kiln
reshaped it to [8, 0, 1]; pixel_shuffle does reshape an empty input, in ATen and kiln. Found by the differential
fuzzer (seed 1100)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("op, shape", [("pixel_unshuffle", [2, 0, 2]), ("pixel_unshuffle", [0, 1, 2, 2]),
                                       ("pixel_shuffle", [4, 0, 2]), ("pixel_shuffle", [0, 4, 1, 2])])
def test_empty_pixel_shuffles(op, shape):
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of(shape, kiln.float32))
    with builder:
        v0 = getattr(aten, op).default(x0, 2)
    program = builder.build([v0])
    check_program(program, [np.zeros(shape, np.float32)], backends=("onnx", "c[AVX2]", "pt2", "torch"))
