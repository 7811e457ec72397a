"""FFTs over an empty dim. ATen refuses a transform of length 0 whether the length is given (`s`) or the input's own
("Invalid number of data points (0) specified"); kiln checked given lengths only, so `fft_irfft2` of a [2, 0, 2]
tensor reached numpy, which raised a ValueError in the interpreter. The meta rule now checks every transformed length
(kiln/ir/ops/fft.py `plan`). Found by the differential fuzzer (seed 8484)."""

import numpy as np
import pytest
import torch

from kiln.ir.errors import KilnError
from kiln.ir.registry import ops

aten = ops.aten


@pytest.mark.parametrize("op, shape, complex_input, kwargs", [
    ("fft_irfft2", (2, 0, 2), False, {}),
    ("fft_irfft2", (2, 0, 1), False, {}),
    ("fft_rfft2", (2, 0, 2), False, {}),
    ("fft_fft2", (2, 0, 2), True, {}),
    ("fft_ifft", (0,), True, {}),
    ("fft_irfft", (2, 0, 2), False, {"dim": 1}),
])
def test_an_empty_transformed_dim_is_refused_as_torch_refuses_it(op, shape, complex_input, kwargs):
    x = np.zeros(shape, np.complex64 if complex_input else np.float32)
    with pytest.raises(RuntimeError) as refused:
        getattr(torch.fft, op.removeprefix("fft_"))(torch.from_numpy(x), **kwargs)
    with pytest.raises(KilnError) as kiln_refused:
        getattr(aten, op).default(x, **kwargs)
    assert str(refused.value).splitlines()[0] in str(kiln_refused.value)


def test_an_empty_dim_that_is_not_transformed_is_taken():
    """(torch's MKL kernel refuses an empty batch dim, a limit of that kernel: its meta function gives the shape)"""
    x = np.zeros((0, 4), np.float32)
    expected = torch.fft.rfft(torch.zeros(0, 4, device="meta"), dim=1)
    got = np.asarray(aten.fft_rfft.default(x, dim=1))
    assert got.shape == tuple(expected.shape) and got.dtype == np.complex64
