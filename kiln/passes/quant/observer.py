"""Observers: statistics collected during calibration, and the qparams they choose (torch.ao's observers in numpy).

Each observer repeats torch's arithmetic in float32 step by step (HistogramObserver's binning, histogram merging and
L2-norm range search included), so kiln chooses the same scales and zero points as torch on the same data.
"""

from __future__ import annotations

import functools
from enum import Enum
from typing import Any, Callable

import numpy as np

from kiln.ir import dtypes
from kiln.ir.cpu import cpu_flags, usable_cpus
from kiln.ir.dtypes import DType
from kiln.ir.errors import KilnError
from kiln.ir.ops.quant import affine_qparams

F32 = np.float32
FLOAT32_EPS = float(np.finfo(np.float32).eps)


class QScheme(Enum):
    per_tensor_affine = "per_tensor_affine"
    per_tensor_symmetric = "per_tensor_symmetric"
    per_channel_affine = "per_channel_affine"
    per_channel_symmetric = "per_channel_symmetric"

    @property
    def is_per_channel(self) -> bool:
        return self in (QScheme.per_channel_affine, QScheme.per_channel_symmetric)

    @property
    def is_symmetric(self) -> bool:
        return self in (QScheme.per_tensor_symmetric, QScheme.per_channel_symmetric)


per_tensor_affine = QScheme.per_tensor_affine
per_tensor_symmetric = QScheme.per_tensor_symmetric
per_channel_affine = QScheme.per_channel_affine
per_channel_symmetric = QScheme.per_channel_symmetric


class PartialConstructor:
    """`Observer.with_args(eps=...)`: a constructor with some arguments bound; call it for a fresh observer."""

    def __init__(self, factory: Callable[..., Any]):
        self.factory = factory

    def __call__(self, **kwargs: Any) -> Any:
        return self.factory(**kwargs)

    def with_args(self, **kwargs: Any) -> "PartialConstructor":
        return PartialConstructor(functools.partial(self.factory, **kwargs))

    @property
    def observer_class(self) -> type:
        factory = self.factory
        while isinstance(factory, functools.partial):
            factory = factory.func
        return factory

    def __repr__(self) -> str:
        return f"PartialConstructor({self.factory})"


