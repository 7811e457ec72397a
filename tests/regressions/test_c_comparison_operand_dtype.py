"""Comparisons convert every operand to torch.result_type's dtype first: int8 < a 0-d int64 tensor holding 1000
compares with 1000 wrapped to int8 (-24), and a float32 tensor == 0.1 compares with 0.1 rounded to float32. The C
backend compared in the promoted type of all tensor dtypes, ignoring that a 0-d tensor or a scalar does not widen
a dimensioned operand's dtype: 12 of 12 results were wrong. Comparisons now carry the operand dtype
(kiln/codegen/schedule.py Apply.operand_dtype). Found by the differential fuzzer (seed 1100)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


def comparison_program(op):
    builder = GraphBuilder()
    small = builder.add_input('small', TensorType.of([3, 4], kiln.int8))
    wide = builder.add_input('wide', TensorType.of([], kiln.int64))
    floats = builder.add_input('floats', TensorType.of([4], kiln.float32))
    double = builder.add_input('double', TensorType.of([], kiln.float64))
    with builder:
        results = [getattr(aten, op).Tensor(small, wide), getattr(aten, op).Scalar(small, 1000),
                   getattr(aten, op).Scalar(small, 300.5), getattr(aten, op).Tensor(floats, double),
                   getattr(aten, op).Scalar(floats, 0.1), getattr(aten, op).Tensor(wide, small)]
    return builder.build(results)


INPUTS = [np.array([[-30, -24, 5, 0], [-128, 127, -25, -23], [1, 2, 3, -24]], np.int8), np.array(1000),
          np.array([0.1, 0.2, -1.0, 0.30000001192092896], np.float32), np.array(0.1)]


@pytest.mark.parametrize("op", ["lt", "eq", "ge"])
def test_comparisons_convert_operands_as_aten(op):
    check_program(comparison_program(op), INPUTS, backends=("onnx", "c[AVX2]", "c[DEFAULT]", "torch"))


def test_triton_comparisons_convert_operands_as_aten(tmp_path):  # (Triton's interpreter on CPU)
    pytest.importorskip("triton")
    from kiln.compiler import compile as compile_program
    program = comparison_program("lt")
    model = compile_program(program, target="triton", output=tmp_path / "compare")
    for got, want in zip(model(*INPUTS), program(*INPUTS)):
        np.testing.assert_array_equal(np.asarray(got), want)
