"""ONNX logsumexp over a symbolic dim that is 0 at run time gave NaN where ATen gives -inf. The decomposition takes
the maximum first (amax; only a dim known to be empty skips it), and the amax lowering flags a NaN anywhere in the
window as ReduceMax of int32 IsNaN flags cast to bool: ReduceMax of no flags is INT32_MIN, which casts to true. The
flag is now compared with 0. Found by the differential fuzzer (seed 20000, 11 programs)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


def _program(dims, with_amax):
    builder = GraphBuilder()
    s0 = builder.shape_env.create_symbol(2, name="s0", min=0, max=8)
    x = builder.add_input("x", TensorType.of([5, s0], kiln.float32))
    with builder:
        results = [aten.logsumexp.default(x, dims)]
        if with_amax:  # ATen refuses amax over an empty dim, so only where the dim holds values
            results.append(aten.amax.default(x, [0]))
    return builder.build(results)


@pytest.mark.parametrize("dims", [[0, -1], [1]])
def test_logsumexp_of_an_empty_dim_is_minus_infinity(dims):
    check_program(_program(dims, with_amax=False), [np.zeros((5, 0), np.float32)], backends=["onnx"])


@pytest.mark.parametrize("dims", [[0, -1], [1]])
def test_a_nan_still_wins_the_window(dims):
    values = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    values[2, 1] = np.nan
    check_program(_program(dims, with_amax=True), [values], backends=["onnx"])
