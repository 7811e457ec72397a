"""The Triton backend's math helpers at their edges, against torch eager: pow (float IEEE special cases and signs,
integer powi with negative exponents and wrap-around), atan2 (signed zeros, infinities, NaN), asin/acos/atan (the
domain's ends). The interpreter has no libdevice, so these are kiln's own core-`tl` forms (render.PRELUDE)."""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")
torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import kiln  # noqa: E402
from kiln.compiler import compile as compile_program  # noqa: E402

SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, -3.0, 2.5, -2.5, 1e-3, 7.25, -7.0, 1e20, -1e20,
           float("inf"), float("-inf"), float("nan")]


class Binary(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x, y):
        return self.fn(x, y)


class Unary(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def _grid(dtype) -> tuple[torch.Tensor, torch.Tensor]:
    pairs = list(itertools.product(SPECIAL, SPECIAL))
    return (torch.tensor([a for a, _ in pairs], dtype=dtype), torch.tensor([b for _, b in pairs], dtype=dtype))


def _run(module, inputs, tmp_path):
    program = kiln.from_torch(module, inputs)
    model = compile_program(program, target="triton", output=tmp_path / "pkg")
    return torch.from_numpy(np.asarray(model(*(t.numpy() for t in inputs))))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("fn", [torch.pow, torch.atan2], ids=["pow", "atan2"])
def test_binary_special_values_match_torch(fn, dtype, tmp_path):
    x, y = _grid(dtype)
    torch.testing.assert_close(_run(Binary(fn), (x, y), tmp_path), fn(x, y), equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_pow_over_a_wide_range_keeps_its_precision(dtype, tmp_path):
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(4096, generator=generator, dtype=dtype) * 20
    y = torch.rand(4096, generator=generator, dtype=dtype) * 60 - 30  # results up to ~1e39 (inf in float32)
    torch.testing.assert_close(_run(Binary(torch.pow), (x, y), tmp_path), torch.pow(x, y))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_integer_pow_is_powi(dtype, tmp_path):
    base = torch.tensor([0, 1, -1, 2, -2, 3, -3, 7, 10, 2, -2, 1, -1, 5], dtype=dtype)
    exponent = torch.tensor([0, -3, -3, -1, -2, 5, 4, 30, 25, 62, 63, 0, 8, 3], dtype=dtype)  # wraps around
    got = _run(Binary(torch.pow), (base, exponent), tmp_path)
    assert torch.equal(got, torch.pow(base, exponent))


def test_scalar_base_pow_matches_torch(tmp_path):
    exponent = torch.tensor(SPECIAL, dtype=torch.float32)
    for base, name in ((2.5, "a"), (-2.0, "b"), (0.0, "c")):
        got = _run(Unary(lambda e, base=base: torch.pow(base, e)), (exponent,), tmp_path / name)
        torch.testing.assert_close(got, torch.pow(base, exponent), equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("fn", [torch.asin, torch.acos, torch.atan], ids=["asin", "acos", "atan"])
def test_inverse_trigonometry_matches_torch(fn, dtype, tmp_path):
    edges = torch.tensor(SPECIAL + [0.9999999, -0.9999999, 1.0000001, 0.66, 2.414213562373095, 2.5, 1e-30],
                         dtype=dtype)
    x = torch.cat([edges, torch.linspace(-1, 1, 2001, dtype=dtype), torch.linspace(-50, 50, 999, dtype=dtype)])
    torch.testing.assert_close(_run(Unary(fn), (x,), tmp_path), fn(x), equal_nan=True)


INF = float("inf")


@pytest.mark.parametrize("dtype,exponent", [(torch.float32, e) for e in (-1, 4, 7, -3, 1.7, -0.25, 0.5, 2, INF, -INF,
                                                                         float("nan"))]
                         + [(torch.int64, e) for e in (4, 7, 2, 0)])  # (torch refuses negative integer powers)
def test_tensor_scalar_pow_takes_every_exponent(dtype, exponent, tmp_path):
    """Against the interpreter (the exponent in the tensor's dtype) and against torch eager below 1e10: ATen's AVX2
    vector kernel rounds a float32 tensor's exponent to float32 as the interpreter does, its AVX-512 kernel keeps the
    double, and the two are 2e-6 apart at 1e20 ** 1.7, so there torch disagrees with itself across CPUs."""
    x = torch.tensor(SPECIAL) if dtype.is_floating_point else torch.arange(-600, 700, 7, dtype=dtype)  # wraps
    module = Unary(lambda t: torch.pow(t, exponent))
    got = _run(module, (x,), tmp_path)
    expected = torch.from_numpy(np.asarray(kiln.from_torch(module, (x,))(x.numpy())))
    torch.testing.assert_close(got, expected, equal_nan=True)
    moderate = x.abs() < 1e10 if dtype.is_floating_point else torch.ones_like(x, dtype=torch.bool)
    torch.testing.assert_close(got[moderate], torch.pow(x, exponent)[moderate], equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_round_is_half_to_even_at_every_float(dtype, tmp_path):
    below_half = float(np.nextafter(np.array(0.5, dtype=str(dtype).removeprefix("torch.")), 0))
    x = torch.tensor(SPECIAL + [below_half, -below_half, 1.5, 2.5, -2.5, 8388607.5, 4503599627370495.5, 1e30],
                     dtype=dtype)
    torch.testing.assert_close(_run(Unary(torch.round), (x,), tmp_path), torch.round(x), equal_nan=True)
