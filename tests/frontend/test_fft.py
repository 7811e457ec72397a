"""kiln.fft against torch.fft, and a kiln.nn model that mixes tokens with FFTs (FNet's block) through export, C
and ONNX with a dynamic sequence length, where the transforms run as DFT matrix products (lower-complex)."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn as nn
from kiln.ir.errors import DTypeError, OpArgumentError
from tests.fuzz.differential import check_program
from tests.serde.support import assert_same

torch = pytest.importorskip("torch")

# Arguments per function family: (args, kwargs) applied to a real [3, 6, 8] input (complex for the inverse real
# transforms, which take spectra).
ONE_D = [((), {}), ((5,), {"dim": 1, "norm": "ortho"}), ((11,), {"dim": 0, "norm": "forward"})]
TWO_D = [((), {}), (([4, 10],), {"dim": (0, 2), "norm": "ortho"})]
N_D = [((), {}), ((), {"dim": (1, 2)}), (([5, 6],), {"norm": "forward"}), (([-1, 9],), {"dim": (0, 1)})]
CASES = {name: {"": ONE_D, "2": TWO_D, "n": N_D}[name.removeprefix("i").removeprefix("r").removeprefix("fft")]
         for name in kiln.fft.__all__}


def _input(name: str, rng: np.random.Generator) -> np.ndarray:
    x = rng.standard_normal((3, 6, 8)).astype(np.float32)
    return (x + 1j * rng.standard_normal(x.shape)).astype(np.complex64) if name.startswith("irfft") else x


@pytest.mark.parametrize("name", kiln.fft.__all__)
def test_every_kiln_fft_function_matches_torch(name):
    rng = np.random.default_rng(0)
    for args, kwargs in CASES[name]:
        x = _input(name, rng)
        expected = getattr(torch.fft, name)(torch.from_numpy(x), *args, **kwargs)
        assert_same(getattr(kiln.fft, name)(kiln.from_numpy(x), *args, **kwargs).numpy(), expected)


def test_complex_values_and_their_parts_match_torch():
    rng = np.random.default_rng(1)
    r, t = (rng.random((4, 5)).astype(np.float32) for _ in range(2))
    z = kiln.polar(kiln.from_numpy(r), kiln.from_numpy(t))
    reference = torch.polar(torch.from_numpy(r), torch.from_numpy(t))
    for ours, theirs in ((z.real, reference.real), (z.imag, reference.imag), (z.abs(), reference.abs()),
                         (kiln.view_as_real(z), torch.view_as_real(reference)),
                         (kiln.view_as_complex(kiln.view_as_real(z)).imag, reference.imag),
                         (kiln.from_numpy(r).real, torch.from_numpy(r).real)):
        assert_same(ours.numpy(), theirs)


def test_bad_fft_arguments_are_refused_as_torch_refuses_them():
    x = kiln.randn(3, 4)
    with pytest.raises(DTypeError, match="rfft expects a real input tensor"):
        kiln.fft.rfft(kiln.polar(x, x))
    with pytest.raises(OpArgumentError, match='Invalid normalization mode: "sideways"'):
        kiln.fft.fft(x, norm="sideways")
    with pytest.raises(OpArgumentError, match="must have the same length"):
        kiln.fft.fftn(x, s=[4], dim=(0, 1))
    with pytest.raises(DTypeError, match="imag is not implemented for tensors with non-complex dtypes"):
        x.imag


class FourierBlock(nn.Module):
    """FNet's encoder block: the real part of a 2-D FFT over (sequence, hidden), then a feed-forward layer; plus a
    one-sided spectrum's magnitude pooled over the sequence, and an inverse transform back."""

    def __init__(self, hidden: int = 16):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.ff = nn.Linear(hidden, hidden)

    def forward(self, x):
        mixed = self.norm(x + kiln.fft.fftn(x, dim=(1, 2)).real)
        spectrum = kiln.fft.rfft(mixed, dim=1, norm="ortho")
        smooth = kiln.fft.irfft(spectrum * 0.5, n=x.shape[1], dim=1, norm="ortho")
        return self.ff(smooth) + spectrum.abs().mean(1, keepdim=True)


def test_a_fourier_block_exports_with_a_dynamic_length_and_runs_in_c_and_onnx():
    model = FourierBlock().eval()
    seq = kiln.Dim("seq", min=2, max=64)
    x = kiln.randn(2, 7, 16)
    program = kiln.export(model, (x,), dynamic_shapes={"x": {1: seq}})
    for length in (7, 12):
        inputs = [np.random.default_rng(length).standard_normal((2, length, 16)).astype(np.float32)]
        expected = model(kiln.from_numpy(inputs[0])).numpy()
        np.testing.assert_allclose(program.module()(inputs[0]), expected, rtol=1.3e-6, atol=1e-5)
        check_program(program, inputs, backends=("c", "onnx"))
