"""Reflection and replication pads with a negative pad in ONNX: onnxruntime's Pad crops first and refused to
replicate an extent cropped to nothing ("Pad: invalid mode: 2 with zero effective input extent"), while ATen reads
each output from the uncropped input. Negative or symbolic pads now gather ATen's positions along each axis
(kiln/codegen/onnx/lowerings.py _padded_positions). Found by the differential fuzzer (seed 900)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("op, shape, padding", [
    ("replication_pad2d", [3, 2, 1], [-1, 2, 3, -2]),
    ("replication_pad2d", [1, 3, 4, 5], [-2, 3, 1, -3]),
    ("replication_pad3d", [1, 2, 3, 4, 5], [-1, 0, 2, -2, 1, 1]),
    ("reflection_pad2d", [1, 3, 4, 5], [-2, 3, 2, -3]),
    ("reflection_pad1d", [2, 3, 6], [-3, 4]),
    ("reflection_pad3d", [1, 1, 3, 4, 5], [1, -2, -1, 2, 0, 1]),
])
def test_negative_spatial_pads(op, shape, padding):
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of(shape, kiln.float32))
    with builder:
        v0 = getattr(aten, op).default(x0, padding)
    program = builder.build([v0])
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    check_program(program, [x], backends=("onnx", "torch"))


@pytest.mark.parametrize("op", ["replication_pad2d", "reflection_pad2d"])
def test_negative_pads_over_a_symbolic_size(op):
    builder = GraphBuilder()
    s0 = builder.shape_env.create_symbol(6, name='s0', min=4, max=64)
    x0 = builder.add_input('x0', TensorType.of([1, 2, 3, s0], kiln.float32))
    with builder:
        v0 = getattr(aten, op).default(x0, [-1, 2, 2, -1])
    program = builder.build([v0])
    x = np.random.default_rng(0).standard_normal((1, 2, 3, 6)).astype(np.float32)
    check_program(program, [x], backends=("onnx", "torch"))
