"""The ONNX emitter makes each cast once and hands it out again (a bool scalar's cast to int64, read by both a
cumsum and a multiplication). It also renames the last node of an op to the IR's name for the op's result: the
cumsum of a 0-dim bool is just the cast, so its output became "cumsum", but the cache still gave the later mul
"cumsum_cast", a name no node produced any more, and onnxruntime refused the model ("Node input 'cumsum_cast' is
not a graph input"). A rename now updates the caches that hold names. Found by the differential fuzzer (seed
10100)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("dtype", [kiln.bool, kiln.int8, kiln.uint8])
def test_a_cast_shared_by_a_renamed_result_and_a_later_op(dtype):
    builder = GraphBuilder()
    flag = builder.add_input("flag", TensorType.of([], dtype))
    x = builder.add_input("x", TensorType.of([3], kiln.float32))
    with builder:
        counted = aten.add.Tensor(x, aten.cumsum.default(flag, 0))
        doubled = aten.mul.Scalar(flag, 2)
    program = builder.build([counted, doubled])
    check_program(program, [np.array(1, dtype.numpy), np.arange(3, dtype=np.float32)], backends=["onnx"])
