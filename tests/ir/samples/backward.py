"""Samples for kiln/ir/ops/backward.py.

The forward results these ops take (max-pool indices, normalization statistics) are computed here in
numpy from the sample's input, so every sample is a gradient call autograd could really make.
"""

from __future__ import annotations

import numpy as np  # noqa: F401

from kiln.ir import dtypes
from tests.ir.samples import Sample, positive, rand, samples  # noqa: F401


def _pool_out(size, kernel, pad, stride, dilation=1, ceil_mode=False):
    out = (size + 2 * pad - dilation * (kernel - 1) - 1 + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def _distinct(rng, *shape, dtype="float32"):
    """Values without ties (a shuffled grid), so max-pool indices are unambiguous."""
    values = rng.permutation(int(np.prod(shape))).reshape(shape) / 8.0 - 3.0
    return values.astype(np.float32).astype(dtypes.dtype(dtype).numpy)


def _max_pool_indices(x, kernel, stride, padding, dilation, ceil_mode):
    """max_pool2d_with_indices' indices: the flat (h * W + w) position of each window's maximum."""
    height, width = x.shape[-2:]
    out = [_pool_out(s, k, p, st, d, ceil_mode) for s, k, p, st, d in zip((height, width), kernel, padding,
                                                                           stride, dilation)]
    rows = np.arange(out[0])[:, None] * stride[0] - padding[0] + np.arange(kernel[0])[None, :] * dilation[0]
    cols = np.arange(out[1])[:, None] * stride[1] - padding[1] + np.arange(kernel[1])[None, :] * dilation[1]
    valid = ((rows >= 0) & (rows < height))[:, :, None, None] & ((cols >= 0) & (cols < width))[None, None]
    values = x.astype(np.float64)[..., np.clip(rows, 0, height - 1)[:, :, None, None],
                                  np.clip(cols, 0, width - 1)[None, None]]  # (..., OH, KH, OW, KW)
    values = np.where(valid, values, -np.inf)
    values = np.moveaxis(values, -3, -2).reshape(*x.shape[:-2], out[0], out[1], -1)
    best = values.argmax(-1)
    flat = rows[:, :, None, None] * width + cols[None, None]  # (OH, KH, OW, KW)
    flat = np.moveaxis(flat, 1, 2).reshape(out[0], out[1], -1)
    return np.take_along_axis(np.broadcast_to(flat, best.shape + flat.shape[-1:]), best[..., None], -1)[..., 0]


@samples("aten.max_pool2d_with_indices_backward.default")
def _max_pool2d_backward(rng):
    cases = [  # (input shape, kernel, stride, padding, dilation, ceil_mode, dtype, note)
        ((2, 3, 6, 6), [2, 2], [2, 2], [0, 0], [1, 1], False, "float32", "disjoint windows"),
        ((1, 2, 7, 7), [3, 3], [2, 2], [1, 1], [1, 1], False, "float32", "overlapping windows and padding"),
        ((1, 2, 9, 8), [3, 2], [1, 2], [1, 1], [2, 1], False, "float32", "dilation, rectangular"),
        ((2, 2, 7, 7), [3, 3], [2, 2], [0, 0], [1, 1], True, "float32", "ceil mode: partial last window"),
        ((3, 5, 5), [2, 2], [1, 1], [0, 0], [1, 1], False, "float64", "3-D input, stride 1"),
        ((1, 3, 6, 6), [3, 3], [3, 3], [1, 1], [1, 1], False, "bfloat16", "bfloat16"),
        ((1, 1, 4, 4), [2, 2], [], [0, 0], [1, 1], False, "float16", "empty stride means the kernel size"),
    ]
    for shape, kernel, stride, padding, dilation, ceil_mode, dtype, note in cases:
        x = _distinct(rng, *shape, dtype=dtype)
        indices = _max_pool_indices(x, kernel, stride or kernel, padding, dilation, ceil_mode)
        grad = rand(rng, *indices.shape, dtype=dtype)
        yield Sample((grad, x, kernel, stride, padding, dilation, ceil_mode, indices), note=note)


@samples("aten.avg_pool2d_backward.default")
def _avg_pool2d_backward(rng):
    cases = [  # (input shape, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override, dtype, note)
        ((2, 3, 6, 6), [2, 2], [2, 2], [0, 0], False, True, None, "float32", "disjoint windows"),
        ((1, 2, 7, 7), [3, 3], [2, 2], [1, 1], False, True, None, "float32", "padding counted"),
        ((1, 2, 7, 7), [3, 3], [2, 2], [1, 1], False, False, None, "float32", "padding not counted"),
        ((1, 2, 8, 7), [3, 2], [2, 1], [1, 0], True, False, None, "float32", "ceil mode, rectangular"),
        ((2, 2, 5, 5), [3, 3], [1, 1], [1, 1], False, True, 4, "float32", "divisor_override, overlapping"),
        ((3, 6, 6), [2, 2], [], [0, 0], False, True, None, "float64", "3-D input, empty stride"),
        ((1, 3, 6, 6), [3, 3], [2, 2], [1, 1], True, True, None, "bfloat16", "bfloat16 ceil mode"),
        ((1, 2, 5, 5), [2, 2], [1, 1], [1, 1], False, False, None, "float16", "float16"),
    ]
    for shape, kernel, stride, padding, ceil_mode, include_pad, divisor, dtype, note in cases:
        x = rand(rng, *shape, dtype=dtype)
        out = [_pool_out(size, k, p, st, 1, ceil_mode)
               for size, k, p, st in zip(shape[-2:], kernel, padding, stride or kernel)]
        grad = rand(rng, *shape[:-2], *out, dtype=dtype)
        yield Sample((grad, x, kernel, stride, padding, ceil_mode, include_pad, divisor), note=note)


@samples("aten._adaptive_avg_pool2d_backward.default")
def _adaptive_avg_pool2d_backward(rng):
    cases = [  # (input shape, output size, dtype, note)
        ((2, 3, 6, 6), (3, 3), "float32", "divisible"),
        ((1, 2, 7, 5), (3, 2), "float32", "overlapping windows"),
        ((1, 2, 3, 4), (5, 6), "float32", "output larger than input"),
        ((2, 5, 4), (1, 1), "float64", "3-D input, global pool"),
        ((1, 3, 9, 7), (4, 3), "bfloat16", "bfloat16"),
        ((1, 2, 6, 5), (4, 4), "float16", "float16"),
    ]
    for shape, out, dtype, note in cases:
        yield Sample((rand(rng, *shape[:-2], *out, dtype=dtype), rand(rng, *shape, dtype=dtype)), note=note)


@samples("aten.embedding_dense_backward.default")
def _embedding_dense_backward(rng):
    indices = np.array([[0, 2, 2, 5], [1, 2, 0, 3]], np.int64)
    yield Sample((rand(rng, 2, 4, 3), indices, 6, -1, False), note="repeated indices accumulate")
    yield Sample((rand(rng, 2, 4, 3), indices, 6, -1, True), note="scale_grad_by_freq")
    yield Sample((rand(rng, 2, 4, 3), indices, 7, 2, False), note="padding_idx gets no gradient")
    yield Sample((rand(rng, 2, 4, 3), indices, 6, 2, True), note="padding_idx with scaling")
    many = rng.integers(0, 4, size=40)
    yield Sample((rand(rng, 40, 5, dtype="bfloat16"), many, 4, -1, False),
                 note="bfloat16: ~10 adds per row, rounded after each like ATen")
    yield Sample((rand(rng, 40, 5, dtype="float16"), many.astype(np.int32), 4, 1, False),
                 note="float16, int32 indices")
    yield Sample((rand(rng, 5, 2, dtype="float64"), np.array([4, 4, 4, 0, 1], np.int64), 5, -1, True),
                 note="float64")
    yield Sample((rand(rng, 3, 4), np.array([1, 0, 2], np.int64), 3, -1, False), note="1-D indices")
    yield Sample((rand(rng, 0, 4), np.zeros(0, np.int64), 3, -1, False), note="no indices")


def _conv_out(size, kernel, stride, padding, dilation):
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def _conv_transpose_out(size, kernel, stride, padding, dilation, output_padding):
    return (size - 1) * stride - 2 * padding + dilation * (kernel - 1) + output_padding + 1


@samples("aten.convolution_backward.default")
def _convolution_backward(rng):
    cases = [  # (input shape, weight shape, stride, padding, dilation, transposed, output_padding, groups, dtype)
        ((2, 3, 6, 6), (4, 3, 3, 3), [1, 1], [1, 1], [1, 1], False, [0, 0], 1, "float32"),
        ((2, 4, 9, 8), (6, 2, 3, 2), [2, 1], [0, 1], [2, 1], False, [0, 0], 2, "float32"),
        ((1, 2, 10), (3, 2, 3), [3], [2], [1], False, [0], 1, "float32"),
        ((1, 2, 4, 5, 4), (2, 1, 2, 3, 2), [1, 2, 1], [0, 1, 1], [1, 1, 1], False, [0, 0, 0], 2, "float32"),
        ((2, 4, 4, 3), (4, 3, 3, 3), [2, 2], [1, 0], [1, 1], True, [1, 0], 2, "float32"),
        ((1, 3, 6), (3, 2, 3), [2], [1], [2], True, [1], 1, "float32"),
        ((2, 3, 5, 5), (2, 3, 3, 3), [1, 1], [0, 0], [1, 1], False, [0, 0], 1, "float64"),
        ((1, 4, 6, 6), (4, 1, 3, 3), [1, 1], [1, 1], [1, 1], False, [0, 0], 4, "bfloat16"),
        ((1, 2, 5, 5), (2, 2, 2, 2), [2, 2], [0, 0], [1, 1], True, [0, 0], 1, "float16"),
    ]
    for shape, weight_shape, stride, padding, dilation, transposed, output_padding, groups, dtype in cases:
        x, weight = rand(rng, *shape, dtype=dtype), rand(rng, *weight_shape, dtype=dtype)
        if transposed:
            channels = weight_shape[1] * groups
            out = [_conv_transpose_out(*args) for args in zip(shape[2:], weight_shape[2:], stride, padding, dilation,
                                                              output_padding)]
        else:
            channels = weight_shape[0]
            out = [_conv_out(*args) for args in zip(shape[2:], weight_shape[2:], stride, padding, dilation)]
        grad = rand(rng, shape[0], channels, *out, dtype=dtype)
        kind = "transposed" if transposed else "conv"
        yield Sample((grad, x, weight, [channels], stride, padding, dilation, transposed, output_padding, groups,
                      [True, True, True]), note=f"{kind}{len(shape) - 2}d groups={groups} {dtype}")
    x, weight = rand(rng, 1, 2, 5, 5), rand(rng, 3, 2, 3, 3)
    yield Sample((rand(rng, 1, 3, 3, 3), x, weight, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
                  [True, True, True]), note="bias_sizes None: grad_bias still has the output channels")


def _layer_norm_stats(x, normalized_ndim, eps=1e-5):
    axes = tuple(range(x.ndim - normalized_ndim, x.ndim))
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=axes, keepdims=True)
    rstd = 1 / np.sqrt(x64.var(axis=axes, keepdims=True) + eps)
    return mean.astype(x.dtype), rstd.astype(x.dtype)


