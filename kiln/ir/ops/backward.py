"""Backward ops: the gradients of pooling, convolution, embedding and normalization, as autograd emits them.

Scatter-style gradients (pooling, embedding) replay ATen's accumulation: contributions in ATen's order,
each addition rounded to the dtype, so float16/bfloat16 results match bit for bit. Reductions
(convolution, normalization) compute in float64 and round once, within rounding of ATen's float32 or
opmath sums whatever order ATen uses.

Ops with an `output_mask` (convolution_backward, native_layer_norm_backward, native_group_norm_backward)
return None in torch for the outputs the mask turns off. A meta rule has to give every result a type,
so kiln always produces all three gradients; the masked ones are computed like the others (for a
missing weight, against an implicit weight of ones) and a well-formed program simply never reads them.

Each op also decomposes into core ops, for backends without its kernel (kiln/codegen/legalize.py): the scatter-style
ones into scatter_add / index_put in the same order (bit for bit), convolution's into convolutions, normalization's
into its formula in opmath.
"""

from __future__ import annotations

import itertools

import numpy as np
import sympy
from numpy.lib.stride_tricks import sliding_window_view

from kiln.ir import dtypes
from kiln.ir.errors import ShapeError
from kiln.ir.meta import dtype_of, numel, require, require_arg, require_dtype, shape_of, tensor
from kiln.ir.registry import defop, ops, register_decomposition
from kiln.ir.symbolic import as_dim, floor_div, guard_bool, sym_eq

_TAGS = ("backward",)
aten = ops.aten


# ---------------------------------------------------------------------------------------------
# Shared checks and helpers

def _require_same_dtype(op: str, **named) -> None:
    items = [(name, dtype_of(t)) for name, t in named.items() if t is not None]
    first_name, first = items[0]
    for name, dt in items[1:]:
        require_dtype(dt is first, op, f"{name} has dtype {dt.name} but {first_name} has {first.name}")


def _require_parameters(op: str, input, **named) -> None:
    """Affine parameters have the input's dtype, or all float32 for a float16/bfloat16 input (ATen's CPU mixed
    precision, as in the forward ops)."""
    given = [t for t in named.values() if t is not None]
    if dtype_of(input) in (dtypes.float16, dtypes.bfloat16) and any(dtype_of(t) is dtypes.float32 for t in given):
        _require_same_dtype(op, **{name: t for name, t in named.items() if t is not None})
    else:
        _require_same_dtype(op, input=input, **named)


def _require_floating(op: str, name: str, value) -> None:
    dtype = dtype_of(value)
    require_dtype(dtype.is_floating_point, op, f"{name} must be a floating tensor, got {dtype.name}")


def _require_shape(op: str, name: str, value, expected) -> None:
    actual = shape_of(value)
    require(len(actual) == len(expected) and all(sym_eq(a, e) for a, e in zip(actual, expected)), op,
            f"{name} has shape {[str(d) for d in actual]} but {[str(d) for d in expected]} was expected")


def _f64(array):
    return np.asarray(array, dtype=np.float64)


def _cropped(value, dim: int, size):
    """`value` cut to `size` along `dim`: unchanged when it has that size for every value of the symbols, else a slice
    (asking whether the sizes agree for the example's values would make the program hold only where they do)."""
    if sympy.sympify(shape_of(value)[dim] - size) == 0:
        return value
    return aten.slice.Tensor(value, dim, 0, size)


# ---------------------------------------------------------------------------------------------
# Pooling: shared output-size rule (ATen's pooling_output_shape) and parameter checks.

def _pool_output_size(input_size, kernel: int, pad: int, stride: int, dilation: int, ceil_mode: bool):
    numerator = input_size + 2 * pad - dilation * (kernel - 1) - 1 + (stride - 1 if ceil_mode else 0)
    size = floor_div(numerator, stride) + 1
    # In ceil mode the last window must start inside the input or the left padding.
    if ceil_mode and guard_bool(sympy.sympify((size - 1) * stride >= input_size + pad)):
        size = size - 1
    return as_dim(size)


def _pool2d_geometry(op: str, self, kernel_size, stride, padding, dilation, ceil_mode, *, half_of_effective: bool):
    """([output height, output width], stride) after ATen's pool2d_shape_check; an empty stride means the
    kernel size."""
    shape = shape_of(self)
    require(len(shape) in (3, 4), op, f"expected a 3-D or 4-D input, got shape {[str(d) for d in shape]}")
    stride = list(stride) if stride else list(kernel_size)
    require_arg(len(kernel_size) == 2 and len(stride) == 2 and len(padding) == 2 and len(dilation) == 2, op,
                "kernel_size, stride, padding and dilation must each have 1 or 2 entries")
    require_arg(all(k > 0 for k in kernel_size), op, f"kernel size should be greater than zero, got {kernel_size}")
    require_arg(all(s > 0 for s in stride), op, f"stride should be greater than zero, got {stride}")
    require_arg(all(d > 0 for d in dilation), op, f"dilation should be greater than zero, got {dilation}")
    for k, p, d in zip(kernel_size, padding, dilation):
        limit = (d * (k - 1) + 1) // 2 if half_of_effective else k // 2
        require_arg(0 <= p <= limit, op, f"pad should be at most half of the kernel size, got pad={padding}, "
                                         f"kernel_size={kernel_size}")
    out = [_pool_output_size(size, k, p, s, d, ceil_mode)
           for size, k, p, s, d in zip(shape[-2:], kernel_size, padding, stride, dilation)]
    for o in out:
        require(not (isinstance(o, int) and o < 1), op,
                f"output size is too small: input {[str(d) for d in shape]}, output {out}")
    return out, stride


def _ordered_scatter_add(size: int, targets: np.ndarray, values: np.ndarray, dtype,
                         multiplier: np.ndarray | None = None) -> np.ndarray:
    """result[:, t] = sum of values[:, i] over targets[i] == t, added in increasing i and rounded to `dtype`
    after every addition (reduced floats add in float32), like ATen's scalar `+=` loops. The r-th
    contribution of every target is added in round r: one vectorized step per round, columns distinct.

    With a multiplier, each step is ATen's fused `row + multiplier[i] * values[:, i]` (one rounding),
    emulated in a wider type: float64 for float32, long double for float64."""
    compute = dtypes.opmath_dtype(dtypes.dtype(dtype)).numpy
    wide = np.longdouble if compute == np.float64 else np.float64
    result = np.zeros((values.shape[0], size), dtype)
    if targets.size == 0:
        return result
    order = np.argsort(targets, kind="stable")
    ordered = targets[order]
    rank = np.empty(targets.size, np.int64)
    rank[order] = np.arange(targets.size) - np.searchsorted(ordered, ordered)
    for round_ in range(int(rank.max()) + 1):
        chosen = np.flatnonzero(rank == round_)
        columns = targets[chosen]
        if multiplier is None:
            updated = result[:, columns].astype(compute) + values[:, chosen].astype(compute)
        else:
            updated = (result[:, columns].astype(wide)
                       + multiplier[chosen].astype(wide) * values[:, chosen].astype(wide)).astype(compute)
        result[:, columns] = updated.astype(dtype)
    return result


