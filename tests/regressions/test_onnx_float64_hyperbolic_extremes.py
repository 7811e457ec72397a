"""float64 asinh and acosh in ONNX (onnxruntime has no float64 kernels for them, so kiln writes them out): asinh
squared its argument, so ±inf and anything past 1e154 gave inf/inf = NaN, and acosh gave inf past 1e154 where
ATen gives log(2a). Above 2^28 both are now log(a) + log 2, and asinh keeps -0 (its zero is taken from Where's
false branch: onnxruntime's true branch turns -0 into +0). Found by the differential fuzzer (asinh(-inf), seed
9000)."""

import numpy as np
import pytest

import kiln
from kiln.codegen.onnx import export_program
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program
from tests.torch_oracle import requires_torch, torch

EXTREMES = np.array([-np.inf, np.inf, -0.0, 0.0, 1e300, -1e300, 3e8, 2.0 ** 28, -1e-300, np.nan, 1e-10, 3.0, -0.5,
                     1.0, 1e20], np.float64)


@requires_torch
@pytest.mark.parametrize("name", ["asinh", "acosh"])
def test_float64_inverse_hyperbolics_at_the_extremes(name):
    builder = GraphBuilder()
    x = builder.add_input('x', TensorType.of([len(EXTREMES)], kiln.float64))
    with builder:
        y = getattr(ops.aten, name).default(x)
    program = builder.build([y])
    want = getattr(torch, name)(torch.from_numpy(EXTREMES)).numpy()
    torch.testing.assert_close(torch.from_numpy(program.module()(EXTREMES)), torch.from_numpy(want), equal_nan=True)
    check_program(program, [EXTREMES], backends=("onnx",))
    got = export_program(program).run([EXTREMES])[0]  # (closeness counts -0 equal to +0: the signs, too)
    numbers = ~np.isnan(want)
    np.testing.assert_array_equal(np.signbit(got[numbers]), np.signbit(want[numbers]))
