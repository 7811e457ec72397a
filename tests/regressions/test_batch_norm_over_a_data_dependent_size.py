"""A batch norm (training statistics) over a boolean-mask index's result: the mask's count is a data-dependent
u0, and the batch norm decomposition's check that the input is not empty asked `u0 > 0`, so compiling for C or
Triton crashed with a GuardError. Triton cannot size a data-dependent buffer and refuses the program with the
UnsupportedError that names the op and the fix; C reads the count while running, so it runs the program as the
interpreter and ONNX do. Found by the differential fuzzer (seed 10000, 3 programs x 6 backends)."""

import numpy as np
import pytest

import kiln
from kiln.ir.errors import UnsupportedError
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


def _program():
    builder = GraphBuilder()
    x = builder.add_input('x', TensorType.of([2, 3, 4], kiln.float32))
    mask = builder.add_input('mask', TensorType.of([3, 4], kiln.bool))
    with builder:
        picked = aten.index.Tensor(x, [None, mask])
        normed = aten.batch_norm.default(picked, None, None, None, None, True, 0.1, 1e-05, True)
    return builder.build([normed])


def test_triton_refuses_it_with_the_data_dependent_op_named(tmp_path):
    pytest.importorskip("triton")
    with pytest.raises(UnsupportedError, match="depends on the input values") as caught:
        kiln.compile(_program(), target="triton", output=tmp_path / "pkg")
    assert "interpreter" in caught.value.fix


@pytest.mark.parametrize("density", [0.5, 1.0])
def test_the_interpreter_onnx_and_c_run_it(density):
    rng = np.random.default_rng(0)
    check_program(_program(), [rng.standard_normal((2, 3, 4)).astype(np.float32), rng.random((3, 4)) < density],
                  backends=("onnx", "c"))
