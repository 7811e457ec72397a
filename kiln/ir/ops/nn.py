"""Neural-network ops: convolution, pooling, normalization, dropout, embeddings, padding, resampling, FFT,
and the composites that lower onto them (conv1d/2d/3d, conv_transpose, layer/group/batch/rms norm,
scaled_dot_product_attention, dropout, pools, lstm_cell/gru_cell, ...).

Conventions:
- Output sizes in meta rules are sympy expressions of the input dims (`floor((s0 + 2 - 3)/2) + 1`), so
  batch and spatial dims may be symbolic; invalid arguments raise KilnError subclasses naming the op.
- Kernels follow ATen's CPU kernels' semantics (index conventions, NaN rules, mixed-precision statistics).
  float32 work is done in float64 and rounded once, float16/bfloat16 in float32 (opmath); integer results
  wrap like ATen's. Where ATen computes in the reduced dtype itself (grid_sampler_2d's scalar fallback),
  so does the kernel.
- kiln's IR is functional: ops that update buffers in place in torch (`_native_batch_norm_legit` updates
  running_mean/running_var when training) only compute their outputs here.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import sympy
from numpy.lib.stride_tricks import sliding_window_view

from kiln.ir import dtypes
from kiln.ir.errors import InputError, UnsupportedError
from kiln.ir.meta import (
    broadcast_shapes, canonical_dim, dtype_of, like, numel, require, require_arg, require_dtype, shape_of, tensor,
)
from kiln.ir.ops._common import checked
from kiln.ir.registry import defop
from kiln.ir.symbolic import SymInt, as_dim, floor_div, guard_bool, sym_eq

_REDUCED = (np.float16, dtypes.bfloat16.numpy)


# ---------------------------------------------------------------------------------------------
# Shared helpers: symbolic size arithmetic and argument normalization

def _is_const(value, constant: int) -> bool:
    return isinstance(value, int) and value == constant


def _at_least(value: SymInt, bound: SymInt) -> bool:
    """value >= bound, deciding symbolic sizes through a guard."""
    if isinstance(value, int) and isinstance(bound, int):
        return value >= bound
    return guard_bool(sympy.Ge(value, bound))


def per_dim(op: str, name: str, values, n: int) -> list:
    """An int[n] argument given as one value or n values (ATen accepts both)."""
    values = list(values) if isinstance(values, (list, tuple)) else [values]
    require_arg(len(values) in (1, n), op,
                f"expected {name} to be a single integer or a list of {n} integers, got {values}",
                fix=f"give one value per spatial dim ({n})")
    return values * n if len(values) == 1 else values


def _accumulation(dtype: np.dtype) -> np.dtype:
    """The dtype kernels compute in: float64 for float32/float64, float32 for float16/bfloat16 (opmath),
    int64 for integers (wrapping back on the final cast, like ATen's integer kernels)."""
    if dtype in _REDUCED:
        return np.dtype(np.float32)
    if dtype.kind == "f":
        return np.dtype(np.float64)
    return np.dtype(np.int64)


def _opmath(dtype: np.dtype) -> np.dtype:
    """ATen's opmath type: float32 for float16/bfloat16, the dtype itself otherwise."""
    return np.dtype(np.float32) if dtype in _REDUCED else np.dtype(dtype)


def _is_floating(dtype: dtypes.DType) -> bool:
    return dtype.is_floating_point


def _nonzero_dims(op: str, shape, first: int, expected: str) -> None:
    """ATen refuses empty non-batch dims in pooling/padding inputs (checked when the size is static)."""
    for size in shape[first:]:
        require(not _is_const(size, 0), op,
                f"expected {expected} with possibly 0 batch size and other non-zero dimensions, "
                f"got shape {list(shape)}")


def _truncating_divide(numerator: np.ndarray, denominator) -> np.ndarray:
    """C++ integer division (rounds toward zero), as ATen's integer average pools divide."""
    quotient = numerator // denominator
    remainder = numerator - quotient * denominator
    return np.where((remainder != 0) & ((numerator < 0) != (np.asarray(denominator) < 0)), quotient + 1, quotient)


def _strided_windows(x: np.ndarray, kernel: Sequence[int], stride: Sequence[int], dilation: Sequence[int],
                     outputs: Sequence[int]) -> np.ndarray:
    """Windows over the last len(kernel) axes: shape x.shape[:-n] + outputs + kernel (a strided view)."""
    n = len(kernel)
    effective = [d * (k - 1) + 1 for k, d in zip(kernel, dilation)]
    windows = sliding_window_view(x, effective, axis=tuple(range(x.ndim - n, x.ndim)))
    lead = (slice(None),) * (x.ndim - n)
    positions = tuple(slice(0, (o - 1) * s + 1, s) if o > 0 else slice(0, 0) for o, s in zip(outputs, stride))
    taps = tuple(slice(None, None, d) for d in dilation)
    return windows[lead + positions + taps]


# ---------------------------------------------------------------------------------------------
# convolution

def conv_output_size(size, kernel, stride, padding, dilation):
    """A convolution's (and pooling's, im2col's) output size along one dim; ints or symbolic dims."""
    return floor_div(size + 2 * padding - dilation * (kernel - 1) - 1, stride) + 1


def _conv_transpose_output_size(size, kernel, stride, padding, dilation, output_padding):
    return as_dim((size - 1) * stride - 2 * padding + dilation * (kernel - 1) + output_padding + 1)


def _convolution_meta(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    op = "aten.convolution.default"
    x, w = shape_of(input), shape_of(weight)
    require(len(w) >= 3, op, f"weight must have at least 3 dimensions (out, in, *kernel), got shape {list(w)}")
    n = len(w) - 2
    require(len(x) == len(w), op,
            f"expected {len(w)}-D input for {len(w)}-D weight {list(w)}, got {len(x)}-D input of shape {list(x)}",
            fix="add the batch dim (convolution takes [N, C, *spatial]; conv1d/2d/3d accept unbatched input)")
    require_dtype(dtype_of(input) is dtype_of(weight), op,
                  f"input ({dtype_of(input)}) and weight ({dtype_of(weight)}) must have the same dtype",
                  fix="convert the input or the weight so that both have one dtype")
    require_dtype(not dtype_of(input).is_bool and not dtype_of(input).is_complex, op,
                  f"{dtype_of(input)} convolution is not supported")
    require_dtype(bias is None or dtype_of(bias) is dtype_of(input), op,
                  f"input ({dtype_of(input)}) and bias ({dtype_of(bias) if bias is not None else None}) must have the "
                  "same dtype", fix="convert the bias to the input's dtype")
    stride, padding, dilation = (per_dim(op, name, value, n) for name, value in
                                 (("stride", stride), ("padding", padding), ("dilation", dilation)))
    output_padding = per_dim(op, "output_padding", output_padding, n) if transposed else [0] * n
    require_arg(all(_at_least(s, 1) for s in stride), op, f"non-positive stride is not supported, got {stride}")
    require_arg(all(_at_least(p, 0) for p in padding), op, f"negative padding is not supported, got {padding}")
    require_arg(all(_at_least(d, 1) for d in dilation), op, f"dilation must be positive, got {dilation}")
    require_arg(_at_least(groups, 1), op, f"non-positive groups is not supported, got groups={groups}")
    channels = x[1]
    kernel = w[2:]
    require(_at_least(w[0], 1), op, f"expected weight to have at least one channel at dimension 0, got {list(w)}")
    require(not any(_is_const(k, 0) for k in kernel), op,
            f"kernel size should be greater than zero, got weight of shape {list(w)}")
    require(transposed or not _is_const(channels, 0), op,
            f"a convolution over 0 input channels (input {list(x)}): ATen returns an empty [N, 0, ...] result "
            "there, not the output channels' bias", fix="give the convolution at least one input channel")
    require(guard_bool(sympy.Eq(sympy.Mod(w[0], groups), 0)), op,
            f"groups={groups} must divide weight dimension 0, got weight of shape {list(w)}",
            fix="use a group count that divides both the input and the output channels")
    if transposed:
        require(sym_eq(channels, w[0]), op,
                f"given transposed weight of shape {list(w)}, expected input of shape {list(x)} to have "
                f"{w[0]} channels, got {channels}",
                fix="a transposed weight is laid out [in_channels, out_channels / groups, *kernel]")
        for s, d, p in zip(stride, dilation, output_padding):
            require_arg(_at_least(s - 1 - p, 0) or _at_least(d - 1 - p, 0), op,
                        f"output padding must be smaller than either stride or dilation, got output_padding="
                        f"{output_padding}, stride={stride}, dilation={dilation}",
                        fix="reduce output_padding below the stride")
        out_channels = w[1] * groups
        spatial = [_conv_transpose_output_size(*args) for args in
                   zip(x[2:], kernel, stride, padding, dilation, output_padding)]
        require(all(_at_least(s, 0) for s in spatial), op,
                f"calculated output size {spatial} is negative for input of shape {list(x)}")
    else:
        require(sym_eq(channels, w[1] * groups), op,
                f"given groups={groups}, weight of shape {list(w)} expects input of shape {list(x)} to have "
                f"{as_dim(w[1] * groups)} channels, got {channels}",
                fix="the input's channel count must equal the weight's dim 1 times groups")
        out_channels = w[0]
        for size, k, p, d in zip(x[2:], kernel, padding, dilation):
            require(_at_least(size + 2 * p - (d * (k - 1) + 1), 0), op,
                    f"padded input size per channel {[as_dim(s + 2 * p) for s, p in zip(x[2:], padding)]} is "
                    f"smaller than the (dilated) kernel size "
                    f"{[as_dim(d * (k - 1) + 1) for k, d in zip(kernel, dilation)]}",
                    fix="pad the input more, or use a smaller kernel or dilation")
        spatial = [conv_output_size(*args) for args in zip(x[2:], kernel, stride, padding, dilation)]
    if bias is not None:
        require(len(shape_of(bias)) == 1 and sym_eq(shape_of(bias)[0], out_channels), op,
                f"expected bias to be 1-D with {out_channels} elements, got shape {list(shape_of(bias))}",
                fix="give one bias value per output channel")
    return tensor([x[0], out_channels, *spatial], dtype_of(input))


def _correlate(x: np.ndarray, w: np.ndarray, stride, dilation, groups: int) -> np.ndarray:
    """Grouped cross-correlation of an already padded x [N, C, *S] with w [Co, C/groups, *K]:
    im2col as a strided window view, contracted per group with tensordot."""
    n = w.ndim - 2
    kernel = w.shape[2:]
    outputs = [(s - (d * (k - 1) + 1)) // st + 1 for s, k, d, st in zip(x.shape[2:], kernel, dilation, stride)]
    columns = _strided_windows(x, kernel, stride, dilation, outputs)  # [N, C, *O, *K]
    in_group, out_group = x.shape[1] // groups, w.shape[0] // groups
    window_axes = list(range(2 + n, 2 + 2 * n))
    kernel_axes = list(range(2, 2 + n))
    parts = [np.tensordot(columns[:, g * in_group:(g + 1) * in_group], w[g * out_group:(g + 1) * out_group],
                          axes=([1, *window_axes], [1, *kernel_axes])) for g in range(groups)]  # [N, *O, Co/g]
    return np.moveaxis(np.concatenate(parts, axis=-1), -1, 1)


def _transposed_correlate(x: np.ndarray, w: np.ndarray, stride, padding, dilation, out_spatial, groups: int):
    """The adjoint of a strided convolution, x [N, Cin, *S] with w [Cin, Cout/groups, *K]: every input
    position scatters x * w over the kernel taps (at i * stride + k * dilation, minus padding). One tensordot
    per group, then one strided slice add per kernel tap (within a tap the targets are distinct)."""
    n = w.ndim - 2
    spatial, kernel = x.shape[2:], w.shape[2:]
    in_group, out_group = x.shape[1] // groups, w.shape[1]
    # Large enough for every tap and for the cropped output (output_padding can reach past the taps).
    extent = [max((s - 1) * st + d * (k - 1) + 1, p + o)
              for s, st, d, k, p, o in zip(spatial, stride, dilation, kernel, padding, out_spatial)]
    out = np.zeros((x.shape[0], groups * out_group, *extent), x.dtype)
    for g in range(groups):
        taps = np.tensordot(x[:, g * in_group:(g + 1) * in_group], w[g * in_group:(g + 1) * in_group],
                            axes=([1], [0]))  # [N, *S, Cout/g, *K]
        taps = np.moveaxis(taps, 1 + n, 1)  # [N, Cout/g, *S, *K]
        for tap in np.ndindex(*kernel):
            target = tuple(slice(k * d, k * d + (s - 1) * st + 1, st)
                           for k, d, s, st in zip(tap, dilation, spatial, stride))
            out[(slice(None), slice(g * out_group, (g + 1) * out_group), *target)] += taps[(Ellipsis, *tap)]
    crop = tuple(slice(p, p + o) for p, o in zip(padding, out_spatial))
    return out[(slice(None), slice(None), *crop)]


def _convolution_kernel(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    n = weight.ndim - 2
    expected = _convolution_meta(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    stride, padding, dilation = (per_dim("", "", v, n) for v in (stride, padding, dilation))
    acc = _accumulation(input.dtype)
    x, w = input.astype(acc), weight.astype(acc)
    if input.size == 0 or weight.size == 0:
        out = np.zeros([int(d) for d in expected.shape], acc)
    elif not transposed:
        out = _correlate(np.pad(x, [(0, 0), (0, 0), *[(p, p) for p in padding]]), w, stride, dilation, groups)
    else:
        out = _transposed_correlate(x, w, stride, padding, dilation, [int(d) for d in expected.shape[2:]], groups)
    if bias is not None:
        out = out + bias.astype(acc).reshape(1, -1, *[1] * n)
    return out


defop("convolution(Tensor input, Tensor weight, Tensor? bias, SymInt[] stride, SymInt[] padding, "
      "SymInt[] dilation, bool transposed, SymInt[] output_padding, SymInt groups) -> Tensor",
      _convolution_meta, _convolution_kernel)


# ---------------------------------------------------------------------------------------------
# Pooling

def _pool_output_size(size, kernel, stride, padding, dilation, ceil_mode):
    """ATen's pooling_output_shape. In ceil mode the last window must start inside the input or the left
    padding, which is min(ceil-mode size, floor((size + padding - 1) / stride) + 1)."""
    span = size + 2 * padding - dilation * (kernel - 1) - 1
    if not ceil_mode:
        return floor_div(span, stride) + 1
    ceiled = floor_div(span + stride - 1, stride) + 1
    last_start_inside = floor_div(size + padding - 1, stride) + 1
    if isinstance(ceiled, int) and isinstance(last_start_inside, int):
        return min(ceiled, last_start_inside)
    return as_dim(sympy.Min(ceiled, last_start_inside))


def _pool_arguments(op, n, kernel_size, stride, padding, dilation=1):
    kernel = per_dim(op, "kernel_size", kernel_size, n)
    stride = kernel if not stride else per_dim(op, "stride", stride, n)
    padding = per_dim(op, "padding", padding, n)
    dilation = per_dim(op, "dilation", dilation, n)
    require_arg(all(k > 0 for k in kernel), op, f"kernel_size must be greater than zero, got {kernel}")
    require_arg(all(s > 0 for s in stride), op, f"stride must be greater than zero, got {stride}")
    require_arg(all(d > 0 for d in dilation), op, f"dilation must be greater than zero, got {dilation}")
    require_arg(all(p >= 0 for p in padding), op, f"padding must be non-negative, got {padding}")
    return kernel, stride, padding, dilation


def _pool_meta(op, n, self, kernel, stride, padding, dilation, ceil_mode, *, input_covers_kernel=False):
    shape = _spatial_input_shape(op, self, n)
    require_arg(all(p <= k // 2 for k, p in zip(kernel, padding)), op,
                f"padding should be at most half of the kernel size, got padding={padding}, kernel_size={kernel}",
                fix="reduce the padding, or pad the input explicitly (constant_pad_nd) before pooling")
    if input_covers_kernel:  # ATen's avg_pool3d also wants the unpadded input to cover the kernel
        require(all(_at_least(size, k) for size, k in zip(shape[-n:], kernel)), op,
                f"input spatial size {list(shape[-n:])} is smaller than the kernel size {kernel}")
    spatial = [_pool_output_size(*args, ceil_mode) for args in zip(shape[-n:], kernel, stride, padding, dilation)]
    require(all(_at_least(s, 1) for s in spatial), op,
            f"input spatial size {list(shape[-n:])} gives output size {spatial}, which is too small",
            fix="use a smaller kernel, more padding, or a larger input")
    return [*shape[:-n], *spatial]


def _avg_pool_meta(n):
    op = f"aten.avg_pool{n}d.default"

    def meta(self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
             divisor_override=None):
        kernel, stride, padding, _ = _pool_arguments(op, n, kernel_size, stride, padding)
        require_arg(divisor_override is None or divisor_override != 0, op, "divisor_override must not be zero")
        require_dtype(not dtype_of(self).is_bool and not dtype_of(self).is_complex, op,
                      f"{dtype_of(self)} input is not supported")
        return tensor(_pool_meta(op, n, self, kernel, stride, padding, [1] * n, ceil_mode,
                                 input_covers_kernel=n == 3), dtype_of(self))
    return meta


def _reachable_taps(kernel, dilation, padding, sizes):
    """Each axis's taps that some window can place inside the input. A window starts at -padding or later, so a tap
    at j * dilation >= size + padding only ever sees the fill: dropping those changes no pool's result, and keeps a
    kernel far larger than its input (Hugging Face EfficientNet's AvgPool2d(1280, ceil_mode=True) over 7x7) from
    padding the input out to the kernel's size (16 GB there)."""
    return [min(k, -(-(size + p) // d)) for k, d, p, size in zip(kernel, dilation, padding, sizes)]


def _padded_for_windows(x, kernel, stride, padding, dilation, outputs, fill):
    """Pad the trailing spatial axes so every output window lies inside the array."""
    after = [max((o - 1) * s + d * (k - 1) + 1 - p - size, 0)
             for o, s, k, d, p, size in zip(outputs, stride, kernel, dilation, padding, x.shape[-len(kernel):])]
    lead = [(0, 0)] * (x.ndim - len(kernel))
    return np.pad(x, lead + [(p, a) for p, a in zip(padding, after)], constant_values=fill)


def _avg_pool_kernel(n):
    meta = _avg_pool_meta(n)

    def kernel(self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
        outputs = [int(d) for d in meta(self, kernel_size, stride, padding, ceil_mode, count_include_pad,
                                        divisor_override).shape[-n:]]
        kernel, stride, padding, _ = _pool_arguments("", n, kernel_size, stride, padding)
        acc = _accumulation(self.dtype)
        taps = _reachable_taps(kernel, [1] * n, padding, self.shape[-n:])
        x = _padded_for_windows(self.astype(acc), taps, stride, padding, [1] * n, outputs, 0)
        windows = _strided_windows(x, taps, stride, [1] * n, outputs)
        sums = windows.sum(axis=tuple(range(-n, 0)))
        # ATen's divisor per window: windows are cut at input + padding; without count_include_pad only
        # the part inside the input counts. The divisor factors over the spatial dims.
        divisor = np.ones((), np.int64)
        for o, k, s, p, size in zip(outputs, kernel, stride, padding, self.shape[-n:]):
            start = np.arange(o) * s - p
            end = np.minimum(start + k, size + p)
            if count_include_pad:
                extent = end - start
            else:
                extent = np.minimum(end, size) - np.maximum(start, 0)
            divisor = np.multiply.outer(divisor, extent)
        if divisor_override is not None:
            divisor = np.full_like(divisor, divisor_override)
        if np.issubdtype(acc, np.integer):
            return _truncating_divide(sums, np.maximum(divisor, 1))
        with np.errstate(all="ignore"):
            return np.where(divisor > 0, sums / np.maximum(divisor, 1), 0)
    return kernel


for _n in (2, 3):
    defop(f"avg_pool{_n}d(Tensor self, int[{_n}] kernel_size, int[{_n}] stride=[], int[{_n}] padding=0, "
          "bool ceil_mode=False, bool count_include_pad=True, int? divisor_override=None) -> Tensor",
          _avg_pool_meta(_n), _avg_pool_kernel(_n))


def _max_pool_meta(n):
    op = f"aten.max_pool{n}d_with_indices.default"

    def meta(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
        kernel, stride, padding, dilation = _pool_arguments(op, n, kernel_size, stride, padding, dilation)
        require_dtype(not dtype_of(self).is_bool and not dtype_of(self).is_complex, op,
                      f"{dtype_of(self)} input is not supported")
        shape = _pool_meta(op, n, self, kernel, stride, padding, dilation, ceil_mode)
        return tensor(shape, dtype_of(self)), tensor(shape, dtypes.int64)
    return meta


def _max_pool_kernel(n):
    meta = _max_pool_meta(n)

    def kernel(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
        outputs = [int(d) for d in meta(self, kernel_size, stride, padding, dilation, ceil_mode)[0].shape[-n:]]
        kernel, stride, padding, dilation = _pool_arguments("", n, kernel_size, stride, padding, dilation)
        spatial = self.shape[-n:]
        floating = self.dtype.kind == "f" or self.dtype == dtypes.bfloat16.numpy
        fill = -np.inf if floating else np.iinfo(self.dtype).min
        # Every input position's flat index in its spatial plane (what ATen returns); padding gets -1.
        plane = np.arange(math.prod(spatial), dtype=np.int64).reshape(spatial)
        kernel = _reachable_taps(kernel, dilation, padding, spatial)
        values = _strided_windows(_padded_for_windows(self, kernel, stride, padding, dilation, outputs, fill),
                                  kernel, stride, dilation, outputs)
        where = _strided_windows(_padded_for_windows(plane, kernel, stride, padding, dilation, outputs, -1),
                                 kernel, stride, dilation, outputs)
        taps = math.prod(kernel)
        values = values.reshape(*values.shape[:-n], taps)
        where = np.broadcast_to(where.reshape(*where.shape[:-n], taps), values.shape)
        inside = where >= 0
        # ATen scans each window in order and takes a value if it is greater than the best so far or NaN:
        # the first maximum wins ties, the last NaN wins over everything, and an all -inf window reports its
        # first position inside the input.
        if floating:
            nan = np.isnan(values) & inside
            comparable = np.where(inside & ~nan, values, fill)
        else:
            comparable = np.where(inside, values, fill)
        best = comparable.max(axis=-1, keepdims=True)
        choice = np.argmax((comparable == best) & inside, axis=-1)
        if floating:
            last_nan = taps - 1 - np.argmax(nan[..., ::-1], axis=-1)
            choice = np.where(nan.any(axis=-1), last_nan, choice)
        chosen = choice[..., None]
        value = np.take_along_axis(values, chosen, -1)[..., 0]
        index = np.take_along_axis(where, chosen, -1)[..., 0]
        # A window can miss the input entirely (ceil mode with dilation): ATen then reports its initial
        # value and the position its scan would have started at, the first tap at or after 0 in each dim.
        empty = ~inside.any(axis=-1)
        if empty.any():
            start_index = np.zeros((), np.int64)
            for o, s, p, d, size in zip(outputs, stride, padding, dilation, spatial):
                start = np.arange(o) * s - p
                start = np.where(start < 0, start + (-start + d - 1) // d * d, start)
                start_index = np.add.outer(start_index * size, start)
            value = np.where(empty, fill, value)
            index = np.where(empty, start_index, index)
        return value, index
    return kernel


for _n in (2, 3):
    defop(f"max_pool{_n}d_with_indices(Tensor self, int[{_n}] kernel_size, int[{_n}] stride=[], "
          f"int[{_n}] padding=0, int[{_n}] dilation=1, bool ceil_mode=False) -> (Tensor, Tensor)",
          _max_pool_meta(_n), _max_pool_kernel(_n),
          doc="indices are flat positions in each input's spatial plane (h * W + w), like ATen's")


def _spatial_input_shape(op, self, n):
    """The shape of an n-D spatial op's input: (C, *spatial) or (N, C, *spatial), no empty non-batch dims."""
    shape = shape_of(self)
    require(len(shape) in (n + 1, n + 2), op,
            f"expected a {n + 1}-D or {n + 2}-D (batched) input, got shape {list(shape)}")
    _nonzero_dims(op, shape, len(shape) - n - 1, f"a {n + 1}-D or {n + 2}-D input")
    return shape


def _adaptive_avg_pool_meta(n):
    op = f"aten._adaptive_avg_pool{n}d.default"

    def meta(self, output_size):
        shape = shape_of(self)
        require(len(shape) in (n + 1, n + 2), op,
                f"expected a {n + 1}-D or {n + 2}-D (batched) input, got shape {list(shape)}")
        # ATen: the 2-D pool needs its two spatial dims non-empty, the 3-D one every dim after the first
        _nonzero_dims(op, shape, len(shape) - 2 if n == 2 else 1, f"a {n + 1}-D or {n + 2}-D input")
        require_arg(len(output_size) == n, op, f"output_size must have {n} elements, got {list(output_size)}")
        require_arg(all(_at_least(s, 0) for s in output_size), op,
                    f"output_size must be non-negative, got {list(output_size)}")
        require_dtype(_is_floating(dtype_of(self)), op, f"expected a floating-point input, got {dtype_of(self)}")
        return tensor([*shape[:-n], *output_size], dtype_of(self))
    return meta


def _adaptive_average(x: np.ndarray, axis: int, out: int) -> np.ndarray:
    """Output i averages input [floor(i * size / out), ceil((i + 1) * size / out)) along `axis`, ATen's adaptive
    windows. Window by window, so a NaN or inf reaches only the windows that hold it (a matrix of weights would
    multiply it by zero everywhere else)."""
    size = x.shape[axis]
    index = np.arange(out)
    starts, ends = (index * size) // out, -((-(index + 1) * size) // out)
    windows = [x.take(np.arange(start, end), axis=axis).mean(axis=axis, keepdims=True)
               for start, end in zip(starts, ends)]
    return np.concatenate(windows, axis=axis) if windows else np.zeros((*x.shape[:axis], 0, *x.shape[axis + 1:]),
                                                                          x.dtype)


def _adaptive_avg_pool_kernel(n):
    def kernel(self, output_size):
        x = self.astype(_accumulation(self.dtype))
        for axis, out in zip(range(self.ndim - n, self.ndim), output_size):
            x = _adaptive_average(x, axis, int(out))
        return x
    return kernel


for _n in (2, 3):
    defop(f"_adaptive_avg_pool{_n}d(Tensor self, SymInt[{_n}] output_size) -> Tensor",
          _adaptive_avg_pool_meta(_n), checked(_adaptive_avg_pool_meta(_n), _adaptive_avg_pool_kernel(_n)))


# ---------------------------------------------------------------------------------------------
# Normalization

def _statistics_dtype(op: str, input, *params) -> dtypes.DType:
    """ATen's CPU mixed-precision rule: float16/bfloat16 input with float32 parameters keeps its statistics
    in float32; otherwise every parameter must have the input's dtype, and so do the statistics."""
    dtype = dtype_of(input)
    require_dtype(_is_floating(dtype), op, f"expected a floating-point input, got {dtype}")
    given = [dtype_of(p) for p in params if p is not None]
    if dtype in (dtypes.float16, dtypes.bfloat16) and any(d is dtypes.float32 for d in given):
        require_dtype(all(d is dtypes.float32 for d in given), op,
                      f"mixed precision needs every parameter in float32, got {[d.name for d in given]}")
        return dtypes.float32
    require_dtype(all(d is dtype for d in given), op,
                  f"parameters must have the input's dtype {dtype} (or float32 for float16/bfloat16 input), "
                  f"got {[d.name for d in given]}", fix="convert the parameters to the input's dtype")
    return dtype


def _channel_vectors(op: str, channels, **vectors) -> None:
    for name, value in vectors.items():
        if value is not None:
            require(len(shape_of(value)) == 1 and sym_eq(shape_of(value)[0], channels), op,
                    f"expected {name} to have shape [{channels}], got {list(shape_of(value))}")


def _batch_norm_meta(op, input, weight, bias, running_mean, running_var, *, uses_batch_stats, empty_ok=False):
    """`empty_ok`: torch's composite batch_norm returns an empty input as it is; the core ops refuse it when they
    need batch statistics (checked again on the run-time shape where a size is symbolic)."""
    shape = shape_of(input)
    require(len(shape) >= 2, op, f"expected an input of at least 2 dims (N, C, ...), got shape {list(shape)}")
    if uses_batch_stats and not empty_ok:
        require(not any(_is_const(d, 0) for d in shape), op,
                f"batch statistics need at least one element, got shape {list(shape)}")
    channels = shape[1]
    _channel_vectors(op, channels, weight=weight, bias=bias, running_mean=running_mean, running_var=running_var)
    stats = _statistics_dtype(op, input, weight, bias, running_mean, running_var)
    saved = [channels] if uses_batch_stats else [0]
    return like(input), tensor(saved, stats), tensor(saved, stats)


def _broadcast_channel(vector: np.ndarray, rank: int) -> np.ndarray:
    return vector.reshape(1, -1, *[1] * (rank - 2))


def _scaled_and_shifted(x, mean, invstd, weight, bias):
    """ATen's batch and group norm kernels: x * alpha + beta, alpha = invstd * weight and beta = bias - mean * alpha
    (weight 1 and bias 0 when absent), each per channel. An infinite weight then gives inf - inf = NaN where
    (x - mean) * invstd * weight + bias would give an infinity, and a zero comes out +0."""
    alpha = invstd if weight is None else invstd * weight
    return x * alpha + ((0.0 if bias is None else bias) - mean * alpha)


def _batch_norm_training(input, weight, bias, eps):
    acc = np.float64
    x = input.astype(acc)
    axes = (0, *range(2, x.ndim))
    mean = x.mean(axis=axes)
    var = ((x - _broadcast_channel(mean, x.ndim)) ** 2).mean(axis=axes)  # biased, like ATen's batch stats
    invstd = 1 / np.sqrt(var + eps)
    return _batch_norm_output(x, mean, invstd, weight, bias), mean, invstd


def _batch_norm_with_running_stats(input, weight, bias, running_mean, running_var, eps):
    invstd = 1 / np.sqrt(running_var.astype(np.float64) + eps)
    return _batch_norm_output(input.astype(np.float64), running_mean.astype(np.float64), invstd, weight, bias)


def _batch_norm_output(x, mean, invstd, weight, bias):
    def channel(vector):
        return None if vector is None else _broadcast_channel(vector.astype(np.float64), x.ndim)
    return _scaled_and_shifted(x, channel(mean), channel(invstd), channel(weight), channel(bias))


def _native_batch_norm_legit_meta(input, weight, bias, running_mean, running_var, training, momentum, eps):
    return _batch_norm_meta("aten._native_batch_norm_legit.default", input, weight, bias, running_mean,
                            running_var, uses_batch_stats=training)


def _native_batch_norm_legit_kernel(input, weight, bias, running_mean, running_var, training, momentum, eps):
    with np.errstate(all="ignore"):
        if training:
            return _batch_norm_training(input, weight, bias, eps)
        out = _batch_norm_with_running_stats(input, weight, bias, running_mean, running_var, eps)
        return out, np.zeros(0), np.zeros(0)


defop("_native_batch_norm_legit(Tensor input, Tensor? weight, Tensor? bias, Tensor(a!) running_mean, "
      "Tensor(b!) running_var, bool training, float momentum, float eps) -> (Tensor, Tensor, Tensor)",
      _native_batch_norm_legit_meta, checked(_native_batch_norm_legit_meta, _native_batch_norm_legit_kernel),
      doc="Returns (out, save_mean, save_invstd); when training, batch statistics normalize the input. torch "
          "also updates running_mean/running_var in place then; kiln's functional IR only computes the outputs. "
          "Without training the running statistics are used and save_mean/save_invstd are empty.")


def _no_stats_meta(input, weight, bias, training, momentum, eps):
    op = "aten._native_batch_norm_legit.no_stats"
    require_arg(training, op, "without running statistics the batch statistics are needed: training must be True")
    return _batch_norm_meta(op, input, weight, bias, None, None, uses_batch_stats=True)


def _no_stats_kernel(input, weight, bias, training, momentum, eps):
    with np.errstate(all="ignore"):
        return _batch_norm_training(input, weight, bias, eps)


defop("_native_batch_norm_legit.no_stats(Tensor input, Tensor? weight, Tensor? bias, bool training, "
      "float momentum, float eps) -> (Tensor, Tensor, Tensor)", _no_stats_meta,
      checked(_no_stats_meta, _no_stats_kernel))


def _no_training_meta(input, weight, bias, running_mean, running_var, momentum, eps):
    return _batch_norm_meta("aten._native_batch_norm_legit_no_training.default", input, weight, bias,
                            running_mean, running_var, uses_batch_stats=False)


def _no_training_kernel(input, weight, bias, running_mean, running_var, momentum, eps):
    with np.errstate(all="ignore"):
        out = _batch_norm_with_running_stats(input, weight, bias, running_mean, running_var, eps)
        return out, np.zeros(0), np.zeros(0)


defop("_native_batch_norm_legit_no_training(Tensor input, Tensor? weight, Tensor? bias, Tensor running_mean, "
      "Tensor running_var, float momentum, float eps) -> (Tensor, Tensor, Tensor)",
      _no_training_meta, _no_training_kernel, doc="Returns (out, empty, empty), like torch.")


def _require_normalized_shape(op: str, input, normalized_shape, affine: dict) -> tuple[list, int]:
    """layer_norm / rms_norm: normalized_shape names the input's trailing dims, and each affine tensor has that
    shape. Returns (normalized_shape, the first normalized axis)."""
    shape = shape_of(input)
    normalized = list(normalized_shape)
    require_arg(len(normalized) >= 1, op, "normalized_shape must have at least one element")
    axis = len(shape) - len(normalized)
    require(axis >= 0 and all(sym_eq(a, b) for a, b in zip(shape[axis:], normalized)), op,
            f"given normalized_shape={normalized}, expected an input of shape [*, "
            f"{', '.join(map(str, normalized))}], got {list(shape)}",
            fix="normalized_shape must equal the input's trailing dims")
    for name, value in affine.items():
        if value is not None:
            require(len(shape_of(value)) == len(normalized) and all(
                sym_eq(a, b) for a, b in zip(shape_of(value), normalized)), op,
                f"expected {name} of shape {normalized}, got {list(shape_of(value))}")
    return normalized, axis


def _layer_norm_meta(input, normalized_shape, weight, bias, eps):
    op = "aten.native_layer_norm.default"
    shape = shape_of(input)
    normalized, axis = _require_normalized_shape(op, input, normalized_shape, {"weight": weight, "bias": bias})
    stats = _statistics_dtype(op, input, weight, bias)
    stat_shape = [*shape[:axis], *[1] * len(normalized)]
    return like(input), tensor(stat_shape, stats), tensor(stat_shape, stats)


def _layer_norm_kernel(input, normalized_shape, weight, bias, eps):
    axes = tuple(range(input.ndim - len(normalized_shape), input.ndim))
    x = input.astype(np.float64)
    with np.errstate(all="ignore"):
        mean = x.mean(axis=axes, keepdims=True) if x.size else np.zeros([*x.shape[:-len(axes)], *[1] * len(axes)])
        var = ((x - mean) ** 2).mean(axis=axes, keepdims=True) if x.size else mean
        rstd = 1 / np.sqrt(var + eps)
        out = (x - mean) * rstd
        if weight is not None:
            out = out * weight.astype(np.float64)
        # ATen adds the bias or 0: a negative weight times +0 gives +0, not -0
        out = out + (0.0 if bias is None else bias.astype(np.float64))
    return out, mean, rstd


defop("native_layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight, Tensor? bias, float eps) "
      "-> (Tensor, Tensor, Tensor)", _layer_norm_meta, _layer_norm_kernel,
      doc="Returns (out, mean, rstd); the statistics keep the normalized dims as size 1.")


def _group_norm_meta(input, weight, bias, N, C, HxW, group, eps):
    op = "aten.native_group_norm.default"
    shape = shape_of(input)
    require(len(shape) >= 2, op, f"expected an input of at least 2 dims (N, C, ...), got shape {list(shape)}")
    require(sym_eq(shape[0], N) and sym_eq(shape[1], C) and sym_eq(numel(shape), N * C * HxW), op,
            f"input of shape {list(shape)} does not match N={N}, C={C}, HxW={HxW}")
    require_arg(guard_bool(sympy.Gt(group, 0)), op, f"group must be positive, got {group}")  # symbolic from legalize
    require(guard_bool(sympy.Eq(sympy.Mod(C, group), 0)), op,
            f"expected the number of channels {C} to be divisible by group={group}",
            fix="use a group count that divides the channel count")
    _channel_vectors(op, C, weight=weight, bias=bias)
    stats = _statistics_dtype(op, input, weight, bias)
    return like(input), tensor([N, group], stats), tensor([N, group], stats)


def _group_norm_kernel(input, weight, bias, N, C, HxW, group, eps):
    x = input.astype(np.float64).reshape(N, group, (C // group) * HxW)
    with np.errstate(all="ignore"):
        if x.size:
            mean = x.mean(axis=-1)
            var = ((x - mean[..., None]) ** 2).mean(axis=-1)
        else:
            mean = var = np.zeros((N, group))
        rstd = 1 / np.sqrt(var + eps)
        per_channel = [np.repeat(v, C // group, axis=1)[..., None] for v in (mean, rstd)]  # [N, C, 1]
        weight, bias = (None if v is None else v.astype(np.float64)[:, None] for v in (weight, bias))
        out = _scaled_and_shifted(x.reshape(N, C, HxW), *per_channel, weight, bias)
        return out.reshape(input.shape), mean, rstd


defop("native_group_norm(Tensor input, Tensor? weight, Tensor? bias, SymInt N, SymInt C, SymInt HxW, int group, "
      "float eps) -> (Tensor, Tensor, Tensor)", _group_norm_meta, _group_norm_kernel,
      doc="Returns (out, mean [N, group], rstd [N, group]).")


# ---------------------------------------------------------------------------------------------
# Dropout

def _native_dropout_meta(input, p, train):
    op = "aten.native_dropout.default"
    require_arg(0 <= p <= 1, op, f"dropout probability has to be between 0 and 1, got {p}")
    return like(input), like(input, dtype=dtypes.bool_)


def _native_dropout_kernel(input, p, train):
    if train is False:
        return input.copy(), np.ones(input.shape, np.bool_)
    from kiln.ir.ops.factory import generator  # the generator kiln.manual_seed reseeds

    keep = generator().random(input.shape) >= p  # kept with probability 1 - p, like bernoulli_(1 - p)
    scale = 0.0 if p == 1 else 1 / (1 - p)
    with np.errstate(all="ignore"):
        out = (input * keep.astype(input.dtype)).astype(_opmath(input.dtype)) * scale
    return out, keep


defop("native_dropout(Tensor input, float p, bool? train) -> (Tensor, Tensor)",
      _native_dropout_meta, _native_dropout_kernel, tags=("random",),
      doc="Returns (input * mask / (1 - p), mask); train=False returns (input, all-true mask). "
          "train=None counts as training.")


# ---------------------------------------------------------------------------------------------
# Embeddings

def _check_index_dtype(op: str, name: str, value) -> None:
    require_dtype(dtype_of(value) in (dtypes.int32, dtypes.int64), op,
                  f"expected {name} to be int32 or int64, got {dtype_of(value)}",
                  fix=f"convert {name} to int64")


def _check_indices_in_range(op: str, indices: np.ndarray, rows: int) -> None:
    if indices.size and (indices.min() < 0 or indices.max() >= rows):
        bad = indices[(indices < 0) | (indices >= rows)].flat[0]
        raise InputError(f"{op}: index {bad} is out of range for a weight with {rows} rows",
                         fix=f"indices must be in [0, {rows})")


def _embedding_meta(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    op = "aten.embedding.default"
    require(len(shape_of(weight)) == 2, op, f"weight must be 2-D, got shape {list(shape_of(weight))}")
    _check_index_dtype(op, "indices", indices)
    return tensor([*shape_of(indices), shape_of(weight)[1]], dtype_of(weight))


def _embedding_kernel(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    _check_indices_in_range("aten.embedding.default", indices, weight.shape[0])
    return weight[indices]


defop("embedding(Tensor weight, Tensor indices, SymInt padding_idx=-1, bool scale_grad_by_freq=False, "
      "bool sparse=False) -> Tensor", _embedding_meta, _embedding_kernel,
      doc="padding_idx, scale_grad_by_freq and sparse only affect gradients.")

_MODE_SUM, _MODE_MEAN, _MODE_MAX = 0, 1, 2


def _embedding_bag_meta(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                        per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    op = "aten._embedding_bag.default"
    require(len(shape_of(weight)) == 2, op, f"weight must be 2-D, got shape {list(shape_of(weight))}")
    require_dtype(_is_floating(dtype_of(weight)), op, f"expected a floating-point weight, got {dtype_of(weight)}")
    _check_index_dtype(op, "indices", indices)
    _check_index_dtype(op, "offsets", offsets)
    require(len(shape_of(indices)) == 1 and len(shape_of(offsets)) == 1, op,
            f"expected 1-D indices and offsets, got shapes {list(shape_of(indices))} and {list(shape_of(offsets))}")
    require_arg(mode in (_MODE_SUM, _MODE_MEAN, _MODE_MAX), op,
                f"mode must be 0 (sum), 1 (mean) or 2 (max), got {mode}")
    bags = shape_of(offsets)[0]
    if include_last_offset:
        require(_at_least(bags, 1), op, "include_last_offset needs at least one offset")
        bags = as_dim(bags - 1)
    if per_sample_weights is not None:
        require_arg(mode == _MODE_SUM, op, "per_sample_weights are only supported with mode=0 (sum)")
        require(len(shape_of(per_sample_weights)) == 1 and sym_eq(shape_of(per_sample_weights)[0],
                                                                   shape_of(indices)[0]), op,
                f"expected per_sample_weights of shape [{shape_of(indices)[0]}], "
                f"got {list(shape_of(per_sample_weights))}")
        require_dtype(dtype_of(per_sample_weights) is dtype_of(weight), op,
                      f"per_sample_weights ({dtype_of(per_sample_weights)}) must have weight's dtype "
                      f"({dtype_of(weight)})")
    # ATen's CPU kernel first promotes indices and offsets to a common type, used for every index output.
    index_dtype = dtypes.promote_types(dtype_of(indices), dtype_of(offsets))
    # The fused float32/float16/bfloat16 sum path does not produce offset2bag.
    fast_sum = (mode == _MODE_SUM and padding_idx < 0
                and dtype_of(weight) in (dtypes.float32, dtypes.float16, dtypes.bfloat16))
    dim = shape_of(weight)[1]
    return (tensor([bags, dim], dtype_of(weight)),
            tensor([0 if fast_sum else shape_of(indices)[0]], index_dtype),
            tensor([bags], index_dtype),
            tensor([bags, dim] if mode == _MODE_MAX else [bags], index_dtype))


def _embedding_bag_kernel(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                          per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    op = "aten._embedding_bag.default"
    expected = _embedding_bag_meta(weight, indices, offsets, scale_grad_by_freq, mode, sparse,
                                   per_sample_weights, include_last_offset, padding_idx)
    bags, dim = (int(d) for d in expected[0].shape)
    count = indices.shape[0]
    _check_indices_in_range(op, indices, weight.shape[0])
    if offsets.size:
        if offsets[0] != 0:
            raise InputError(f"{op}: offsets[0] must be 0, got {offsets[0]}")
        if offsets[-1] > count:
            raise InputError(f"{op}: offsets[-1] = {offsets[-1]} is greater than the number of indices {count}")
        if np.any(np.diff(offsets) < 0):
            raise InputError(f"{op}: offsets must be non-decreasing, got {offsets.tolist()}")
        if include_last_offset and offsets[-1] != count:
            # ATen's CPU paths disagree with each other on such input (some stop at the last offset, some at
            # the end of indices), so kiln refuses it.
            raise InputError(f"{op}: with include_last_offset the last offset must equal the number of indices "
                             f"{count}, got {offsets[-1]}")
    starts = offsets[:bags].astype(np.int64)  # the last bag runs to the end of indices
    bag_of = np.searchsorted(starts, np.arange(count), side="right") - 1
    valid = indices != padding_idx if padding_idx >= 0 else np.ones(count, np.bool_)
    acc = _accumulation(weight.dtype)
    rows = weight[indices].astype(acc)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.astype(acc)[:, None]
    rows = np.where(valid[:, None], rows, 0)
    sizes = np.bincount(bag_of[valid], minlength=bags) if count else np.zeros(bags, np.int64)
    index_dtype = expected[1].dtype.numpy
    if mode == _MODE_MAX:
        # ATen scans each bag in order, starting from its first row and replacing on a strictly greater value: the
        # first maximum wins, and a NaN is the result only where it comes first (nothing is greater than it, and it
        # is greater than nothing).
        kept_bags, kept_rows = bag_of[valid], rows[valid]
        positions = np.arange(count)[valid]
        numbers = ~np.isnan(kept_rows)
        best = np.full((bags, dim), -np.inf, acc)
        np.maximum.at(best, kept_bags, np.where(numbers, kept_rows, -np.inf))
        first = np.full((bags, dim), count)
        np.minimum.at(first, kept_bags,
                      np.where(numbers & (kept_rows == best[kept_bags]), positions[:, None], count))
        bag_start = np.full(bags, count)
        np.minimum.at(bag_start, kept_bags, positions)
        empty = (sizes == 0)[:, None]
        if count:
            starts_with_nan = np.isnan(rows[np.minimum(bag_start, count - 1)])
            first = np.minimum(np.where(starts_with_nan, bag_start[:, None], first), count - 1)
            output = np.where(empty, 0, np.take_along_axis(rows, first, axis=0))
            max_indices = np.where(empty, 0, indices[first])
        else:
            output, max_indices = np.zeros((bags, dim), acc), np.zeros((bags, dim), np.int64)
    else:
        output = np.zeros((bags, dim), acc)
        np.add.at(output, bag_of, rows)
        if mode == _MODE_MEAN:
            output = output / np.maximum(sizes, 1)[:, None]
        max_indices = sizes if mode == _MODE_MEAN else np.zeros(bags, np.int64)
    fast_sum = int(expected[1].shape[0]) == 0
    offset2bag = np.zeros(0, index_dtype) if fast_sum else bag_of
    bag_size = sizes if mode != _MODE_SUM else np.zeros(bags, np.int64)
    return output, offset2bag, bag_size, max_indices


defop("_embedding_bag(Tensor weight, Tensor indices, Tensor offsets, bool scale_grad_by_freq=False, int mode=0, "
      "bool sparse=False, Tensor? per_sample_weights=None, bool include_last_offset=False, int padding_idx=-1) "
      "-> (Tensor, Tensor, Tensor, Tensor)", _embedding_bag_meta, _embedding_bag_kernel,
      doc="Returns (output, offset2bag, bag_size, max_indices) as ATen's CPU kernel: offset2bag is empty on the "
          "fused float sum path, bag_size and max_indices are zeros for sum, max_indices repeats bag_size for "
          "mean, and empty bags give zeros.")


# ---------------------------------------------------------------------------------------------
# Padding

def _pad_meta(kind: str, n: int):
    op = f"aten.{kind}_pad{n}d.default"

    def meta(self, padding):
        shape = _spatial_input_shape(op, self, n)
        require_arg(len(padding) == 2 * n, op, f"padding must have {2 * n} elements, got {list(padding)}")
        spatial = []
        for i in range(n):  # padding lists the last dim first: (left, right, top, bottom, front, back)
            size = shape[len(shape) - 1 - i]
            before, after = padding[2 * i], padding[2 * i + 1]
            if kind == "reflection":
                require(not _at_least(before, size) and not _at_least(after, size), op,
                        f"padding ({before}, {after}) must be smaller than the input size {size} at dimension "
                        f"{len(shape) - 1 - i} of input {list(shape)}",
                        fix="reflection can only mirror existing elements; use replication or constant padding")
            out = as_dim(size + before + after)
            require(_at_least(out, 1 if kind == "reflection" else 0), op,
                    f"input of shape {list(shape)} is too small for padding {list(padding)}: output size {out}")
            spatial.insert(0, out)
        return tensor([*shape[:-n], *spatial], dtype_of(self))
    return meta


def _pad_kernel(kind: str, n: int):
    mode = "reflect" if kind == "reflection" else "edge"

    def kernel(self, padding):
        before = [padding[2 * i] for i in reversed(range(n))]
        after = [padding[2 * i + 1] for i in reversed(range(n))]
        lead = [(0, 0)] * (self.ndim - n)
        # Negative padding crops; ATen reflects about the original edges, i.e. pads first, then crops.
        padded = np.pad(self, lead + [(max(b, 0), max(a, 0)) for b, a in zip(before, after)], mode=mode)
        crop = tuple(slice(max(-b, 0), padded.shape[self.ndim - n + i] - max(-a, 0))
                     for i, (b, a) in enumerate(zip(before, after)))
        return padded[(slice(None),) * (self.ndim - n) + crop]
    return kernel


for _kind, _dims in (("reflection", (1, 2, 3)), ("replication", (2, 3))):
    for _n in _dims:
        defop(f"{_kind}_pad{_n}d(Tensor self, SymInt[{2 * _n}] padding) -> Tensor",
              _pad_meta(_kind, _n), checked(_pad_meta(_kind, _n), _pad_kernel(_kind, _n)))


# ---------------------------------------------------------------------------------------------
# Upsampling

def _scaled_size(size: SymInt, scale: float) -> SymInt:
    """ATen's output size for a scale factor: the double product truncated. Static sizes reproduce the
    double arithmetic exactly; symbolic ones use the decimal scale (floor(s0 * 3/2) for 1.5)."""
    if isinstance(size, int):
        return int(size * scale)
    if float(scale).is_integer():
        return as_dim(size * int(scale))
    return as_dim(sympy.floor(sympy.sympify(size) * sympy.Rational(repr(float(scale)))))


def _upsample_sizes(op: str, input, output_size, scale_factors, spatial: int = 2) -> list:
    """The output's `spatial` trailing sizes, from output_size or the scale factors (exactly one is given)."""
    shape = shape_of(input)
    layout = {1: "(N, C, L)", 2: "(N, C, H, W)"}[spatial]
    require(len(shape) == 2 + spatial, op, f"expected a {2 + spatial}-D input {layout}, got shape {list(shape)}")
    require_arg((output_size is None) != (scale_factors is None), op,
                "exactly one of output_size and scale_factors must be given",
                fix="pass output_size=None when giving scale_factors, or the reverse")
    if output_size is not None:
        require_arg(len(output_size) == spatial, op,
                    f"output_size must have {spatial} element(s), got {list(output_size)}")
        sizes = list(output_size)
    else:
        require_arg(len(scale_factors) == spatial, op,
                    f"scale_factors must have {spatial} element(s), got {list(scale_factors)}")
        sizes = [_scaled_size(s, f) for s, f in zip(shape[2:], scale_factors)]
    for size in [*shape[1:], *sizes]:
        require(not isinstance(size, int) or size > 0, op,
                f"input and output sizes should be greater than 0, got input {list(shape)} and output {sizes}")
    return sizes


def _nearest_meta(input, output_size, scale_factors):
    op = "aten.upsample_nearest2d.vec"
    sizes = _upsample_sizes(op, input, output_size, scale_factors)
    return tensor([*shape_of(input)[:2], *sizes], dtype_of(input))


def nearest_source(size: int, out: int, scale) -> np.ndarray:
    """ATen's nearest_idx: float32 arithmetic, floor(dst * scale) (not the 'exact' half-pixel rule)."""
    if out == size:
        return np.arange(out)
    if out == 2 * size:
        return np.arange(out) >> 1
    ratio = np.float32(1.0 / scale) if scale is not None and scale > 0 else np.float32(size) / np.float32(out)
    return np.minimum(np.floor(np.arange(out, dtype=np.float32) * ratio).astype(np.int64), size - 1)


def _nearest_resample(input, out_h: int, out_w: int, scale_h, scale_w):
    rows = nearest_source(input.shape[2], out_h, scale_h)
    cols = nearest_source(input.shape[3], out_w, scale_w)
    return input[:, :, rows[:, None], cols[None, :]]


def _nearest_kernel(input, output_size, scale_factors):
    out_h, out_w = (int(s) for s in _nearest_meta(input, output_size, scale_factors).shape[2:])
    return _nearest_resample(input, out_h, out_w, *(scale_factors if scale_factors is not None else (None, None)))


defop("upsample_nearest2d.vec(Tensor input, SymInt[]? output_size, float[]? scale_factors) -> Tensor",
      _nearest_meta, _nearest_kernel,
      doc="torch's legacy nearest: source = min(floor(dst * in/out), in - 1), or 1/scale when scale factors "
          "are given.")


def _bilinear_meta(input, output_size, align_corners, scale_factors):
    op = "aten.upsample_bilinear2d.vec"
    sizes = _upsample_sizes(op, input, output_size, scale_factors)
    require_dtype(_is_floating(dtype_of(input)), op, f"expected a floating-point input, got {dtype_of(input)}")
    return tensor([*shape_of(input)[:2], *sizes], dtype_of(input))


def area_pixel_scale(size, out, align_corners: bool, scale, dtype: np.dtype) -> float:
    """ATen's area_pixel_compute_scale in opmath `dtype` (float32 unless the input is float64), as a Python float
    that `dtype` holds exactly."""
    if align_corners:
        return float(dtype.type(size - 1) / dtype.type(out - 1)) if out > 1 else 0.0
    if scale is not None and scale > 0:
        return float(dtype.type(1.0 / scale))
    return float(dtype.type(size) / dtype.type(out))


def area_pixel_sources(size: int, out: int, align_corners: bool, scale, dtype: np.dtype) -> np.ndarray:
    """ATen's area_pixel_compute_source_index for every output position, in opmath `dtype`, not clamped (linear
    clamps at 0, cubic does not). The half-pixel form ratio * (i + 0.5) - 0.5 rounds once, as ATen's CPU kernels,
    compiled with FMA contraction, do: two roundings (or float64 positions) put a position an ulp off theirs, which
    moved interpolated values by up to 1.1e-5 (CLAP's 64 -> 256 bicubic resize). The float32 product is exact in
    float64, so one rounding to float32 after the float64 subtract is the FMA's result."""
    ratio = area_pixel_scale(size, out, align_corners, scale, dtype)
    if align_corners:
        return dtype.type(ratio) * np.arange(out, dtype=dtype)
    halves = np.arange(out, dtype=dtype) + dtype.type(0.5)
    if dtype == np.float32:
        return (ratio * halves.astype(np.float64) - 0.5).astype(np.float32)
    return dtype.type(ratio) * halves - dtype.type(0.5)  # an ulp of a float64 position is below every tolerance


def _area_pixel_sources_op(size: int, out: int, align_corners: bool, scale, compute: dtypes.DType):
    """area_pixel_sources written with ops, for the decompositions."""
    aten = ops.aten
    ratio = area_pixel_scale(size, out, align_corners, scale, np.dtype(compute.numpy))
    if align_corners:
        return aten.mul.Scalar(aten.arange.start_step(0, out, 1, dtype=compute), ratio)
    halves = aten.add.Scalar(aten.arange.start_step(0, out, 1, dtype=dtypes.float64), 0.5)
    return _cast(aten.sub.Scalar(aten.mul.Scalar(halves, ratio), 0.5), compute)


def linear_taps(size: int, out: int, align_corners: bool, scale, dtype):
    """ATen's two linear taps per output position with their weights, in opmath precision. A dim whose size does
    not change takes taps (i, i) with weights (1, 0), whatever the scale, as ATen's do (an inf there becomes NaN)."""
    one = dtype.type(1)
    if size == out:
        identity = np.arange(out)
        return identity, identity, np.ones(out, dtype), np.zeros(out, dtype)
    source = area_pixel_sources(size, out, align_corners, scale, dtype)
    if not align_corners:
        source = np.maximum(source, 0)
    low = np.minimum(np.floor(source).astype(np.int64), size - 1)
    weight_high = np.clip(source - low, 0, 1).astype(dtype)
    high = np.minimum(low + 1, size - 1)
    return low, high, one - weight_high, weight_high


def _bilinear_resample(input, out_h: int, out_w: int, align_corners: bool, scale_h, scale_w):
    dtype = _opmath(input.dtype)
    x = input.astype(dtype)
    top, bottom, w_top, w_bottom = linear_taps(input.shape[2], out_h, align_corners, scale_h, dtype)
    left, right, w_left, w_right = linear_taps(input.shape[3], out_w, align_corners, scale_w, dtype)
    upper = x[:, :, top][..., left] * w_left + x[:, :, top][..., right] * w_right
    lower = x[:, :, bottom][..., left] * w_left + x[:, :, bottom][..., right] * w_right
    return upper * w_top[:, None] + lower * w_bottom[:, None]


def _bilinear_kernel(input, output_size, align_corners, scale_factors):
    out_h, out_w = (int(s) for s in _bilinear_meta(input, output_size, align_corners, scale_factors).shape[2:])
    scales = scale_factors if scale_factors is not None else (None, None)
    return _bilinear_resample(input, out_h, out_w, align_corners, *scales)


defop("upsample_bilinear2d.vec(Tensor input, SymInt[]? output_size, bool align_corners, float[]? scale_factors) "
      "-> Tensor", _bilinear_meta, _bilinear_kernel)


# ---------------------------------------------------------------------------------------------
# grid_sampler_2d

_BILINEAR, _NEAREST, _BICUBIC = 0, 1, 2
_ZEROS, _BORDER, _REFLECTION = 0, 1, 2


def _grid_sampler_meta(input, grid, interpolation_mode, padding_mode, align_corners):
    op = "aten.grid_sampler_2d.default"
    x, g = shape_of(input), shape_of(grid)
    require(len(x) == 4 and len(g) == 4, op,
            f"expected 4-D input and grid, got shapes {list(x)} and {list(g)}")
    require(sym_eq(x[0], g[0]) and sym_eq(g[3], 2), op,
            f"expected grid of shape [{x[0]}, H_out, W_out, 2] for input of shape {list(x)}, got {list(g)}",
            fix="the grid holds one (x, y) pair per output pixel and per batch element")
    require_dtype(_is_floating(dtype_of(input)) and dtype_of(grid) is dtype_of(input), op,
                  f"expected floating-point input and grid of the same dtype, got {dtype_of(input)} "
                  f"and {dtype_of(grid)}")
    require_arg(interpolation_mode in (_BILINEAR, _NEAREST, _BICUBIC), op,
                f"interpolation_mode must be 0 (bilinear), 1 (nearest) or 2 (bicubic), got {interpolation_mode}")
    require_arg(padding_mode in (_ZEROS, _BORDER, _REFLECTION), op,
                f"padding_mode must be 0 (zeros), 1 (border) or 2 (reflection), got {padding_mode}")
    for size in x[2:]:
        require(not _is_const(size, 0), op, f"input spatial dims must be non-empty, got shape {list(x)}")
    return tensor([x[0], x[1], g[1], g[2]], dtype_of(input))


class _GridAxis:
    """One axis of grid_sampler: unnormalize grid coordinates and apply the padding mode, with the same
    algebra as ATen's vectorized CPU kernel (ComputeLocation), in the input's opmath precision."""

    def __init__(self, size: int, align_corners: bool, padding_mode: int, dtype):
        self.size, self.align_corners, self.padding_mode, self.t = size, align_corners, padding_mode, dtype.type

    def unnormalize(self, coordinate):
        t = self.t
        if self.align_corners:
            return (coordinate + t(1)) * t((self.size - 1) / 2)
        return (coordinate + t(1)) * t(self.size / 2) - t(0.5)

    def clip(self, coordinate):
        return np.minimum(self.t(self.size - 1), np.maximum(coordinate, self.t(0)))

    def reflect(self, coordinate):
        t = self.t
        low = t(0) if self.align_corners else t(-0.5)
        twice_span = t(2 * (self.size - 1)) if self.align_corners else t(2 * self.size)
        if twice_span <= 0:
            return np.zeros_like(coordinate)
        distance = np.abs(coordinate - low)
        extra = distance - np.trunc(distance / twice_span) * twice_span
        return np.minimum(extra, twice_span - extra) + low

    def pad(self, coordinate):
        if self.padding_mode == _BORDER:
            return self.clip(coordinate)
        if self.padding_mode == _REFLECTION:
            return self.clip(self.reflect(coordinate))
        return coordinate


def _gather(x, rows, cols, height, width):
    """x[n, :, rows, cols] per grid point, zero where the point is outside the input. x: [N, C, H, W];
    rows/cols: [N, Ho, Wo] integer arrays. Returns [N, C, Ho, Wo]."""
    inside = (rows >= 0) & (rows < height) & (cols >= 0) & (cols < width)
    batch = np.arange(x.shape[0])[:, None, None]
    values = x[batch, :, np.clip(rows, 0, height - 1), np.clip(cols, 0, width - 1)]  # [N, Ho, Wo, C]
    return np.moveaxis(np.where(inside[..., None], values, 0), -1, 1)


def _cubic_coefficients(t, dtype):
    a = dtype.type(-0.75)
    one, two = dtype.type(1), dtype.type(2)

    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return [far(t + one), near(t), near(one - t), far(two - t)]


def _grid_sampler_kernel(input, grid, interpolation_mode, padding_mode, align_corners):
    if input.dtype in _REDUCED:
        return _grid_sampler_reduced(input, grid, interpolation_mode, padding_mode, align_corners)
    dtype = _opmath(input.dtype)
    x, g = input.astype(dtype), grid.astype(dtype)
    height, width = input.shape[2:]
    along_w = _GridAxis(width, align_corners, padding_mode, dtype)
    along_h = _GridAxis(height, align_corners, padding_mode, dtype)
    gx, gy = along_w.unnormalize(g[..., 0]), along_h.unnormalize(g[..., 1])
    with np.errstate(all="ignore"):
        if interpolation_mode == _BICUBIC:
            # Bicubic pads each of the 16 integer taps, not the sampling point.
            x0, y0 = np.floor(gx), np.floor(gy)
            wx, wy = _cubic_coefficients(gx - x0, dtype), _cubic_coefficients(gy - y0, dtype)
            out = 0
            for i in range(4):
                row = 0
                for j in range(4):
                    cols = along_w.pad(x0 - 1 + j)
                    rows = along_h.pad(y0 - 1 + i)
                    taps = _gather(x, _to_index(rows), _to_index(cols), height, width)
                    row = row + taps * wx[j][:, None]
                out = out + row * wy[i][:, None]
            return out
        gx, gy = along_w.pad(gx), along_h.pad(gy)
        if interpolation_mode == _NEAREST:
            return _gather(x, _to_index(np.rint(gy)), _to_index(np.rint(gx)), height, width)
        west, north = np.floor(gx), np.floor(gy)
        w, n = gx - west, gy - north
        e, s = dtype.type(1) - w, dtype.type(1) - n
        west_i, north_i = _to_index(west), _to_index(north)
        out = _gather(x, north_i, west_i, height, width) * (s * e)[:, None]
        out = out + _gather(x, north_i, west_i + 1, height, width) * (s * w)[:, None]
        out = out + _gather(x, north_i + 1, west_i, height, width) * (n * e)[:, None]
        out = out + _gather(x, north_i + 1, west_i + 1, height, width) * (n * w)[:, None]
        return out


def _grid_sampler_reduced(input, grid, interpolation_mode, padding_mode, align_corners):
    """float16/bfloat16 take ATen's scalar fallback, which computes in the input dtype itself and rounds after
    every operation; numpy's float16 and ml_dtypes' bfloat16 arithmetic round the same way, so the scalar
    algorithm is written out here in that dtype, operation by operation."""
    dtype = input.dtype
    height, width = input.shape[2:]

    def constant(value):
        return np.asarray(value, dtype=dtype)

    def unnormalize(coordinate, size):
        if align_corners:
            return ((coordinate + 1) / 2) * (size - 1)
        return ((coordinate + 1) * size - 1) / 2

    def clip(coordinate, size):
        return np.minimum(constant(size - 1), np.maximum(coordinate, constant(0)))

    def reflect(coordinate, twice_low, twice_high):
        if twice_low == twice_high:
            return np.zeros_like(coordinate)
        low = constant(twice_low) / 2
        span = constant(twice_high - twice_low) / 2
        distance = np.abs(coordinate - low)
        extra = np.fmod(distance.astype(np.float32), span.astype(np.float32)).astype(dtype)
        flips = np.floor(distance / span).astype(np.int64)
        return np.where(flips % 2 == 0, extra + low, span - extra + low)

    def pad(coordinate, size):
        if padding_mode == _BORDER:
            return clip(coordinate, size)
        if padding_mode == _REFLECTION:
            twice = (0, 2 * (size - 1)) if align_corners else (-1, 2 * size - 1)
            return clip(reflect(coordinate, *twice), size)
        return coordinate

    def value(cols, rows):
        return _gather(input, _to_index(rows), _to_index(cols), height, width)

    gx, gy = grid[..., 0], grid[..., 1]
    with np.errstate(all="ignore"):
        if interpolation_mode == _BICUBIC:
            ix, iy = unnormalize(gx, width), unnormalize(gy, height)
            ix_nw, iy_nw = np.floor(ix), np.floor(iy)
            tx, ty = ix - ix_nw, iy - iy_nw

            def coefficients(t):
                a = constant(-0.75)
                near = lambda x: ((a + 2) * x - (a + 3)) * x * x + 1  # noqa: E731
                far = lambda x: ((a * x - 5 * a) * x + 8 * a) * x - 4 * a  # noqa: E731
                opposite = (1.0 - t.astype(np.float64)).astype(dtype)
                return [far((t.astype(np.float64) + 1.0).astype(dtype)), near(t), near(opposite),
                        far((opposite.astype(np.float64) + 1.0).astype(dtype))]

            def interpolate(taps, t):
                c = [w[:, None] for w in coefficients(t)]
                return taps[0] * c[0] + taps[1] * c[1] + taps[2] * c[2] + taps[3] * c[3]

            rows = [interpolate([value(pad(ix_nw + (j - 1), width), pad(iy_nw + (i - 1), height))
                                 for j in range(4)], tx) for i in range(4)]
            return interpolate(rows, ty)
        ix, iy = pad(unnormalize(gx, width), width), pad(unnormalize(gy, height), height)
        if interpolation_mode == _NEAREST:
            return value(np.rint(ix), np.rint(iy))
        west, north = np.floor(ix).astype(np.int64), np.floor(iy).astype(np.int64)
        east, south = (west + 1).astype(dtype), (north + 1).astype(dtype)
        west_f, north_f = west.astype(dtype), north.astype(dtype)
        weights = [(east - ix) * (south - iy), (ix - west_f) * (south - iy),
                   (east - ix) * (iy - north_f), (ix - west_f) * (iy - north_f)]
        corners = [(west, north), (west + 1, north), (west, north + 1), (west + 1, north + 1)]
        out = np.zeros((input.shape[0], input.shape[1], *grid.shape[1:3]), dtype)
        for (cols, rows), weight in zip(corners, weights):
            out = out + value(cols, rows) * weight[:, None]
        return out


def _to_index(coordinate: np.ndarray) -> np.ndarray:
    """Integer positions; non-finite or huge coordinates become an out-of-range position (sampled as 0)."""
    safe = np.where(np.isfinite(coordinate) & (np.abs(coordinate) < 2 ** 40), coordinate, -(2 ** 40))
    return safe.astype(np.int64)


defop("grid_sampler_2d(Tensor input, Tensor grid, int interpolation_mode, int padding_mode, bool align_corners) "
      "-> Tensor", _grid_sampler_meta, _grid_sampler_kernel,
      doc="interpolation_mode: 0 bilinear, 1 nearest (round half to even), 2 bicubic; "
          "padding_mode: 0 zeros, 1 border, 2 reflection.")


# ---------------------------------------------------------------------------------------------
# col2im

def _col2im_meta(self, output_size, kernel_size, dilation, padding, stride):
    op = "aten.col2im.default"
    shape = shape_of(self)
    require(len(shape) in (2, 3), op, f"expected a 2-D or 3-D (batched) input, got shape {list(shape)}")
    require(all(_at_least(d, 1) for d in shape[-2:]), op,
            f"expected a 2-D or 3-D (batch mode) input with possibly 0 batch size and non-zero dimensions for input, "
            f"got shape {list(shape)}")
    require_arg(len(output_size) == 2, op, f"output_size must have 2 elements, got {list(output_size)}")
    kernel = per_dim(op, "kernel_size", kernel_size, 2)
    dilation = per_dim(op, "dilation", dilation, 2)
    padding = per_dim(op, "padding", padding, 2)
    stride = per_dim(op, "stride", stride, 2)
    require_arg(all(k > 0 for k in kernel) and all(d > 0 for d in dilation) and all(s > 0 for s in stride)
                and all(p >= 0 for p in padding), op,
                f"kernel_size, dilation and stride must be positive and padding non-negative, got "
                f"kernel_size={kernel}, dilation={dilation}, padding={padding}, stride={stride}")
    taps = kernel[0] * kernel[1]
    columns = shape[-2]
    require(guard_bool(sympy.Eq(sympy.Mod(columns, taps), 0)), op,
            f"expected size of input's dimension {len(shape) - 2} ({columns}) to be divisible by the product of "
            f"kernel_size ({taps})")
    blocks = [conv_output_size(o, k, s, p, d) for o, k, s, p, d in zip(output_size, kernel, stride, padding, dilation)]
    require(all(_at_least(b, 1) for b in blocks) and sym_eq(shape[-1], blocks[0] * blocks[1]), op,
            f"given output_size={list(output_size)}, kernel_size={kernel}, dilation={dilation}, padding={padding}, "
            f"stride={stride}, expected {as_dim(blocks[0] * blocks[1])} blocks in input's last dimension, "
            f"got {shape[-1]}")
    channels = floor_div(columns, taps)
    return tensor([*shape[:-2], channels, *output_size], dtype_of(self))


def _col2im_kernel(self, output_size, kernel_size, dilation, padding, stride):
    kernel = per_dim("", "", kernel_size, 2)
    dilation, padding, stride = (per_dim("", "", v, 2) for v in (dilation, padding, stride))
    batched = self.ndim == 3
    cols = self if batched else self[None]
    height, width = (int(s) for s in output_size)
    blocks = [conv_output_size(o, k, s, p, d) for o, k, s, p, d in zip((height, width), kernel, stride, padding,
                                                                        dilation)]
    acc = _accumulation(self.dtype) if self.dtype != np.bool_ else np.dtype(np.bool_)
    channels = cols.shape[1] // (kernel[0] * kernel[1])  # (not -1: a batch of 0 leaves it undetermined)
    cols = cols.astype(acc).reshape(cols.shape[0], channels, kernel[0], kernel[1], blocks[0], blocks[1])
    out = np.zeros((cols.shape[0], cols.shape[1], height + 2 * padding[0], width + 2 * padding[1]), acc)
    # Within one kernel tap the blocks land on distinct positions, so a strided slice add is exact.
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            rows = slice(i * dilation[0], i * dilation[0] + (blocks[0] - 1) * stride[0] + 1, stride[0])
            columns = slice(j * dilation[1], j * dilation[1] + (blocks[1] - 1) * stride[1] + 1, stride[1])
            if acc == np.bool_:
                out[:, :, rows, columns] |= cols[:, :, i, j]
            else:
                out[:, :, rows, columns] += cols[:, :, i, j]
    out = out[:, :, padding[0]:padding[0] + height, padding[1]:padding[1] + width]
    return out if batched else out[0]


defop("col2im(Tensor self, SymInt[2] output_size, int[2] kernel_size, int[2] dilation, int[2] padding, "
      "int[2] stride) -> Tensor", _col2im_meta, _col2im_kernel,
      doc="Sums sliding-window columns [N, C*kh*kw, L] back into an image [N, C, H, W] (the adjoint of im2col).")


def _col2im_decomposition(self, output_size, kernel_size, dilation, padding, stride):
    """For backends without a col2im kernel (C): the kernel's tap loop in ops, each tap's blocks added to a strided
    window of the padded image (its positions are distinct) in the kernel's accumulation dtype, then cropped."""
    aten = ops.aten
    _col2im_meta(self, output_size, kernel_size, dilation, padding, stride)
    kernel = per_dim("", "", kernel_size, 2)
    dilation, padding, stride = (per_dim("", "", v, 2) for v in (dilation, padding, stride))
    dtype = dtype_of(self)
    accumulate = dtypes.dtype(_accumulation(np.dtype(dtype.numpy))) if dtype is not dtypes.bool_ else dtype
    cols = self if len(shape_of(self)) == 3 else aten.unsqueeze.default(self, 0)
    batch, columns = shape_of(cols)[:2]
    channels = floor_div(columns, kernel[0] * kernel[1])
    blocks = [conv_output_size(o, k, s, p, d) for o, k, s, p, d in zip(output_size, kernel, stride, padding,
                                                                        dilation)]
    if accumulate is not dtype:
        cols = aten._to_copy.default(cols, dtype=accumulate)
    cols = aten.reshape.default(cols, [batch, channels, kernel[0], kernel[1], *blocks])
    height, width = (as_dim(o + 2 * p) for o, p in zip(output_size, padding))
    out = aten.full.default([batch, channels, height, width], 0, dtype=accumulate)
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            top, left = i * dilation[0], j * dilation[1]
            bottom, right = (as_dim(start + (b - 1) * s + 1) for start, b, s in zip((top, left), blocks, stride))
            rows = aten.slice.Tensor(out, 2, top, bottom, stride[0])
            window = aten.slice.Tensor(rows, 3, left, right, stride[1])
            summed = aten.add.Tensor(window, aten.select.int(aten.select.int(cols, 2, i), 2, j))
            rows = aten.slice_scatter.default(rows, summed, 3, left, right, stride[1])
            out = aten.slice_scatter.default(out, rows, 2, top, bottom, stride[0])
    out = aten.slice.Tensor(aten.slice.Tensor(out, 2, padding[0], as_dim(padding[0] + output_size[0])), 3,
                            padding[1], as_dim(padding[1] + output_size[1]))
    if accumulate is not dtype:
        out = aten._to_copy.default(out, dtype=dtype)
    return out if len(shape_of(self)) == 3 else aten.squeeze.dims(out, [0])


# =============================================================================================
# Composites. Each has a reference kernel built from the core kernels above (or numpy directly) and a
# decomposition written with kiln.ops.aten handles only.

from kiln.ir.registry import ops, register_decomposition  # noqa: E402

register_decomposition("aten.col2im.default")(_col2im_decomposition)


def _batched_type(value, rank_without_batch: int):
    """(value's type with a batch dim of 1 added if it lacks one, whether it was added)."""
    shape = shape_of(value)
    if len(shape) == rank_without_batch:
        return tensor([1, *shape], dtype_of(value)), True
    return like(value), False


def _unbatched(meta_type, added: bool):
    return tensor(meta_type.shape[1:], meta_type.dtype) if added else meta_type


# --- conv1d/2d/3d and conv_transpose1d/2d/3d: convolution on a batch, unbatched inputs get a batch of one

def _conv_check_rank(op, n, input, weight):
    require(len(shape_of(input)) in (n + 1, n + 2), op,
            f"expected a {n + 1}-D (unbatched) or {n + 2}-D (batched) input, got shape {list(shape_of(input))}")
    require(len(shape_of(weight)) == n + 2, op, f"expected a {n + 2}-D weight, got shape {list(shape_of(weight))}")


def _conv_like(op: str, n: int, convolution_args):
    """meta, kernel and decomposition of a convN-style composite, given a function mapping its own
    arguments (after input, weight, bias) to convolution's (stride, padding, dilation, transposed,
    output_padding, groups)."""
    def meta(input, weight, bias, *rest):
        _conv_check_rank(op, n, input, weight)
        batched, added = _batched_type(input, n + 1)
        return _unbatched(_convolution_meta(batched, weight, bias, *convolution_args(*rest)), added)

    def kernel(input, weight, bias, *rest):
        added = input.ndim == n + 1
        out = _convolution_kernel(input[None] if added else input, weight, bias, *convolution_args(*rest))
        return out[0] if added else out

    def decomposition(input, weight, bias, *rest):
        aten = ops.aten
        _conv_check_rank(op, n, input, weight)
        added = len(shape_of(input)) == n + 1
        x = aten.unsqueeze.default(input, 0) if added else input
        out = aten.convolution.default(x, weight, bias, *convolution_args(*rest))
        return aten.squeeze.dims(out, [0]) if added else out
    return meta, kernel, decomposition


def _listed(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _define_conv(n: int):
    ones, zeros = ", ".join(["1"] * n), ", ".join(["0"] * n)
    name = f"conv{n}d"
    meta, kernel, decomposition = _conv_like(
        f"aten.{name}.default", n,
        lambda stride, padding, dilation, groups: (stride, padding, dilation, False, [0] * n, groups))
    defop(f"{name}(Tensor input, Tensor weight, Tensor? bias=None, SymInt[{n}] stride=[{ones}], "
          f"SymInt[{n}] padding=[{zeros}], SymInt[{n}] dilation=[{ones}], SymInt groups=1) -> Tensor",
          meta, kernel, tags=("composite",))

    def conv(input, weight, bias=None, stride=(1,) * n, padding=(0,) * n, dilation=(1,) * n, groups=1):
        return decomposition(input, weight, bias, _listed(stride), _listed(padding), _listed(dilation), groups)
    conv.forwards_sparse_weight = True  # the weight reaches convolution untouched (a sparse one's rule runs there)
    register_decomposition(f"aten.{name}.default")(conv)


def _define_conv_transpose(n: int):
    ones, zeros = ", ".join(["1"] * n), ", ".join(["0"] * n)
    name = f"conv_transpose{n}d{'.input' if n > 1 else ''}"
    meta, kernel, decomposition = _conv_like(
        f"aten.{name if n > 1 else name + '.default'}", n,
        lambda stride, padding, output_padding, groups, dilation: (stride, padding, dilation, True, output_padding,
                                                                   groups))
    defop(f"{name}(Tensor input, Tensor weight, Tensor? bias=None, SymInt[{n}] stride=[{ones}], "
          f"SymInt[{n}] padding=[{zeros}], SymInt[{n}] output_padding=[{zeros}], SymInt groups=1, "
          f"SymInt[{n}] dilation=[{ones}]) -> Tensor", meta, kernel, tags=("composite",))

    def conv_transpose(input, weight, bias=None, stride=(1,) * n, padding=(0,) * n, output_padding=(0,) * n,
                       groups=1, dilation=(1,) * n):
        return decomposition(input, weight, bias, _listed(stride), _listed(padding), _listed(output_padding), groups,
                             _listed(dilation))
    register_decomposition(f"aten.{name if n > 1 else name + '.default'}")(conv_transpose)


def _define_conv_padding(n: int):
    """convNd.padding: padding="valid" (none) or "same" (stride 1; an odd total pads one more on the right, with an
    explicit zero pad of the input as ATen's _convolution_same does). EfficientNet's depthwise convs use it."""
    ones = ", ".join(["1"] * n)
    op = f"aten.conv{n}d.padding"
    meta, kernel, decomposition = _conv_like(
        op, n, lambda stride, padding, dilation, groups: (stride, padding, dilation, False, [0] * n, groups))

    def arguments(weight, stride, padding, dilation):
        """(stride, symmetric padding, extra right padding, dilation) per spatial dim."""
        stride, dilation = per_dim(op, "stride", stride, n), per_dim(op, "dilation", dilation, n)
        require_arg(padding in ("valid", "same"), op, f"Invalid padding string: '{padding}'",
                    fix='use "valid", "same" or a list of ints')
        if padding == "valid":
            return stride, [0] * n, [0] * n, dilation
        require_arg(all(_is_const(s, 1) for s in stride), op, "padding='same' is not supported for strided "
                    "convolutions", fix="compute the padding yourself and pass it as ints")
        total = [d * (k - 1) for d, k in zip(dilation, shape_of(weight)[2:])]
        return stride, [t // 2 for t in total], [t % 2 for t in total], dilation

    def padded_meta(input, weight, bias=None, stride=(1,) * n, padding="valid", dilation=(1,) * n, groups=1):
        stride, left, extra, dilation = arguments(weight, stride, padding, dilation)
        shape = shape_of(input)
        if any(extra) and len(shape) >= n:
            input = tensor([*shape[:-n], *(as_dim(s + e) for s, e in zip(shape[-n:], extra))], dtype_of(input))
        return meta(input, weight, bias, stride, left, dilation, groups)

    def padded_kernel(input, weight, bias=None, stride=(1,) * n, padding="valid", dilation=(1,) * n, groups=1):
        stride, left, extra, dilation = arguments(weight, stride, padding, dilation)
        if any(extra):
            input = np.pad(input, [(0, 0)] * (input.ndim - n) + [(0, e) for e in extra])
        return kernel(input, weight, bias, stride, left, dilation, groups)

    def padded_decomposition(input, weight, bias=None, stride=(1,) * n, padding="valid", dilation=(1,) * n,
                             groups=1):
        stride, left, extra, dilation = arguments(weight, stride, padding, dilation)
        if any(extra):  # constant_pad_nd lists (left, right) pairs from the last dim backwards
            input = ops.aten.constant_pad_nd.default(input, [v for e in reversed(extra) for v in (0, e)], 0)
        return decomposition(input, weight, bias, stride, left, dilation, groups)

    defop(f"conv{n}d.padding(Tensor input, Tensor weight, Tensor? bias=None, SymInt[{n}] stride=[{ones}], "
          f"str padding=\"valid\", SymInt[{n}] dilation=[{ones}], SymInt groups=1) -> Tensor",
          padded_meta, padded_kernel, tags=("composite",))
    register_decomposition(op)(padded_decomposition)


for _n in (1, 2, 3):
    _define_conv(_n)
    _define_conv_transpose(_n)
    _define_conv_padding(_n)


# --- normalization

defop("layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, Tensor? bias=None, "
      "float eps=1.0000000000000001e-05, bool cudnn_enable=True) -> Tensor",
      lambda input, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True:
      _layer_norm_meta(input, normalized_shape, weight, bias, eps)[0],
      lambda input, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True:
      _layer_norm_kernel(input, normalized_shape, weight, bias, eps)[0],
      tags=("composite",))


@register_decomposition("aten.layer_norm.default")
def _layer_norm_decomposition(input, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    return ops.aten.native_layer_norm.default(input, normalized_shape, weight, bias, eps)[0]


def _group_norm_arguments(op, input, num_groups):
    shape = shape_of(input)
    require(len(shape) >= 2, op, f"expected an input of at least 2 dims (N, C, ...), got shape {list(shape)}")
    require_arg(num_groups > 0, op, f"num_groups must be positive, got {num_groups}")
    require(guard_bool(sympy.Eq(sympy.Mod(shape[1], num_groups), 0)), op,
            f"expected the number of channels {shape[1]} to be divisible by num_groups={num_groups}",
            fix="use a group count that divides the channel count")
    return shape[0], shape[1], numel(shape[2:])


def _group_norm_meta_composite(input, num_groups, weight=None, bias=None, eps=1e-5, cudnn_enabled=True):
    n, c, hxw = _group_norm_arguments("aten.group_norm.default", input, num_groups)
    return _group_norm_meta(input, weight, bias, n, c, hxw, num_groups, eps)[0]


def _group_norm_kernel_composite(input, num_groups, weight=None, bias=None, eps=1e-5, cudnn_enabled=True):
    n, c, hxw = _group_norm_arguments("aten.group_norm.default", input, num_groups)
    return _group_norm_kernel(input, weight, bias, n, c, hxw, num_groups, eps)[0]


defop("group_norm(Tensor input, int num_groups, Tensor? weight=None, Tensor? bias=None, "
      "float eps=1.0000000000000001e-05, bool cudnn_enabled=True) -> Tensor",
      _group_norm_meta_composite, _group_norm_kernel_composite, tags=("composite",))


@register_decomposition("aten.group_norm.default")
def _group_norm_decomposition(input, num_groups, weight=None, bias=None, eps=1e-5, cudnn_enabled=True):
    n, c, hxw = _group_norm_arguments("aten.group_norm.default", input, num_groups)
    return ops.aten.native_group_norm.default(input, weight, bias, n, c, hxw, num_groups, eps)[0]


def _batch_norm_route(op, running_mean, running_var, training):
    """Which core op batch_norm becomes: batch statistics when training (updating running statistics in
    torch, which kiln's functional IR does not model), running statistics otherwise."""
    has_stats = running_mean is not None and running_var is not None
    require_arg(training or has_stats, op, "running_mean and running_var must be given in evaluation mode")
    if not training:
        return "no_training"
    return "legit" if has_stats else "no_stats"


def _batch_norm_composite_meta(input, weight, bias, running_mean, running_var, training, momentum, eps,
                               cudnn_enabled):
    op = "aten.batch_norm.default"
    route = _batch_norm_route(op, running_mean, running_var, training)
    return _batch_norm_meta(op, input, weight, bias, running_mean if route != "no_stats" else None,
                            running_var if route != "no_stats" else None, uses_batch_stats=training,
                            empty_ok=True)[0]


def _batch_norm_composite_kernel(input, weight, bias, running_mean, running_var, training, momentum, eps,
                                 cudnn_enabled):
    with np.errstate(all="ignore"):
        if training:
            return _batch_norm_training(input, weight, bias, eps)[0]
        return _batch_norm_with_running_stats(input, weight, bias, running_mean, running_var, eps)


defop("batch_norm(Tensor input, Tensor? weight, Tensor? bias, Tensor? running_mean, Tensor? running_var, "
      "bool training, float momentum, float eps, bool cudnn_enabled) -> Tensor",
      _batch_norm_composite_meta, _batch_norm_composite_kernel, tags=("composite",),
      doc="In training mode torch also updates running_mean/running_var in place; kiln only computes the output.")


@register_decomposition("aten.batch_norm.default")
def _batch_norm_decomposition(input, weight, bias, running_mean, running_var, training, momentum, eps,
                              cudnn_enabled):
    aten = ops.aten
    route = _batch_norm_route("aten.batch_norm.default", running_mean, running_var, training)
    if route != "no_training" and any(_is_const(d, 0) for d in shape_of(input)):
        return aten.clone.default(input)  # torch's composite returns an empty input as it is (a copy)
    if route == "no_training":
        return aten._native_batch_norm_legit_no_training.default(input, weight, bias, running_mean, running_var,
                                                                 momentum, eps)[0]
    if route == "legit":
        return aten._native_batch_norm_legit.default(input, weight, bias, running_mean, running_var, True,
                                                     momentum, eps)[0]
    return aten._native_batch_norm_legit.no_stats(input, weight, bias, True, momentum, eps)[0]


def _instance_norm_meta(input, weight, bias, running_mean, running_var, use_input_stats, momentum, eps,
                        cudnn_enabled):
    op = "aten.instance_norm.default"
    shape = shape_of(input)
    require(len(shape) >= 2, op, f"expected an input of at least 2 dims (N, C, ...), got shape {list(shape)}")
    _channel_vectors(op, shape[1], weight=weight, bias=bias, running_mean=running_mean, running_var=running_var)
    require_arg(use_input_stats or (running_mean is not None and running_var is not None), op,
                "running_mean and running_var must be given when use_input_stats is False")
    _statistics_dtype(op, input, weight, bias, running_mean, running_var)
    return like(input)


def _instance_norm_kernel(input, weight, bias, running_mean, running_var, use_input_stats, momentum, eps,
                          cudnn_enabled):
    n, c = input.shape[:2]
    folded = input.reshape(1, n * c, *input.shape[2:])

    def repeat(vector):
        return None if vector is None else np.tile(vector, n)
    with np.errstate(all="ignore"):
        if use_input_stats:
            out = _batch_norm_training(folded, repeat(weight), repeat(bias), eps)[0]
        else:
            out = _batch_norm_with_running_stats(folded, repeat(weight), repeat(bias), repeat(running_mean),
                                                 repeat(running_var), eps)
    return out.reshape(input.shape)


defop("instance_norm(Tensor input, Tensor? weight, Tensor? bias, Tensor? running_mean, Tensor? running_var, "
      "bool use_input_stats, float momentum, float eps, bool cudnn_enabled) -> Tensor",
      _instance_norm_meta, _instance_norm_kernel, tags=("composite",))


def _tiled(vector, times):
    """[C] -> [times * C], the vector repeated (like torch's weight.repeat(N) in instance_norm)."""
    if vector is None:
        return None
    aten = ops.aten
    c = shape_of(vector)[0]
    return aten.view.default(aten.clone.default(aten.expand.default(aten.unsqueeze.default(vector, 0), [times, c])),
                             [times * c])


@register_decomposition("aten.instance_norm.default")
def _instance_norm_decomposition(input, weight, bias, running_mean, running_var, use_input_stats, momentum, eps,
                                 cudnn_enabled):
    """torch's own lowering: fold the batch into channels and batch-normalize [1, N*C, ...]."""
    aten = ops.aten
    _instance_norm_meta(input, weight, bias, running_mean, running_var, use_input_stats, momentum, eps,
                        cudnn_enabled)
    shape = list(shape_of(input))
    if any(_is_const(d, 0) for d in shape):  # nothing to normalize (batch norm refuses an empty input; ATen returns it)
        return aten.clone.default(input)
    n, c = shape[:2]
    folded = aten.view.default(input, [1, as_dim(n * c), *shape[2:]])
    weight, bias = _tiled(weight, n), _tiled(bias, n)
    if use_input_stats:
        out = aten._native_batch_norm_legit.no_stats(folded, weight, bias, True, momentum, eps)[0]
    else:
        out = aten._native_batch_norm_legit_no_training.default(folded, weight, bias, _tiled(running_mean, n),
                                                                _tiled(running_var, n), momentum, eps)[0]
    return aten.view.default(out, shape)


def _rms_norm_meta(input, normalized_shape, weight=None, eps=None):
    op = "aten.rms_norm.default"
    _require_normalized_shape(op, input, normalized_shape, {"weight": weight})
    require_dtype(_is_floating(dtype_of(input)), op, f"expected a floating-point input, got {dtype_of(input)}")
    return like(input)


def _rms_epsilon(dtype: dtypes.DType, eps):
    """eps=None means the machine epsilon of the computation dtype (float32 for float16/bfloat16)."""
    return float(np.finfo(dtypes.opmath_dtype(dtype).numpy).eps) if eps is None else eps


def _rms_norm_kernel(input, normalized_shape, weight=None, eps=None):
    compute = _opmath(input.dtype)
    x = input.astype(compute)
    axes = tuple(range(input.ndim - len(normalized_shape), input.ndim))
    epsilon = _rms_epsilon(dtypes.dtype(input.dtype), eps)
    with np.errstate(all="ignore"):
        out = x * (1 / np.sqrt(np.mean(x * x, axis=axes, keepdims=True) + compute.type(epsilon)))
        # torch multiplies by the weight in the computation dtype and rounds once to the input dtype.
        return out * weight.astype(compute) if weight is not None else out


defop("rms_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, float? eps=None) -> Tensor",
      _rms_norm_meta, _rms_norm_kernel, tags=("composite",))


def _cast(value, dtype: dtypes.DType):
    return value if dtype_of(value) is dtype else ops.aten._to_copy.default(value, dtype=dtype)


@register_decomposition("aten.rms_norm.default")
def _rms_norm_decomposition(input, normalized_shape, weight=None, eps=None):
    aten = ops.aten
    _rms_norm_meta(input, normalized_shape, weight, eps)
    dtype = dtype_of(input)
    compute = dtypes.opmath_dtype(dtype)
    x = _cast(input, compute)
    rank = len(shape_of(input))
    dims = list(range(rank - len(list(normalized_shape)), rank))
    mean_square = aten.mean.dim(aten.pow.Tensor_Scalar(x, 2), dims, True)
    out = aten.mul.Tensor(x, aten.rsqrt.default(aten.add.Scalar(mean_square, _rms_epsilon(dtype, eps))))
    if weight is not None:
        out = aten.mul.Tensor(out, _cast(weight, compute))
    return _cast(out, dtype)


# --- scaled_dot_product_attention

def _sdpa_meta(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    op = "aten.scaled_dot_product_attention.default"
    q, k, v = shape_of(query), shape_of(key), shape_of(value)
    require(len(q) >= 2 and len(k) >= 2 and len(v) >= 2, op,
            f"query, key and value need at least 2 dims, got shapes {list(q)}, {list(k)}, {list(v)}")
    dtype = dtype_of(query)
    require_dtype(_is_floating(dtype) and dtype_of(key) is dtype and dtype_of(value) is dtype, op,
                  f"query, key and value must share a floating-point dtype, got {dtype_of(query)}, "
                  f"{dtype_of(key)}, {dtype_of(value)}")
    require(sym_eq(q[-1], k[-1]) and sym_eq(k[-2], v[-2]), op,
            f"expected query [..., L, E], key [..., S, E] and value [..., S, Ev], got {list(q)}, {list(k)}, {list(v)}",
            fix="query and key need the same embedding size, key and value the same sequence length")
    require_arg(0 <= dropout_p <= 1, op, f"dropout_p must be in [0, 1], got {dropout_p}")
    key_batch, value_batch = list(k[:-2]), list(v[:-2])
    if enable_gqa and len(q) >= 3 and len(k) >= 3:
        heads, kv_heads = q[-3], k[-3]
        require(guard_bool(sympy.Eq(sympy.Mod(heads, kv_heads), 0)), op,
                f"with enable_gqa the query heads ({heads}) must be a multiple of the key/value heads ({kv_heads})")
        key_batch[-1] = value_batch[-1] = heads
    from kiln.ir.meta import broadcast_shapes
    batch = broadcast_shapes(op, q[:-2], key_batch, value_batch)
    if attn_mask is not None:
        require_arg(not is_causal, op, "an explicit attn_mask cannot be combined with is_causal=True")
        mask_dtype = dtype_of(attn_mask)
        require_dtype(mask_dtype.is_bool or mask_dtype is dtype or mask_dtype is dtypes.float32, op,
                      f"attn_mask must be bool or have the query's dtype, got {mask_dtype} for {dtype} query",
                      fix="pass a bool mask (True = attend) or an additive mask in the query's dtype")
        broadcast_shapes(op, shape_of(attn_mask), [*batch, q[-2], k[-2]])
    return tensor([*batch, q[-2], v[-1]], dtype)


def _sdpa_scale(head_dim, scale):
    if scale is not None:
        return scale
    require(isinstance(head_dim, int), "aten.scaled_dot_product_attention.default",
            f"the default scale needs a static head dim, got {head_dim}", fix="pass scale explicitly")
    return 1 / math.sqrt(head_dim)


def _sdpa_kernel(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    q, k, v = (t.astype(np.float64) for t in (query, key, value))
    if enable_gqa and q.ndim >= 3 and k.ndim >= 3:
        k = np.repeat(k, q.shape[-3] // k.shape[-3], axis=-3)
        v = np.repeat(v, q.shape[-3] // v.shape[-3], axis=-3)
    with np.errstate(all="ignore"):
        scores = np.matmul(q, np.swapaxes(k, -1, -2)) * _sdpa_scale(query.shape[-1], scale)
        if is_causal:
            attn_mask = np.tril(np.ones((q.shape[-2], k.shape[-2]), np.bool_))
        if attn_mask is not None:
            scores = (np.where(attn_mask, scores, -np.inf) if attn_mask.dtype == np.bool_
                      else scores + attn_mask.astype(np.float64))
        best = scores.max(axis=-1, keepdims=True)
        exp = np.exp(scores - np.where(np.isneginf(best), 0, best))
        weights = exp / exp.sum(axis=-1, keepdims=True)
        # Rows masked out entirely attend to nothing (torch's _safe_softmax), giving zeros rather than NaN.
        weights = np.where(np.isneginf(best), 0, weights)
        if dropout_p > 0:
            weights = _native_dropout_kernel(weights, dropout_p, True)[0]
        return np.matmul(weights, v)


defop("scaled_dot_product_attention(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, "
      "float dropout_p=0., bool is_causal=False, *, float? scale=None, bool enable_gqa=False) -> Tensor",
      _sdpa_meta, _sdpa_kernel, tags=("composite", "random"),
      doc="Random only when dropout_p > 0. Fully masked rows give zeros, like torch.")


def _repeat_heads(value, repeats):
    """[..., H, S, E] -> [..., H * repeats, S, E], each head repeated in place (repeat_interleave on -3)."""
    if repeats == 1:
        return value
    aten = ops.aten
    shape = list(shape_of(value))
    expanded = shape[:-2] + [repeats] + shape[-2:]
    expanded[-4:-3] = [shape[-3]]
    grown = aten.expand.default(aten.unsqueeze.default(value, len(shape) - 2), expanded)
    return aten.view.default(aten.clone.default(grown), [*shape[:-3], as_dim(shape[-3] * repeats), *shape[-2:]])


@register_decomposition("aten.scaled_dot_product_attention.default")
def _sdpa_decomposition(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                        enable_gqa=False):
    """softmax(q k^T * scale + mask) v with torch's _safe_softmax rule, in float32 for float16/bfloat16."""
    from kiln.ir.ops.linalg import _matmul_decomposition
    aten = ops.aten
    dtype = _sdpa_meta(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa).dtype
    compute = dtypes.opmath_dtype(dtype)
    q, k, v = (_cast(t, compute) for t in (query, key, value))
    # enable_gqa: the query heads [..., H, L, E] of each key head's group as one block of rows, [..., KV, R * L, E]
    # (head h reads key head h // R), so the keys and values are read as they are, never repeated
    heads_shape = None  # [..., H, L, S] when grouped: the shape the mask is given over
    if enable_gqa and len(shape_of(q)) >= 3 and len(shape_of(k)) >= 3:
        repeats = as_dim(shape_of(q)[-3] // shape_of(k)[-3]) if isinstance(shape_of(k)[-3], int) else None
        require(isinstance(repeats, int), "aten.scaled_dot_product_attention.default",
                "enable_gqa needs static head counts to decompose")
        q_shape, k_shape, v_shape = (list(shape_of(t)) for t in (q, k, v))
        if repeats > 1 and len(q_shape) == len(k_shape) == len(v_shape) and \
                all(sym_eq(a, b) and sym_eq(b, c) for a, b, c in zip(q_shape[:-3], k_shape[:-3], v_shape[:-3])):
            heads_shape = [*q_shape[:-1], k_shape[-2]]
            q = aten.view.default(q, [*q_shape[:-3], k_shape[-3], as_dim(repeats * q_shape[-2]), q_shape[-1]])
        else:  # batch dims that broadcast: repeat the keys and values
            k, v = _repeat_heads(k, repeats), _repeat_heads(v, repeats)
    rank = len(shape_of(k))
    key_t = aten.permute.default(k, [*range(rank - 2), rank - 1, rank - 2])
    scores = aten.mul.Scalar(_matmul_decomposition(q, key_t), _sdpa_scale(shape_of(query)[-1], scale))
    length, source = shape_of(query)[-2], shape_of(k)[-2]
    if is_causal:
        rows = aten.view.default(aten.arange.start_step(0, length, dtype=dtypes.int64), [length, 1])
        cols = aten.view.default(aten.arange.start_step(0, source, dtype=dtypes.int64), [1, source])
        attn_mask = aten.le.Tensor(cols, rows)
    if attn_mask is not None and heads_shape is not None:  # the mask over the grouped rows
        attn_mask = _grouped(attn_mask, heads_shape, shape_of(scores))
    if attn_mask is not None:
        if dtype_of(attn_mask).is_bool:
            scores = aten.where.self(attn_mask, scores, aten.scalar_tensor.default(-math.inf, dtype=compute))
        else:
            scores = aten.add.Tensor(scores, _cast(attn_mask, compute))
    weights = aten._softmax.default(scores, -1, False)
    fully_masked = aten.eq.Scalar(aten.amax.default(scores, [-1], True), -math.inf)
    weights = aten.where.self(fully_masked, aten.scalar_tensor.default(0.0, dtype=compute), weights)
    if dropout_p > 0:
        weights = aten.native_dropout.default(weights, dropout_p, True)[0]
    out = _matmul_decomposition(weights, v)
    if heads_shape is not None:  # back to one block of rows per query head
        out = aten.view.default(out, [*heads_shape[:-1], shape_of(v)[-1]])
    return _cast(out, dtype)


def _grouped(mask, heads_shape, grouped_shape):
    """A mask given over [..., H, L, S] (broadcasting) laid over the grouped scores [..., KV, R * L, S]: the same
    elements in the same order, copied where it broadcast (a mask shared by the heads is not affine in the grouped
    rows)."""
    aten = ops.aten
    if not all(sym_eq(a, b) for a, b in zip(shape_of(mask), heads_shape)) or len(shape_of(mask)) != len(heads_shape):
        mask = aten.clone.default(aten.expand.default(mask, heads_shape))
    return aten.view.default(mask, list(grouped_shape))


# --- dropout

def _dropout_meta(input, p, train):
    require_arg(0 <= p <= 1, "aten.dropout.default", f"dropout probability has to be between 0 and 1, got {p}")
    return like(input)


def _dropout_kernel(input, p, train):
    if not train or p == 0:
        return input.copy()
    return _native_dropout_kernel(input, p, True)[0]


defop("dropout(Tensor input, float p, bool train) -> Tensor", _dropout_meta, _dropout_kernel,
      tags=("composite", "random"), doc="The identity unless train and p > 0.")


@register_decomposition("aten.dropout.default")
def _dropout_decomposition(input, p, train):
    _dropout_meta(input, p, train)
    if not train or p == 0:
        return input
    return ops.aten.native_dropout.default(input, p, True)[0]


# --- pooling composites

def _max_pool_composite(n: int):
    core = _max_pool_meta(n), _max_pool_kernel(n)
    defop(f"max_pool{n}d(Tensor self, int[{n}] kernel_size, int[{n}] stride=[], int[{n}] padding=0, "
          f"int[{n}] dilation=1, bool ceil_mode=False) -> Tensor",
          lambda *args: core[0](*args)[0], lambda *args: core[1](*args)[0], tags=("composite",))
    register_decomposition(f"aten.max_pool{n}d.default")(
        lambda *args, **kwargs: getattr(ops.aten, f"max_pool{n}d_with_indices").default(*args, **kwargs)[0])


for _n in (2, 3):
    _max_pool_composite(_n)


def _as_2d_pool_arguments(kernel_size, stride, padding, dilation=(1,)):
    """1-D pool arguments as the 2-D ones of a [.., 1, L] input."""
    return [1, kernel_size[0]], ([1, stride[0]] if stride else []), [0, padding[0]], [1, dilation[0]]


def _max_pool1d_meta(self, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    op = "aten.max_pool1d.default"
    require(len(shape_of(self)) in (2, 3), op, f"expected a 2-D or 3-D input, got shape {list(shape_of(self))}")
    kernel, stride2, padding2, dilation2 = _as_2d_pool_arguments(kernel_size, stride, padding, dilation)
    out = _max_pool_meta(2)(tensor([*shape_of(self)[:-1], 1, shape_of(self)[-1]], dtype_of(self)),
                            kernel, stride2, padding2, dilation2, ceil_mode)[0]
    return tensor([*out.shape[:-2], out.shape[-1]], out.dtype)


def _max_pool1d_kernel(self, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    args = _as_2d_pool_arguments(kernel_size, stride, padding, dilation)
    return _max_pool_kernel(2)(self[..., None, :], *args, ceil_mode)[0][..., 0, :]


defop("max_pool1d(Tensor self, int[1] kernel_size, int[1] stride=[], int[1] padding=[0], int[1] dilation=[1], "
      "bool ceil_mode=False) -> Tensor", _max_pool1d_meta, _max_pool1d_kernel, tags=("composite",))


@register_decomposition("aten.max_pool1d.default")
def _max_pool1d_decomposition(self, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    aten = ops.aten
    _max_pool1d_meta(self, kernel_size, stride, padding, dilation, ceil_mode)
    x = aten.unsqueeze.default(self, -2)
    out = aten.max_pool2d_with_indices.default(x, *_as_2d_pool_arguments(kernel_size, stride, padding, dilation),
                                               ceil_mode)[0]
    return aten.squeeze.dims(out, [-2])


def _avg_pool1d_meta(self, kernel_size, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True):
    op = "aten.avg_pool1d.default"
    require(len(shape_of(self)) in (2, 3), op, f"expected a 2-D or 3-D input, got shape {list(shape_of(self))}")
    kernel, stride2, padding2, _ = _as_2d_pool_arguments(kernel_size, stride, padding)
    out = _avg_pool_meta(2)(tensor([*shape_of(self)[:-1], 1, shape_of(self)[-1]], dtype_of(self)),
                            kernel, stride2, padding2, ceil_mode, count_include_pad)
    return tensor([*out.shape[:-2], out.shape[-1]], out.dtype)


def _avg_pool1d_kernel(self, kernel_size, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True):
    kernel, stride2, padding2, _ = _as_2d_pool_arguments(kernel_size, stride, padding)
    return _avg_pool_kernel(2)(self[..., None, :], kernel, stride2, padding2, ceil_mode, count_include_pad)[..., 0, :]


defop("avg_pool1d(Tensor self, int[1] kernel_size, int[1] stride=[], int[1] padding=[0], bool ceil_mode=False, "
      "bool count_include_pad=True) -> Tensor", _avg_pool1d_meta, _avg_pool1d_kernel, tags=("composite",))


@register_decomposition("aten.avg_pool1d.default")
def _avg_pool1d_decomposition(self, kernel_size, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True):
    aten = ops.aten
    _avg_pool1d_meta(self, kernel_size, stride, padding, ceil_mode, count_include_pad)
    kernel, stride2, padding2, _ = _as_2d_pool_arguments(kernel_size, stride, padding)
    out = aten.avg_pool2d.default(aten.unsqueeze.default(self, -2), kernel, stride2, padding2, ceil_mode,
                                  count_include_pad)
    return aten.squeeze.dims(out, [-2])


def _adaptive_avg_pool_composite(n: int):
    defop(f"adaptive_avg_pool{n}d(Tensor self, SymInt[{n}] output_size) -> Tensor",
          _adaptive_avg_pool_meta(n), checked(_adaptive_avg_pool_meta(n), _adaptive_avg_pool_kernel(n)),
          tags=("composite",))

    def decomposition(self, output_size):
        return getattr(ops.aten, f"_adaptive_avg_pool{n}d").default(self, output_size)
    register_decomposition(f"aten.adaptive_avg_pool{n}d.default")(decomposition)


for _n in (2, 3):
    _adaptive_avg_pool_composite(_n)


def _adaptive_avg_pool1d_meta(self, output_size):
    op = "aten.adaptive_avg_pool1d.default"
    require(len(shape_of(self)) in (2, 3), op, f"expected a 2-D or 3-D input, got shape {list(shape_of(self))}")
    require_arg(len(output_size) == 1, op, f"output_size must have one element, got {list(output_size)}")
    out = _adaptive_avg_pool_meta(2)(tensor([*shape_of(self)[:-1], 1, shape_of(self)[-1]], dtype_of(self)),
                                     [1, output_size[0]])
    return tensor([*out.shape[:-2], out.shape[-1]], out.dtype)


defop("adaptive_avg_pool1d(Tensor self, int[1] output_size) -> Tensor", _adaptive_avg_pool1d_meta,
      lambda self, output_size: _adaptive_avg_pool_kernel(2)(self[..., None, :], [1, output_size[0]])[..., 0, :],
      tags=("composite",))


@register_decomposition("aten.adaptive_avg_pool1d.default")
def _adaptive_avg_pool1d_decomposition(self, output_size):
    aten = ops.aten
    _adaptive_avg_pool1d_meta(self, output_size)
    out = aten._adaptive_avg_pool2d.default(aten.unsqueeze.default(self, -2), [1, output_size[0]])
    return aten.squeeze.dims(out, [-2])


# --- recurrent cells

def _cell_meta(op: str, gates: int, input, hidden, w_ih, w_hh, b_ih, b_hh):
    x, h = shape_of(input), shape_of(hidden)
    require(len(x) == 2 and len(h) == 2, op, f"expected 2-D input and hidden state, got shapes {list(x)} and {list(h)}")
    hidden_size = h[1]
    require(len(shape_of(w_ih)) == 2 and sym_eq(shape_of(w_ih)[0], gates * hidden_size)
            and sym_eq(shape_of(w_ih)[1], x[1]), op,
            f"expected w_ih of shape [{as_dim(gates * hidden_size)}, {x[1]}], got {list(shape_of(w_ih))}")
    require(len(shape_of(w_hh)) == 2 and sym_eq(shape_of(w_hh)[0], gates * hidden_size)
            and sym_eq(shape_of(w_hh)[1], hidden_size), op,
            f"expected w_hh of shape [{as_dim(gates * hidden_size)}, {hidden_size}], got {list(shape_of(w_hh))}")
    require(sym_eq(x[0], h[0]), op, f"input batch {x[0]} does not match hidden state batch {h[0]}")
    for name, bias in (("b_ih", b_ih), ("b_hh", b_hh)):
        if bias is not None:
            require(len(shape_of(bias)) == 1 and sym_eq(shape_of(bias)[0], gates * hidden_size), op,
                    f"expected {name} of shape [{as_dim(gates * hidden_size)}], got {list(shape_of(bias))}")
    dtype = dtype_of(input)
    require_dtype(_is_floating(dtype) and all(dtype_of(t) is dtype for t in (hidden, w_ih, w_hh, *(
        b for b in (b_ih, b_hh) if b is not None))), op, "expected all tensors to share one floating-point dtype")
    return like(hidden)


def _cell_linear(x, w, b, acc):
    out = x.astype(acc) @ w.astype(acc).T
    return out + b.astype(acc) if b is not None else out


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _lstm_cell_meta(input, hx, w_ih, w_hh, b_ih=None, b_hh=None):
    op = "aten.lstm_cell.default"
    require_arg(len(hx) == 2, op, f"hx must hold (h, c), got {len(hx)} tensors")
    h = _cell_meta(op, 4, input, hx[0], w_ih, w_hh, b_ih, b_hh)
    require(list(map(str, shape_of(hx[1]))) == list(map(str, h.shape)), op,
            f"expected c of shape {list(h.shape)}, got {list(shape_of(hx[1]))}")
    return h, like(hx[1])


def _lstm_cell_kernel(input, hx, w_ih, w_hh, b_ih=None, b_hh=None):
    acc = _accumulation(input.dtype)
    with np.errstate(all="ignore"):
        gates = _cell_linear(hx[0], w_hh, b_hh, acc) + _cell_linear(input, w_ih, b_ih, acc)
        in_gate, forget_gate, cell_gate, out_gate = np.split(gates, 4, axis=1)
        cy = _sigmoid(forget_gate) * hx[1].astype(acc) + _sigmoid(in_gate) * np.tanh(cell_gate)
        return _sigmoid(out_gate) * np.tanh(cy), cy


defop("lstm_cell(Tensor input, Tensor[] hx, Tensor w_ih, Tensor w_hh, Tensor? b_ih=None, Tensor? b_hh=None) "
      "-> (Tensor, Tensor)", _lstm_cell_meta, _lstm_cell_kernel, tags=("composite",))


def _linear_decomposed(x, w, b):
    aten = ops.aten
    w_t = aten.permute.default(w, [1, 0])
    return aten.mm.default(x, w_t) if b is None else aten.addmm.default(b, x, w_t)


def _chunks(value, count):
    aten = ops.aten
    size = floor_div(shape_of(value)[1], count)
    return [aten.slice.Tensor(value, 1, as_dim(i * size), as_dim((i + 1) * size)) for i in range(count)]


@register_decomposition("aten.lstm_cell.default")
def _lstm_cell_decomposition(input, hx, w_ih, w_hh, b_ih=None, b_hh=None):
    aten = ops.aten
    _lstm_cell_meta(input, hx, w_ih, w_hh, b_ih, b_hh)
    gates = aten.add.Tensor(_linear_decomposed(hx[0], w_hh, b_hh), _linear_decomposed(input, w_ih, b_ih))
    in_gate, forget_gate, cell_gate, out_gate = _chunks(gates, 4)
    cy = aten.add.Tensor(aten.mul.Tensor(aten.sigmoid.default(forget_gate), hx[1]),
                         aten.mul.Tensor(aten.sigmoid.default(in_gate), aten.tanh.default(cell_gate)))
    hy = aten.mul.Tensor(aten.sigmoid.default(out_gate), aten.tanh.default(cy))
    return hy, cy


def _gru_cell_meta(input, hx, w_ih, w_hh, b_ih=None, b_hh=None):
    return _cell_meta("aten.gru_cell.default", 3, input, hx, w_ih, w_hh, b_ih, b_hh)


def _gru_cell_kernel(input, hx, w_ih, w_hh, b_ih=None, b_hh=None):
    acc = _accumulation(input.dtype)
    with np.errstate(all="ignore"):
        i_r, i_z, i_n = np.split(_cell_linear(input, w_ih, b_ih, acc), 3, axis=1)
        h_r, h_z, h_n = np.split(_cell_linear(hx, w_hh, b_hh, acc), 3, axis=1)
        reset, update = _sigmoid(i_r + h_r), _sigmoid(i_z + h_z)
        new = np.tanh(i_n + reset * h_n)
        return (hx.astype(acc) - new) * update + new


defop("gru_cell(Tensor input, Tensor hx, Tensor w_ih, Tensor w_hh, Tensor? b_ih=None, Tensor? b_hh=None) -> Tensor",
      _gru_cell_meta, _gru_cell_kernel, tags=("composite",))


@register_decomposition("aten.gru_cell.default")
def _gru_cell_decomposition(input, hx, w_ih, w_hh, b_ih=None, b_hh=None):
    aten = ops.aten
    _gru_cell_meta(input, hx, w_ih, w_hh, b_ih, b_hh)
    i_r, i_z, i_n = _chunks(_linear_decomposed(input, w_ih, b_ih), 3)
    h_r, h_z, h_n = _chunks(_linear_decomposed(hx, w_hh, b_hh), 3)
    reset = aten.sigmoid.default(aten.add.Tensor(i_r, h_r))
    update = aten.sigmoid.default(aten.add.Tensor(i_z, h_z))
    new = aten.tanh.default(aten.add.Tensor(i_n, aten.mul.Tensor(reset, h_n)))
    return aten.add.Tensor(aten.mul.Tensor(aten.sub.Tensor(hx, new), update), new)


# --- bilinear, cosine_similarity, pixel_shuffle

def _bilinear_layer_meta(input1, input2, weight, bias=None):
    op = "aten.bilinear.default"
    a, b, w = shape_of(input1), shape_of(input2), shape_of(weight)
    require(len(w) == 3, op, f"weight must be 3-D [out, in1, in2], got {list(w)}")
    require(len(a) >= 1 and len(a) == len(b) and all(sym_eq(x, y) for x, y in zip(a[:-1], b[:-1])), op,
            f"input1 {list(a)} and input2 {list(b)} must have the same batch dims")
    require(sym_eq(a[-1], w[1]) and sym_eq(b[-1], w[2]), op,
            f"input sizes {a[-1]} and {b[-1]} do not match weight of shape {list(w)}")
    if bias is not None:
        require(len(shape_of(bias)) == 1 and sym_eq(shape_of(bias)[0], w[0]), op,
                f"expected bias of shape [{w[0]}], got {list(shape_of(bias))}")
    dtype = dtype_of(input1)
    require_dtype(all(dtype_of(t) is dtype for t in (input2, weight, *([bias] if bias is not None else []))), op,
                  "expected all tensors to share one dtype")
    return tensor([*a[:-1], w[0]], dtype)


def _bilinear_layer_kernel(input1, input2, weight, bias=None):
    # ATen's order (_trilinear): input1 against the weight first, then input2. One triple sum differs where an
    # input is infinite: a zero weight times an infinite input2 is NaN in it, while ATen's first sum stays finite
    acc = _accumulation(input1.dtype)
    first = np.einsum("...i,oij->...oj", input1.astype(acc), weight.astype(acc))
    out = np.einsum("...oj,...j->...o", first, input2.astype(acc))
    return out + bias.astype(acc) if bias is not None else out


defop("bilinear(Tensor input1, Tensor input2, Tensor weight, Tensor? bias=None) -> Tensor",
      _bilinear_layer_meta, _bilinear_layer_kernel, tags=("composite",))


@register_decomposition("aten.bilinear.default")
def _bilinear_layer_decomposition(input1, input2, weight, bias=None):
    from kiln.ir.ops.linalg import _einsum_decomposition
    _bilinear_layer_meta(input1, input2, weight, bias)
    out = _einsum_decomposition("...i,oij,...j->...o", [input1, weight, input2])
    return out if bias is None else ops.aten.add.Tensor(out, bias)


def _cosine_similarity_meta(x1, x2, dim=1, eps=1e-8):
    op = "aten.cosine_similarity.default"
    from kiln.ir.meta import broadcast_shapes, require_dtype
    common = dtypes.result_type(x1, x2)
    require_dtype(common.is_floating_point, op, f"expected common dtype to be floating point, yet common dtype is "
                  f"{common.name}", fix="convert the inputs to a floating dtype first (x.float())")
    shape = broadcast_shapes(op, shape_of(x1), shape_of(x2))
    axis = canonical_dim(op, dim, len(shape))
    # ATen converts integral operands to the common dtype, then expands both before computing: a 0-dim operand then
    # promotes as a tensor (float64[] with float32[3, 5] gives float64, where elementwise promotion gives float32)
    floating = [own if (own := dtypes.result_type(x)).is_floating_point else common for x in (x1, x2)]
    return tensor([s for i, s in enumerate(shape) if i != axis], dtypes.promote_types(*floating))


def _cosine_similarity_kernel(x1, x2, dim=1, eps=1e-8):
    dtype = _cosine_similarity_meta(x1, x2, dim, eps).dtype
    compute = np.float64
    a, b = np.broadcast_arrays(x1.astype(compute), x2.astype(compute))
    axis = canonical_dim("", dim, a.ndim)
    with np.errstate(all="ignore"):
        norm_a = np.maximum(np.sqrt((a * a).sum(axis=axis, keepdims=True)), eps)
        norm_b = np.maximum(np.sqrt((b * b).sum(axis=axis, keepdims=True)), eps)
        return ((a / norm_a) * (b / norm_b)).sum(axis=axis).astype(dtype.numpy)


defop("cosine_similarity(Tensor x1, Tensor x2, int dim=1, float eps=1e-08) -> Tensor",
      _cosine_similarity_meta, _cosine_similarity_kernel, tags=("composite",),
      doc="Each input is divided by its norm clamped to eps, then the products are summed (torch's formula).")


@register_decomposition("aten.cosine_similarity.default")
def _cosine_similarity_decomposition(x1, x2, dim=1, eps=1e-8):
    aten = ops.aten
    dtype = _cosine_similarity_meta(like(x1), like(x2), dim, eps).dtype  # TensorTypes: x1/x2 may be IR values
    from kiln.ir.meta import broadcast_shapes
    shape = list(broadcast_shapes("aten.cosine_similarity.default", shape_of(x1), shape_of(x2)))
    a, b = (aten.expand.default(_cast(x, dtype), shape) if list(map(str, shape_of(x))) != list(map(str, shape))
            else _cast(x, dtype) for x in (x1, x2))
    axis = canonical_dim("aten.cosine_similarity.default", dim, len(shape))

    def normalized(x):
        norm = aten.sqrt.default(aten.sum.dim_IntList(aten.mul.Tensor(x, x), [axis], True))
        return aten.div.Tensor(x, aten.clamp.default(norm, eps))
    return aten.sum.dim_IntList(aten.mul.Tensor(normalized(a), normalized(b)), [axis])


def _pixel_shuffle_meta(op: str, factor_name: str, inverse: bool):
    def meta(self, factor):
        shape = shape_of(self)
        require(len(shape) >= 3, op, f"expected an input of at least 3 dims (..., C, H, W), got {list(shape)}")
        require_arg(factor > 0, op, f"{factor_name} must be positive, got {factor}")
        c, h, w = shape[-3:]
        if inverse:
            require(guard_bool(sympy.Eq(sympy.Mod(h, factor), 0)) and guard_bool(sympy.Eq(sympy.Mod(w, factor), 0)),
                    op, f"height {h} and width {w} must be divisible by {factor_name}={factor}")
            out = [as_dim(c * factor * factor), floor_div(h, factor), floor_div(w, factor)]
            if _empty_unshuffle(shape):
                out = [c, h, w]
        else:
            require(guard_bool(sympy.Eq(sympy.Mod(c, factor * factor), 0)), op,
                    f"channels {c} must be divisible by {factor_name}^2={factor * factor}")
            out = [floor_div(c, factor * factor), as_dim(h * factor), as_dim(w * factor)]
        return tensor([*shape[:-3], *out], dtype_of(self))
    return meta


def _empty_unshuffle(shape) -> bool:
    """ATen's pixel_unshuffle returns an empty input as it is (a copy), where pixel_shuffle reshapes it (seen when
    a size is 0 statically; a symbolic size that is 0 at run time is not)."""
    return any(_is_const(d, 0) for d in shape)


def _pixel_shuffle_layout(shape, factor, inverse):
    """(split shape, permutation, final shape) for pixel_(un)shuffle."""
    lead, (c, h, w), r = list(shape[:-3]), shape[-3:], factor
    k = len(lead)
    if inverse:  # [.., C, H*r, W*r] -> [.., C, H, r, W, r] -> [.., C, r, r, H, W]
        split = [*lead, c, floor_div(h, r), r, floor_div(w, r), r]
        order = [*range(k), k, k + 2, k + 4, k + 1, k + 3]
        final = [*lead, as_dim(c * r * r), floor_div(h, r), floor_div(w, r)]
    else:  # [.., C*r*r, H, W] -> [.., C, r, r, H, W] -> [.., C, H, r, W, r]
        split = [*lead, floor_div(c, r * r), r, r, h, w]
        order = [*range(k), k, k + 3, k + 1, k + 4, k + 2]
        final = [*lead, floor_div(c, r * r), as_dim(h * r), as_dim(w * r)]
    return split, order, final


for _name, _factor, _inverse in (("pixel_shuffle", "upscale_factor", False),
                                 ("pixel_unshuffle", "downscale_factor", True)):
    def _make(name=_name, factor_name=_factor, inverse=_inverse):
        meta = _pixel_shuffle_meta(f"aten.{name}.default", factor_name, inverse)

        def kernel(self, factor):
            if inverse and _empty_unshuffle(self.shape):
                return self.copy()
            split, order, final = _pixel_shuffle_layout(self.shape, factor, inverse)
            return self.reshape(split).transpose(order).reshape(final)

        def decomposition(self, factor):
            aten = ops.aten
            meta(self, factor)
            if inverse and _empty_unshuffle(shape_of(self)):
                return aten.clone.default(self)
            split, order, final = _pixel_shuffle_layout(shape_of(self), factor, inverse)
            moved = aten.permute.default(aten.view.default(self, split), order)
            return aten.view.default(aten.clone.default(moved), final)
        defop(f"{name}(Tensor self, int {factor_name}) -> Tensor", meta, kernel, tags=("composite",))
        register_decomposition(f"aten.{name}.default")(decomposition)
    _make()


# --- upsample_nearest2d / upsample_bilinear2d (the output_size + scales overloads)

def _vec_scale_factors(op: str, input, output_size, scales):
    """The .vec form of a (output_size, scales_h, scales_w) call: output sizes when no scale is given (or they
    cannot matter), else the scale factors, provided they reproduce output_size."""
    if all(s is None for s in scales):
        return list(output_size), None
    shape = shape_of(input)
    reproduced = (all(s is not None for s in scales)
                  and all(isinstance(size, int) for size in shape[2:])
                  and [_scaled_size(size, s) for size, s in zip(shape[2:], scales)] == list(output_size))
    if not reproduced:
        raise UnsupportedError(f"{op}: output_size {list(output_size)} with scales {list(scales)} cannot be "
                               f"expressed with the .vec overload (the scales would give a different output size)",
                               fix="pass either output_size or matching scale factors")
    return None, list(scales)


def _nearest_default_meta(self, output_size, scales_h=None, scales_w=None):
    op = "aten.upsample_nearest2d.default"
    require_arg(len(output_size) == 2, op, f"output_size must have 2 elements, got {list(output_size)}")
    return _nearest_meta(self, list(output_size), None)


def _nearest_default_kernel(self, output_size, scales_h=None, scales_w=None):
    return _nearest_resample(self, int(output_size[0]), int(output_size[1]), scales_h, scales_w)


defop("upsample_nearest2d(Tensor self, SymInt[2] output_size, float? scales_h=None, float? scales_w=None) -> Tensor",
      _nearest_default_meta, checked(_nearest_default_meta, _nearest_default_kernel), tags=("composite",))


@register_decomposition("aten.upsample_nearest2d.default")
def _nearest_default_decomposition(self, output_size, scales_h=None, scales_w=None):
    _nearest_default_meta(self, output_size, scales_h, scales_w)
    sizes, factors = _vec_scale_factors("aten.upsample_nearest2d.default", self, output_size, (scales_h, scales_w))
    return ops.aten.upsample_nearest2d.vec(self, sizes, factors)


def _bilinear_default_meta(self, output_size, align_corners, scales_h=None, scales_w=None):
    op = "aten.upsample_bilinear2d.default"
    require_arg(len(output_size) == 2, op, f"output_size must have 2 elements, got {list(output_size)}")
    return _bilinear_meta(self, list(output_size), align_corners, None)


def _bilinear_default_kernel(self, output_size, align_corners, scales_h=None, scales_w=None):
    return _bilinear_resample(self, int(output_size[0]), int(output_size[1]), align_corners, scales_h, scales_w)


defop("upsample_bilinear2d(Tensor self, SymInt[2] output_size, bool align_corners, float? scales_h=None, "
      "float? scales_w=None) -> Tensor", _bilinear_default_meta,
      checked(_bilinear_default_meta, _bilinear_default_kernel), tags=("composite",))


@register_decomposition("aten.upsample_bilinear2d.default")
def _bilinear_default_decomposition(self, output_size, align_corners, scales_h=None, scales_w=None):
    _bilinear_default_meta(self, output_size, align_corners, scales_h, scales_w)
    scales = (None, None) if align_corners else (scales_h, scales_w)  # align_corners ignores the scales
    sizes, factors = _vec_scale_factors("aten.upsample_bilinear2d.default", self, output_size, scales)
    return ops.aten.upsample_bilinear2d.vec(self, sizes, align_corners, factors)


# --- upsample_nearest1d / upsample_linear1d (F.interpolate on (N, C, L); SAM resizes its relative-position tables
# with mode="linear"). Nearest decomposes into the 2-D op over a plane of height 1 (row 0 for any height); linear
# into gathers of its two taps (see its decomposition).

def _nearest1d_meta(input, output_size, scale_factors):
    op = "aten.upsample_nearest1d.vec"
    sizes = _upsample_sizes(op, input, output_size, scale_factors, spatial=1)
    return tensor([*shape_of(input)[:2], *sizes], dtype_of(input))


def _nearest1d_resample(input, out: int, scale):
    return input[:, :, nearest_source(input.shape[2], out, scale)]


def _nearest1d_kernel(input, output_size, scale_factors):
    out = int(_nearest1d_meta(input, output_size, scale_factors).shape[2])
    return _nearest1d_resample(input, out, None if scale_factors is None else scale_factors[0])


defop("upsample_nearest1d.vec(Tensor input, SymInt[]? output_size, float[]? scale_factors) -> Tensor",
      _nearest1d_meta, _nearest1d_kernel, tags=("composite",))


def _on_a_plane(output_size, scale_factors):
    """The 2-D op's (output_size, scale_factors) for a 1-D call over a plane of height 1."""
    return (None if output_size is None else [1, *output_size],
            None if scale_factors is None else [1.0, *scale_factors])


@register_decomposition("aten.upsample_nearest1d.vec")
def _nearest1d_decomposition(input, output_size, scale_factors):
    _nearest1d_meta(input, output_size, scale_factors)
    plane = ops.aten.upsample_nearest2d.vec(ops.aten.unsqueeze.default(input, 2),
                                            *_on_a_plane(output_size, scale_factors))
    return ops.aten.squeeze.dims(plane, [2])


def _linear1d_meta(input, output_size, align_corners, scale_factors):
    op = "aten.upsample_linear1d.vec"
    sizes = _upsample_sizes(op, input, output_size, scale_factors, spatial=1)
    require_dtype(_is_floating(dtype_of(input)), op, f"expected a floating-point input, got {dtype_of(input)}")
    return tensor([*shape_of(input)[:2], *sizes], dtype_of(input))


def _linear1d_resample(input, out: int, align_corners: bool, scale):
    dtype = _opmath(input.dtype)
    low, high, w_low, w_high = linear_taps(input.shape[2], out, align_corners, scale, dtype)
    x = input.astype(dtype)
    return x[..., low] * w_low + x[..., high] * w_high


def _linear1d_kernel(input, output_size, align_corners, scale_factors):
    out = int(_linear1d_meta(input, output_size, align_corners, scale_factors).shape[2])
    return _linear1d_resample(input, out, align_corners, None if scale_factors is None else scale_factors[0])


defop("upsample_linear1d.vec(Tensor input, SymInt[]? output_size, bool align_corners, float[]? scale_factors) "
      "-> Tensor", _linear1d_meta, _linear1d_kernel, tags=("composite",))


@register_decomposition("aten.upsample_linear1d.vec")
def _linear1d_decomposition(input, output_size, align_corners, scale_factors):
    """Static lengths: ATen's two taps (linear_taps) computed with ops, gathered and weighed. Symbolic lengths: the
    2-D op over a plane of height 1, which differs from ATen's 1-D kernel on non-finite inputs only (the plane's
    zero-weight row tap turns an inf into a NaN)."""
    aten = ops.aten
    result = _linear1d_meta(input, output_size, align_corners, scale_factors)
    size, out = shape_of(input)[2], result.shape[2]
    if not (isinstance(size, int) and isinstance(out, int)):
        sizes, factors = _on_a_plane(output_size, scale_factors)
        plane = aten.upsample_bilinear2d.vec(aten.unsqueeze.default(input, 2), sizes, align_corners, factors)
        return aten.squeeze.dims(plane, [2])
    dtype = dtype_of(input)
    compute = dtypes.float64 if dtype is dtypes.float64 else dtypes.float32
    x = _cast(input, compute)
    if size == out:  # linear_taps: (i, i) with weights (1, 0), so an inf becomes a NaN as in ATen
        return _cast(aten.add.Tensor(x, aten.mul.Scalar(x, 0)), dtype)
    scale = scale_factors[0] if scale_factors is not None else None
    source = _area_pixel_sources_op(size, out, align_corners, scale, compute)
    if not align_corners:
        source = aten.clamp.default(source, 0, None)
    low = aten.clamp.default(aten.floor.default(source), None, size - 1)
    w_high = aten.clamp.default(aten.sub.Tensor(source, low), 0, 1)
    low = aten._to_copy.default(low, dtype=dtypes.int64)
    high = aten.clamp.default(aten.add.Scalar(low, 1), None, size - 1)
    resampled = aten.add.Tensor(aten.mul.Tensor(aten.index.Tensor(x, [None, None, low]), aten.rsub.Scalar(w_high, 1)),
                                aten.mul.Tensor(aten.index.Tensor(x, [None, None, high]), w_high))
    return _cast(resampled, dtype)


def _nearest1d_default_meta(self, output_size, scales=None):
    op = "aten.upsample_nearest1d.default"
    require_arg(len(output_size) == 1, op, f"output_size must have 1 element, got {list(output_size)}")
    return _nearest1d_meta(self, list(output_size), None)


def _nearest1d_default_kernel(self, output_size, scales=None):
    return _nearest1d_resample(self, int(output_size[0]), scales)


defop("upsample_nearest1d(Tensor self, SymInt[1] output_size, float? scales=None) -> Tensor",
      _nearest1d_default_meta, checked(_nearest1d_default_meta, _nearest1d_default_kernel), tags=("composite",))


@register_decomposition("aten.upsample_nearest1d.default")
def _nearest1d_default_decomposition(self, output_size, scales=None):
    _nearest1d_default_meta(self, output_size, scales)
    sizes, factors = _vec_scale_factors("aten.upsample_nearest1d.default", self, output_size, (scales,))
    return ops.aten.upsample_nearest1d.vec(self, sizes, factors)


def _linear1d_default_meta(self, output_size, align_corners, scales=None):
    op = "aten.upsample_linear1d.default"
    require_arg(len(output_size) == 1, op, f"output_size must have 1 element, got {list(output_size)}")
    return _linear1d_meta(self, list(output_size), align_corners, None)


def _linear1d_default_kernel(self, output_size, align_corners, scales=None):
    return _linear1d_resample(self, int(output_size[0]), align_corners, scales)


defop("upsample_linear1d(Tensor self, SymInt[1] output_size, bool align_corners, float? scales=None) -> Tensor",
      _linear1d_default_meta, checked(_linear1d_default_meta, _linear1d_default_kernel), tags=("composite",))


@register_decomposition("aten.upsample_linear1d.default")
def _linear1d_default_decomposition(self, output_size, align_corners, scales=None):
    _linear1d_default_meta(self, output_size, align_corners, scales)
    scale = None if align_corners else scales  # align_corners ignores the scale
    sizes, factors = _vec_scale_factors("aten.upsample_linear1d.default", self, output_size, (scale,))
    return ops.aten.upsample_linear1d.vec(self, sizes, align_corners, factors)


# ---------------------------------------------------------------------------------------------
# im2col (F.unfold): every kernel window as a column; decomposed into a pad and one advanced-indexing gather,
# as torch's own decomposition does (ConvBERT's span convolution)

def _im2col_arguments(self, kernel_size, dilation, padding, stride):
    op = "aten.im2col.default"
    x = shape_of(self)
    require(len(x) in (3, 4) and not any(_is_const(size, 0) for size in x[-3:]), op,
            f"Expected 3D or 4D (batch mode) tensor with possible 0 batch size and non-zero dimensions for input, "
            f"but got: {list(x)}")
    for name, values, low in (("kernel_size", kernel_size, 1), ("dilation", dilation, 1), ("padding", padding, 0),
                              ("stride", stride, 1)):
        require_arg(len(values) == 2, op, f"It is expected {name} equals to 2, but got size {len(values)}")
        require_arg(all(v >= low for v in values), op,
                    f"expected {name} to be {'non-negative' if low == 0 else 'greater than zero'}, "
                    f"but got {name}: {list(values)}")
    outputs = [conv_output_size(size, k, s, p, d)
               for size, k, s, p, d in zip(x[-2:], kernel_size, stride, padding, dilation)]
    require(all(_at_least(o, 1) for o in outputs), op,
            f"Given input with spatial size {list(x[-2:])}, kernel_size={list(kernel_size)}, "
            f"dilation={list(dilation)}, padding={list(padding)}, calculated shape of the array of sliding blocks "
            f"as {outputs}, but its components must be at least one.")
    return x, outputs


def _im2col_meta(self, kernel_size, dilation, padding, stride):
    x, (rows, cols) = _im2col_arguments(self, kernel_size, dilation, padding, stride)
    return tensor([*x[:-3], as_dim(x[-3] * kernel_size[0] * kernel_size[1]), as_dim(rows * cols)], dtype_of(self))


def _im2col(self, kernel_size, dilation, padding, stride):
    _, outputs = _im2col_arguments(self, kernel_size, dilation, padding, stride)
    x = self if self.ndim == 4 else self[None]
    x = np.pad(x, ((0, 0), (0, 0), (padding[0], padding[0]), (padding[1], padding[1])))
    windows = _strided_windows(x, kernel_size, stride, dilation, outputs)  # [N, C, oh, ow, kh, kw]
    columns = windows.transpose(0, 1, 4, 5, 2, 3).reshape(
        x.shape[0], x.shape[1] * kernel_size[0] * kernel_size[1], outputs[0] * outputs[1])
    return columns if self.ndim == 4 else columns[0]


defop("im2col(Tensor self, int[2] kernel_size, int[2] dilation, int[2] padding, int[2] stride) -> Tensor",
      _im2col_meta, _im2col, tags=("composite",))


@register_decomposition("aten.im2col.default")
def _im2col_decomposition(self, kernel_size, dilation, padding, stride):
    x, outputs = _im2col_arguments(self, kernel_size, dilation, padding, stride)
    aten = ops.aten
    batched = self if len(x) == 4 else aten.unsqueeze.default(self, 0)
    padded = aten.constant_pad_nd.default(batched, [padding[1], padding[1], padding[0], padding[0]], 0)

    def positions(axis: int):  # [kernel, outputs]: window start + tap offset along one spatial axis
        starts = aten.arange.start_step(0, as_dim(outputs[axis] * stride[axis]), stride[axis], dtype=dtypes.int64)
        taps = aten.arange.start_step(0, kernel_size[axis] * dilation[axis], dilation[axis], dtype=dtypes.int64)
        return aten.add.Tensor(aten.unsqueeze.default(starts, 0), aten.unsqueeze.default(taps, 1))

    rows = aten.unsqueeze.default(aten.unsqueeze.default(positions(0), -1), -1)  # [kh, oh, 1, 1]
    gathered = aten.index.Tensor(padded, [None, None, rows, positions(1)])  # [N, C, kh, oh, kw, ow]
    gathered = aten.permute.default(gathered, [0, 1, 2, 4, 3, 5])
    shape = shape_of(padded)
    columns = aten.view.default(gathered, [shape[0], as_dim(shape[1] * kernel_size[0] * kernel_size[1]),
                                           as_dim(outputs[0] * outputs[1])])
    return columns if len(x) == 4 else aten.squeeze.dim(columns, 0)



# ---------------------------------------------------------------------------------------------
# upsample_bicubic2d (F.interpolate(mode="bicubic"); YOLOS and DINO-style position-embedding resizing): ATen's
# separable 4-tap cubic convolution (A = -0.75) with clamped taps; decomposed into gathers and pointwise ops

_CUBIC_A = -0.75


def _cubic_weights(t, mul, add):
    """The four tap weights for fractional offsets t, with `mul(a, b)` / `add(a, scalar)` for numpy arrays or
    program values: near(x) = ((A+2)x - (A+3))x^2 + 1 for |x| <= 1, far(x) = ((Ax - 5A)x + 8A)x - 4A for 1 < |x| < 2."""
    def horner(x, coefficients):
        result = mul(x, coefficients[0])
        for c in coefficients[1:-1]:
            result = mul(add(result, c), x)
        return add(result, coefficients[-1])
    near = [_CUBIC_A + 2, -(_CUBIC_A + 3), 0, 1]
    far = [_CUBIC_A, -5 * _CUBIC_A, 8 * _CUBIC_A, -4 * _CUBIC_A]
    one_minus_t = add(mul(t, -1), 1)
    return [horner(add(t, 1), far), horner(t, near), horner(one_minus_t, near), horner(add(one_minus_t, 1), far)]


def _bicubic_meta(input, output_size, align_corners, scale_factors):
    op = "aten.upsample_bicubic2d.vec"
    sizes = _upsample_sizes(op, input, output_size, scale_factors)
    require_dtype(_is_floating(dtype_of(input)), op, f"expected a floating-point input, got {dtype_of(input)}")
    return tensor([*shape_of(input)[:2], *sizes], dtype_of(input))


def _bicubic_taps(size: int, out: int, align_corners: bool, scale, dtype: np.dtype):
    """The four clamped source indices and weights per output position, computed in opmath `dtype` as ATen does."""
    real = area_pixel_sources(size, out, align_corners, scale, dtype)  # cubic: not clamped at 0
    index = np.minimum(np.floor(real).astype(np.int64), size - 1)
    offset = np.clip(real - index.astype(dtype), 0, 1).astype(dtype)
    weights = _cubic_weights(offset, lambda a, b: a * b, lambda a, b: a + b)
    return [np.clip(index - 1 + k, 0, size - 1) for k in range(4)], weights


def _bicubic(input, output_size, align_corners, scale_factors):
    out_h, out_w = (int(s) for s in _bicubic_meta(input, output_size, align_corners, scale_factors).shape[2:])
    scale_h, scale_w = scale_factors if scale_factors is not None else (None, None)
    # ATen computes positions, weights and sums in opmath (float64 for float64, else float32) and stores
    # float16/bfloat16 weights in the input's dtype
    compute = _opmath(input.dtype)
    x = input.astype(compute)
    rows, row_weights = _bicubic_taps(input.shape[2], out_h, align_corners, scale_h, compute)
    cols, col_weights = _bicubic_taps(input.shape[3], out_w, align_corners, scale_w, compute)
    row_weights, col_weights = ([w.astype(input.dtype).astype(compute) for w in ws]
                                for ws in (row_weights, col_weights))
    across = sum(x[..., c] * w for c, w in zip(cols, col_weights))  # [N, C, H, out_w]
    return sum(across[:, :, r, :] * w[:, None] for r, w in zip(rows, row_weights))


defop("upsample_bicubic2d.vec(Tensor input, SymInt[]? output_size, bool align_corners, float[]? scale_factors) "
      "-> Tensor", _bicubic_meta, _bicubic, tags=("composite",))


def _times(a, b):
    return ops.aten.mul.Tensor(a, b) if hasattr(b, "type") or hasattr(b, "shape") else ops.aten.mul.Scalar(a, b)


@register_decomposition("aten.upsample_bicubic2d.vec")
def _bicubic_decomposition(input, output_size, align_corners, scale_factors):
    op = "aten.upsample_bicubic2d.vec"
    result = _bicubic_meta(input, output_size, align_corners, scale_factors)
    sizes = [*shape_of(input)[2:], *result.shape[2:]]
    if not all(isinstance(s, int) for s in sizes):  # a limit of kiln's, not an error in the program: unsupported
        raise UnsupportedError(f"{op}: the decomposition needs static spatial sizes, got input "
                               f"{list(shape_of(input))} and output {list(result.shape)}",
                               fix="keep H and W static in dynamic_shapes (batch and channels may vary)")
    aten = ops.aten
    dtype = dtype_of(input)
    compute = dtypes.float64 if dtype is dtypes.float64 else dtypes.float32
    x = input if dtype is compute else aten._to_copy.default(input, dtype=compute)
    scales = scale_factors if scale_factors is not None else (None, None)

    def taps(axis: int):  # four clamped index tensors and four weight tensors along one spatial axis
        size, out = sizes[axis], sizes[axis + 2]
        real = _area_pixel_sources_op(size, out, align_corners, scales[axis], compute)
        index = aten.clamp.default(aten.floor.default(real), None, size - 1)
        weights = _cubic_weights(aten.clamp.default(aten.sub.Tensor(real, index), 0, 1), _times, aten.add.Scalar)
        index = aten._to_copy.default(index, dtype=dtypes.int64)
        if dtype is not compute:  # float16/bfloat16 weights are rounded to the input's dtype, as ATen stores them
            weights = [aten._to_copy.default(w, dtype=dtype) for w in weights]
        return ([aten.clamp.default(aten.add.Scalar(index, k - 1), 0, size - 1) for k in range(4)],
                [aten._to_copy.default(w, dtype=compute) for w in weights])

    def combine(values, weights):
        total = aten.mul.Tensor(values[0], weights[0])
        for value, weight in zip(values[1:], weights[1:]):
            total = aten.add.Tensor(total, aten.mul.Tensor(value, weight))
        return total

    rows, row_weights = taps(0)
    cols, col_weights = taps(1)
    across = combine([aten.index.Tensor(x, [None, None, None, c]) for c in cols], col_weights)
    result = combine([aten.index.Tensor(across, [None, None, r]) for r in rows],
                     [aten.unsqueeze.default(w, -1) for w in row_weights])
    return result if dtype is compute else aten._to_copy.default(result, dtype=dtype)



# ---------------------------------------------------------------------------------------------
# glu: the first half of `dim` gated by the sigmoid of the second (Speech2Text's convolutional subsampler)

def _glu_split(self, dim):
    op = "aten.glu.default"
    shape = shape_of(self)
    require(len(shape) > 0, op, "glu does not support scalars because halving size must be even")
    d = canonical_dim(op, dim, len(shape))
    require_dtype(_is_floating(dtype_of(self)), op, f"expected a floating-point tensor, got {dtype_of(self)}")
    size = shape[d]
    even = size % 2 == 0 if isinstance(size, int) else guard_bool(sympy.Eq(sympy.Mod(size, 2), 0))
    require(even, op, f"Halving dimension must be even, but dimension {d} is size {size}")
    return d, floor_div(size, 2)


def _glu_meta(self, dim=-1):
    d, half = _glu_split(self, dim)
    shape = list(shape_of(self))
    return tensor(shape[:d] + [half] + shape[d + 1:], dtype_of(self))


def _glu(self, dim=-1):
    d, half = _glu_split(self, dim)
    x = self.astype(_opmath(self.dtype))
    first, second = np.split(x, 2, axis=d)
    with np.errstate(over="ignore"):
        return first * (1 / (1 + np.exp(-second)))


defop("glu(Tensor self, int dim=-1) -> Tensor", _glu_meta, _glu, tags=("composite",))


@register_decomposition("aten.glu.default")
def _glu_decomposition(self, dim=-1):
    d, half = _glu_split(self, dim)
    aten = ops.aten
    dtype = dtype_of(self)
    x = aten._to_copy.default(self, dtype=dtypes.float32) if dtype.numpy in _REDUCED else self
    first = aten.slice.Tensor(x, d, 0, half)
    second = aten.slice.Tensor(x, d, half, shape_of(x)[d])
    result = aten.mul.Tensor(first, aten.sigmoid.default(second))
    return result if x is self else aten._to_copy.default(result, dtype=dtype)



# ---------------------------------------------------------------------------------------------
# _weight_norm (nn.utils.weight_norm; wav2vec2's positional convolution): v * (g / norm of v over every dim but
# `dim`), dim=-1 taking the norm of the whole of v, as ATen's norm_except_dim

def _weight_norm_dims(op, v, dim):
    rank = len(shape_of(v))
    require(rank > 0, op, "v must have dims, got a 0-d tensor (ATen wraps dim into v's dims: there are none)")
    require_arg(-1 <= dim < rank, op, f"dim must be -1 or in [0, {rank}), got {dim}")
    return None if dim == -1 else [d for d in range(rank) if d != dim]


def _weight_norm_meta(v, g, dim=0):
    op = "aten._weight_norm.default"
    require_dtype(_is_floating(dtype_of(v)) and _is_floating(dtype_of(g)), op,
                  f"expected floating-point v and g, got {dtype_of(v)} and {dtype_of(g)}")
    dims = _weight_norm_dims(op, v, dim)
    require_dtype(dim == -1 or dtype_of(v) is dtype_of(g), op,  # ATen's fused kernel; dim=-1 is composite
                  f"v and g must have the same dtype (unless dim=-1), got {dtype_of(v)} and {dtype_of(g)}")
    # v * (g / norm), promoted as those ops promote: a 0-d g (or the whole-tensor norm) does not widen v's dtype
    norm_shape = [] if dims is None else [1 if i in dims else d for i, d in enumerate(shape_of(v))]
    if dims is not None:
        # ATen's fused kernel (dim 0 or the last) scales the i-th slice along `dim` by the i-th element of g and gives
        # v's shape whatever g's: g must be norm_except_dim's shape (broadcasting any other g would disagree with it)
        padded = [1] * (len(norm_shape) - len(shape_of(g))) + list(shape_of(g))
        require(len(padded) == len(norm_shape) and all(sym_eq(a, b) for a, b in zip(padded, norm_shape)), op,
                f"g must have the shape of norm_except_dim(v, 2, {dim}), {norm_shape}; got {list(shape_of(g))}",
                fix=f"reshape g to {norm_shape} (the shape torch.nn.utils.weight_norm gives it)")
    norm = tensor(norm_shape, dtype_of(v))
    quotient = tensor(broadcast_shapes(op, shape_of(g), shape_of(norm)), dtypes.result_type(g, norm))
    return tensor(broadcast_shapes(op, shape_of(v), shape_of(quotient)), dtypes.result_type(v, quotient))


def _weight_norm(v, g, dim=0):
    dims = _weight_norm_dims("aten._weight_norm.default", v, dim)
    x = v.astype(np.float64)
    norm = np.sqrt(np.sum(np.square(x), axis=None if dims is None else tuple(dims), keepdims=dims is not None))
    return x * (g.astype(np.float64) / norm)


defop("_weight_norm(Tensor v, Tensor g, int dim=0) -> Tensor", _weight_norm_meta, _weight_norm, tags=("composite",))


@register_decomposition("aten._weight_norm.default")
def _weight_norm_decomposition(v, g, dim=0):
    dims = _weight_norm_dims("aten._weight_norm.default", v, dim)
    aten = ops.aten
    if dims == []:  # a 1-D v normed along its only dim: each element's magnitude
        norm = aten.abs.default(v)
    else:
        norm = aten.linalg_vector_norm.default(v, 2, dims, dims is not None)
    return aten.mul.Tensor(v, aten.div.Tensor(g, norm))


# =============================================================================================
# VJP rules (torch's derivatives.yaml, written with kiln.ops handles; see register_vjp). Ops with a backward op
# (kiln/ir/ops/backward.py) call it; the others scatter their gradient back with index_put / scatter_add, or
# reuse a 2-D backward op along pairs of axes (the 3-D pools are separable per axis).

from kiln.ir.ops._grad import cast, zeros_like  # noqa: E402
from kiln.ir.registry import register_vjp  # noqa: E402

aten = ops.aten


def _ints(values, n: int) -> list:
    """An int[n] argument as n values (ATen accepts one value for all dims)."""
    values = list(values) if isinstance(values, (list, tuple)) else [values]
    return values * n if len(values) == 1 else values


def _zeros(shape, dtype: dtypes.DType):
    return aten.full.default(list(shape), 0, dtype=dtype)


def _zero_where_not(keep, value):
    """`value` where `keep` holds, else 0 (also where `value` is NaN or inf, unlike a multiplication by the mask)."""
    return aten.where.self(keep, value, aten.full.default([], 0, dtype=dtype_of(value)))


def _column(vector):
    return aten.unsqueeze.default(vector, 1)


# --- convolution

@register_vjp("aten.convolution.default")
def _convolution_vjp(grad, out, input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    bias_sizes = None if bias is None else list(shape_of(bias))
    grad_input, grad_weight, grad_bias = aten.convolution_backward.default(
        grad, input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups,
        [True, True, bias is not None])
    return grad_input, grad_weight, None if bias is None else cast(grad_bias, dtype_of(bias))


# --- pooling

def _pool_arguments_2d(kernel_size, stride, padding, n: int):
    kernel = _ints(kernel_size, n)
    return kernel, _ints(stride, n) if stride else kernel, _ints(padding, n)


@register_vjp("aten.max_pool2d_with_indices.default")
def _max_pool2d_vjp(grad, out, self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    if grad[0] is None:
        return None
    kernel, stride, padding = _pool_arguments_2d(kernel_size, stride, padding, 2)
    return aten.max_pool2d_with_indices_backward.default(grad[0], self, kernel, stride, padding, _ints(dilation, 2),
                                                         ceil_mode, out[1])


@register_vjp("aten.max_pool3d_with_indices.default")
def _max_pool3d_vjp(grad, out, self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    """Each output's gradient goes to the input its index names (a flat position in its D*H*W volume)."""
    if grad[0] is None:
        return None
    shape = shape_of(self)
    lead = list(shape[:-3])
    volume, pooled = numel(shape[-3:]), numel(shape_of(grad[0])[-3:])
    flat = aten.view.default(zeros_like(self), [*lead, volume])
    flat = aten.scatter_add.default(flat, len(lead), aten.view.default(out[1], [*lead, pooled]),
                                    aten.view.default(grad[0], [*lead, pooled]))
    return aten.view.default(flat, list(shape))


@register_vjp("aten.avg_pool2d.default")
def _avg_pool2d_vjp(grad, out, self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                    divisor_override=None):
    kernel, stride, padding = _pool_arguments_2d(kernel_size, stride, padding, 2)
    return aten.avg_pool2d_backward.default(grad, self, kernel, stride, padding, ceil_mode, count_include_pad,
                                            divisor_override)


def _shape_carrier(shape, dtype: dtypes.DType):
    """A tensor of `shape` for a backward op that reads only its argument's shape and dtype (a broadcast zero)."""
    return aten.expand.default(aten.full.default([], 0, dtype=dtype), list(shape))


def _separable_3d_backward(grad, self, backward_2d):
    """The VJP of a 3-D pool that factors over its axes (windows and divisors are per-axis products): the 2-D
    backward over (H, W) on [batch * D_out, H_out, W_out], then over D on [batch, D_out, H * W] with a
    window of one along the flattened H * W. `backward_2d(grad, carrier, axes)` runs the 2-D backward op."""
    shape, pooled = shape_of(self), shape_of(grad)
    batch = numel(shape[:-3])
    depth, height, width = shape[-3:]
    out_depth, out_height, out_width = pooled[-3:]
    dtype = dtype_of(grad)
    planes = as_dim(batch * out_depth)
    result = backward_2d(aten.view.default(grad, [planes, out_height, out_width]),
                         _shape_carrier([planes, height, width], dtype), (1, 2))
    plane = as_dim(height * width)
    result = backward_2d(aten.view.default(result, [batch, out_depth, plane]),
                         _shape_carrier([batch, depth, plane], dtype), (0,))
    return aten.view.default(result, list(shape))


@register_vjp("aten.avg_pool3d.default")
def _avg_pool3d_vjp(grad, out, self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                    divisor_override=None):
    kernel, stride, padding = _pool_arguments_2d(kernel_size, stride, padding, 3)
    # With divisor_override each axis only sums (divisor 1); the override divides once at the end.
    per_axis_divisor = None if divisor_override is None else 1

    def backward_2d(grad_2d, carrier, axes):
        if axes == (0,):
            k, s, p = [kernel[0], 1], [stride[0], 1], [padding[0], 0]
        else:
            k, s, p = kernel[1:], stride[1:], padding[1:]
        return aten.avg_pool2d_backward.default(grad_2d, carrier, k, s, p, ceil_mode, count_include_pad,
                                                per_axis_divisor)
    result = _separable_3d_backward(grad, self, backward_2d)
    return result if divisor_override is None else aten.div.Scalar(result, divisor_override)


@register_vjp("aten._adaptive_avg_pool2d.default")
def _adaptive_avg_pool2d_vjp(grad, out, self, output_size):
    return aten._adaptive_avg_pool2d_backward.default(grad, self)


@register_vjp("aten._adaptive_avg_pool3d.default")
def _adaptive_avg_pool3d_vjp(grad, out, self, output_size):
    return _separable_3d_backward(grad, self, lambda g, carrier, axes: aten._adaptive_avg_pool2d_backward.default(
        g, carrier))


# --- normalization

def _channel_view(vector, rank: int):
    """[C] -> [1, C, 1, ...], to broadcast against an [N, C, *] input."""
    return aten.view.default(vector, [1, shape_of(vector)[0], *[1] * (rank - 2)])


def _batch_norm_vjp(grad, input, weight, bias, mean, invstd, training: bool):
    """torch's native_batch_norm_backward. Training: the statistics are the batch's own, so
    dx = (dy - mean(dy) - (x - mean) * mean(dy * (x - mean)) * invstd^2) * invstd * weight; otherwise they are
    constants and dx = dy * invstd * weight. dweight = sum(dy * (x - mean)) * invstd, dbias = sum(dy)."""
    if grad is None:
        return None, None, None
    rank = len(shape_of(input))
    dims = [0, *range(2, rank)]
    centered = aten.sub.Tensor(input, _channel_view(mean, rank))
    product = aten.mul.Tensor(grad, centered)
    scale = invstd if weight is None else aten.mul.Tensor(invstd, weight)
    if training:
        projection = aten.mul.Tensor(centered, aten.mul.Tensor(aten.mean.dim(product, dims, True),
                                                               _channel_view(aten.mul.Tensor(invstd, invstd), rank)))
        grad_input = aten.sub.Tensor(aten.sub.Tensor(grad, aten.mean.dim(grad, dims, True)), projection)
        grad_input = aten.mul.Tensor(grad_input, _channel_view(scale, rank))
    else:
        grad_input = aten.mul.Tensor(grad, _channel_view(scale, rank))
    grad_weight = grad_bias = None
    if weight is not None:
        grad_weight = cast(aten.mul.Tensor(aten.sum.dim_IntList(product, dims), invstd), dtype_of(weight))
    if bias is not None:
        grad_bias = cast(aten.sum.dim_IntList(grad, dims), dtype_of(bias))
    return cast(grad_input, dtype_of(input)), grad_weight, grad_bias


def _running_invstd(running_var, eps):
    return aten.rsqrt.default(aten.add.Scalar(running_var, eps))


@register_vjp("aten._native_batch_norm_legit.default")
def _native_batch_norm_legit_vjp(grad, out, input, weight, bias, running_mean, running_var, training, momentum, eps):
    if training:
        grads = _batch_norm_vjp(grad[0], input, weight, bias, out[1], out[2], True)
    else:
        grads = _batch_norm_vjp(grad[0], input, weight, bias, running_mean, _running_invstd(running_var, eps), False)
    return (*grads, None, None)  # the running statistics are buffers: no gradient (torch refuses to make one)


@register_vjp("aten._native_batch_norm_legit.no_stats")
def _native_batch_norm_legit_no_stats_vjp(grad, out, input, weight, bias, training, momentum, eps):
    return _batch_norm_vjp(grad[0], input, weight, bias, out[1], out[2], True)


@register_vjp("aten._native_batch_norm_legit_no_training.default")
def _native_batch_norm_legit_no_training_vjp(grad, out, input, weight, bias, running_mean, running_var, momentum,
                                             eps):
    grads = _batch_norm_vjp(grad[0], input, weight, bias, running_mean, _running_invstd(running_var, eps), False)
    return (*grads, None, None)


@register_vjp("aten.native_layer_norm.default")
def _native_layer_norm_vjp(grad, out, input, normalized_shape, weight, bias, eps):
    """torch's rule reads only the output's gradient: mean and rstd are not differentiable outputs in torch."""
    if grad[0] is None:
        return None, None, None
    grad_input, grad_weight, grad_bias = aten.native_layer_norm_backward.default(
        grad[0], input, normalized_shape, out[1], out[2], weight, bias, [True, weight is not None, bias is not None])
    return grad_input, None if weight is None else grad_weight, None if bias is None else grad_bias


@register_vjp("aten.native_group_norm.default")
def _native_group_norm_vjp(grad, out, input, weight, bias, N, C, HxW, group, eps):  # noqa: N803
    """native_group_norm_backward for the output's gradient, plus (torch's infinitely differentiable form) what
    flows through the mean and rstd outputs: d mean / dx = 1 / M, d rstd / dx = -rstd^3 (x - mean) / M over each
    group of M = C / group * HxW elements."""
    grad_out, grad_mean, grad_rstd = grad
    grad_input = grad_weight = grad_bias = None
    if grad_out is not None:
        grad_input, grad_weight, grad_bias = aten.native_group_norm_backward.default(
            grad_out, input, out[1], out[2], weight, N, C, HxW, group, [True, weight is not None, bias is not None])
    if grad_mean is not None or grad_rstd is not None:
        count = as_dim(floor_div(C, group) * HxW)
        grouped = aten.view.default(input, [N, group, count])
        through_stats = None
        if grad_rstd is not None:
            rstd, mean = _column3(out[2]), _column3(out[1])
            through_stats = aten.mul.Tensor(aten.sub.Tensor(grouped, mean),
                                            aten.mul.Tensor(_column3(grad_rstd), aten.pow.Tensor_Scalar(rstd, 3)))
            through_stats = aten.neg.default(through_stats)
        if grad_mean is not None:
            through_stats = (aten.expand.default(_column3(grad_mean), [N, group, count]) if through_stats is None
                             else aten.add.Tensor(through_stats, _column3(grad_mean)))
        through_stats = aten.view.default(aten.div.Scalar(through_stats, count), list(shape_of(input)))
        through_stats = cast(through_stats, dtype_of(input))
        grad_input = through_stats if grad_input is None else aten.add.Tensor(grad_input, through_stats)
    return grad_input, None if weight is None else grad_weight, None if bias is None else grad_bias


def _column3(statistic):
    """[N, group] -> [N, group, 1]."""
    return aten.unsqueeze.default(statistic, 2)


# --- dropout

@register_vjp("aten.native_dropout.default")
def _native_dropout_vjp(grad, out, input, p, train):
    """grad * mask * scale. torch scales by 1 / (1 - p) only for train=True: train=None trains in the forward
    pass but its gradient is not rescaled (derivatives.yaml's `!train.has_value() ? 1`); kiln does the same."""
    if grad[0] is None:
        return None
    masked = aten.mul.Tensor(grad[0], out[1])
    scale = (0.0 if p == 1 else 1.0 / (1.0 - p)) if train else 1.0
    return masked if scale == 1.0 else aten.mul.Scalar(masked, scale)


# --- embeddings

@register_vjp("aten.embedding.default")
def _embedding_vjp(grad, out, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return aten.embedding_dense_backward.default(grad, indices, shape_of(weight)[0], padding_idx,
                                                 scale_grad_by_freq), None


def _bag_of_each_index(indices, offsets, include_last_offset: bool):
    """offset2bag computed from the offsets (the fused sum path leaves it empty): index i belongs to the number
    of bag starts after the first that are <= i."""
    count = shape_of(indices)[0]
    bags = shape_of(offsets)[0] - (1 if include_last_offset else 0)
    starts = aten.slice.Tensor(offsets, 0, 1, bags)
    marks = aten.index_put.default(_zeros([as_dim(count + 1)], dtypes.int64), [starts],
                                   aten.full_like.default(starts, 1, dtype=dtypes.int64), True)
    return aten.slice.Tensor(aten.cumsum.default(marks, 0), 0, 0, count)


@register_vjp("aten._embedding_bag.default")
def _embedding_bag_vjp(grad, out, weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                       per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    """ATen's _embedding_bag_dense_backward and _embedding_bag_per_sample_weights_backward: sum and mean send each
    bag's gradient to its rows (divided by the bag size for mean, times the sample weight), max to the row that
    won each column of a non-empty bag; padding_idx rows get nothing."""
    if grad[0] is None:
        return None, None, None, None
    grad_out, (_, _, bag_size, max_indices) = grad[0], out
    rows, dtype = shape_of(weight)[0], dtype_of(grad_out)
    if mode == _MODE_MAX:
        kept = _zero_where_not(_column(aten.gt.Scalar(bag_size, 0)), grad_out)
        grad_weight = aten.scatter_add.default(_zeros([rows, shape_of(weight)[1]], dtype), 0,
                                               cast(max_indices, dtypes.int64), kept)
        return grad_weight, None, None, None
    bag_of = _bag_of_each_index(indices, offsets, include_last_offset)
    bag_grad = aten.index_select.default(grad_out, 0, bag_of)
    per_index = bag_grad
    if mode == _MODE_MEAN:
        sizes = cast(aten.index_select.default(bag_size, 0, bag_of), dtype)
        per_index = aten.div.Tensor(per_index, _column(sizes))
    if per_sample_weights is not None:
        per_index = aten.mul.Tensor(per_index, _column(per_sample_weights))
    if scale_grad_by_freq:
        counts = aten.index_put.default(_zeros([rows], dtype), [indices],
                                        aten.full_like.default(indices, 1, dtype=dtype), True)
        per_index = aten.div.Tensor(per_index, _column(aten.index_select.default(counts, 0, indices)))
    kept = aten.ne.Scalar(indices, padding_idx) if padding_idx >= 0 else None
    if kept is not None:
        per_index = _zero_where_not(_column(kept), per_index)
    grad_weight = aten.index_put.default(zeros_like(weight), [indices], cast(per_index, dtype_of(weight)), True)
    grad_sample_weights = None
    if per_sample_weights is not None:
        rows_used = aten.index_select.default(weight, 0, indices)
        grad_sample_weights = aten.sum.dim_IntList(aten.mul.Tensor(bag_grad, rows_used), [1])
        if kept is not None:
            grad_sample_weights = _zero_where_not(kept, grad_sample_weights)
        grad_sample_weights = cast(grad_sample_weights, dtype_of(per_sample_weights))
    return grad_weight, None, None, grad_sample_weights


# --- padding

def _padding_source(kind: str, size, out, before):
    """The input position each output position reads along one axis, as int64 [out]."""
    position = aten.arange.start_step(-before, as_dim(out - before), 1, dtype=dtypes.int64)
    last = as_dim(size - 1)
    if kind == "replication":
        return aten.clamp.default(position, 0, last)
    # Mirror about both edges: last - |last - |i||.
    mirrored = aten.abs.default(aten.sub.Scalar(aten.abs.default(position), last))
    return aten.add.Scalar(aten.neg.default(mirrored), last)


def _axis_indices(per_axis: list) -> list:
    """Index tensors of the last len(per_axis) dims, shaped to broadcast against each other."""
    n = len(per_axis)
    return [aten.view.default(index, [shape_of(index)[0], *[1] * (n - 1 - k)]) for k, index in enumerate(per_axis)]


def _pad_vjp(kind: str, n: int):
    def vjp(grad, out, self, padding):
        """Every output position adds its gradient to the input position it copies."""
        shape, padded = shape_of(self), shape_of(grad)
        sources = [_padding_source(kind, shape[len(shape) - n + k], padded[len(shape) - n + k],
                                   padding[2 * (n - 1 - k)]) for k in range(n)]
        return aten.index_put.default(zeros_like(self), [None] * (len(shape) - n) + _axis_indices(sources), grad,
                                      True)
    return vjp


for _kind, _dims in (("reflection", (1, 2, 3)), ("replication", (2, 3))):
    for _n in _dims:
        register_vjp(f"aten.{_kind}_pad{_n}d.default")(_pad_vjp(_kind, _n))


# --- upsampling

def _resampled_positions(resample, input, axis: int, output_size, scale_factors, dtype: dtypes.DType):
    """Where each output row (axis 2) or column (axis 3) reads the input: the op itself run on the positions
    0..size-1 laid out along that axis (the other spatial axis has size 1, which the op copies), so the rule
    repeats the kernel's own index arithmetic. Bilinear gives the fractional source position."""
    size = shape_of(input)[axis]
    first = axis == 2
    carrier = aten.view.default(aten.arange.start_step(0, size, 1, dtype=dtype), [1, 1, size, 1] if first
                                else [1, 1, 1, size])
    sizes = None if output_size is None else ([output_size[0], 1] if first else [1, output_size[1]])
    scales = None if scale_factors is None else ([scale_factors[0], 1.0] if first else [1.0, scale_factors[1]])
    positions = resample(carrier, sizes, scales)
    return aten.view.default(positions, [shape_of(positions)[axis]])


@register_vjp("aten.upsample_nearest2d.vec")
def _upsample_nearest2d_vjp(grad, out, input, output_size, scale_factors):
    rows, columns = (cast(_resampled_positions(aten.upsample_nearest2d.vec, input, axis, output_size, scale_factors,
                                               dtypes.float32), dtypes.int64) for axis in (2, 3))
    return aten.index_put.default(zeros_like(input), [None, None, *_axis_indices([rows, columns])], grad, True)


@register_vjp("aten.upsample_bilinear2d.vec")
def _upsample_bilinear2d_vjp(grad, out, input, output_size, align_corners, scale_factors):
    """Each output pixel adds its gradient, times the bilinear weights, to its four source pixels."""
    float64 = dtype_of(input) is dtypes.float64
    dtype = dtypes.float64 if float64 else dtypes.float32  # ATen's opmath: the weights' precision

    def resample(carrier, sizes, scales):
        return aten.upsample_bilinear2d.vec(carrier, sizes, align_corners, scales)

    taps = []  # per axis: (low, high, weight of low, weight of high)
    for axis in (2, 3):
        position = _resampled_positions(resample, input, axis, output_size, scale_factors, dtype)
        low = aten.floor.default(position)
        weight_high = aten.sub.Tensor(position, low)
        low = cast(low, dtypes.int64)
        high = aten.clamp.default(aten.add.Scalar(low, 1), None, as_dim(shape_of(input)[axis] - 1))
        taps.append((low, high, aten.add.Scalar(aten.neg.default(weight_high), 1), weight_high))
    (top, bottom, w_top, w_bottom), (left, right, w_left, w_right) = taps
    result = zeros_like(input)
    for rows, w_rows in ((top, w_top), (bottom, w_bottom)):
        for columns, w_columns in ((left, w_left), (right, w_right)):
            weights = aten.mul.Tensor(_column(w_rows), aten.unsqueeze.default(w_columns, 0))
            values = cast(aten.mul.Tensor(grad, weights), dtype_of(input))
            result = aten.index_put.default(result, [None, None, *_axis_indices([rows, columns])], values, True)
    return result


# --- col2im

@register_vjp("aten.col2im.default")
def _col2im_vjp(grad, out, self, output_size, kernel_size, dilation, padding, stride):
    return aten.im2col.default(grad, kernel_size, dilation, padding, stride)


# --- grid_sampler_2d (ATen's GridSamplerKernel backward, written with gathers and scatter_add over the flattened
# H * W plane)

def _grid_source(coordinate, size, align_corners: bool, padding_mode: int, *, pad_point: bool = True):
    """Grid coordinates of one axis -> (source positions, slope): d position / d coordinate is
    slope[0] / 2 * slope[1] (a count, and a tensor or None for 1), or 0 where the slope is None. The padding
    derivative is ATen's: border and reflection clip with gradient 0 at and beyond the edges
    (`clip_coordinates_set_grad`), and reflection flips its sign on every mirror image. Scales are applied as
    integer multiples and halvings, so symbolic sizes stay exact."""
    extent = as_dim(size - 1) if align_corners else size  # unnormalize: (coordinate + 1) * extent / 2 (- 0.5)
    position = aten.div.Scalar(aten.mul.Scalar(aten.add.Scalar(coordinate, 1), extent), 2)
    if not align_corners:
        position = aten.sub.Scalar(position, 0.5)
    if not pad_point or padding_mode == _ZEROS:
        return position, (extent, None)
    sign = None
    if padding_mode == _REFLECTION:
        position, sign = _reflected(position, size, align_corners)
        if sign is None:  # nothing to mirror over (one pixel, align_corners): position 0, gradient 0
            return position, None
    last = as_dim(size - 1)
    inside = cast(aten.logical_and.default(aten.gt.Scalar(position, 0), aten.lt.Scalar(position, last)),
                  dtype_of(position))
    return aten.clamp.default(position, 0, last), (extent, inside if sign is None else aten.mul.Tensor(inside, sign))


def _reflected(position, size, align_corners: bool):
    """Mirror into [low, low + span] (the forward's _GridAxis.reflect); the sign of d reflected / d position."""
    low = 0.0 if align_corners else -0.5
    twice_span = 2 * (size - 1) if align_corners else 2 * size
    if isinstance(twice_span, int) and twice_span == 0:
        return aten.mul.Scalar(position, 0), None
    shifted = aten.sub.Scalar(position, low)
    distance = aten.abs.default(shifted)
    extra = aten.sub.Tensor(distance, aten.mul.Scalar(aten.trunc.default(aten.div.Scalar(distance, twice_span)),
                                                      twice_span))
    flipped = aten.gt.Scalar(extra, twice_span / 2)
    mirrored = aten.where.self(flipped, aten.add.Scalar(aten.neg.default(extra), twice_span), extra)
    negative = aten.logical_xor.default(flipped, aten.lt.Scalar(shifted, 0))
    one = aten.full.default([], 1, dtype=dtype_of(position))
    sign = aten.where.self(negative, aten.neg.default(one), one)
    return aten.add.Scalar(mirrored, low), sign


class _GridTaps:
    """Gathers from and scatters into an [N, C, H, W] input flattened to [N, C, H * W], at integer positions
    [N, Ho, Wo]; positions outside the input read 0 and receive nothing."""

    def __init__(self, input, grad):
        self.shape = shape_of(input)
        batch, channels, self.height, self.width = self.shape
        self.sampled = list(shape_of(grad)[2:])  # [Ho, Wo]
        self.points = numel(self.sampled)
        self.flat_input = aten.view.default(input, [batch, channels, as_dim(self.height * self.width)])
        self.flat_grad = aten.view.default(grad, [batch, channels, self.points])
        self.grad_input = zeros_like(self.flat_input)

    def _where(self, rows, columns):
        batch, channels = self.shape[:2]
        inside = aten.logical_and.default(
            aten.logical_and.default(aten.ge.Scalar(rows, 0), aten.lt.Scalar(rows, self.height)),
            aten.logical_and.default(aten.ge.Scalar(columns, 0), aten.lt.Scalar(columns, self.width)))
        flat = aten.add.Tensor(aten.mul.Scalar(aten.clamp.default(rows, 0, as_dim(self.height - 1)), self.width),
                               aten.clamp.default(columns, 0, as_dim(self.width - 1)))
        index = aten.expand.default(aten.view.default(flat, [batch, 1, self.points]), [batch, channels, self.points])
        return index, aten.view.default(inside, [batch, 1, self.points])

    def tap(self, rows, columns, weight):
        """Add grad * weight ([N, Ho, Wo]) at the tap; return the input values there ([N, C, Ho * Wo])."""
        index, inside = self._where(rows, columns)
        weight = aten.view.default(weight, [self.shape[0], 1, self.points])
        spread = _zero_where_not(inside, aten.mul.Tensor(self.flat_grad, weight))
        self.grad_input = aten.scatter_add.default(self.grad_input, 2, index, cast(spread, dtype_of(self.grad_input)))
        return _zero_where_not(inside, aten.gather.default(self.flat_input, 2, index))

    def grid_term(self, values):
        """sum over channels of grad * values, as [N, Ho, Wo]."""
        summed = aten.sum.dim_IntList(aten.mul.Tensor(self.flat_grad, values), [1])
        return aten.view.default(summed, [self.shape[0], *self.sampled])


def _cubic_weights_and_slopes(t):
    """ATen's cubic convolution weights (A = -0.75) of the four taps around fractional offset t, and their
    derivatives with respect to t."""
    a = -0.75

    def near(x):  # |x| <= 1
        return aten.add.Scalar(aten.mul.Tensor(aten.mul.Tensor(aten.add.Scalar(aten.mul.Scalar(x, a + 2), -(a + 3)),
                                                               x), x), 1)

    def far(x):  # 1 < |x| < 2
        inner = aten.add.Scalar(aten.mul.Tensor(aten.add.Scalar(aten.mul.Scalar(x, a), -5 * a), x), 8 * a)
        return aten.add.Scalar(aten.mul.Tensor(inner, x), -4 * a)

    def near_slope(x):
        return aten.mul.Tensor(aten.add.Scalar(aten.mul.Scalar(x, 3 * (a + 2)), -2 * (a + 3)), x)

    def far_slope(x):
        return aten.add.Scalar(aten.mul.Tensor(aten.add.Scalar(aten.mul.Scalar(x, 3 * a), -10 * a), x), 8 * a)

    plus_one, one_minus = aten.add.Scalar(t, 1), aten.add.Scalar(aten.neg.default(t), 1)
    two_minus = aten.add.Scalar(aten.neg.default(t), 2)
    weights = [far(plus_one), near(t), near(one_minus), far(two_minus)]
    slopes = [far_slope(plus_one), near_slope(t), aten.neg.default(near_slope(one_minus)),
              aten.neg.default(far_slope(two_minus))]
    return weights, slopes


@register_vjp("aten.grid_sampler_2d.default")
def _grid_sampler_2d_vjp(grad, out, input, grid, interpolation_mode, padding_mode, align_corners):
    """Bilinear: each output adds grad * weight to its four corners, and moves with the grid by the difference of
    its corners' values; nearest: grad to the nearest pixel, no grid gradient (zeros, like torch); bicubic: 16
    taps at padded integer positions, the grid gradient through the cubic weights only. Computed in opmath."""
    dtype = dtypes.float64 if dtype_of(input) is dtypes.float64 else dtypes.float32
    height, width = shape_of(input)[2:]
    taps = _GridTaps(cast(input, dtype), cast(grad, dtype))
    coordinates = [cast(aten.select.int(grid, 3, axis), dtype) for axis in (0, 1)]
    to_index = lambda position: cast(position, dtypes.int64)  # noqa: E731 (positions are integral here)
    grid_grads = [None, None]
    if interpolation_mode == _NEAREST:
        (x, _), (y, _) = (_grid_source(c, size, align_corners, padding_mode)
                          for c, size in zip(coordinates, (width, height)))
        rows, columns = (to_index(aten.round.default(p)) for p in (y, x))
        taps.tap(rows, columns, aten.full_like.default(x, 1))
    elif interpolation_mode == _BILINEAR:
        (x, x_slope), (y, y_slope) = (_grid_source(c, size, align_corners, padding_mode)
                                      for c, size in zip(coordinates, (width, height)))
        west, north = aten.floor.default(x), aten.floor.default(y)
        w, n = aten.sub.Tensor(x, west), aten.sub.Tensor(y, north)
        e, s = aten.add.Scalar(aten.neg.default(w), 1), aten.add.Scalar(aten.neg.default(n), 1)
        west, north = to_index(west), to_index(north)
        east, south = aten.add.Scalar(west, 1), aten.add.Scalar(north, 1)
        nw = taps.tap(north, west, aten.mul.Tensor(s, e))
        ne = taps.tap(north, east, aten.mul.Tensor(s, w))
        sw = taps.tap(south, west, aten.mul.Tensor(n, e))
        se = taps.tap(south, east, aten.mul.Tensor(n, w))
        along_x = aten.add.Tensor(aten.mul.Tensor(aten.sub.Tensor(ne, nw), _points(s, taps)),
                                  aten.mul.Tensor(aten.sub.Tensor(se, sw), _points(n, taps)))
        along_y = aten.add.Tensor(aten.mul.Tensor(aten.sub.Tensor(sw, nw), _points(e, taps)),
                                  aten.mul.Tensor(aten.sub.Tensor(se, ne), _points(w, taps)))
        grid_grads = [_scaled(taps.grid_term(along_x), x_slope), _scaled(taps.grid_term(along_y), y_slope)]
    else:
        (x, x_slope), (y, y_slope) = (_grid_source(c, size, align_corners, padding_mode, pad_point=False)
                                      for c, size in zip(coordinates, (width, height)))
        west, north = aten.floor.default(x), aten.floor.default(y)
        (x_weights, x_slopes), (y_weights, y_slopes) = (_cubic_weights_and_slopes(aten.sub.Tensor(x, west)),
                                                        _cubic_weights_and_slopes(aten.sub.Tensor(y, north)))
        along_x = along_y = None
        for i in range(4):
            rows = to_index(_grid_source_pad(aten.add.Scalar(north, i - 1), height, align_corners, padding_mode))
            for j in range(4):
                columns = to_index(_grid_source_pad(aten.add.Scalar(west, j - 1), width, align_corners,
                                                    padding_mode))
                values = taps.tap(rows, columns, aten.mul.Tensor(x_weights[j], y_weights[i]))
                dx = aten.mul.Tensor(values, _points(aten.mul.Tensor(x_slopes[j], y_weights[i]), taps))
                dy = aten.mul.Tensor(values, _points(aten.mul.Tensor(x_weights[j], y_slopes[i]), taps))
                along_x = dx if along_x is None else aten.add.Tensor(along_x, dx)
                along_y = dy if along_y is None else aten.add.Tensor(along_y, dy)
        grid_grads = [_scaled(taps.grid_term(along_x), x_slope), _scaled(taps.grid_term(along_y), y_slope)]
    grad_input = cast(aten.view.default(taps.grad_input, list(shape_of(input))), dtype_of(input))
    if grid_grads[0] is None:
        return grad_input, zeros_like(grid)
    grad_grid = aten.cat.default([aten.unsqueeze.default(g, 3) for g in grid_grads], 3)
    return grad_input, cast(grad_grid, dtype_of(grid))


def _points(weight, taps: _GridTaps):
    """[N, Ho, Wo] -> [N, 1, Ho * Wo], to broadcast over the channels of gathered values."""
    return aten.view.default(weight, [taps.shape[0], 1, taps.points])


def _scaled(term, slope):
    """The grid gradient of one axis: its term times d position / d coordinate (see _grid_source)."""
    if slope is None:
        return aten.mul.Scalar(term, 0)
    extent, factor = slope
    term = aten.div.Scalar(aten.mul.Scalar(term, extent), 2)
    return term if factor is None else aten.mul.Tensor(term, factor)


def _grid_source_pad(position, size, align_corners: bool, padding_mode: int):
    """A bicubic tap's integer position after the padding mode (no gradient flows through taps)."""
    if padding_mode == _ZEROS:
        return position
    if padding_mode == _REFLECTION:
        position = _reflected(position, size, align_corners)[0]
    return aten.clamp.default(position, 0, as_dim(size - 1))


from kiln.ir.registry import mark_nondifferentiable  # noqa: E402

mark_nondifferentiable("aten.native_layer_norm.default", "aten._native_batch_norm_legit.default",
                       "aten._native_batch_norm_legit.no_stats", "aten._native_batch_norm_legit_no_training.default",
                       outputs=(1, 2))
mark_nondifferentiable("aten._native_batch_norm_legit.default", "aten._native_batch_norm_legit_no_training.default",
                       arguments=("running_mean", "running_var"))