def quant_range(dtype: DType, quant_min: int | None, quant_max: int | None, reduce_range: bool) -> tuple[int, int]:
    """torch.ao's calculate_qmin_qmax: the dtype's full range, halved by reduce_range, unless given."""
    dtype = dtypes.dtype(dtype)
    if quant_min is not None and quant_max is not None:
        return (quant_min // 2, quant_max // 2) if reduce_range else (quant_min, quant_max)
    ranges = {dtypes.int8: ((-128, 127), (-64, 63)), dtypes.uint8: ((0, 255), (0, 127)),
              dtypes.int16: ((-2 ** 15, 2 ** 15 - 1),) * 2, dtypes.int32: ((-2 ** 31, 2 ** 31 - 1),) * 2}
    if dtype not in ranges:
        raise KilnError(f"observers do not support dtype {dtype.name}", fix="use uint8, int8, int16 or int32")
    return ranges[dtype][1 if reduce_range else 0]


class ObserverBase:
    """An observer is called on every value it watches during calibration and then names its qparams."""

    def __init__(self, dtype: DType = dtypes.uint8, is_dynamic: bool = False):
        self.dtype = dtypes.dtype(dtype)
        self.is_dynamic = is_dynamic

    @classmethod
    def with_args(cls, **kwargs: Any) -> PartialConstructor:
        return PartialConstructor(functools.partial(cls, **kwargs))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        self.forward(np.asarray(x))
        return x

    def forward(self, x: np.ndarray) -> None:
        raise NotImplementedError

    def calculate_qparams(self) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError


class UniformQuantizationObserverBase(ObserverBase):
    def __init__(self, dtype: DType = dtypes.uint8, qscheme: QScheme = per_tensor_affine, reduce_range: bool = False,
                 quant_min: int | None = None, quant_max: int | None = None, eps: float = FLOAT32_EPS,
                 is_dynamic: bool = False, **_: Any):
        super().__init__(dtype, is_dynamic)
        self.qscheme = QScheme(qscheme)
        self.reduce_range = reduce_range
        self.eps = eps
        self.has_customized_qrange = quant_min is not None and quant_max is not None
        self.quant_min, self.quant_max = quant_range(self.dtype, quant_min, quant_max, reduce_range)

    def _calculate_qparams(self, min_val: np.ndarray, max_val: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        low, high = np.asarray(min_val), np.asarray(max_val)
        if low.ndim == 0 and low == np.inf and high == -np.inf:
            return np.array([1.0], F32), np.array([0], np.int64)  # nothing observed: torch's defaults
        if not np.all(low <= high):
            raise KilnError(f"the observed range [{low}, {high}] is empty or NaN",
                            fix="calibrate with finite data (a moving average of infinities is NaN)")
        return affine_qparams(min_val, max_val, self.quant_min, self.quant_max, self.dtype, self.eps,
                              self.qscheme.is_symmetric, self.has_customized_qrange)


def _require_per_tensor(name: str, qscheme: QScheme) -> None:
    if QScheme(qscheme).is_per_channel:
        raise KilnError(f"{name} supports per-tensor qschemes only, got {QScheme(qscheme).value}",
                        fix="use PerChannelMinMaxObserver for per-channel quantization")


def moving_average(running: Any, current: Any, averaging_constant: float) -> Any:
    """torch's moving-average observer update, `running + c * (current - running)`, in float32 (a tensor plus a
    Python float times a tensor)."""
    return running + F32(averaging_constant) * (current - running)


class MinMaxObserver(UniformQuantizationObserverBase):
    """The running minimum and maximum."""

    def __init__(self, dtype: DType = dtypes.uint8, qscheme: QScheme = per_tensor_affine, **kwargs: Any):
        _require_per_tensor(type(self).__name__, qscheme)
        super().__init__(dtype, qscheme, **kwargs)
        self.min_val, self.max_val = F32(np.inf), F32(-np.inf)

    def forward(self, x: np.ndarray) -> None:
        if x.size == 0:
            return
        values = x.astype(F32, copy=False)
        self.min_val = np.minimum(values.min(), self.min_val)
        self.max_val = np.maximum(values.max(), self.max_val)

    def calculate_qparams(self) -> tuple[np.ndarray, np.ndarray]:
        return self._calculate_qparams(self.min_val, self.max_val)


class MovingAverageMinMaxObserver(MinMaxObserver):
    """An exponential moving average of each batch's minimum and maximum."""

    def __init__(self, averaging_constant: float = 0.01, dtype: DType = dtypes.uint8,
                 qscheme: QScheme = per_tensor_affine, **kwargs: Any):
        self.averaging_constant = averaging_constant
        super().__init__(dtype, qscheme, **kwargs)

    def forward(self, x: np.ndarray) -> None:
        if x.size == 0:
            return
        values = x.astype(F32, copy=False)
        if self.min_val == np.inf and self.max_val == -np.inf:
            self.min_val, self.max_val = values.min(), values.max()
            return
        self.min_val = moving_average(self.min_val, values.min(), self.averaging_constant)
        self.max_val = moving_average(self.max_val, values.max(), self.averaging_constant)


class PerChannelMinMaxObserver(UniformQuantizationObserverBase):
    """Running minimum and maximum per slice along `ch_axis` (weights: the output channel)."""

    def __init__(self, ch_axis: int = 0, dtype: DType = dtypes.uint8, qscheme: QScheme = per_channel_affine,
                 **kwargs: Any):
        super().__init__(dtype, qscheme, **kwargs)
        self.ch_axis = ch_axis
        self.min_val = np.zeros(0, F32)
        self.max_val = np.zeros(0, F32)

    def channel_extrema(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each channel's minimum and maximum in this batch."""
        rows = np.moveaxis(x.astype(F32, copy=False), self.ch_axis, 0).reshape(x.shape[self.ch_axis], -1)
        return rows.min(axis=1), rows.max(axis=1)

    def forward(self, x: np.ndarray) -> None:
        if x.size == 0:
            return
        current_min, current_max = self.channel_extrema(x)
        if self.min_val.size == 0:
            self.min_val, self.max_val = current_min, current_max
        else:
            self.min_val, self.max_val = self._combined(current_min, current_max)

    def _combined(self, current_min: np.ndarray, current_max: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The running extrema after a batch's (the first batch's are taken as they are)."""
        return np.minimum(current_min, self.min_val), np.maximum(current_max, self.max_val)

    def calculate_qparams(self) -> tuple[np.ndarray, np.ndarray]:
        return self._calculate_qparams(self.min_val, self.max_val)


class MovingAveragePerChannelMinMaxObserver(PerChannelMinMaxObserver):
    """An exponential moving average of each channel's batch minimum and maximum (torch's default per-channel
    weight observer for quantization-aware training)."""

    def __init__(self, averaging_constant: float = 0.01, ch_axis: int = 0, dtype: DType = dtypes.uint8,
                 qscheme: QScheme = per_channel_affine, **kwargs: Any):
        if not QScheme(qscheme).is_per_channel:
            raise KilnError(f"MovingAveragePerChannelMinMaxObserver supports per-channel qschemes only, got "
                            f"{QScheme(qscheme).value}", fix="use MovingAverageMinMaxObserver for per-tensor qschemes")
        if kwargs.get("is_dynamic"):
            raise KilnError("MovingAveragePerChannelMinMaxObserver does not support dynamic quantization",
                            fix="use PlaceholderObserver for dynamic quantization")
        super().__init__(ch_axis, dtype, qscheme, **kwargs)
        self.averaging_constant = averaging_constant

    def _combined(self, current_min: np.ndarray, current_max: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return (moving_average(self.min_val, current_min, self.averaging_constant),
                moving_average(self.max_val, current_max, self.averaging_constant))


class PerGroupMinMaxObserver(UniformQuantizationObserverBase):
    """Symmetric qparams per group of `group_size` consecutive elements of each row of a 2-d weight (int4
    weight-only quantization): one scale per group, as quantize_per_channel_group takes them."""

    def __init__(self, group_size: int = 32, dtype: DType = dtypes.int8, qscheme: QScheme = per_channel_symmetric,
                 quant_min: int | None = -8, quant_max: int | None = 7, **kwargs: Any):
        super().__init__(dtype, qscheme, quant_min=quant_min, quant_max=quant_max, **kwargs)
        self.group_size = group_size
        self.min_val = np.zeros(0, F32)
        self.max_val = np.zeros(0, F32)

    def forward(self, x: np.ndarray) -> None:
        if x.ndim != 2 or x.shape[1] % self.group_size:
            raise KilnError(f"group-wise quantization needs a 2-d weight whose columns ({list(x.shape)}) divide "
                            f"into groups of {self.group_size}", fix="choose a group size that divides the columns")
        groups = x.astype(F32, copy=False).reshape(-1, self.group_size)
        low, high = groups.min(axis=1), groups.max(axis=1)
        if self.min_val.size:
            low, high = np.minimum(low, self.min_val), np.maximum(high, self.max_val)
        self.min_val, self.max_val = low, high

    def calculate_qparams(self) -> tuple[np.ndarray, np.ndarray]:
        scale, zero_point = self._calculate_qparams(self.min_val, self.max_val)
        return scale, zero_point.astype(np.int32)


class FixedQParamsObserver(ObserverBase):
    """Fixed qparams, whatever it sees (ops with a known output range: sigmoid, tanh, hardsigmoid)."""

    def __init__(self, scale: float, zero_point: int, dtype: DType = dtypes.uint8,
                 qscheme: QScheme = per_tensor_affine, quant_min: int = 0, quant_max: int = 255,
                 is_dynamic: bool = False, **_: Any):
        if is_dynamic:
            raise KilnError("FixedQParamsObserver does not support dynamic quantization",
                            fix="use PlaceholderObserver for dynamic quantization")
        super().__init__(dtype, is_dynamic)
        self.qscheme = QScheme(qscheme)
        self.quant_min, self.quant_max = quant_min, quant_max
        self.scale = np.array([scale], F32)
        self.zero_point = np.array([zero_point], np.int32)

    def forward(self, x: np.ndarray) -> None:
        pass

    def calculate_qparams(self) -> tuple[np.ndarray, np.ndarray]:
        return self.scale, self.zero_point


# torch's observers for ops whose output lies in [-1, 1] (tanh) or [0, 1] (sigmoid)
default_fixed_qparams_range_neg1to1_observer = FixedQParamsObserver.with_args(
    scale=2.0 / 256.0, zero_point=128, dtype=dtypes.uint8, quant_min=0, quant_max=255)
default_fixed_qparams_range_0to1_observer = FixedQParamsObserver.with_args(
    scale=1.0 / 256.0, zero_point=0, dtype=dtypes.uint8, quant_min=0, quant_max=255)


SMALL_SCALE_THRESHOLD = F32(6.1e-5)  # fbgemm's cut-off: no scale in float16's subnormal range


def fbgemm_qparams(min_val: float, max_val: float, quant_min: int, quant_max: int,
                   preserve_sparsity: bool) -> tuple[np.float32, int]:
    """fbgemm's ChooseQuantizationParams, which torch's fused observer + fake-quantize op (and its
    FusedMovingAvgObsFakeQuantize) uses instead of the observers' formula: the range widened to include 0 (made
    symmetric when `preserve_sparsity`), a float32 scale of at least 6.1e-5, and the zero point from whichever end
    adds the smaller terms, rounded half to even. Each step in C++'s float / double arithmetic."""
    low, high = F32(min_val), F32(max_val)
    if low > high:
        raise KilnError(f"the observed range [{low}, {high}] is empty or NaN", fix="observe finite data")
    if low < 0 and high > 0 and preserve_sparsity:
        symmetric_min, symmetric_max = -((quant_max - quant_min) // 2 + 1), (quant_max - quant_min) // 2
        largest = float(max(abs(low / F32(symmetric_min)), abs(high / F32(symmetric_max))))  # float division
        low, high = F32(largest * symmetric_min), F32(largest * symmetric_max)
    low, high = min(low, F32(0)), max(high, F32(0))
    levels = quant_max - quant_min
    scale = F32((float(high) - float(low)) / levels)  # computed in double, kept as float
    with np.errstate(divide="ignore", over="ignore"):
        if scale == 0 or np.isinf(F32(1) / scale):
            scale = F32(0.1)
    if scale < SMALL_SCALE_THRESHOLD:
        original, scale = scale, SMALL_SCALE_THRESHOLD
        if low == 0:
            high = F32(SMALL_SCALE_THRESHOLD * F32(levels))
        elif high == 0:
            low = F32(-SMALL_SCALE_THRESHOLD * F32(levels))
        else:
            amplifier = F32(SMALL_SCALE_THRESHOLD / original)
            low, high = F32(low * amplifier), F32(high * amplifier)
    from_min, from_max = quant_min - float(low) / float(scale), quant_max - float(high) / float(scale)
    min_error = abs(quant_min) + abs(float(low) / float(scale))
    max_error = abs(quant_max) + abs(float(high) / float(scale))
    initial = from_min if min_error < max_error else from_max
    if low < 0 and high > 0 and preserve_sparsity:
        initial = (quant_min + quant_max) / 2
    zero_point = quant_min if initial < quant_min else quant_max if initial > quant_max else int(np.rint(initial))
    return scale, zero_point


class PlaceholderObserver(ObserverBase):
    """Records nothing: for dynamic quantization, where the program chooses qparams at run time."""

    def __init__(self, dtype: DType = dtypes.uint8, qscheme: QScheme = per_tensor_affine,
                 quant_min: int | None = None, quant_max: int | None = None, eps: float | None = None,
                 is_dynamic: bool = False, **_: Any):
        super().__init__(dtype, is_dynamic)
        self.qscheme = QScheme(qscheme)
        self.quant_min, self.quant_max, self.eps = quant_min, quant_max, eps

    def forward(self, x: np.ndarray) -> None:
        pass

    def calculate_qparams(self) -> tuple[np.ndarray, np.ndarray]:
        raise KilnError("PlaceholderObserver has no qparams: the program computes them at run time")


# ---------------------------------------------------------------------------------------------
# The histogram observer


def _cpu_vector_lanes() -> int:
    """float32 lanes of torch's CPU kernels here: 16 with AVX-512, else 8 (AVX2)."""
    return 16 if "avx512f" in cpu_flags() else 8


def _linspace(start: np.float32, end: np.float32, steps: int, lanes: int = 1, threads: int = 1) -> np.ndarray:
    """torch.linspace on float32 (CPU), rounding included: the first half counts up from start, the second down from
    end; torch's vector body takes one base per `lanes` elements (base + i * step in the lanes) over each
    thread's share (parallel_for, grain 32768), and its scalar tail computes each element from start or end."""
    start, end = F32(start), F32(end)
    step = (end - start) / F32(steps - 1)
    halfway = steps // 2

    def element(index: np.ndarray) -> np.ndarray:
        return np.where(index < halfway, start + step * index.astype(F32),
                        end - step * (steps - index - 1).astype(F32)).astype(F32)

    out = np.empty(steps, F32)
    tasks = max(1, min(threads, -(-steps // 32768)))
    chunk = -(-steps // tasks)
    for begin in range(0, steps, chunk):
        stop = min(steps, begin + chunk)
        vector_stop = begin + (stop - begin) // (2 * lanes) * (2 * lanes) if lanes > 1 else begin
        bases = np.arange(begin, vector_stop, lanes)
        if bases.size:
            out[begin:vector_stop] = (element(bases)[:, None] + np.arange(lanes, dtype=F32)[None, :] * step).ravel()
        out[vector_stop:stop] = element(np.arange(vector_stop, stop))
    return out


def histc(x: np.ndarray, bins: int, low: np.float32, high: np.float32) -> np.ndarray:
    """torch.histc (CPU) on float32: bin = int((x - low) * bins / (high - low)) over the linspace edges' ends,
    values outside [low, high] dropped, a degenerate range widened by 1 on each side."""
    low, high = F32(low), F32(high)
    if low == high:
        low, high = low - F32(1), high + F32(1)
    edges = _linspace(low, high, bins + 1)
    left, right = edges[0], edges[-1]
    values = x.astype(F32, copy=False).reshape(-1)
    values = values[(values >= left) & (values <= right)]
    position = ((values - left) * F32(bins) / (right - left)).astype(np.int64)
    position[position == bins] = bins - 1
    return np.bincount(position, minlength=bins).astype(F32)


class HistogramObserver(UniformQuantizationObserverBase):
    """A running histogram of the values; qparams from the range that minimizes the L2 quantization error."""

    def __init__(self, bins: int = 2048, dtype: DType = dtypes.uint8, qscheme: QScheme = per_tensor_affine,
                 **kwargs: Any):
        _require_per_tensor("HistogramObserver", qscheme)
        if kwargs.get("is_dynamic"):
            raise KilnError("HistogramObserver does not support dynamic quantization",
                            fix="use PlaceholderObserver for dynamic quantization")
        super().__init__(dtype, qscheme, **kwargs)
        self.bins = bins
        self.histogram = np.zeros(bins, F32)
        self.min_val, self.max_val = F32(np.inf), F32(-np.inf)
        self.dst_nbins = 2 ** (8 * self.dtype.itemsize)
        self.upsample_rate = 16  # finer sub-bins when re-binning a histogram onto a wider range
        # Re-binning uses torch.linspace, whose rounding follows torch's vector width and thread split: kiln
        # reproduces torch on this machine (set these to reproduce another).
        self.vector_lanes = _cpu_vector_lanes()
        self.threads = usable_cpus()

    def forward(self, x: np.ndarray) -> None:
        if x.size == 0:
            return
        values = x.astype(F32, copy=False)
        x_min, x_max = values.min(), values.max()
        if x_min == -np.inf or x_max == np.inf:
            values = values[np.abs(values) != np.inf]
            if values.size == 0:
                return
            x_min, x_max = values.min(), values.max()
        if self.min_val == np.inf or self.max_val == -np.inf:
            self.min_val, self.max_val = x_min, x_max
            self.histogram = histc(values, self.bins, x_min, x_max)
            return
        new_min, new_max = np.minimum(self.min_val, x_min), np.maximum(self.max_val, x_max)
        update = histc(values, self.bins, new_min, new_max)
        if new_min == self.min_val and new_max == self.max_val:
            self.histogram = self.histogram + update
            return
        self.histogram = self._combine_histograms(self.histogram, self.min_val, self.max_val, update, new_min, new_max)
        self.min_val, self.max_val = new_min, new_max

    def _combine_histograms(self, orig_hist, orig_min, orig_max, update_hist, update_min, update_max) -> np.ndarray:
        if orig_min == orig_max:
            return histc(np.array([orig_min], F32), self.bins, update_min, update_max) * orig_hist.sum(dtype=F32) \
                + update_hist
        return update_hist + self._upscale_histogram(orig_hist, orig_min, orig_max, update_min, update_max)

    def _upscale_histogram(self, histogram, orig_min, orig_max, update_min, update_max) -> np.ndarray:
        rate = self.upsample_rate
        fine = np.repeat(histogram, rate) / F32(rate)
        bin_size = (F32(orig_max) - F32(orig_min)) / F32(self.bins * rate)
        grid = dict(lanes=self.vector_lanes, threads=self.threads)
        midpoints = _linspace(orig_min, orig_max, self.bins * rate + 1, **grid)[:-1] + F32(0.5) * bin_size
        boundaries = _linspace(update_min, update_max, self.bins + 1, **grid)
        bucket = np.clip(np.searchsorted(boundaries, midpoints, side="right") - 1, 0, self.bins - 1)
        combined = np.zeros(self.bins, F32)
        np.add.at(combined, bucket, fine)  # float32, in element order, as torch.bincount with float weights
        return combined

    @staticmethod
    def _get_norm(delta_begin, delta_end, density):
        return density * ((delta_end * delta_end * delta_end - delta_begin * delta_begin * delta_begin) / F32(3))

    def _compute_quantization_error(self, next_start_bin: int, next_end_bin: int) -> float:
        bin_width = (float(self.max_val) - float(self.min_val)) / self.bins
        dst_bin_width = bin_width * (next_end_bin - next_start_bin + 1) / self.dst_nbins
        if dst_bin_width == 0.0:
            return 0.0
        width, dst_width = F32(bin_width), F32(dst_bin_width)
        src_begin = (np.arange(self.bins) - next_start_bin).astype(F32) * width
        src_end = src_begin + width
        dst_of_begin = np.clip(np.floor_divide(src_begin, dst_width), 0, self.dst_nbins - 1).astype(F32)
        dst_of_begin_center = (dst_of_begin + F32(0.5)) * dst_width
        dst_of_end = np.clip(np.floor_divide(src_end, dst_width), 0, self.dst_nbins - 1).astype(F32)
        density = self.histogram / width
        half = F32(dst_bin_width / 2)
        norm = np.zeros(self.bins, F32)
        norm += self._get_norm(src_begin - dst_of_begin_center, np.ones(self.bins, F32) * half, density)
        norm += (dst_of_end - dst_of_begin - F32(1)) * self._get_norm(F32(-dst_bin_width / 2), half, density)
        dst_of_end_center = dst_of_end * dst_width + half
        norm += self._get_norm(F32(-dst_bin_width / 2), src_end - dst_of_end_center, density)
        return float(norm.sum(dtype=F32))

    def _non_linear_param_search(self) -> tuple[np.float32, np.float32]:
        """caffe2's NormMinimization search: trim the histogram's tails while the L2 error keeps falling."""
        bin_width = (self.max_val - self.min_val) / F32(self.bins)
        total = float(self.histogram.sum(dtype=F32))
        cumulative = np.cumsum(self.histogram, dtype=np.float64).astype(F32)
        stepsize, alpha, beta = 1e-5, 0.0, 1.0
        start_bin, end_bin = 0, self.bins - 1
        norm_min = float("inf")
        while alpha < beta:
            next_alpha, next_beta = alpha + stepsize, beta - stepsize
            left, right = start_bin, end_bin
            while left < end_bin and cumulative[left] < F32(next_alpha * total):
                left += 1
            while right > start_bin and cumulative[right] > F32(next_beta * total):
                right -= 1
            next_start, next_end = start_bin, end_bin
            if left - start_bin > end_bin - right:
                next_start, alpha = left, next_alpha
            else:
                next_end, beta = right, next_beta
            if next_start == start_bin and next_end == end_bin:
                continue
            norm = self._compute_quantization_error(next_start, next_end)
            if norm > norm_min:
                break
            norm_min, start_bin, end_bin = norm, next_start, next_end
        return self.min_val + bin_width * F32(start_bin), self.min_val + bin_width * F32(end_bin + 1)

    def calculate_qparams(self) -> tuple[np.ndarray, np.ndarray]:
        if self.min_val == np.inf and self.max_val == -np.inf:
            return np.array([1.0], F32), np.array([0], np.int64)
        return self._calculate_qparams(*self._non_linear_param_search())
