"""cosine_similarity of integer or bool tensors: ATen refuses them ("expected common dtype to be floating point, yet
common dtype is Byte"), in eager and in its meta rule, but kiln's meta rule promoted them to float32 and ran. A
program kiln made then failed in torch. kiln now refuses them with ATen's message. Found by the differential
fuzzer (seed 9100)."""

import numpy as np
import pytest

import kiln
from kiln.ir.errors import DTypeError
from kiln.ir.registry import ops
from tests.torch_oracle import requires_torch, torch


@requires_torch
@pytest.mark.parametrize("first,second", [("uint8", "uint8"), ("int64", "int32"), ("bool", "bool"),
                                          ("int8", "float32"), ("float16", "float64")])
def test_cosine_similarity_takes_floating_common_dtypes_only(first, second):
    a = np.arange(6).reshape(2, 3).astype(first)
    b = (np.arange(6).reshape(2, 3) % 4).astype(second)
    common = np.result_type(a.dtype, b.dtype)
    if common.kind == "f":
        got = np.asarray(ops.aten.cosine_similarity.default(kiln.tensor(a), kiln.tensor(b)))
        want = torch.cosine_similarity(torch.from_numpy(a), torch.from_numpy(b)).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-3 if "float16" in (first, second) else 1e-6)
        return
    with pytest.raises(RuntimeError, match="expected common dtype to be floating point"):
        torch.cosine_similarity(torch.from_numpy(a), torch.from_numpy(b))
    with pytest.raises(DTypeError, match="expected common dtype to be floating point"):
        ops.aten.cosine_similarity.default(kiln.tensor(a), kiln.tensor(b))


DTYPES = ("float64", "float32", "float16", "bfloat16", "int32", "int64", "bool")


@requires_torch
@pytest.mark.parametrize("first_rank,second_rank", [(0, 2), (2, 0), (0, 0), (2, 2)])
def test_cosine_similarity_promotes_its_expanded_operands(first_rank, second_rank):
    """ATen converts integral operands to the common dtype, then expands both: a 0-dim operand promotes as a tensor,
    float64[] with float32[3, 5] gives float64, where kiln's elementwise promotion gave float32 (a program kiln made
    then returned float64 in torch). Found by the differential fuzzer (seed 14000)."""
    from kiln.ir.registry import REGISTRY
    from kiln.ir.types import TensorType
    shapes = {0: [], 2: [3, 5]}
    for first in DTYPES:
        for second in DTYPES:
            a = torch.ones(shapes[first_rank], dtype=getattr(torch, first))
            b = torch.ones(shapes[second_rank], dtype=getattr(torch, second))
            if not (a.dtype.is_floating_point or b.dtype.is_floating_point):
                continue  # refused by both (above)
            want = torch.cosine_similarity(a, b, 0).dtype
            got = REGISTRY["aten.cosine_similarity.default"].meta(
                TensorType.of(shapes[first_rank], getattr(kiln, first)),
                TensorType.of(shapes[second_rank], getattr(kiln, second)), 0).dtype
            assert got is getattr(kiln, str(want).removeprefix("torch.")), (first, second)


def test_cosine_similarity_of_a_float64_scalar_runs_in_float64_everywhere():
    from kiln.ir.program import GraphBuilder
    from kiln.ir.types import TensorType
    from tests.fuzz.differential import check_program
    builder = GraphBuilder()
    x = builder.add_input('x', TensorType.of([], kiln.float64))
    y = builder.add_input('y', TensorType.of([3, 5], kiln.float32))
    with builder:
        z = ops.aten.cosine_similarity.default(x, y, 0)
    program = builder.build([z])
    inputs = [np.array(-1.5), np.random.default_rng(14000).standard_normal((3, 5)).astype(np.float32)]
    assert program(*inputs).dtype == np.float64
    check_program(program, inputs, backends=("onnx", "c[AVX2]", "torch"))
