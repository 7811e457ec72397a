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
