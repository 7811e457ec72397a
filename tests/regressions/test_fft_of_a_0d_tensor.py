"""torch.fft's functions on a 0-d tensor: the one-dimensional ones refuse it as ATen does ("Dimension specified as -1
but tensor has no dimensions": its dims are wrapped without a 0-d tensor's allowance), where kiln's meta rule failed
with an IndexError; fftn and ifftn over no dims are the identity, which kiln refused, and rfftn / irfftn need a
dim, in ATen's words. Found by the differential fuzzer (seed 4242: a meta rule raised a non-KilnError)."""

import numpy as np
import pytest

import kiln
from kiln.ir.errors import KilnError

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("name", ["fft", "ifft", "rfft", "irfft"])
@pytest.mark.parametrize("dim", [-1, 0])
def test_one_dimensional_transforms_refuse_a_0d_tensor(name, dim):
    with pytest.raises(IndexError, match=f"Dimension specified as {dim} but tensor has no dimensions"):
        getattr(torch.fft, name)(torch.tensor(2.0), dim=dim)
    with pytest.raises(KilnError, match=f"Dimension specified as {dim} but tensor has no dimensions"):
        getattr(kiln.fft, name)(kiln.tensor(np.float32(2.0)), dim=dim)


@pytest.mark.parametrize("name", ["fftn", "ifftn"])
def test_transforms_over_no_dims_are_the_identity(name):
    for x, dim in ((np.float32(2.5), None), (np.arange(6, dtype=np.float32).reshape(2, 3), [])):
        got = getattr(kiln.fft, name)(kiln.tensor(x), dim=dim)
        torch.testing.assert_close(torch.from_numpy(got.numpy()), getattr(torch.fft, name)(torch.tensor(x),
                                                                                                  dim=dim))


@pytest.mark.parametrize("name", ["rfftn", "irfftn"])
def test_one_sided_transforms_need_a_dim(name):
    with pytest.raises(RuntimeError, match=f"{name} must transform at least one axis"):
        getattr(torch.fft, name)(torch.ones(3), dim=[])
    with pytest.raises(KilnError, match=f"{name} must transform at least one axis"):
        getattr(kiln.fft, name)(kiln.tensor(np.ones(3, np.float32)), dim=[])
