"""Nearest upsampling of an int64, int16 or bool image in ONNX: kiln emitted Resize, which onnxruntime has no kernel
for in those dtypes ("Could not find an implementation for Resize(19)"). The lowering now gathers the nearest source
rows and columns, exact in every dtype (kiln/codegen/onnx/lowerings.py _resample_gathered). ATen has no integer
nearest kernel, so the oracle is kiln's reference interpreter. Found by the differential fuzzer (seed 9100)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("dtype", [kiln.int64, kiln.int16, kiln.bool])
@pytest.mark.parametrize("size", [[6, 7], [2, 3]])
def test_nearest_upsample_of_integers_runs_in_onnxruntime(dtype, size):
    builder = GraphBuilder()
    x0 = builder.add_input("x0", TensorType.of([1, 2, 3, 5], dtype))
    with builder:
        v0 = aten.upsample_nearest2d.vec(x0, size, None)
    program = builder.build([v0])
    x = np.random.default_rng(0).integers(-1000, 1000, (1, 2, 3, 5)).astype(dtype.numpy)
    check_program(program, [x], backends=("onnx",))
