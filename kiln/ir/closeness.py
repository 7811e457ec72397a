"""How close two arrays are, by torch.testing.assert_close's rule: per-dtype default tolerances and mismatch figures.

One definition, shared by `kiln.testing.assert_close` and the backends' verification (ONNX `verify=True`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kiln.ir import dtypes

# torch.testing.assert_close's default (rtol, atol) per dtype; integers and bools compare exactly.
TOLERANCES: dict[dtypes.DType, tuple[float, float]] = {
    dtypes.float16: (1e-3, 1e-5), dtypes.bfloat16: (1.6e-2, 1e-5), dtypes.float32: (1.3e-6, 1e-5),
    dtypes.float64: (1e-7, 1e-7), dtypes.complex64: (1.3e-6, 1e-5), dtypes.complex128: (1e-7, 1e-7),
}


def default_tolerances(*kinds: dtypes.DType) -> tuple[float, float]:
    """(rtol, atol) for comparing values of these dtypes: the loosest of their defaults, as torch picks."""
    pairs = [TOLERANCES.get(kind, (0.0, 0.0)) for kind in kinds]
    return max(rtol for rtol, _ in pairs), max(atol for _, atol in pairs)


@dataclass
class Closeness:
    """`actual` against `expected`, elementwise: which elements are close, and the absolute and relative
    differences, computed in the values' common dtype (integers in int64) as torch computes them."""

    close: np.ndarray
    absolute: np.ndarray
    relative: np.ndarray
    rtol: float
    atol: float

    @property
    def ok(self) -> bool:
        return bool(self.close.all())

    @property
    def mismatched(self) -> int:
        return int(self.close.size - np.count_nonzero(self.close))

    def greatest(self, mismatches_only: bool = False) -> tuple[tuple[float, tuple[int, ...]], ...]:
        """((greatest absolute difference, its index), (greatest relative difference, its index)); a NaN counts as
        the greatest. `mismatches_only` ignores the elements that are close, as torch's failure message does."""
        if self.close.size == 0:
            return (0.0, ()), (0.0, ())
        figures = []
        for values in (self.absolute, self.relative):
            if mismatches_only:
                values = np.where(self.close, np.zeros((), values.dtype), values)
            at = np.unravel_index(int(np.argmax(values)), values.shape)  # argmax returns the first NaN
            figures.append((values[at].item(), tuple(map(int, at))))
        return tuple(figures)


def closeness(actual: np.ndarray, expected: np.ndarray, rtol: float, atol: float,
              equal_nan: bool = False) -> Closeness:
    """Compare same-shaped arrays: an element is close when it is equal, or |a - e| <= atol + rtol * |e| for a
    finite difference, or (with `equal_nan`) both are NaN."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    common = np.result_type(actual, expected)
    exact = not (dtypes.dtype(common).is_floating_point or dtypes.dtype(common).is_complex)
    a, e = (actual.astype(np.int64), expected.astype(np.int64)) if exact else (actual.astype(common),
                                                                               expected.astype(common))
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):  # inf - inf and x / 0 are meant
        absolute = np.abs(a - e)
        close = a == e  # the tolerance applies where the difference is finite: inf is close only to itself
        if not exact:
            close |= np.isfinite(absolute) & (absolute <= atol + rtol * np.abs(e))
            if equal_nan:
                close |= np.isnan(a) & np.isnan(e)
        # torch divides integer differences in its default float dtype (float32)
        relative = absolute.astype(np.float32) / np.abs(e).astype(np.float32) if exact else absolute / np.abs(e)
    # Equal elements differ by nothing, also where inf - inf or 0 / 0 says NaN.
    absolute = np.where(close & np.isnan(absolute), np.zeros((), absolute.dtype), absolute)
    relative = np.where(absolute == 0, np.zeros((), relative.dtype), relative)
    return Closeness(close, absolute, relative, rtol, atol)
