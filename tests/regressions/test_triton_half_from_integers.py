"""Triton: converting integers (or bools) to float16 crashed: the cast asked for round-to-nearest-even, which Triton
takes only for narrowing float conversions. Every conversion to float16 now goes through float32, as c10::Half's
does (render.Exprs.cast). Found by the fuzzer."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("source", [kiln.int8, kiln.uint8, kiln.int32, kiln.int64, kiln.bool, kiln.float64])
def test_conversion_to_float16(source):
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of([6], source))
    with builder:
        v0 = aten._to_copy.default(x0, dtype=kiln.float16)
    program = builder.build([v0])
    if source == kiln.float64:
        values = np.array([1e-8, 65519.9, 70000.0, -2.5, 0.1, 2049.0000001])
    else:
        values = np.array([1, 0, 100, 127, 3, 2049]).astype(source.numpy)
    check_program(program, [values], backends=("triton", "onnx", "torch"))