@samples("aten.native_layer_norm_backward.default")
def _native_layer_norm_backward(rng):
    # torch returns None for the gradients output_mask turns off (and refuses a missing weight or bias
    # with the mask on), so every sample asks for all three.
    # For float16/bfloat16 ATen sums dweight/dbias row by row into per-thread buffers of the input dtype,
    # so with several rows its rounding depends on torch's thread count: those samples have one row.
    cases = [((2, 3, 8), [8], "float32"), ((2, 3, 4), [3, 4], "float32"), ((5, 16), [16], "float64"),
             ((1, 32), [32], "bfloat16"), ((1, 1, 24), [24], "float16"), ((0, 4), [4], "float32")]
    for shape, normalized, dtype in cases:
        x = rand(rng, *shape, dtype=dtype)
        mean, rstd = _layer_norm_stats(x, len(normalized))
        weight, bias = rand(rng, *normalized, dtype=dtype), rand(rng, *normalized, dtype=dtype)
        yield Sample((rand(rng, *shape, dtype=dtype), x, normalized, mean, rstd, weight, bias, [True, True, True]),
                     note=f"{dtype} normalized over {normalized}" + (" (no rows)" if 0 in shape else ""))


@samples("aten.native_group_norm_backward.default")
def _native_group_norm_backward(rng):
    cases = [((2, 6, 5), 3, "float32"), ((2, 4, 3, 3), 2, "float32"), ((3, 4, 7), 1, "float32"),
             ((2, 4, 5), 4, "float64"), ((2, 8, 4, 4), 4, "bfloat16"), ((1, 6, 9), 2, "float16")]
    for shape, group, dtype in cases:
        x = rand(rng, *shape, dtype=dtype)
        batch, channels = shape[:2]
        spatial = int(np.prod(shape[2:]))
        grouped = x.astype(np.float64).reshape(batch, group, -1)
        mean = grouped.mean(-1).astype(x.dtype)
        rstd = (1 / np.sqrt(grouped.var(-1) + 1e-5)).astype(x.dtype)
        yield Sample((rand(rng, *shape, dtype=dtype), x, mean, rstd, rand(rng, channels, dtype=dtype), batch, channels,
                      spatial, group, [True, True, True]), note=f"{dtype} {group} groups of {channels} channels")