def _divide(numerator: np.ndarray, divisor: np.ndarray) -> np.ndarray:
    """numerator / divisor like c10's scalar `/` by an int: the divisor converted to numerator's dtype
    first, then divided in opmath and rounded once."""
    compute = dtypes.opmath_dtype(dtypes.dtype(numerator.dtype)).numpy
    divisor = np.asarray(divisor).astype(numerator.dtype).astype(compute)
    return (numerator.astype(compute) / divisor).astype(numerator.dtype)


def _window_backward(grad_delta: np.ndarray, self_shape, inside_h: np.ndarray, inside_w: np.ndarray) -> np.ndarray:
    """Add each output's grad_delta[..., o, p] to every input of its window (inside_h[o] x inside_w[p]), in
    ATen's order: outputs in raster order, each addition rounded to the dtype."""
    planes = int(np.prod(self_shape[:-2]))
    if planes == 0:  # an empty batch
        return np.zeros(self_shape, grad_delta.dtype)
    out_h, in_h = np.nonzero(inside_h)  # sorted by output, so contributions arrive in raster order
    out_w, in_w = np.nonzero(inside_w)
    values = grad_delta.reshape(planes, *grad_delta.shape[-2:])[:, out_h[:, None], out_w[None, :]]
    targets = in_h[:, None] * self_shape[-1] + in_w[None, :]
    result = _ordered_scatter_add(self_shape[-2] * self_shape[-1], targets.reshape(-1), values.reshape(planes, -1),
                                  grad_delta.dtype)
    return result.reshape(self_shape)


def _zero(dtype):
    return aten.full.default([], 0, dtype=dtype)


def _window_taps(starts, lengths, longest):
    """One axis of a pool's windows (each one's first input and length): the input position of each of a window's
    `longest` taps, [windows, longest], and whether the tap lies inside the window."""
    offsets = aten.arange.start_step(0, longest, dtype=dtypes.int64)
    positions = aten.add.Tensor(aten.unsqueeze.default(starts, 1), offsets)
    return positions, aten.lt.Tensor(offsets, aten.unsqueeze.default(lengths, 1))


def _scatter_over_windows(grad_delta, self, rows, columns):
    """_window_backward in ops: one scatter_add per plane, whose index walks (output row, output column, window row,
    window column), so each input gets its contributions in ATen's order, rounded to the dtype after each addition
    (taps outside a window add a zero). `rows`, `columns`: (first input, length, longest length) of the windows."""
    shape, (out_h, out_w) = shape_of(self), shape_of(grad_delta)[-2:]
    (row_at, row_in), (column_at, column_in) = _window_taps(*rows), _window_taps(*columns)

    def by_row(value):
        return aten.view.default(value, [out_h, 1, rows[2], 1])

    def by_column(value):
        return aten.view.default(value, [1, out_w, 1, columns[2]])
    inside = aten.logical_and.default(by_row(row_in), by_column(column_in))
    target = aten.add.Tensor(aten.mul.Scalar(by_row(row_at), shape[-1]), by_column(column_at))
    target = aten.where.self(inside, target, _zero(dtypes.int64))
    planes, span = numel(shape[:-2]), numel([out_h, out_w, rows[2], columns[2]])
    index = aten.expand.default(aten.view.default(target, [1, span]), [planes, span])  # the same for every plane
    dtype = dtype_of(grad_delta)
    values = aten.where.self(inside, aten.view.default(grad_delta, [planes, out_h, out_w, 1, 1]), _zero(dtype))
    zeros = aten.full.default([planes, numel(shape[-2:])], 0, dtype=dtype)
    return aten.view.default(aten.scatter_add.default(zeros, 1, index, aten.view.default(values, [planes, span])),
                             list(shape))


# -- avg_pool2d_backward

def _avg_pool_windows(input_size: int, output_size: int, kernel: int, stride: int, pad: int):
    """Per axis: which inputs each output's window covers, and the padded and clipped window extents."""
    starts = np.arange(output_size) * stride - pad
    padded_ends = np.minimum(starts + kernel, input_size + pad)
    clipped_starts, clipped_ends = np.maximum(starts, 0), np.minimum(padded_ends, input_size)
    positions = np.arange(input_size)
    inside = (positions >= clipped_starts[:, None]) & (positions < clipped_ends[:, None])
    return inside, padded_ends - starts, clipped_ends - clipped_starts


def _avg_pool2d_backward_meta(grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad,
                              divisor_override):
    op = "aten.avg_pool2d_backward.default"
    _require_same_dtype(op, self=self, grad_output=grad_output)
    require_arg(divisor_override is None or divisor_override != 0, op, "divisor must be not zero")
    out, _ = _pool2d_geometry(op, self, kernel_size, stride, padding, [1, 1], ceil_mode, half_of_effective=False)
    _require_shape(op, "grad_output", grad_output, [*shape_of(self)[:-2], *out])
    return tensor(shape_of(self), dtype_of(self))


def _avg_pool2d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad,
                         divisor_override):
    stride = list(stride) if stride else list(kernel_size)
    (inside_h, padded_h, clipped_h), (inside_w, padded_w, clipped_w) = (
        _avg_pool_windows(size, out, k, s, p)
        for size, out, k, s, p in zip(self.shape[-2:], grad_output.shape[-2:], kernel_size, stride, padding))
    if divisor_override is not None:
        divisor = np.full((len(padded_h), len(padded_w)), divisor_override)
    elif count_include_pad:
        divisor = padded_h[:, None] * padded_w[None, :]
    else:
        divisor = clipped_h[:, None] * clipped_w[None, :]
    return _window_backward(_divide(grad_output, divisor), self.shape, inside_h, inside_w)


defop("avg_pool2d_backward(Tensor grad_output, Tensor self, int[2] kernel_size, int[2] stride, int[2] padding, "
      "bool ceil_mode, bool count_include_pad, int? divisor_override) -> Tensor",
      _avg_pool2d_backward_meta, _avg_pool2d_backward, tags=_TAGS)


def _pool_windows(size, out: int, kernel: int, stride: int, pad: int):
    """Per axis: each output's window start (negative in the padding) and its end clipped to the padded input."""
    starts = aten.sub.Scalar(aten.mul.Scalar(aten.arange.start_step(0, out, dtype=dtypes.int64), stride), pad)
    return starts, aten.clamp.default(aten.add.Scalar(starts, kernel), None, size + pad)


@register_decomposition("aten.avg_pool2d_backward.default")
def _avg_pool2d_backward_decomposition(grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad,
                                       divisor_override):
    stride = list(stride) if stride else list(kernel_size)
    windows = [_pool_windows(size, out, k, s, p) for size, out, k, s, p in
               zip(shape_of(self)[-2:], shape_of(grad_output)[-2:], kernel_size, stride, padding)]
    clipped = [(aten.clamp.default(starts, 0, None), aten.clamp.default(ends, None, size))
               for (starts, ends), size in zip(windows, shape_of(self)[-2:])]
    if divisor_override is not None:
        grad_delta = aten.div.Scalar(grad_output, divisor_override)
    else:
        height, width = (aten.sub.Tensor(ends, starts) for starts, ends in (windows if count_include_pad else clipped))
        grad_delta = aten.div.Tensor(grad_output, aten.mul.Tensor(aten.unsqueeze.default(height, 1), width))
    rows, columns = ((starts, aten.sub.Tensor(ends, starts), k) for (starts, ends), k in zip(clipped, kernel_size))
    return _scatter_over_windows(grad_delta, self, rows, columns)


