"""Integer pow in ONNX: onnxruntime's integer Pow goes through double, so 93 ** 9 in int8 came out 0 where ATen's
wrapping square-and-multiply gives 125, and 0 ** -7 came out INT64_MIN where ATen gives 0. kiln now lowers integer
pow as ATen's `powi` (kiln/codegen/onnx/lowerings.py _integer_pow). Found by the differential fuzzer (seed 800)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten

BASES = [0, 1, -1, 2, 3, -3, 93, 127, -128, 5, 7, -7, 2, 3, -2, 6]
EXPONENTS = [0, -7, -3, -2, 9, 65, 9, 63, 3, 1, 100, -1, 64, 62, 7, 8]


@pytest.mark.parametrize("dtype", [kiln.int8, kiln.uint8, kiln.int16, kiln.int32, kiln.int64])
def test_integer_pow_wraps_as_aten(dtype):
    info = np.iinfo(dtype.numpy)
    bases, exponents = np.array(BASES), np.array(EXPONENTS)
    if info.min == 0:
        bases, exponents = np.abs(bases), np.abs(exponents)
    bases = np.clip(bases, info.min, info.max).astype(dtype.numpy)
    exponents = exponents.astype(dtype.numpy)
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of([len(BASES)], dtype))
    x1 = builder.add_input('x1', TensorType.of([len(BASES)], dtype))
    with builder:
        results = [aten.pow.Tensor_Tensor(x0, x1), aten.pow.Tensor_Scalar(x0, 9), aten.pow.Tensor_Scalar(x0, 0),
                   aten.pow.Tensor_Scalar(x0, 1), aten.pow.Tensor_Scalar(x0, 12), aten.pow.Scalar(3, x1)]
    program = builder.build(results)
    backends = ("onnx", "torch") if dtype is kiln.int16 else ("onnx", "c[AVX2]", "torch")  # (C has no int16)
    check_program(program, [bases, exponents], backends=backends)
