"""lower-complex: complex values as (real, imaginary) pairs for C and ONNX. Llama 4 and DeepSeek-V2 rotate their
queries and keys as complex products (torch.polar, view_as_complex, view_as_real), which the interpreter computes
in numpy's complex types and the backends, which have none, computed nowhere. Each case: torch.export, save,
kiln.load; the interpreter against torch eager, the lowered program has no complex value left, and C and ONNX
against the interpreter."""

from __future__ import annotations

import pytest

import kiln
from kiln.codegen.onnx.export import MissingLoweringError
from kiln.ir.errors import UnsupportedError
from kiln.passes import run
from tests.fuzz.differential import check_program
from tests.serde.support import assert_same

torch = pytest.importorskip("torch")


def _rope(x, angles):  # Llama 4's apply_rotary_emb, scaled as its rotary embedding scales
    freqs = torch.polar(torch.ones_like(angles), angles) * 0.5
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(pairs * freqs[:, None, :]).flatten(2)


def _shapes_and_sums(x, angles):  # the shape ops, and sums with real tensors and numbers
    z = torch.view_as_complex(x.reshape(5, 3, 4, 2)[:, 0])  # [5, 4]
    w = torch.polar(angles.abs() + 0.1, angles)  # [5, 4]
    y = (z * w).permute(1, 0).transpose(0, 1)[1:, :3]  # [4, 3]
    y = y.unsqueeze(0).expand(2, -1, -1) + angles[1:, :3]  # complex + real
    y = (y - 0.25)[1].select(0, 2) - z[0, :3] * 2.0  # complex - number, select, complex - complex
    return torch.view_as_real(-y.to(torch.complex64).contiguous())


def _fnet_mix(x, angles):  # FNet's token mixing: the real part of a 2-D FFT over (sequence, hidden)
    return torch.fft.fftn(x, dim=(1, 2)).real


def _spectra(x, angles):  # every transform kind, sizes cut and padded, each norm, abs, imag
    spectrum = torch.fft.rfft(x, n=6, norm="ortho")  # [5, 3, 4], cut to 6
    round_trip = torch.fft.irfft(spectrum, n=7, dim=-1)  # [5, 3, 7], odd length
    mixed = torch.fft.ifft2(torch.fft.fft(x, n=11, dim=1), norm="forward")  # [5, 11, 8], padded
    full = torch.fft.fftn(torch.view_as_complex(x.reshape(5, 3, 4, 2)), s=[4, 5], dim=[0, 2])
    return (round_trip, mixed.imag, spectrum.abs(), torch.fft.irfftn(full, dim=[0, 2], norm="backward"),
            torch.fft.fft(angles).real)


@pytest.mark.parametrize("fn", [_rope, _shapes_and_sums, _fnet_mix, _spectra], ids=lambda fn: fn.__name__.strip("_"))
def test_complex_values_run_as_pairs(fn, tmp_path):
    class Wrap(torch.nn.Module):
        def forward(self, x, angles):
            return fn(x, angles)

    x, angles = torch.randn(5, 3, 8), torch.randn(5, 4)
    torch.export.save(torch.export.export(Wrap(), (x, angles)), tmp_path / "model.pt2")
    program = kiln.load(tmp_path / "model.pt2")
    assert_same(program(x.numpy(), angles.numpy()), fn(x, angles))
    lowered = run(program, "lower-complex")
    assert not [op.name for op in lowered.nodes() for v in op.results if v.type.dtype.is_complex]
    assert_same(lowered(x.numpy(), angles.numpy()), fn(x, angles))
    check_program(program, [x.numpy(), angles.numpy()], backends=("c", "onnx"))


def test_a_complex_output_is_refused_by_name(tmp_path):
    class Polar(torch.nn.Module):
        def forward(self, r, t):
            return torch.polar(r, t)

    r = torch.rand(3)
    torch.export.save(torch.export.export(Polar(), (r, r)), tmp_path / "model.pt2")
    program = kiln.load(tmp_path / "model.pt2")
    with pytest.raises(UnsupportedError, match="complex program input or output") as raised:
        kiln.compile(program, output=tmp_path / "package")
    assert "view_as_real" in raised.value.fix
    with pytest.raises(MissingLoweringError, match=r"aten\.polar\.default \(complex values"):  # ONNX names the op
        kiln.onnx.export(program)
