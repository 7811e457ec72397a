"""leaky_relu with a NaN or infinite negative_slope in ONNX: ATen computes x * slope wherever x > 0 fails, so a zero
gives 0 * NaN (or 0 * inf) = NaN, where onnxruntime's LeakyRelu passes the zero through; a linear layer and isnan
then turned that into a wrong integer. The lowering now emits Where(x > 0, x, x * slope) for a non-finite slope.
Found by the differential fuzzer (seed 9101)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("slope", [float("nan"), float("inf"), float("-inf")])
def test_leaky_relu_of_zero_with_a_nonfinite_slope(slope):
    builder = GraphBuilder()
    x0 = builder.add_input("x0", TensorType.of([2, 3], kiln.float32))
    with builder:
        v0 = aten.leaky_relu.default(x0, slope)
    program = builder.build([v0])
    x = np.array([[0.0, -0.0, 1.5], [-2.0, 0.0, 3.0]], np.float32)
    check_program(program, [x], backends=("onnx", "torch"))
