"""Batch norm (training statistics) of a slice `[2:4]` of a symbolic channel dim s2 in [2, 16]: its channel count
Min(4, s2) - 2 may be 0, and the C/Triton legalization wrote a group norm with one group per channel, whose
meta rule (like ATen) refuses `group > 0` it cannot prove: every compiled backend crashed with "group must be
positive". Such a channel count now takes mean/var reductions. Found by the differential fuzzer (seed 10100,
3 programs x 6 backends)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import available_backends, check_program

aten = ops.aten


def _program(dtype, affine):
    builder = GraphBuilder()
    s2 = builder.shape_env.create_symbol(4, name="s2", min=2, max=16)
    x = builder.add_input("x", TensorType.of([2, s2, 3], dtype))
    params = [builder.add_input(name, TensorType.of([s2], kiln.float32)) for name in ("weight", "bias")] if affine \
        else []
    with builder:
        sliced = aten.slice.Tensor(x, 1, 2, 4)
        params = [aten.slice.Tensor(p, 0, 2, 4) for p in params] or [None, None]  # as many as the channels
        normed = aten.batch_norm.default(sliced, *params, None, None, True, 0.1, 1e-05, True)
    return builder.build([normed])


@pytest.mark.parametrize("s2", [4, 2, 3])  # the slice keeps 2 channels, none, one
@pytest.mark.parametrize("dtype, affine", [(kiln.float32, False), (kiln.float32, True), (kiln.float16, True)])
def test_every_backend_agrees_with_the_interpreter(s2, dtype, affine):
    rng = np.random.default_rng(s2)
    inputs = [rng.standard_normal((2, s2, 3)).astype(dtype.numpy)]
    if affine:
        inputs += [rng.standard_normal(s2).astype(np.float32) for _ in range(2)]
    refused = set()
    if affine and s2 == 2:  # torch's batch norm indexes the weight of no channel (select(): index 0 out of range)
        refused.add("torch")
    if dtype is kiln.float16:  # kiln's C computes no float16 (it refuses the program)
        refused.update(b.name for b in available_backends() if b.name.startswith("c["))
    backends = [b.name for b in available_backends() if b.name not in refused]
    check_program(_program(dtype, affine), inputs, backends=backends)
