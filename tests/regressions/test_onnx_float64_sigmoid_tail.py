"""float64 sigmoid far below 0: onnxruntime's Sigmoid (1.32) gives 2.2e-16 at -36 (ATen: 2.3e-16) and 0 below -36.7,
so an rsqrt of it was inf and a sin of that NaN where ATen's values are finite. kiln's ONNX file computes float64
sigmoid as 1 / (1 + exp(-x)). Found by a differential fuzz run (seed 9601); float32 keeps onnxruntime's fused
Sigmoid (docs/onnx.md)."""

import numpy as np

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program
from tests.torch_oracle import requires_torch, torch

aten = ops.aten


@requires_torch
def test_float64_sigmoid_keeps_its_tail():
    x = np.array([-700.0, -604.5, -37.0, -36.0, -20.0, -1e-3, 0.0, 5.0, 40.0, np.inf, -np.inf, np.nan])
    builder = GraphBuilder()
    value = builder.add_input("x", TensorType.of([x.size], kiln.float64))
    with builder:
        sigmoid = aten.sigmoid.default(value)
        amplified = aten.sin.default(aten.rsqrt.default(sigmoid))  # the fuzzer's chain: the tail's scale matters
    program = builder.build([sigmoid, amplified])
    expected = torch.sigmoid(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(program(x)[0], expected, rtol=1e-15, atol=0, equal_nan=True)
    check_program(program, [x], backends=("onnx",))