# -- _adaptive_avg_pool2d_backward

def _adaptive_windows(input_size: int, output_size: int):
    """Output o averages inputs [floor(o*I/O), ceil((o+1)*I/O)): the window indicator and its length."""
    outputs = np.arange(output_size)
    starts = (outputs * input_size) // output_size
    ends = -((-(outputs + 1) * input_size) // output_size)
    positions = np.arange(input_size)
    return (positions >= starts[:, None]) & (positions < ends[:, None]), ends - starts


def _adaptive_avg_pool2d_backward_meta(grad_output, self):
    op = "aten._adaptive_avg_pool2d_backward.default"
    _require_same_dtype(op, self=self, grad_output=grad_output)
    require(len(shape_of(self)) in (3, 4), op, f"expected a 3-D or 4-D input, got shape {list(shape_of(self))}")
    require(len(shape_of(grad_output)) == len(shape_of(self)) and all(
        sym_eq(a, b) for a, b in zip(shape_of(grad_output)[:-2], shape_of(self)[:-2])), op,
        f"grad_output shape {[str(d) for d in shape_of(grad_output)]} does not match input shape "
        f"{[str(d) for d in shape_of(self)]} outside the last two dims")
    return tensor(shape_of(self), dtype_of(self))


def _adaptive_avg_pool2d_backward(grad_output, self):
    (inside_h, length_h), (inside_w, length_w) = (
        _adaptive_windows(size, out) for size, out in zip(self.shape[-2:], grad_output.shape[-2:]))
    # ATen divides twice, rounding each time: grad / kh / kw.
    grad_delta = _divide(_divide(grad_output, length_h[:, None]), length_w[None, :])
    return _window_backward(grad_delta, self.shape, inside_h, inside_w)


defop("_adaptive_avg_pool2d_backward(Tensor grad_output, Tensor self) -> Tensor",
      _adaptive_avg_pool2d_backward_meta, _adaptive_avg_pool2d_backward, tags=_TAGS)


def _adaptive_windows_of(size, out):
    """Per axis: each output's window [floor(o*size/out), ceil((o+1)*size/out)) as (starts, lengths, longest)."""
    outputs = aten.arange.start_step(0, out, dtype=dtypes.int64)
    starts = aten.div.Scalar_mode(aten.mul.Scalar(outputs, size), out, rounding_mode="floor")
    ends = aten.div.Scalar_mode(aten.add.Scalar(aten.mul.Scalar(outputs, size), size + out - 1), out,
                                rounding_mode="floor")
    if isinstance(size, int) and isinstance(out, int):
        longest = max(-(-(o + 1) * size // out) - o * size // out for o in range(out)) if out else 1
    else:
        longest = as_dim(floor_div(size + out - 1, out) + 1)
    return starts, aten.sub.Tensor(ends, starts), longest


@register_decomposition("aten._adaptive_avg_pool2d_backward.default")
def _adaptive_avg_pool2d_backward_decomposition(grad_output, self):
    rows, columns = (_adaptive_windows_of(size, out) for size, out in zip(shape_of(self)[-2:],
                                                                          shape_of(grad_output)[-2:]))
    # ATen divides twice, rounding each time: grad / kh / kw.
    grad_delta = aten.div.Tensor(aten.div.Tensor(grad_output, aten.unsqueeze.default(rows[1], 1)), columns[1])
    return _scatter_over_windows(grad_delta, self, rows, columns)


# -- max_pool2d_with_indices_backward: each output's gradient goes to the input its index names.

def _max_pool2d_backward_meta(grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices):
    op = "aten.max_pool2d_with_indices_backward.default"
    _require_same_dtype(op, self=self, grad_output=grad_output)
    require_dtype(dtype_of(indices) is dtypes.int64, op, f"indices must be int64, got {dtype_of(indices).name}")
    out, _ = _pool2d_geometry(op, self, kernel_size, stride, padding, dilation, ceil_mode, half_of_effective=True)
    expected = [*shape_of(self)[:-2], *out]
    _require_shape(op, "grad_output", grad_output, expected)
    _require_shape(op, "indices", indices, expected)
    return tensor(shape_of(self), dtype_of(self))


def _max_pool2d_backward(grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices):
    plane = self.shape[-2] * self.shape[-1]
    planes = int(np.prod(self.shape[:-2]))
    if planes == 0:  # an empty batch
        return np.zeros(self.shape, self.dtype)
    indices = indices.reshape(planes, -1)
    if indices.size and (indices.min() < -1 or indices.max() >= plane):
        raise ShapeError(f"aten.max_pool2d_with_indices_backward.default: indices must lie in [0, {plane}) "
                         f"(or be -1), got values in [{indices.min()}, {indices.max()}]")
    targets = (indices + (np.arange(planes) * plane)[:, None]).reshape(-1)
    kept = indices.reshape(-1) != -1  # ATen skips -1 (a window that saw no input)
    values = grad_output.reshape(1, -1)[:, kept]
    result = _ordered_scatter_add(planes * plane, targets[kept], values, grad_output.dtype)
    return result.reshape(self.shape).astype(self.dtype)


defop("max_pool2d_with_indices_backward(Tensor grad_output, Tensor self, int[2] kernel_size, int[2] stride, "
      "int[2] padding, int[2] dilation, bool ceil_mode, Tensor indices) -> Tensor",
      _max_pool2d_backward_meta, _max_pool2d_backward, tags=_TAGS)


@register_decomposition("aten.max_pool2d_with_indices_backward.default")
def _max_pool2d_backward_decomposition(grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices):
    """A scatter_add of each plane's gradients to the flat positions its indices name (-1 adds nothing)."""
    shape = shape_of(self)
    planes, outputs = numel(shape[:-2]), numel(shape_of(indices)[-2:])
    indices = aten.view.default(indices, [planes, outputs])
    named = aten.ne.Scalar(indices, -1)
    indices = aten.where.self(named, indices, _zero(dtypes.int64))
    grads = aten.where.self(named, aten.view.default(grad_output, [planes, outputs]), _zero(dtype_of(grad_output)))
    zeros = aten.full.default([planes, numel(shape[-2:])], 0, dtype=dtype_of(grad_output))
    return aten.view.default(aten.scatter_add.default(zeros, 1, indices, grads), list(shape))


# ---------------------------------------------------------------------------------------------
# embedding_dense_backward

def _embedding_backward_meta(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    op = "aten.embedding_dense_backward.default"
    require_dtype(dtype_of(indices) in (dtypes.int32, dtypes.int64), op,
                  f"indices must be int32 or int64, got {dtype_of(indices).name}")
    grad_shape, index_shape = shape_of(grad_output), shape_of(indices)
    require(len(grad_shape) == len(index_shape) + 1 and all(
        sym_eq(a, b) for a, b in zip(grad_shape, index_shape)), op,
        f"grad_output shape {[str(d) for d in grad_shape]} must be the indices shape "
        f"{[str(d) for d in index_shape]} plus the embedding dim")
    require(not (isinstance(num_weights, int) and num_weights < 0), op, f"num_weights must be >= 0, got {num_weights}")
    return tensor([num_weights, grad_shape[-1]], dtype_of(grad_output))


def _embedding_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    """ATen adds grad rows in index order: `row.add_(grad, alpha=1/count)` with alpha 1 unless scaling."""
    dtype = dtypes.dtype(grad_output.dtype)
    flat = indices.reshape(-1).astype(np.int64)
    if flat.size and (flat.min() < 0 or flat.max() >= num_weights):
        raise ShapeError(f"aten.embedding_dense_backward.default: indices must lie in [0, {num_weights}), "
                         f"got values in [{flat.min()}, {flat.max()}]")
    kept = flat != padding_idx  # compared as given: a negative padding_idx matches no index
    grads = grad_output.reshape(-1, grad_output.shape[-1])[kept]
    flat = flat[kept]
    if not scale_grad_by_freq:
        return _ordered_scatter_add(num_weights, flat, grads.T, dtype.numpy).T
    scale = 1.0 / np.bincount(flat, minlength=num_weights)[flat]  # a double, as in ATen
    if dtype in (dtypes.float16, dtypes.bfloat16):
        # Reduced floats: alpha becomes the dtype and `alpha * grad` is rounded before the addition.
        return _ordered_scatter_add(num_weights, flat, (grads * scale.astype(dtype.numpy)[:, None]).T, dtype.numpy).T
    # float32/float64: the vectorized add is a fused multiply-add with alpha in the dtype.
    return _ordered_scatter_add(num_weights, flat, grads.T, dtype.numpy, multiplier=scale.astype(dtype.numpy)).T


defop("embedding_dense_backward(Tensor grad_output, Tensor indices, SymInt num_weights, SymInt padding_idx, "
      "bool scale_grad_by_freq) -> Tensor", _embedding_backward_meta, _embedding_backward, tags=_TAGS)


@register_decomposition("aten.embedding_dense_backward.default")
def _embedding_dense_backward_decomposition(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    """index_put with accumulate: rows added in index order, in the dtype, as ATen does; padding_idx's rows add zero.
    Scaling multiplies each row by 1 / (its index's count), a double rounded to the dtype first."""
    count = numel(shape_of(indices))
    flat = aten.view.default(indices, [count])
    grads = aten.view.default(grad_output, [count, shape_of(grad_output)[-1]])
    dtype = dtype_of(grad_output)
    if padding_idx >= 0:  # a negative padding_idx matches no index
        kept = aten.unsqueeze.default(aten.ne.Scalar(flat, padding_idx), 1)
        grads = aten.where.self(kept, grads, _zero(dtype))
    if scale_grad_by_freq:
        counts = aten.index_put.default(aten.full.default([num_weights], 0, dtype=dtypes.int64), [flat],
                                        aten.full.default([count], 1, dtype=dtypes.int64), True)
        scale = aten.reciprocal.default(aten._to_copy.default(aten.index_select.default(counts, 0, flat),
                                                              dtype=dtypes.float64))
        grads = aten.mul.Tensor(grads, aten.unsqueeze.default(aten._to_copy.default(scale, dtype=dtype), 1))
    zeros = aten.full.default([num_weights, shape_of(grad_output)[-1]], 0, dtype=dtype)
    return aten.index_put.default(zeros, [flat], grads, True)


# ---------------------------------------------------------------------------------------------
# convolution_backward

def _expand_param(op: str, name: str, values, spatial: int) -> list:
    values = list(values)
    if len(values) == 1 and spatial > 1:
        values = values * spatial
    require_arg(len(values) == spatial, op, f"{name} must have {spatial} entries (one per spatial dim), got {values}")
    return values


def _conv_geometry(op, grad_output, input, weight, stride, padding, dilation, transposed, output_padding, groups):
    """Checked parameters and the expected grad_output shape of the forward convolution."""
    input_shape, weight_shape = shape_of(input), shape_of(weight)
    rank = len(input_shape)
    require(rank >= 3 and len(weight_shape) == rank, op,
            f"input {[str(d) for d in input_shape]} and weight {[str(d) for d in weight_shape]} must have the same "
            "rank, at least 3 (batch, channels, spatial dims)")
    spatial = rank - 2
    stride = _expand_param(op, "stride", stride, spatial)
    padding = _expand_param(op, "padding", padding, spatial)
    dilation = _expand_param(op, "dilation", dilation, spatial)
    output_padding = _expand_param(op, "output_padding", output_padding, spatial) if transposed else [0] * spatial
    require_arg(all(s > 0 for s in stride), op, f"stride must be positive, got {stride}")
    require_arg(all(p >= 0 for p in padding), op, f"padding must be non-negative, got {padding}")
    require_arg(all(d > 0 for d in dilation), op, f"dilation must be positive, got {dilation}")
    require_arg(groups > 0, op, f"groups must be positive, got {groups}")
    kernel = weight_shape[2:]
    channels = input_shape[1]
    if transposed:
        require(sym_eq(weight_shape[0], channels), op,
                f"transposed weight has {weight_shape[0]} input channels but the input has {channels}")
        out_channels = weight_shape[1] * groups
        require_arg(all(extra < s or extra < d for extra, s, d in zip(output_padding, stride, dilation)), op,
                    f"output_padding {output_padding} must be smaller than either stride or dilation")
        require(not isinstance(channels, int) or channels % groups == 0, op,
                f"{channels} input channels are not divisible by groups={groups}")
        out_size = [(size - 1) * s - 2 * p + d * (k - 1) + extra + 1
                    for size, s, p, d, k, extra in zip(input_shape[2:], stride, padding, dilation, kernel,
                                                       output_padding)]
    else:
        require(sym_eq(weight_shape[1] * groups, channels), op,
                f"weight expects {weight_shape[1]} x {groups} groups input channels but the input has {channels}")
        out_channels = weight_shape[0]
        require(not isinstance(out_channels, int) or out_channels % groups == 0, op,
                f"{out_channels} output channels are not divisible by groups={groups}")
        out_size = [floor_div(size + 2 * p - d * (k - 1) - 1, s) + 1
                    for size, s, p, d, k in zip(input_shape[2:], stride, padding, dilation, kernel)]
    for size in out_size:
        require(not (isinstance(size, int) and size < 1), op,
                f"the convolution's output size {out_size} is too small for input {[str(d) for d in input_shape]}")
    _require_shape(op, "grad_output", grad_output, [input_shape[0], out_channels, *out_size])
    return stride, padding, dilation, out_channels


def _conv_backward_meta(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
                        output_padding, groups, output_mask):
    op = "aten.convolution_backward.default"
    _require_same_dtype(op, grad_output=grad_output, input=input, weight=weight)
    _require_floating(op, "grad_output", grad_output)
    *_, out_channels = _conv_geometry(op, grad_output, input, weight, stride, padding, dilation, transposed,
                                      output_padding, groups)
    require(bias_sizes is None or (len(bias_sizes) == 1 and sym_eq(bias_sizes[0], out_channels)), op,
            f"bias_sizes {bias_sizes} must be [{out_channels}] (the output channels)")
    dtype = dtype_of(grad_output)
    return (tensor(shape_of(input), dtype), tensor(shape_of(weight), dtype), tensor([out_channels], dtype))


def _windows(x, kernel, stride, padding, dilation, out_size):
    """x zero-padded, viewed as (N, C, *out_size, *kernel): element [.., o, k] is x_pad[.., o*stride + k*dilation]."""
    spatial = len(kernel)
    padded = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in padding])
    spans = [d * (k - 1) + 1 for k, d in zip(kernel, dilation)]
    view = sliding_window_view(padded, spans, axis=tuple(range(2, 2 + spatial)))
    return view[(slice(None), slice(None))
                + tuple(slice(0, s * o, s) for s, o in zip(stride, out_size))
                + tuple(slice(None, None, d) for d in dilation)]


def _conv_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
                   output_padding, groups, output_mask):
    """Regular conv y = W * x: dW correlates x's windows with dy, dx scatters dy·W back over the windows.
    A transposed conv is the adjoint of the regular one, so its dx is the regular conv of dy and its
    dW correlates dy's windows with x."""
    spatial = input.ndim - 2
    stride, padding, dilation = (list(v) * (spatial if len(v) == 1 else 1) for v in (stride, padding, dilation))
    kernel = weight.shape[2:]
    x, w, dy = _f64(input), _f64(weight), _f64(grad_output)
    batch, groups = x.shape[0], int(groups)
    dtype = grad_output.dtype
    if x.size == 0 or w.size == 0 or dy.size == 0:  # an empty batch (or channels): nothing to sum
        grad_bias = dy.sum(axis=(0, *range(2, dy.ndim)))
        return np.zeros(x.shape, dtype), np.zeros(w.shape, dtype), grad_bias.astype(dtype)
    O, K = "xyz"[:spatial], "ijk"[:spatial]  # einsum letters of the spatial and kernel dims
    if transposed:
        cols = _windows(dy, kernel, stride, padding, dilation, x.shape[2:])
        cols = cols.reshape(batch, groups, -1, *cols.shape[2:])  # (n, g, o, *L, *K)
        xg = x.reshape(batch, groups, -1, *x.shape[2:])  # (n, g, c, *L)
        wg = w.reshape(groups, -1, *w.shape[1:])  # (g, c, o, *K)
        grad_input = np.einsum(f"ngo{O}{K},gco{K}->ngc{O}", cols, wg, optimize=True).reshape(x.shape)
        grad_weight = np.einsum(f"ngc{O},ngo{O}{K}->gco{K}", xg, cols, optimize=True).reshape(w.shape)
    else:
        out_size = dy.shape[2:]
        cols = _windows(x, kernel, stride, padding, dilation, out_size)
        cols = cols.reshape(batch, groups, -1, *cols.shape[2:])  # (n, g, c, *O, *K)
        dyg = dy.reshape(batch, groups, -1, *out_size)  # (n, g, o, *O)
        wg = w.reshape(groups, -1, *w.shape[1:])  # (g, o, c, *K)
        grad_weight = np.einsum(f"ngc{O}{K},ngo{O}->goc{K}", cols, dyg, optimize=True).reshape(w.shape)
        grad_cols = np.einsum(f"ngo{O},goc{K}->ngc{O}{K}", dyg, wg, optimize=True).reshape(
            batch, x.shape[1], *out_size, *kernel)
        padded = np.zeros((batch, x.shape[1], *(size + 2 * p for size, p in zip(x.shape[2:], padding))))
        for offset in itertools.product(*(range(k) for k in kernel)):
            target = tuple(slice(k * d, k * d + s * (o - 1) + 1, s)
                           for k, d, s, o in zip(offset, dilation, stride, out_size))
            padded[(slice(None), slice(None)) + target] += grad_cols[(Ellipsis,) + offset]
        grad_input = padded[(slice(None), slice(None))
                            + tuple(slice(p, p + size) for p, size in zip(padding, x.shape[2:]))]
    grad_bias = dy.sum(axis=(0, *range(2, dy.ndim)))
    return grad_input.astype(dtype), grad_weight.astype(dtype), grad_bias.astype(dtype)


defop("convolution_backward(Tensor grad_output, Tensor input, Tensor weight, SymInt[]? bias_sizes, SymInt[] stride, "
      "SymInt[] padding, SymInt[] dilation, bool transposed, SymInt[] output_padding, SymInt groups, "
      "bool[3] output_mask) -> (Tensor, Tensor, Tensor)", _conv_backward_meta, _conv_backward, tags=_TAGS)


def _convolution_weight_grad(x, dy, kernel, stride, padding, dilation, groups):
    """The weight gradient of a convolution of x with output gradient dy: a convolution of x, channels as the batch and
    the batch as channels, with dy as the kernel (stride and dilation trade places), cropped to the kernel size.
    Grouping x's channels as [C / groups, groups * N] and dy's as [out channels, N] makes it one grouped convolution,
    so a depthwise layer costs no more than its forward pass. Returns [out channels, C / groups, *kernel]."""
    batch, channels, *spatial = shape_of(x)
    out_channels, out_spatial = shape_of(dy)[1], shape_of(dy)[2:]
    rank, per_group, out_per_group = len(spatial), floor_div(channels, groups), floor_div(out_channels, groups)
    trailing = list(range(3, 3 + rank))
    x = aten.view.default(aten.permute.default(aten.view.default(x, [batch, groups, per_group, *spatial]),
                                               [2, 1, 0, *trailing]), [per_group, as_dim(groups * batch), *spatial])
    dy = aten.view.default(aten.permute.default(aten.view.default(dy, [batch, groups, out_per_group, *out_spatial]),
                                                [1, 2, 0, *trailing]), [out_channels, batch, *out_spatial])
    grad = aten.convolution.default(x, dy, None, dilation, padding, stride, False, [0] * rank, groups)
    for dim, size in enumerate(kernel, start=2):
        grad = _cropped(grad, dim, size)
    return aten.permute.default(grad, [1, 0, *range(2, 2 + rank)])


def _convolution_input_grad(dy, weight, spatial, stride, padding, dilation, groups):
    """The input gradient of a regular convolution: the transposed convolution of dy with its weight, as a regular
    convolution (which backends run fastest, as a GEMM): dy with stride - 1 zeros after each element, convolved with
    the weight flipped and its channels swapped within each group, padded by dilation * (kernel - 1) - padding, and
    cropped to the input size."""
    kernel, rank = shape_of(weight)[2:], len(spatial)
    reach = [d * (k - 1) - p for k, p, d in zip(kernel, padding, dilation)]
    if not all(isinstance(r, int) and r >= 0 for r in reach):  # padding wider than the kernel: crop instead
        restored = [as_dim(size - ((out - 1) * s - 2 * p + d * (k - 1) + 1)) for size, out, s, p, d, k in
                    zip(spatial, shape_of(dy)[2:], stride, padding, dilation, kernel)]
        return aten.convolution.default(dy, weight, None, stride, padding, dilation, True, restored, groups)
    if any(s > 1 for s in stride):
        batch, channels, *out = shape_of(dy)
        spread = aten.view.default(dy, [batch, channels, *[d for o in out for d in (o, 1)]])
        trailing = [pad for s in reversed(stride) for pad in (0, s - 1, 0, 0)]
        spread = aten.constant_pad_nd.default(spread, trailing)
        dy = aten.view.default(spread, [batch, channels, *[as_dim(o * s) for o, s in zip(out, stride)]])
    out_channels, per_group = shape_of(weight)[:2]
    out_per_group = floor_div(out_channels, groups)
    swapped = aten.permute.default(aten.view.default(weight, [groups, out_per_group, per_group, *kernel]),
                                   [0, 2, 1, *range(3, 3 + rank)])
    swapped = aten.view.default(swapped, [as_dim(groups * per_group), out_per_group, *kernel])
    flipped = aten.flip.default(swapped, list(range(2, 2 + rank)))
    grad = aten.convolution.default(dy, flipped, None, [1] * rank, reach, dilation, False, [0] * rank, groups)
    for dim, size in enumerate(spatial, start=2):  # the zeros after dy's last element reach past the input
        grad = _cropped(grad, dim, size)
    return grad


@register_decomposition("aten.convolution_backward.default")
def _convolution_backward_decomposition(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
                                        output_padding, groups, output_mask):
    """A transposed convolution's input gradient is the regular convolution of grad_output with the same weight, and its
    weight gradient swaps the roles of input and grad_output. All three gradients are computed, as the kernel does."""
    spatial = shape_of(input)[2:]
    rank = len(spatial)
    op = "aten.convolution_backward.default"
    stride, padding, dilation = (_expand_param(op, name, values, rank) for name, values in
                                 (("stride", stride), ("padding", padding), ("dilation", dilation)))
    kernel = shape_of(weight)[2:]
    if transposed:
        grad_input = aten.convolution.default(grad_output, weight, None, stride, padding, dilation, False,
                                              [0] * rank, groups)
        for dim, size in enumerate(spatial, start=2):  # output_padding past the last stride reads nothing back
            grad_input = _cropped(grad_input, dim, size)
        grad_weight = _convolution_weight_grad(grad_output, input, kernel, stride, padding, dilation, groups)
    else:
        grad_input = _convolution_input_grad(grad_output, weight, spatial, stride, padding, dilation, groups)
        grad_weight = _convolution_weight_grad(input, grad_output, kernel, stride, padding, dilation, groups)
    grad_bias = aten.sum.dim_IntList(grad_output, [0, *range(2, 2 + rank)])
    return grad_input, grad_weight, grad_bias


# ---------------------------------------------------------------------------------------------
# Normalization backward. With x̂ = (x - mean) * rstd and g = dy * weight, per normalized group:
#   dx = rstd * (g - mean(g) - x̂ * mean(g * x̂)),  dweight = Σ dy * x̂,  dbias = Σ dy  (over the batch).
# This is ATen's formula rearranged; it holds for any mean/rstd given, not only x's own statistics.

def _normalized_input_grad(dy_weighted, x_hat, rstd, axis):
    if dy_weighted.size == 0:
        return np.zeros_like(dy_weighted)
    return rstd * (dy_weighted - dy_weighted.mean(axis=axis, keepdims=True)
                   - x_hat * (dy_weighted * x_hat).mean(axis=axis, keepdims=True))


def _layer_norm_backward_meta(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    op = "aten.native_layer_norm_backward.default"
    _require_same_dtype(op, input=input, grad_out=grad_out)
    _require_parameters(op, input, weight=weight, bias=bias)
    _require_floating(op, "input", input)
    shape, normalized = shape_of(input), list(normalized_shape)
    axis = len(shape) - len(normalized)
    require(axis >= 0 and all(sym_eq(a, b) for a, b in zip(shape[axis:], normalized)), op,
            f"normalized_shape {[str(d) for d in normalized]} must end the input shape {[str(d) for d in shape]}")
    _require_shape(op, "grad_out", grad_out, shape)
    for name, value in (("weight", weight), ("bias", bias)):
        if value is not None:
            _require_shape(op, name, value, normalized)
    outer = numel(shape[:axis])
    for name, value in (("mean", mean), ("rstd", rstd)):
        require(sym_eq(numel(shape_of(value)), outer), op,
                f"{name} must hold one value per normalized row ({outer}), got shape {list(shape_of(value))}")
    dtype = dtype_of(input)
    return (tensor(shape, dtype), tensor(normalized, dtype_of(weight) if weight is not None else dtype),
            tensor(normalized, dtype_of(bias) if bias is not None else dtype))


def _layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    rows = int(np.prod(input.shape[:input.ndim - len(normalized_shape)]))
    row_size = int(np.prod(normalized_shape))
    x, dy = _f64(input).reshape(rows, row_size), _f64(grad_out).reshape(rows, row_size)
    mean, rstd = _f64(mean).reshape(rows, 1), _f64(rstd).reshape(rows, 1)
    x_hat = (x - mean) * rstd
    weighted = dy * _f64(weight).reshape(1, -1) if weight is not None else dy
    grad_input = _normalized_input_grad(weighted, x_hat, rstd, axis=1)
    grad_weight, grad_bias = (dy * x_hat).sum(axis=0), dy.sum(axis=0)
    weight_dtype = (weight if weight is not None else input).dtype
    bias_dtype = (bias if bias is not None else input).dtype
    return (grad_input.reshape(input.shape).astype(input.dtype),
            grad_weight.reshape(normalized_shape).astype(weight_dtype),
            grad_bias.reshape(normalized_shape).astype(bias_dtype))


defop("native_layer_norm_backward(Tensor grad_out, Tensor input, SymInt[] normalized_shape, Tensor mean, "
      "Tensor rstd, Tensor? weight, Tensor? bias, bool[3] output_mask) -> (Tensor, Tensor, Tensor)",
      _layer_norm_backward_meta, _layer_norm_backward, tags=_TAGS)


def _normalization_backward(grad_out, input, mean, rstd, weight, dims, weight_dims):
    """The formula above in opmath (float32 for float16/bfloat16), all tensors laid out to broadcast against input,
    weight (None: ones) in the layout of the affine parameters, whose gradients sum over `weight_dims`: (dx, dweight,
    dbias) in opmath, the parameter gradients still in that layout. (`cast` and `_normalized_projection` are the
    helpers of the double-backward rules below.)"""
    compute = dtypes.opmath_dtype(dtype_of(input))
    grad_out, input, mean, rstd = (cast(value, compute) for value in (grad_out, input, mean, rstd))
    x_hat = aten.mul.Tensor(aten.sub.Tensor(input, mean), rstd)
    weighted = grad_out if weight is None else aten.mul.Tensor(grad_out, cast(weight, compute))
    grad_input = aten.mul.Tensor(rstd, _normalized_projection(weighted, x_hat, dims))
    grad_weight, grad_bias = aten.mul.Tensor(grad_out, x_hat), grad_out
    if weight_dims:  # summing over no dims would sum over all of them
        grad_weight, grad_bias = (aten.sum.dim_IntList(value, weight_dims) for value in (grad_weight, grad_bias))
    return grad_input, grad_weight, grad_bias


@register_decomposition("aten.native_layer_norm_backward.default")
def _native_layer_norm_backward_decomposition(grad_out, input, normalized_shape, mean, rstd, weight, bias,
                                              output_mask):
    shape = shape_of(input)
    axis = len(shape) - len(normalized_shape)
    stats = [*shape[:axis], *[1] * len(normalized_shape)]  # one value per normalized row
    grad_input, grad_weight, grad_bias = _normalization_backward(
        grad_out, input, aten.view.default(mean, stats), aten.view.default(rstd, stats), weight,
        list(range(axis, len(shape))), list(range(axis)))
    return (cast(grad_input, dtype_of(input)), cast(grad_weight, dtype_of(weight if weight is not None else input)),
            cast(grad_bias, dtype_of(bias if bias is not None else input)))


def _group_norm_backward_meta(grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask):  # noqa: N803
    op = "aten.native_group_norm_backward.default"
    _require_same_dtype(op, input=input, grad_out=grad_out)
    _require_parameters(op, input, weight=weight)
    _require_floating(op, "input", input)
    shape = shape_of(input)
    require(len(shape) >= 2 and sym_eq(shape[0], N) and sym_eq(shape[1], C), op,
            f"input shape {[str(d) for d in shape]} must start with N={N}, C={C}")
    require(sym_eq(numel(shape), N * C * HxW), op, f"input shape {[str(d) for d in shape]} must hold N*C*HxW elements")
    require_arg(group > 0, op, f"group must be positive, got {group}")
    require(not isinstance(C, int) or C % group == 0, op, f"C={C} channels are not divisible by group={group}")
    _require_shape(op, "grad_out", grad_out, shape)
    if weight is not None:
        _require_shape(op, "weight", weight, [C])
    for name, value in (("mean", mean), ("rstd", rstd)):
        require(sym_eq(numel(shape_of(value)), N * group), op,
                f"{name} must hold N*group = {N * group} values, got shape {list(shape_of(value))}")
    dtype = dtype_of(input)
    parameter_dtype = dtype_of(weight) if weight is not None else dtype
    return tensor(shape, dtype), tensor([C], parameter_dtype), tensor([C], parameter_dtype)


def _group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask):  # noqa: N803
    grouped = (N, group, C // group, HxW)
    x, dy = _f64(input).reshape(grouped), _f64(grad_out).reshape(grouped)
    mean, rstd = _f64(mean).reshape(N, group, 1, 1), _f64(rstd).reshape(N, group, 1, 1)
    x_hat = (x - mean) * rstd
    weighted = dy * _f64(weight).reshape(1, group, -1, 1) if weight is not None else dy
    grad_input = _normalized_input_grad(weighted, x_hat, rstd, axis=(2, 3))
    grad_weight = (dy * x_hat).sum(axis=(0, 3)).reshape(C)
    grad_bias = dy.sum(axis=(0, 3)).reshape(C)
    parameter_dtype = (weight if weight is not None else input).dtype
    return (grad_input.reshape(input.shape).astype(input.dtype), grad_weight.astype(parameter_dtype),
            grad_bias.astype(parameter_dtype))


defop("native_group_norm_backward(Tensor grad_out, Tensor input, Tensor mean, Tensor rstd, Tensor? weight, "
      "SymInt N, SymInt C, SymInt HxW, int group, bool[3] output_mask) -> (Tensor, Tensor, Tensor)",
      _group_norm_backward_meta, _group_norm_backward, tags=_TAGS)


@register_decomposition("aten.native_group_norm_backward.default")
def _native_group_norm_backward_decomposition(grad_out, input, mean, rstd, weight, N, C, HxW, group,  # noqa: N803
                                              output_mask):
    """Layer norm's backward over [N, group, C / group, HxW], with one weight per channel."""
    per_group = floor_div(C, group)
    grouped, stats = [N, group, per_group, HxW], [N, group, 1, 1]
    grad_input, grad_weight, grad_bias = _normalization_backward(
        aten.view.default(grad_out, grouped), aten.view.default(input, grouped), aten.view.default(mean, stats),
        aten.view.default(rstd, stats), None if weight is None else aten.view.default(weight, [1, group, per_group, 1]),
        [2, 3], [0, 3])
    parameter_dtype = dtype_of(weight if weight is not None else input)
    return (cast(aten.view.default(grad_input, list(shape_of(input))), dtype_of(input)),
            cast(aten.view.default(grad_weight, [C]), parameter_dtype),
            cast(aten.view.default(grad_bias, [C]), parameter_dtype))


# ---------------------------------------------------------------------------------------------
# VJP rules: double backward (torch's derivatives.yaml). The pooling and embedding backwards are linear in
# grad_output, so their VJP is the forward op again; `self` only lends its shape and gets no gradient.

from kiln.ir.ops._grad import cast  # noqa: E402
from kiln.ir.registry import ops, register_vjp  # noqa: E402

aten = ops.aten


@register_vjp("aten.avg_pool2d_backward.default")
def _avg_pool2d_backward_vjp(grad, out, grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad,
                             divisor_override):
    return aten.avg_pool2d.default(grad, kernel_size, stride, padding, ceil_mode, count_include_pad,
                                   divisor_override), None


@register_vjp("aten._adaptive_avg_pool2d_backward.default")
def _adaptive_avg_pool2d_backward_vjp(grad, out, grad_output, self):
    return aten._adaptive_avg_pool2d.default(grad, list(shape_of(grad_output)[-2:])), None


@register_vjp("aten.max_pool2d_with_indices_backward.default")
def _max_pool2d_backward_vjp(grad, out, grad_output, self, kernel_size, stride, padding, dilation, ceil_mode,
                             indices):
    """torch's max_pool_double_backward: each output reads the gradient at the input its index names."""
    lead = list(shape_of(self)[:-2])
    flat_grad = aten.view.default(grad, [*lead, numel(shape_of(self)[-2:])])
    flat_indices = aten.view.default(indices, [*lead, numel(shape_of(indices)[-2:])])
    picked = aten.gather.default(flat_grad, len(lead), flat_indices)
    return aten.view.default(picked, list(shape_of(indices))), None, None


@register_vjp("aten.embedding_dense_backward.default")
def _embedding_dense_backward_vjp(grad, out, grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    """torch's embedding_dense_double_backward: the rows the indices name, zero at padding_idx. Like torch, it does
    not scale by frequency (its comment: "the first backward takes care of scaling by frequency")."""
    flat = aten.view.default(indices, [numel(shape_of(indices))])
    rows = aten.index_select.default(grad, 0, flat)
    if padding_idx >= 0:
        keep = aten.unsqueeze.default(aten.ne.Scalar(flat, padding_idx), 1)
        rows = aten.where.self(keep, rows, aten.full.default([], 0, dtype=dtype_of(rows)))
    return aten.view.default(rows, list(shape_of(grad_output))), None


@register_vjp("aten.convolution_backward.default")
def _convolution_backward_vjp(grad, out, grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
                              output_padding, groups, output_mask):
    """torch's _convolution_double_backward. With y = conv(x, w): dx = dx(dy, w) and dw = dw(x, dy) are bilinear,
    so the cotangents (ggx, ggw, ggb) of (dx, dw, db) give d(dy) = conv(ggx, w) + conv(x, ggw) + ggb,
    d(x) = dx(dy, ggw) and d(w) = dw(ggx, dy)."""
    grad_grad_input, grad_grad_weight, grad_grad_bias = grad

    def conv(x, w):
        return aten.convolution.default(x, w, None, stride, padding, dilation, transposed, output_padding, groups)

    def conv_backward(dy, x, w, mask):
        return aten.convolution_backward.default(dy, x, w, None, stride, padding, dilation, transposed,
                                                 output_padding, groups, mask)
    terms = []
    if grad_grad_input is not None:
        terms.append(conv(grad_grad_input, weight))
    if grad_grad_weight is not None:
        terms.append(conv(input, grad_grad_weight))
    if grad_grad_bias is not None:
        rank = len(shape_of(grad_output))
        channels = aten.view.default(grad_grad_bias, [1, shape_of(grad_grad_bias)[0], *[1] * (rank - 2)])
        terms.append(aten.expand.default(channels, list(shape_of(grad_output))))
    grad_grad_output = None
    for term in terms:
        grad_grad_output = term if grad_grad_output is None else aten.add.Tensor(grad_grad_output, term)
    if grad_grad_output is not None:
        grad_grad_output = cast(grad_grad_output, dtype_of(grad_output))
    grad_input = None if grad_grad_weight is None else conv_backward(
        grad_output, input, grad_grad_weight, [True, False, False])[0]
    grad_weight = None if grad_grad_input is None else conv_backward(
        grad_output, grad_grad_input, weight, [False, True, False])[1]
    return grad_grad_output, grad_input, grad_weight


def _normalized_projection(value, x_hat, dims):
    """P(v) = v - mean(v) - x̂ * mean(v * x̂) over each normalized group: the normalization's input gradient
    before the rstd factor (P is self-adjoint)."""
    centered = aten.sub.Tensor(value, aten.mean.dim(value, dims, True))
    return aten.sub.Tensor(centered, aten.mul.Tensor(x_hat, aten.mean.dim(aten.mul.Tensor(value, x_hat), dims, True)))


def _normalization_double_backward(grad, grad_out, input, mean, rstd, weight, dims, weight_dims, count):
    """The VJP of dx = rstd * P(dy * weight), dweight = sum(dy * x̂), dbias = sum(dy), where mean and rstd are
    the statistics of `input` over `dims` (count elements per group), so the gradient of input includes what
    flows through them (torch's layer_norm_double_backward). All tensors come laid out to broadcast against
    input; weight (None: ones) and the weight and bias cotangents in the layout of the affine parameters,
    whose gradient sums over `weight_dims`. With x̂ = (x - mean) * rstd, g = dy * weight, a the cotangent of
    dx and b, c those of dweight, dbias (· sums over a group):
      d(dy)     = weight * rstd * P(a) + b * x̂ + c
      d(weight) = sum of dy * rstd * P(a)
      d(x)      = rstd * P(b * dy) - rstd^2 / M * [(a·x̂) P(g) + (g·x̂) P(a) + (a·g - M mean(a) mean(g)
                  - (g·x̂)(a·x̂) / M) x̂]."""
    grad_grad_input, grad_grad_weight, grad_grad_bias = grad
    x_hat = aten.mul.Tensor(aten.sub.Tensor(input, mean), rstd)
    weighted = grad_out if weight is None else aten.mul.Tensor(grad_out, weight)
    terms_dy, terms_x = [], []
    grad_weight = None
    if grad_grad_input is not None:
        a = grad_grad_input
        projected_a = aten.mul.Tensor(rstd, _normalized_projection(a, x_hat, dims))
        terms_dy.append(projected_a if weight is None else aten.mul.Tensor(projected_a, weight))
        if weight is not None:
            grad_weight = aten.sum.dim_IntList(aten.mul.Tensor(grad_out, projected_a), weight_dims, True)
        a_dot_xhat = aten.sum.dim_IntList(aten.mul.Tensor(a, x_hat), dims, True)
        g_dot_xhat = aten.sum.dim_IntList(aten.mul.Tensor(weighted, x_hat), dims, True)
        a_dot_g = aten.sub.Tensor(aten.sum.dim_IntList(aten.mul.Tensor(a, weighted), dims, True), aten.mul.Scalar(
            aten.mul.Tensor(aten.mean.dim(a, dims, True), aten.mean.dim(weighted, dims, True)), count))
        inner = aten.add.Tensor(aten.mul.Tensor(a_dot_xhat, _normalized_projection(weighted, x_hat, dims)),
                                aten.mul.Tensor(g_dot_xhat, _normalized_projection(a, x_hat, dims)))
        along_xhat = aten.sub.Tensor(a_dot_g, aten.div.Scalar(aten.mul.Tensor(g_dot_xhat, a_dot_xhat), count))
        inner = aten.add.Tensor(inner, aten.mul.Tensor(along_xhat, x_hat))
        terms_x.append(aten.neg.default(aten.mul.Tensor(aten.div.Scalar(aten.mul.Tensor(rstd, rstd), count), inner)))
    if grad_grad_weight is not None:
        terms_dy.append(aten.mul.Tensor(grad_grad_weight, x_hat))
        terms_x.append(aten.mul.Tensor(rstd, _normalized_projection(aten.mul.Tensor(grad_grad_weight, grad_out),
                                                                    x_hat, dims)))
    if grad_grad_bias is not None:
        terms_dy.append(aten.expand.default(grad_grad_bias, list(shape_of(input))))
    return _summed(terms_dy), _summed(terms_x), grad_weight


def _summed(terms):
    total = None
    for term in terms:
        total = term if total is None else aten.add.Tensor(total, term)
    return total


def _reshaped(value, shape, dtype=None):
    if value is None:
        return None
    value = aten.view.default(value, list(shape))
    return value if dtype is None else cast(value, dtype)


@register_vjp("aten.native_layer_norm_backward.default")
def _native_layer_norm_backward_vjp(grad, out, grad_out, input, normalized_shape, mean, rstd, weight, bias,
                                    output_mask):
    """torch's layer_norm_double_backward (see _normalization_double_backward). torch implements no gradient for
    mean and rstd, nor for bias, which the backward does not read."""
    shape = shape_of(input)
    axis = len(shape) - len(normalized_shape)
    stats = [*shape[:axis], *[1] * len(normalized_shape)]  # one value per normalized group
    grad_dy, grad_x, grad_weight = _normalization_double_backward(
        grad, grad_out, input, aten.view.default(mean, stats), aten.view.default(rstd, stats), weight,
        list(range(axis, len(shape))), list(range(axis)), numel(shape[axis:]))
    dtype = dtype_of(input)
    return (_reshaped(grad_dy, shape, dtype), _reshaped(grad_x, shape, dtype), None, None,
            _reshaped(grad_weight, shape_of(weight), dtype_of(weight)) if weight is not None else None, None)


@register_vjp("aten.native_group_norm_backward.default")
def _native_group_norm_backward_vjp(grad, out, grad_out, input, mean, rstd, weight, N, C, HxW, group,  # noqa: N803
                                    output_mask):
    """The double backward of group norm, as layer norm's over [N, group, C / group, HxW] with a weight per channel.
    torch implements none (its double backward raises), so this one is checked against finite differences."""
    per_group = floor_div(C, group)
    grouped = [N, group, per_group, HxW]
    channels = [1, group, per_group, 1]
    stats = [N, group, 1, 1]
    grad_grad_input, grad_grad_weight, grad_grad_bias = grad
    grad_dy, grad_x, grad_weight = _normalization_double_backward(
        (_reshaped(grad_grad_input, grouped), _reshaped(grad_grad_weight, channels),
         _reshaped(grad_grad_bias, channels)),
        aten.view.default(grad_out, grouped), aten.view.default(input, grouped), aten.view.default(mean, stats),
        aten.view.default(rstd, stats), _reshaped(weight, channels), [2, 3], [0, 3], as_dim(per_group * HxW))
    dtype, shape = dtype_of(input), shape_of(input)
    return (_reshaped(grad_dy, shape, dtype), _reshaped(grad_x, shape, dtype), None, None,
            _reshaped(grad_weight, [C], dtype_of(weight)) if weight is not None else None)


from kiln.ir.registry import mark_nondifferentiable  # noqa: E402

mark_nondifferentiable("aten.native_layer_norm_backward.default", arguments=("mean", "rstd"))
