"""`nonzero(x).squeeze()` of a 0-d x: the result's rows are a data-dependent u0 in [0, 1], which the trace cannot
decide is 1, so squeeze keeps that dim (torch's guard_or_false) and the program says [u0, 0]. When x is nonzero,
u0 is 1 at run time and the interpreter's kernel dropped the dim, crashing against the declared [1, 0]. The
interpreter now follows the trace's decision, as ONNX and C do. Found by the differential fuzzer (seed 9100)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("value", [1.89, 0.0])
def test_squeeze_keeps_a_data_dependent_dim_that_is_one_at_run_time(value):
    builder = GraphBuilder()
    x = builder.add_input('x', TensorType.of([], kiln.float32))
    with builder:
        rows = aten.nonzero.default(x)
        squeezed = aten.squeeze.default(rows)
        squeezed_dim = aten.squeeze.dim(rows, 0)
        clamped = aten.clamp.default(squeezed, -1, 2)
    program = builder.build([clamped, squeezed_dim])
    (out, out_dim) = program.module()(np.asarray(value, np.float32))
    assert out.shape == out_dim.shape == ((1, 0) if value else (0, 0))
    check_program(program, [np.asarray(value, np.float32)], backends=("onnx", "pt2"))


def test_torch_eager_squeezing_what_its_export_kept_is_told_apart(tmp_path):
    """torch's exported graph says [u0, 0] too, but its eager kernel squeezes the run-time 1: the fuzzer's torch
    backend counts that as torch's refusal, not as kiln's mismatch."""
    from tests.fuzz.differential import TorchRefused, _torch
    builder = GraphBuilder()
    x = builder.add_input('x', TensorType.of([], kiln.float32))
    with builder:
        squeezed = aten.squeeze.default(aten.nonzero.default(x))
    program = builder.build([squeezed])
    with pytest.raises(TorchRefused, match="data-dependent dim"):
        _torch(program, [np.asarray(1.0, np.float32)], tmp_path)
