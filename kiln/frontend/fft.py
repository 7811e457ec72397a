"""kiln.fft, mirroring torch.fft: discrete Fourier transforms of kiln tensors, recorded as torch.fft's own ops
(`aten.fft_fft`, ...) so an exported program reads as torch's does. Backends without complex tensors run them as
DFT matrix products (the lower-complex pass); see docs/ops.md."""

from __future__ import annotations

from typing import Any, Sequence

from kiln.frontend.tensor import Tensor, dispatch
from kiln.ir.registry import ops

aten = ops.aten


def fft(input: Tensor, n: Any = None, dim: int = -1, norm: str | None = None) -> Tensor:
    return dispatch(aten.fft_fft.default, input, n, dim, norm)


def ifft(input: Tensor, n: Any = None, dim: int = -1, norm: str | None = None) -> Tensor:
    return dispatch(aten.fft_ifft.default, input, n, dim, norm)


def rfft(input: Tensor, n: Any = None, dim: int = -1, norm: str | None = None) -> Tensor:
    return dispatch(aten.fft_rfft.default, input, n, dim, norm)


def irfft(input: Tensor, n: Any = None, dim: int = -1, norm: str | None = None) -> Tensor:
    return dispatch(aten.fft_irfft.default, input, n, dim, norm)


def fft2(input: Tensor, s: Sequence[Any] | None = None, dim: Sequence[int] = (-2, -1),
         norm: str | None = None) -> Tensor:
    return dispatch(aten.fft_fft2.default, input, _list(s), list(dim), norm)


def ifft2(input: Tensor, s: Sequence[Any] | None = None, dim: Sequence[int] = (-2, -1),
          norm: str | None = None) -> Tensor:
    return dispatch(aten.fft_ifft2.default, input, _list(s), list(dim), norm)


def rfft2(input: Tensor, s: Sequence[Any] | None = None, dim: Sequence[int] = (-2, -1),
          norm: str | None = None) -> Tensor:
    return dispatch(aten.fft_rfft2.default, input, _list(s), list(dim), norm)


def irfft2(input: Tensor, s: Sequence[Any] | None = None, dim: Sequence[int] = (-2, -1),
           norm: str | None = None) -> Tensor:
    return dispatch(aten.fft_irfft2.default, input, _list(s), list(dim), norm)


def fftn(input: Tensor, s: Sequence[Any] | None = None, dim: Sequence[int] | None = None,
         norm: str | None = None) -> Tensor:
    return dispatch(aten.fft_fftn.default, input, _list(s), _list(dim), norm)


def ifftn(input: Tensor, s: Sequence[Any] | None = None, dim: Sequence[int] | None = None,
          norm: str | None = None) -> Tensor:
    return dispatch(aten.fft_ifftn.default, input, _list(s), _list(dim), norm)


def rfftn(input: Tensor, s: Sequence[Any] | None = None, dim: Sequence[int] | None = None,
          norm: str | None = None) -> Tensor:
    return dispatch(aten.fft_rfftn.default, input, _list(s), _list(dim), norm)


def irfftn(input: Tensor, s: Sequence[Any] | None = None, dim: Sequence[int] | None = None,
           norm: str | None = None) -> Tensor:
    return dispatch(aten.fft_irfftn.default, input, _list(s), _list(dim), norm)


def _list(values: Any) -> list | None:
    if values is None:
        return None
    return [values] if isinstance(values, int) else list(values)


__all__ = ["fft", "ifft", "rfft", "irfft", "fft2", "ifft2", "rfft2", "irfft2", "fftn", "ifftn", "rfftn", "irfftn"]
