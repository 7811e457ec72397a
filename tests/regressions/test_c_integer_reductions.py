"""Reductions over integer and bool tensors in C. Hugging Face's CLIP text model pools the hidden state at the
argmax of its token ids, and the C backend refused the argmax ("only floating reductions"). C now runs argmax,
argmin, max/min.dim, amax, amin, sum and prod over integers in their own type: a double accumulator would tie
int64 values above 2^53, and sums and products wrap as ATen's int64 arithmetic does."""

import numpy as np
import pytest

from kiln.ir import dtypes
from kiln.codegen.target import INTEGER_REDUCTIONS
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import REGISTRY, call_op
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

DTYPES = ["int64", "int32", "int8", "uint8", "bool"]
REFUSED = {("aten.argmax.default", "bool"), ("aten.argmin.default", "bool")}  # as ATen refuses them
BIG = 1 << 62  # int64s a double cannot tell apart: 2^62 + 1 and 2^62 + 2 round to the same double


def _values(dtype: str, rng: np.random.Generator) -> np.ndarray:
    if dtype == "bool":
        return rng.random((3, 5)) < 0.5
    info = np.iinfo(dtype)
    values = rng.integers(max(info.min, -100), min(info.max, 100), (3, 5)).astype(dtype)
    if dtype == "int64":
        values[0] = [BIG + 1, BIG + 3, BIG + 2, BIG + 3, BIG]  # the max ties at 1 and 3: the first wins
        values[1, :2] = [BIG, BIG]  # the sum wraps around
    return values


def _arguments(name: str, dim: int) -> list:
    if name in ("aten.sum.dim_IntList", "aten.amax.default", "aten.amin.default"):
        return [[dim]]
    if name == "aten.prod.default":
        return []
    return [dim]


@pytest.mark.parametrize("dim", [1, 0])
def test_integer_reductions_in_c(dim):
    rng = np.random.default_rng(dim)
    builder = GraphBuilder()
    values, inputs, outputs = [], [], []
    for dtype in DTYPES:
        array = _values(dtype, rng)
        values.append(array)
        inputs.append(builder.add_input(f"x_{dtype}", TensorType.of(array.shape, dtypes.dtype(array.dtype))))
    with builder:
        for name in sorted(INTEGER_REDUCTIONS):
            for dtype, x in zip(DTYPES, inputs):
                if (name, dtype) in REFUSED:
                    continue
                result = call_op(REGISTRY[name], (x, *_arguments(name, dim)), {})
                outputs += list(result) if isinstance(result, (list, tuple)) else [result]
    program = builder.build(outputs)
    check_program(program, values, backends=("c",))
