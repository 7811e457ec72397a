"""trunc of a value in (-1, 0) is -0 in ATen; ONNX has no Trunc, and kiln's lowering took Ceil from Where's true
branch, where onnxruntime's Where turns -0 into +0. A floor division by trunc(-0.418) then gave +inf where ATen
divides by -0 (-inf, and relu of it 0). The Ceil is now Where's false branch (trunc, truncating division and the
average pools' rounding share one helper). Found by the differential fuzzer (seed 10100, 7 programs)."""

import numpy as np
import pytest

import kiln
from kiln.codegen.onnx import export_program
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program
from tests.torch_oracle import requires_torch, torch

aten = ops.aten
VALUES = np.array([-0.418, -0.0, 0.0, 0.7, -1.5, 2.5, -np.inf, np.inf, np.nan, -0.999], np.float32)


@requires_torch
@pytest.mark.parametrize("dtype", [kiln.float32, kiln.float64])
def test_trunc_and_truncating_division_keep_negative_zero(dtype):
    builder = GraphBuilder()
    x = builder.add_input('x', TensorType.of([len(VALUES)], dtype))
    with builder:
        truncated = aten.trunc.default(x)
        divided = aten.floor_divide.default(aten.full_like.default(x, 2.6), truncated)
        quotient = aten.div.Tensor_mode(x, aten.full_like.default(x, 3.0), rounding_mode="trunc")
    program = builder.build([truncated, divided, quotient])
    inputs = [VALUES.astype(np.dtype(dtype.numpy))]
    t = torch.from_numpy(inputs[0])
    expected = [torch.trunc(t), torch.floor_divide(torch.full_like(t, 2.6), torch.trunc(t)),
                torch.div(t, torch.full_like(t, 3.0), rounding_mode="trunc")]
    for got, want in zip(program(*inputs), expected):
        np.testing.assert_array_equal(got, want.numpy())
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want.numpy()))
    check_program(program, inputs, backends=("onnx",))
    for got, want in zip(export_program(program).run(inputs), expected):  # closeness counts -0 equal to +0
        numbers = ~np.isnan(want.numpy())
        np.testing.assert_array_equal(np.signbit(got[numbers]), np.signbit(want.numpy()[numbers]))
