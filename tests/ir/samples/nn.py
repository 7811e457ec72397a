"""Samples for kiln/ir/ops/nn.py."""

from __future__ import annotations

import numpy as np

from tests.ir.samples import Sample, positive, rand, samples

NAN, INF = float("nan"), float("inf")


def _conv(rng, x_shape, w_shape, *, bias=True, stride=(1,), padding=(0,), dilation=(1,), transposed=False,
          output_padding=(0,), groups=1, dtype="float32", note=""):
    out_channels = w_shape[1] * groups if transposed else w_shape[0]
    return Sample((rand(rng, *x_shape, dtype=dtype), rand(rng, *w_shape, dtype=dtype),
                   rand(rng, out_channels, dtype=dtype) if bias else None,
                   list(stride), list(padding), list(dilation), transposed, list(output_padding), groups), note=note)


@samples("aten.convolution.default")
def _convolution(rng):
    yield _conv(rng, (2, 3, 7, 6), (4, 3, 3, 3), note="2-D")
    yield _conv(rng, (1, 4, 9, 8), (6, 2, 3, 2), stride=(2, 1), padding=(1, 2), dilation=(2, 1), groups=2,
                note="2-D stride/padding/dilation/groups")
    yield _conv(rng, (2, 3, 11), (5, 3, 4), bias=False, stride=(3,), padding=(2,), note="1-D, no bias")
    yield _conv(rng, (1, 2, 5, 6, 4), (3, 2, 2, 3, 2), stride=(1, 2, 1), padding=(1, 0, 1), note="3-D")
    yield _conv(rng, (1, 4, 6, 6), (4, 1, 3, 3), padding=(1,), groups=4, note="depthwise")
    yield _conv(rng, (2, 3, 5, 4), (3, 2, 3, 3), transposed=True, note="transposed")
    yield _conv(rng, (1, 4, 4, 5), (4, 3, 3, 2), stride=(2, 3), padding=(1, 0), output_padding=(1, 2),
                transposed=True, groups=2, note="transposed stride/output_padding/groups")
    yield _conv(rng, (1, 2, 6), (2, 3, 3), stride=(2,), padding=(2,), dilation=(2,), output_padding=(1,),
                transposed=True, note="transposed 1-D dilation")
    yield _conv(rng, (1, 2, 3, 3, 2), (2, 2, 2, 2, 2), stride=(2,), transposed=True, note="transposed 3-D")
    yield _conv(rng, (1, 2, 5), (2, 2, 3), padding=(3,), transposed=True, note="transposed padding crops")
    yield _conv(rng, (2, 3, 7, 6), (4, 3, 3, 3), dtype="float64", note="float64")
    yield _conv(rng, (1, 3, 8, 8), (4, 3, 3, 3), dtype="float16", padding=(1,), note="float16")
    yield _conv(rng, (1, 3, 8, 8), (4, 3, 3, 3), dtype="bfloat16", padding=(1,), note="bfloat16")
    yield _conv(rng, (1, 2, 5, 5), (3, 2, 3, 3), dtype="int64", note="int64")
    yield Sample((rand(rng, 1, 2, 5, 5, dtype="uint8", high=200), rand(rng, 3, 2, 3, 3, dtype="uint8", high=5),
                  None, [1], [0], [1], False, [0], 1), note="uint8 wraps around")
    yield _conv(rng, (0, 3, 5, 5), (4, 3, 3, 3), note="empty batch")
    yield Sample((np.array([[[1.0, NAN, 2.0, 3.0, INF]]], np.float32), rand(rng, 1, 1, 2), None,
                  [1], [0], [1], False, [0], 1), note="nan/inf")


@samples("aten.avg_pool2d.default")
def _avg_pool2d(rng):
    yield Sample((rand(rng, 2, 3, 6, 7), [2, 2]), note="stride defaults to kernel")
    yield Sample((rand(rng, 2, 3, 7, 7), [3, 2], [2, 1], [1, 1]), note="padding counted")
    yield Sample((rand(rng, 1, 2, 7, 6), [3, 3], [2, 2], [1, 1], True, False), note="ceil mode, pad excluded")
    yield Sample((rand(rng, 1, 2, 6, 6), [3, 3], [2, 2], [1, 1], True, True), note="ceil mode, pad included")
    yield Sample((rand(rng, 2, 5, 5), [2, 3], [2, 2], [1, 0], False, True, 4), note="3-D input, divisor_override")
    yield Sample((rand(rng, 1, 1, 5, 5), [5, 5], [1, 1], [2, 2], True, False), note="pad = kernel/2")
    yield Sample((rand(rng, 1, 2, 6, 6, dtype="float64"), [2, 2], [1, 1]), note="float64 overlapping")
    yield Sample((rand(rng, 1, 2, 6, 6, dtype="bfloat16"), [3, 3], [2, 2], [1, 1]), note="bfloat16")
    yield Sample((rand(rng, 1, 2, 6, 6, dtype="float16"), [3, 3], [2, 2], [1, 1], True), note="float16")
    yield Sample((rand(rng, 1, 2, 5, 5, dtype="int64", low=-50, high=50), [2, 2], [2, 2], [1, 1], True, False),
                 note="int64 truncating division")
    yield Sample((rand(rng, 0, 2, 4, 4), [2, 2]), note="empty batch")
    yield Sample((np.array([[[[1.0, NAN], [INF, 2.0]]]], np.float32), [1, 2]), note="nan/inf")


@samples("aten.avg_pool3d.default")
def _avg_pool3d(rng):
    yield Sample((rand(rng, 1, 2, 4, 5, 6), [2, 2, 2]))
    yield Sample((rand(rng, 2, 4, 5, 6), [3, 2, 3], [2, 1, 2], [1, 0, 1], True, False), note="4-D, ceil, no pad")
    yield Sample((rand(rng, 1, 1, 5, 5, 5, dtype="float64"), [3, 3, 3], [2, 2, 2], [1, 1, 1], False, True, 7),
                 note="float64, divisor_override")
    yield Sample((rand(rng, 1, 1, 4, 4, 4, dtype="int64", low=-20, high=20), [2, 2, 2]), note="int64")


@samples("aten.max_pool2d_with_indices.default")
def _max_pool2d(rng):
    yield Sample((rand(rng, 2, 3, 6, 7), [2, 2]), note="stride defaults to kernel")
    yield Sample((rand(rng, 1, 2, 7, 7), [3, 3], [2, 2], [1, 1]), note="padding")
    yield Sample((rand(rng, 1, 2, 9, 8), [3, 2], [2, 1], [1, 1], [2, 3]), note="dilation")
    yield Sample((rand(rng, 1, 2, 6, 7), [3, 3], [2, 2], [1, 1], [1, 1], True), note="ceil mode")
    yield Sample((rand(rng, 3, 5, 5), [2, 2], [1, 1]), note="3-D input, overlapping")
    yield Sample((rand(rng, 1, 2, 6, 6, dtype="float64"), [3, 3], [3, 3]), note="float64")
    yield Sample((rand(rng, 1, 2, 6, 6, dtype="bfloat16"), [2, 2], [2, 2], [1, 1]), note="bfloat16")
    yield Sample((rand(rng, 1, 2, 6, 6, dtype="float16"), [2, 2]), note="float16")
    yield Sample((rng.permutation(40).reshape(1, 2, 4, 5).astype(np.int32) - 30, [2, 2], [1, 1], [1, 1]),
                 note="int32, negative values beat padding")
    yield Sample((rng.permutation(50).reshape(2, 5, 5).astype(np.uint8), [3, 3], [2, 2]), note="uint8")
    nans = np.array([[[-INF, -INF, NAN, 1.0], [2.0, NAN, 3.0, 3.5]]], np.float32)
    yield Sample((nans, [2, 2]), note="NaN wins")
    yield Sample((nans, [2, 2], [1, 1], [1, 1]), note="the last NaN of a window wins; -inf windows")
    yield Sample((np.full((1, 2, 2), -INF, np.float32), [2, 2], [1, 1], [1, 1]), note="all -inf")
    yield Sample((rand(rng, 0, 2, 4, 4), [2, 2]), note="empty batch")


@samples("aten.max_pool3d_with_indices.default")
def _max_pool3d(rng):
    yield Sample((rand(rng, 1, 2, 4, 5, 6), [2, 2, 2]))
    yield Sample((rand(rng, 2, 5, 6, 7), [3, 2, 3], [2, 1, 2], [1, 1, 1], [1, 2, 1], True), note="4-D, all options")
    yield Sample((rand(rng, 1, 1, 4, 4, 4, dtype="float64"), [2, 2, 2], [1, 1, 1]), note="float64")
    yield Sample((rng.permutation(64).reshape(1, 4, 4, 4).astype(np.int64) - 70, [2, 2, 2], [2, 2, 2], [1, 1, 1]),
                 note="int64 negative")


@samples("aten._adaptive_avg_pool2d.default")
def _adaptive_avg_pool2d(rng):
    yield Sample((rand(rng, 2, 3, 7, 9), [3, 4]), note="uneven windows")
    yield Sample((rand(rng, 3, 5, 5), [5, 5]), note="3-D input, identity")
    yield Sample((rand(rng, 1, 2, 4, 6), [1, 1]), note="global average")
    yield Sample((rand(rng, 1, 2, 3, 3), [7, 5]), note="upsampling windows")
    yield Sample((rand(rng, 1, 2, 8, 8, dtype="float64"), [3, 3]), note="float64")
    yield Sample((rand(rng, 1, 2, 8, 8, dtype="bfloat16"), [3, 2]), note="bfloat16")
    yield Sample((rand(rng, 1, 2, 8, 8, dtype="float16"), [4, 3]), note="float16")
    yield Sample((rand(rng, 0, 2, 4, 4), [2, 2]), note="empty batch")


@samples("aten._adaptive_avg_pool3d.default")
def _adaptive_avg_pool3d(rng):
    yield Sample((rand(rng, 1, 2, 5, 7, 6), [2, 3, 4]), note="uneven windows")
    yield Sample((rand(rng, 2, 4, 4, 4), [1, 1, 1]), note="4-D input, global")
    yield Sample((rand(rng, 1, 1, 3, 4, 5, dtype="float64"), [4, 4, 4]), note="float64 upsampling windows")


def _batch_norm_params(rng, channels, dtype="float32"):
    return rand(rng, channels, dtype=dtype), rand(rng, channels, dtype=dtype)


@samples("aten._native_batch_norm_legit.default")
def _batch_norm_legit(rng):
    weight, bias = _batch_norm_params(rng, 3)
    yield Sample((rand(rng, 4, 3, 5), weight, bias, rand(rng, 3), positive(rng, 3), True, 0.1, 1e-5),
                 note="training: batch statistics")
    yield Sample((rand(rng, 4, 3, 5), weight, bias, rand(rng, 3), positive(rng, 3), False, 0.1, 1e-5),
                 note="eval: running statistics, empty saves")
    yield Sample((rand(rng, 2, 3, 4, 4), None, None, rand(rng, 3), positive(rng, 3), True, 0.1, 1e-3),
                 note="4-D, no affine")
    yield Sample((rand(rng, 6, 3), weight, None, rand(rng, 3), positive(rng, 3), True, 0.3, 1e-5), note="2-D input")
    w64, b64 = _batch_norm_params(rng, 2, "float64")
    yield Sample((rand(rng, 3, 2, 4, dtype="float64"), w64, b64, rand(rng, 2, dtype="float64"),
                  positive(rng, 2, dtype="float64"), True, 0.1, 1e-5), note="float64")
    yield Sample((rand(rng, 3, 3, 4, dtype="bfloat16"), weight, bias, rand(rng, 3), positive(rng, 3), True, 0.1, 1e-5),
                 note="bfloat16 input, float32 parameters: float32 statistics")
    yield Sample((rand(rng, 3, 3, 4, dtype="float16"), None, None, rand(rng, 3, dtype="float16"),
                  positive(rng, 3, dtype="float16"), True, 0.1, 1e-5), note="float16 throughout")
    yield Sample((rand(rng, 3, 3, 4, dtype="bfloat16"), weight, bias, rand(rng, 3), positive(rng, 3), False, 0.1,
                  1e-5), note="bfloat16 eval")


@samples("aten._native_batch_norm_legit.no_stats")
def _batch_norm_no_stats(rng):
    weight, bias = _batch_norm_params(rng, 3)
    yield Sample((rand(rng, 4, 3, 5), weight, bias, True, 0.1, 1e-5))
    yield Sample((rand(rng, 2, 3, 2, 3), None, None, True, 0.1, 1e-2), note="4-D, no affine")
    yield Sample((rand(rng, 4, 3, 2, dtype="bfloat16"), weight, bias, True, 0.1, 1e-5),
                 note="bfloat16 input, float32 parameters")
    yield Sample((rand(rng, 4, 2, dtype="float64"), None, rand(rng, 2, dtype="float64"), True, 0.1, 1e-5),
                 note="float64, bias only")


@samples("aten._native_batch_norm_legit_no_training.default")
def _batch_norm_no_training(rng):
    weight, bias = _batch_norm_params(rng, 3)
    yield Sample((rand(rng, 4, 3, 5), weight, bias, rand(rng, 3), positive(rng, 3), 0.1, 1e-5))
    yield Sample((rand(rng, 2, 3, 2, 2), None, None, rand(rng, 3), positive(rng, 3), 0.1, 1e-5), note="no affine")
    yield Sample((rand(rng, 2, 3, 4, dtype="float16"), weight, bias, rand(rng, 3), positive(rng, 3), 0.1, 1e-5),
                 note="float16 input, float32 parameters")
    # Empty results have no values to compare; shape-only also keeps it from torch.autograd, whose batch-norm
    # backward of an empty batch dies of a floating point exception (SIGFPE, torch 2.13 CPU).
    yield Sample((rand(rng, 0, 3, 4), weight, bias, rand(rng, 3), positive(rng, 3), 0.1, 1e-5), note="empty batch",
                 check_values=False)


@samples("aten.native_layer_norm.default")
def _layer_norm(rng):
    yield Sample((rand(rng, 2, 3, 8), [8], rand(rng, 8), rand(rng, 8), 1e-5))
    yield Sample((rand(rng, 2, 3, 4), [3, 4], rand(rng, 3, 4), None, 1e-5), note="two normalized dims, weight only")
    yield Sample((rand(rng, 2, 3, 4), [2, 3, 4], None, None, 1e-3), note="all dims")
    yield Sample((rand(rng, 5, 6, dtype="float64"), [6], rand(rng, 6, dtype="float64"), rand(rng, 6, dtype="float64"),
                  1e-5), note="float64")
    yield Sample((rand(rng, 4, 16, dtype="bfloat16"), [16], rand(rng, 16), rand(rng, 16), 1e-5),
                 note="bfloat16 input, float32 parameters")
    yield Sample((rand(rng, 4, 16, dtype="float16"), [16], None, None, 1e-5), note="float16")
    yield Sample((rand(rng, 0, 4), [4], None, None, 1e-5), note="empty")


@samples("aten.native_group_norm.default")
def _group_norm(rng):
    yield Sample((rand(rng, 2, 6, 5), rand(rng, 6), rand(rng, 6), 2, 6, 5, 3, 1e-5))
    yield Sample((rand(rng, 2, 4, 3, 2), None, None, 2, 4, 6, 4, 1e-5), note="4-D, a group per channel")
    yield Sample((rand(rng, 3, 4), rand(rng, 4), None, 3, 4, 1, 1, 1e-2), note="2-D, one group")
    yield Sample((rand(rng, 2, 4, 6, dtype="float64"), None, rand(rng, 4, dtype="float64"), 2, 4, 6, 2, 1e-5),
                 note="float64")
    yield Sample((rand(rng, 2, 4, 6, dtype="bfloat16"), rand(rng, 4), rand(rng, 4), 2, 4, 6, 2, 1e-5),
                 note="bfloat16 input, float32 parameters")
    yield Sample((rand(rng, 0, 4, 3), None, None, 0, 4, 3, 2, 1e-5), note="empty batch")


@samples("aten.native_dropout.default")
def _native_dropout(rng):
    yield Sample((rand(rng, 3, 4), 0.5, False), note="eval: identity, all-true mask")
    yield Sample((rand(rng, 3, 4), 0.0, True), note="p=0 keeps everything")
    yield Sample((rand(rng, 3, 4, dtype="float64"), 1.0, True), note="p=1 drops everything")
    yield Sample((rand(rng, 3, 4, dtype="bfloat16"), 0.3, None), note="train=None trains", check_values=False)
    yield Sample((rand(rng, 5, 6), 0.5, True), note="random mask", check_values=False)
    yield Sample((rand(rng, 4, dtype="int64"), 0.5, False), note="eval keeps integers")


@samples("aten.embedding.default")
def _embedding(rng):
    yield Sample((rand(rng, 10, 4), rng.integers(0, 10, (3, 5))), note="2-D indices")
    yield Sample((rand(rng, 6, 3, dtype="float64"), rng.integers(0, 6, (4,)).astype(np.int32), 2),
                 note="int32 indices, padding_idx")
    yield Sample((rand(rng, 5, 2, dtype="int64"), np.array(3)), note="0-d index")
    yield Sample((rand(rng, 5, 2, dtype="bfloat16"), np.zeros((0, 2), np.int64)), note="empty indices")
    repeated = np.array([[1, 3, 1], [4, 1, 3]])
    yield Sample((rand(rng, 6, 3), repeated, -1, True), note="scale_grad_by_freq (gradient only)")
    yield Sample((rand(rng, 6, 3), repeated, 3, True), note="scale_grad_by_freq and padding_idx (gradient only)")


def _bags(rng, weight_dtype="float32", index_dtype="int64", offset_dtype="int64", last_offset=False):
    weight = rand(rng, 10, 3, dtype=weight_dtype)
    indices = np.array([1, 2, 4, 5, 4, 3, 2, 9], index_dtype)
    offsets = np.array([0, 2, 2, 5] + ([8] if last_offset else []), offset_dtype)
    return weight, indices, offsets


@samples("aten._embedding_bag.default")
def _embedding_bag(rng):
    for mode in (0, 1, 2):
        weight, indices, offsets = _bags(rng)
        yield Sample((weight, indices, offsets, False, mode), note=f"mode {mode}, an empty bag")
        yield Sample((weight, indices, _bags(rng, last_offset=True)[2], False, mode, False, None, True),
                     note=f"mode {mode}, include_last_offset")
        yield Sample((weight, indices, offsets, False, mode, False, None, False, 4), note=f"mode {mode}, padding_idx")
    weight, indices, offsets = _bags(rng, "float64", "int32", "int32")
    yield Sample((weight, indices, offsets, False, 0), note="float64 sum computes offset2bag; int32 indices")
    yield Sample((weight, indices, offsets, False, 2, False, None, False, 2), note="float64 max, padding")
    weight, indices, offsets = _bags(rng, "float32", "int32", "int64")
    yield Sample((weight, indices, offsets, False, 1), note="mixed index dtypes promote to int64")
    weight, indices, offsets = _bags(rng, "bfloat16")
    yield Sample((weight, indices, offsets, False, 1), note="bfloat16 mean")
    weight, indices, offsets = _bags(rng)
    yield Sample((weight, indices, offsets, False, 0, False, rand(rng, 8)), note="per_sample_weights")
    yield Sample((weight, indices, _bags(rng, last_offset=True)[2], False, 0, False, rand(rng, 8), True, 3),
                 note="per_sample_weights, include_last_offset, padding")
    yield Sample((weight, np.array([4, 4, 3]), np.array([0, 2]), False, 2, False, None, False, 4),
                 note="max over a bag of padding only")
    yield Sample((weight, np.zeros(0, np.int64), np.array([0, 0]), False, 1), note="no indices")
    # torch's CPU backward scales the i-th distinct index by the frequency of sorted(indices)[i] (not its own), so
    # the gradient can only be checked where every index is equally frequent.
    twice = np.array([1, 4, 4, 2, 1, 2])
    for mode in (0, 1):
        yield Sample((weight, twice, offsets, True, mode), note=f"mode {mode}, scale_grad_by_freq (gradient only)")


def _pad_input(rng, n, batched, dtype="float32"):
    spatial = [5, 4, 6][:n]
    shape = ([2] if batched else []) + [3] + spatial
    return rand(rng, *shape, dtype=dtype)


@samples("aten.reflection_pad1d.default")
def _reflection_pad1d(rng):
    yield Sample((_pad_input(rng, 1, True), [2, 3]))
    yield Sample((_pad_input(rng, 1, False), [4, 0]), note="2-D input, pad up to size - 1")
    yield Sample((_pad_input(rng, 1, True, "int32"), [-1, 2]), note="negative padding crops")
    yield Sample((_pad_input(rng, 1, True, "bfloat16"), [1, 1]), note="bfloat16")
    yield Sample((rand(rng, 0, 2, 4), [1, 2]), note="empty batch")


@samples("aten.reflection_pad2d.default")
def _reflection_pad2d(rng):
    yield Sample((_pad_input(rng, 2, True), [1, 2, 3, 0]))
    yield Sample((_pad_input(rng, 2, False, "float64"), [3, 3, -1, 2]), note="3-D input, negative padding")
    yield Sample((_pad_input(rng, 2, True, "uint8"), [1, 1, 1, 1]), note="uint8")


@samples("aten.reflection_pad3d.default")
def _reflection_pad3d(rng):
    yield Sample((_pad_input(rng, 3, True), [1, 2, 3, 0, 2, 1]))
    yield Sample((_pad_input(rng, 3, False, "int64"), [0, 1, 1, 0, -1, 3]), note="4-D input, negative padding")


@samples("aten.replication_pad2d.default")
def _replication_pad2d(rng):
    yield Sample((_pad_input(rng, 2, True), [1, 2, 3, 0]))
    yield Sample((_pad_input(rng, 2, False, "float16"), [7, 0, 0, 6]), note="padding beyond the input size")
    yield Sample((_pad_input(rng, 2, True, "int32"), [-1, 2, 3, -2]), note="negative padding")


@samples("aten.replication_pad3d.default")
def _replication_pad3d(rng):
    yield Sample((_pad_input(rng, 3, True), [1, 2, 3, 0, 2, 1]))
    yield Sample((_pad_input(rng, 3, False, "bfloat16"), [0, 4, 1, 0, -2, 1]), note="4-D input, negative padding")


@samples("aten.upsample_nearest2d.vec")
def _upsample_nearest(rng):
    yield Sample((rand(rng, 2, 3, 4, 5), [8, 10], None), note="exact 2x")
    yield Sample((rand(rng, 1, 2, 5, 7), [3, 11], None), note="downsample rows, upsample columns")
    yield Sample((rand(rng, 1, 2, 3, 3), None, [1.7, 0.6]), note="scale factors")
    yield Sample((rand(rng, 1, 2, 4, 4), None, [3.0, 2.5]), note="scale factors used for the source index")
    yield Sample((rand(rng, 1, 1, 3, 5, dtype="float64"), [7, 5], None), note="float64, one axis unchanged")
    yield Sample((rand(rng, 1, 2, 3, 3, dtype="uint8"), [5, 4], None), note="uint8")
    yield Sample((rand(rng, 1, 2, 3, 3, dtype="bfloat16"), [6, 7], None), note="bfloat16")
    yield Sample((rand(rng, 0, 2, 3, 3), [4, 4], None), note="empty batch")


@samples("aten.upsample_bilinear2d.vec")
def _upsample_bilinear(rng):
    for align in (False, True):
        yield Sample((rand(rng, 2, 3, 4, 5), [7, 9], align, None), note=f"align_corners={align}")
        yield Sample((rand(rng, 1, 2, 6, 5), [3, 2], align, None), note=f"downsample, align_corners={align}")
        yield Sample((rand(rng, 1, 2, 3, 4), None, align, [1.7, 2.5]), note=f"scale factors, align_corners={align}")
    yield Sample((rand(rng, 1, 2, 4, 4), [1, 1], True, None), note="one output pixel with align_corners")
    yield Sample((rand(rng, 1, 1, 3, 5, dtype="float64"), [7, 5], False, None), note="float64")
    yield Sample((rand(rng, 1, 2, 3, 3, dtype="bfloat16"), [6, 7], False, None), note="bfloat16")
    yield Sample((rand(rng, 1, 2, 3, 3, dtype="float16"), [5, 4], True, None), note="float16")


@samples("aten.grid_sampler_2d.default")
def _grid_sampler(rng):
    for mode in (0, 1, 2):
        for padding in (0, 1, 2):
            for align in (False, True):
                yield Sample((rand(rng, 2, 3, 5, 6), rand(rng, 2, 4, 3, 2, low=-1.4, high=1.4), mode, padding, align),
                             note=f"mode {mode}, padding {padding}, align_corners={align}")
    yield Sample((rand(rng, 1, 2, 4, 4, dtype="float64"), rand(rng, 1, 3, 5, 2, dtype="float64", low=-3, high=3),
                  0, 2, False), note="float64, far outside with reflection")
    yield Sample((rand(rng, 1, 1, 1, 1), rand(rng, 1, 2, 2, 2), 0, 2, True), note="1x1 input, reflection")
    # Points on pixel centres and on the edges, where torch's gradient takes the right-hand corner and the
    # border/reflection clip has gradient 0.
    steps = np.array([-1.0, -0.5, 0.0, 0.5, 1.0], np.float32)
    on_pixels = np.stack(np.meshgrid(steps, steps[::-1]), -1)[None]
    for padding in (0, 1, 2):
        yield Sample((rand(rng, 1, 2, 5, 5), on_pixels, 0, padding, True),
                     note=f"bilinear on pixel centres and edges, padding {padding}")
    yield Sample((rand(rng, 1, 2, 4, 4), on_pixels, 2, 1, False), note="bicubic on edges, border")
    yield Sample((rand(rng, 1, 2, 4, 4, dtype="bfloat16"), rand(rng, 1, 3, 3, 2, dtype="bfloat16", low=-1, high=1),
                  0, 0, False), note="bfloat16 (computed in bfloat16, like ATen's scalar fallback)")
    yield Sample((rand(rng, 1, 2, 4, 5, dtype="bfloat16"), rand(rng, 1, 3, 3, 2, dtype="bfloat16", low=-1.5, high=1.5),
                  1, 1, True), note="bfloat16 nearest, border")
    yield Sample((rand(rng, 1, 2, 4, 5, dtype="float16"), rand(rng, 1, 3, 3, 2, dtype="float16", low=-1.5, high=1.5),
                  2, 2, False), note="float16 bicubic, reflection")


@samples("aten.col2im.default")
def _col2im(rng):
    yield Sample((rand(rng, 2, 3 * 4, 12), [4, 5], [2, 2], [1, 1], [0, 0], [1, 1]))
    yield Sample((rand(rng, 2 * 6, 9), [5, 6], [2, 3], [1, 1], [1, 1], [2, 2]), note="unbatched, padding, stride")
    yield Sample((rand(rng, 1, 2 * 4, 9, dtype="float64"), [6, 6], [2, 2], [2, 2], [1, 1], [2, 2]), note="dilation")
    yield Sample((rand(rng, 1, 4, 4, dtype="bfloat16"), [3, 3], [2, 2], [1, 1], [0, 0], [1, 1]), note="bfloat16")


# ---------------------------------------------------------------------------------------------
# Composites

@samples("aten.conv1d.default")
def _conv1d(rng):
    yield Sample((rand(rng, 2, 3, 9), rand(rng, 4, 3, 3), rand(rng, 4)))
    yield Sample((rand(rng, 4, 10), rand(rng, 6, 2, 3), None, [2], [1], [2], 2), note="unbatched, all options")
    yield Sample((rand(rng, 1, 2, 6, dtype="float64"), rand(rng, 2, 2, 2, dtype="float64")), note="float64")


@samples("aten.conv2d.default")
def _conv2d(rng):
    yield Sample((rand(rng, 2, 3, 7, 6), rand(rng, 4, 3, 3, 3), rand(rng, 4)))
    yield Sample((rand(rng, 4, 8, 7), rand(rng, 6, 2, 3, 2), rand(rng, 6), [2, 1], [1, 0], [1, 2], 2),
                 note="unbatched, all options")
    yield Sample((rand(rng, 1, 3, 6, 6, dtype="bfloat16"), rand(rng, 2, 3, 3, 3, dtype="bfloat16")), note="bfloat16")


@samples("aten.conv3d.default")
def _conv3d(rng):
    yield Sample((rand(rng, 1, 2, 5, 4, 6), rand(rng, 3, 2, 2, 3, 2), rand(rng, 3)))
    yield Sample((rand(rng, 2, 4, 4, 5), rand(rng, 2, 2, 2, 2, 2), None, [1, 2, 1], [1], [1], 1), note="unbatched")


@samples("aten.conv_transpose1d.default")
def _conv_transpose1d(rng):
    yield Sample((rand(rng, 2, 3, 5), rand(rng, 3, 4, 3), rand(rng, 4)))
    yield Sample((rand(rng, 4, 6), rand(rng, 4, 2, 3), rand(rng, 4), [2], [1], [1], 2, [1]),
                 note="unbatched, stride/padding/output_padding/groups")


@samples("aten.conv_transpose2d.input")
def _conv_transpose2d(rng):
    yield Sample((rand(rng, 2, 3, 4, 5), rand(rng, 3, 2, 3, 3), rand(rng, 2)))
    yield Sample((rand(rng, 1, 4, 3, 4), rand(rng, 4, 3, 2, 3), None, [2, 3], [0, 1], [1, 2], 2, [2, 1]),
                 note="all options")
    yield Sample((rand(rng, 2, 4, 4), rand(rng, 2, 3, 3, 3)), note="unbatched")


@samples("aten.conv_transpose3d.input")
def _conv_transpose3d(rng):
    yield Sample((rand(rng, 1, 2, 3, 3, 2), rand(rng, 2, 2, 2, 2, 2), rand(rng, 2), [2, 1, 2], [0], [1, 0, 0]))


@samples("aten.layer_norm.default")
def _layer_norm_composite(rng):
    yield Sample((rand(rng, 2, 3, 8), [8], rand(rng, 8), rand(rng, 8)))
    yield Sample((rand(rng, 2, 3, 4), [3, 4]), note="no affine, default eps")
    yield Sample((rand(rng, 4, 16, dtype="bfloat16"), [16], rand(rng, 16), rand(rng, 16), 1e-3),
                 note="bfloat16 input, float32 parameters")


@samples("aten.group_norm.default")
def _group_norm_composite(rng):
    yield Sample((rand(rng, 2, 6, 5), 3, rand(rng, 6), rand(rng, 6)))
    yield Sample((rand(rng, 2, 4, 3, 2), 2), note="4-D, no affine")
    yield Sample((rand(rng, 3, 4, dtype="float64"), 1, None, None, 1e-3), note="2-D float64")


@samples("aten.batch_norm.default")
def _batch_norm_composite(rng):
    weight, bias = rand(rng, 3), rand(rng, 3)
    yield Sample((rand(rng, 4, 3, 5), weight, bias, rand(rng, 3), positive(rng, 3), False, 0.1, 1e-5, True),
                 note="eval")
    yield Sample((rand(rng, 4, 3, 5), weight, bias, rand(rng, 3), positive(rng, 3), True, 0.1, 1e-5, True),
                 note="training with running statistics")
    yield Sample((rand(rng, 2, 3, 2, 2), None, None, None, None, True, 0.1, 1e-5, True),
                 note="training without running statistics")
    yield Sample((rand(rng, 4, 3, dtype="bfloat16"), weight, bias, rand(rng, 3), positive(rng, 3), False, 0.1, 1e-5,
                  True), note="bfloat16 eval")


@samples("aten.instance_norm.default")
def _instance_norm(rng):
    yield Sample((rand(rng, 2, 3, 5), rand(rng, 3), rand(rng, 3), None, None, True, 0.1, 1e-5, True))
    yield Sample((rand(rng, 2, 3, 2, 3), None, None, rand(rng, 3), positive(rng, 3), False, 0.1, 1e-5, True),
                 note="running statistics")


@samples("aten.rms_norm.default")
def _rms_norm(rng):
    yield Sample((rand(rng, 2, 3, 8), [8], rand(rng, 8)), note="eps=None: float32 machine epsilon")
    yield Sample((rand(rng, 2, 3, 4), [3, 4], None, 1e-5), note="two dims, no weight")
    yield Sample((rand(rng, 4, 16, dtype="bfloat16", low=-0.01, high=0.01), [16], rand(rng, 16)),
                 note="bfloat16: eps is float32's, weight applied before rounding")
    yield Sample((rand(rng, 4, 16, dtype="float16"), [16], rand(rng, 16, dtype="float16"), 1e-6), note="float16")
    yield Sample((rand(rng, 3, 5, dtype="float64"), [5], rand(rng, 5)), note="float64 input, float32 weight")


def _attention_inputs(rng, batch, heads, length, source, dim, value_dim=None, kv_heads=None, dtype="float32"):
    kv = heads if kv_heads is None else kv_heads
    return (rand(rng, *batch, heads, length, dim, dtype=dtype), rand(rng, *batch, kv, source, dim, dtype=dtype),
            rand(rng, *batch, kv, source, value_dim or dim, dtype=dtype))


@samples("aten.scaled_dot_product_attention.default")
def _sdpa(rng):
    yield Sample(_attention_inputs(rng, [2], 2, 3, 5, 4))
    yield Sample(_attention_inputs(rng, [2], 2, 4, 4, 8, value_dim=3), {"is_causal": True}, note="causal")
    yield Sample(_attention_inputs(rng, [1], 2, 3, 5, 4), {"is_causal": True}, note="causal, L < S")
    q, k, v = _attention_inputs(rng, [2], 2, 3, 5, 4)
    mask = rand(rng, 3, 5, dtype="bool")
    mask[:, 0] = True
    yield Sample((q, k, v, mask), note="bool mask")
    yield Sample((q, k, v, rand(rng, 2, 1, 3, 5)), {"scale": 0.3}, note="float mask, explicit scale")
    no_row = np.ones((3, 5), np.bool_)
    no_row[1] = False
    yield Sample((q, k, v, no_row), note="a fully masked row gives zeros")
    yield Sample(_attention_inputs(rng, [2], 4, 3, 5, 4, kv_heads=2), {"enable_gqa": True}, note="grouped query")
    yield Sample((rand(rng, 3, 4), rand(rng, 5, 4), rand(rng, 5, 6)), note="no batch dims")
    yield Sample((rand(rng, 2, 3, 4), rand(rng, 1, 5, 4), rand(rng, 1, 5, 6)), note="broadcast batch")
    yield Sample(_attention_inputs(rng, [1], 2, 3, 5, 8, dtype="float64"), note="float64")
    yield Sample(_attention_inputs(rng, [1], 2, 3, 5, 8, dtype="bfloat16"), note="bfloat16")
    yield Sample(_attention_inputs(rng, [1], 2, 3, 5, 8), {"dropout_p": 0.5}, note="dropout", check_values=False)
    # (drawn after the samples above, which keep their values)
    q, k, v = _attention_inputs(rng, [1], 6, 4, 7, 8, value_dim=5, kv_heads=2)
    yield Sample((q, k, v, rand(rng, 1, 6, 4, 7)), {"enable_gqa": True},
                 note="grouped query, per-head float mask, value dim != query dim")
    yield Sample(_attention_inputs(rng, [2], 4, 3, 5, 4, kv_heads=2), {"enable_gqa": True, "is_causal": True},
                 note="grouped query, causal")
    yield Sample((rand(rng, 2, 4, 3, 4), rand(rng, 1, 2, 5, 4), rand(rng, 1, 2, 5, 4)), {"enable_gqa": True},
                 note="grouped query, broadcast batch: the keys repeated")


@samples("aten.dropout.default")
def _dropout(rng):
    yield Sample((rand(rng, 3, 4), 0.5, False), note="eval")
    yield Sample((rand(rng, 3, 4), 0.0, True), note="p=0")
    yield Sample((rand(rng, 3, 4), 1.0, True), note="p=1 zeroes everything")
    yield Sample((rand(rng, 5, 6), 0.5, True), note="random", check_values=False)


@samples("aten.max_pool2d.default")
def _max_pool2d_composite(rng):
    yield Sample((rand(rng, 2, 3, 6, 7), [2, 2]))
    yield Sample((rand(rng, 1, 2, 7, 7), [3, 3], [2, 2], [1, 1], [1, 1], True), note="all options")


@samples("aten.max_pool3d.default")
def _max_pool3d_composite(rng):
    yield Sample((rand(rng, 1, 2, 4, 5, 6), [2, 2, 2]))
    yield Sample((rand(rng, 2, 5, 6, 7), [3, 2, 3], [2, 1, 2], [1, 1, 1], [1, 2, 1], True), note="all options")


@samples("aten.max_pool1d.default")
def _max_pool1d(rng):
    yield Sample((rand(rng, 2, 3, 9), [3]))
    yield Sample((rand(rng, 3, 10), [3], [2], [1], [2], True), note="unbatched, all options")


@samples("aten.avg_pool1d.default")
def _avg_pool1d(rng):
    yield Sample((rand(rng, 2, 3, 9), [3]))
    yield Sample((rand(rng, 3, 10), [3], [2], [1], True, False), note="unbatched, ceil, pad excluded")


@samples("aten.adaptive_avg_pool2d.default")
def _adaptive_avg_pool2d_composite(rng):
    yield Sample((rand(rng, 2, 3, 7, 9), [3, 4]))
    yield Sample((rand(rng, 3, 5, 5), [1, 1]), note="global")


@samples("aten.adaptive_avg_pool3d.default")
def _adaptive_avg_pool3d_composite(rng):
    yield Sample((rand(rng, 1, 2, 5, 7, 6), [2, 3, 4]))


@samples("aten.adaptive_avg_pool1d.default")
def _adaptive_avg_pool1d(rng):
    yield Sample((rand(rng, 2, 3, 10), [4]))
    yield Sample((rand(rng, 3, 7), [7]), note="unbatched identity")


def _cell_inputs(rng, gates, batch=3, input_size=4, hidden=5, bias=True, dtype="float32"):
    weights = (rand(rng, gates * hidden, input_size, dtype=dtype), rand(rng, gates * hidden, hidden, dtype=dtype))
    biases = (rand(rng, gates * hidden, dtype=dtype), rand(rng, gates * hidden, dtype=dtype)) if bias else ()
    return rand(rng, batch, input_size, dtype=dtype), rand(rng, batch, hidden, dtype=dtype), weights, biases


@samples("aten.lstm_cell.default")
def _lstm_cell(rng):
    x, h, weights, biases = _cell_inputs(rng, 4)
    yield Sample((x, [h, rand(rng, 3, 5)], *weights, *biases))
    x, h, weights, _ = _cell_inputs(rng, 4, bias=False, dtype="float64")
    yield Sample((x, [h, rand(rng, 3, 5, dtype="float64")], *weights), note="float64, no biases")


@samples("aten.gru_cell.default")
def _gru_cell(rng):
    x, h, weights, biases = _cell_inputs(rng, 3)
    yield Sample((x, h, *weights, *biases))
    x, h, weights, _ = _cell_inputs(rng, 3, bias=False, dtype="float64")
    yield Sample((x, h, *weights), note="float64, no biases")


@samples("aten.bilinear.default")
def _bilinear(rng):
    yield Sample((rand(rng, 3, 4), rand(rng, 3, 5), rand(rng, 2, 4, 5), rand(rng, 2)))
    yield Sample((rand(rng, 2, 3, 4), rand(rng, 2, 3, 2), rand(rng, 6, 4, 2)), note="batched, no bias")


@samples("aten.cosine_similarity.default")
def _cosine_similarity(rng):
    yield Sample((rand(rng, 3, 4), rand(rng, 3, 4)))
    yield Sample((rand(rng, 2, 3, 4), rand(rng, 3, 1), -1), note="broadcast, dim=-1")
    yield Sample((np.zeros((2, 3), np.float32), rand(rng, 2, 3), 1, 1e-3), note="zero vector: eps clamp")
    yield Sample((rand(rng, 2, 5, dtype="float64"), rand(rng, 2, 5, dtype="float64"), 0), note="float64, dim 0")


@samples("aten.pixel_shuffle.default")
def _pixel_shuffle(rng):
    yield Sample((rand(rng, 2, 8, 3, 4), 2))
    yield Sample((rand(rng, 9, 2, 2, dtype="int32"), 3), note="unbatched int32")


@samples("aten.pixel_unshuffle.default")
def _pixel_unshuffle(rng):
    yield Sample((rand(rng, 2, 2, 6, 4), 2))
    yield Sample((rand(rng, 1, 3, 3, dtype="int64"), 3), note="unbatched int64")


@samples("aten.upsample_nearest2d.default")
def _upsample_nearest_default(rng):
    yield Sample((rand(rng, 2, 3, 4, 5), [8, 10]))
    yield Sample((rand(rng, 1, 2, 3, 4), [5, 10], 1.7, 2.5), note="scales that reproduce the sizes")


@samples("aten.upsample_bilinear2d.default")
def _upsample_bilinear_default(rng):
    yield Sample((rand(rng, 2, 3, 4, 5), [7, 9], False))
    yield Sample((rand(rng, 1, 2, 3, 4), [5, 10], False, 1.7, 2.5), note="scales that reproduce the sizes")
    yield Sample((rand(rng, 1, 2, 3, 4), [5, 9], True, 1.7, 2.5), note="align_corners ignores scales")


@samples("aten.upsample_nearest1d.vec")
def _upsample_nearest1d(rng):
    yield Sample((rand(rng, 2, 3, 5), [10], None), note="exact 2x")
    yield Sample((rand(rng, 1, 2, 7), [3], None), note="downsample")
    yield Sample((rand(rng, 1, 2, 4), None, [2.5]), note="scale factor used for the source index")
    yield Sample((rand(rng, 1, 2, 3, dtype="uint8"), [7], None), note="uint8")


@samples("aten.upsample_linear1d.vec")
def _upsample_linear1d(rng):
    for align in (False, True):
        yield Sample((rand(rng, 2, 3, 5), [9], align, None), note=f"align_corners={align}")
        yield Sample((rand(rng, 1, 2, 7), [3], align, None), note=f"downsample, align_corners={align}")
        yield Sample((rand(rng, 1, 2, 4), None, align, [1.7]), note=f"scale factor, align_corners={align}")
    yield Sample((rand(rng, 1, 4, 13), [27], False, None), note="SAM's relative-position table")
    yield Sample((rand(rng, 1, 2, 4), [1], True, None), note="one output with align_corners")
    yield Sample((rand(rng, 1, 1, 5, dtype="float64"), [8], False, None), note="float64")
    yield Sample((rand(rng, 1, 2, 3, dtype="bfloat16"), [7], False, None), note="bfloat16")
    yield Sample((rand(rng, 1, 2, 3, dtype="float16"), [5], True, None), note="float16")


@samples("aten.upsample_nearest1d.default")
def _upsample_nearest1d_default(rng):
    yield Sample((rand(rng, 2, 3, 5), [8]))
    yield Sample((rand(rng, 1, 2, 4), [10], 2.5), note="a scale that reproduces the size")


@samples("aten.upsample_linear1d.default")
def _upsample_linear1d_default(rng):
    yield Sample((rand(rng, 2, 3, 5), [9], False))
    yield Sample((rand(rng, 1, 2, 4), [6], False, 1.7), note="a scale that reproduces the size")
    yield Sample((rand(rng, 1, 2, 4), [9], True, 1.7), note="align_corners ignores the scale")


@samples("aten.im2col.default")
def _im2col(rng):
    yield Sample((rand(rng, 2, 3, 5, 6), [2, 3], [1, 1], [0, 0], [1, 1]))
    yield Sample((rand(rng, 2, 4, 7, 1), [3, 1], [1, 1], [1, 0], [1, 1]), note="ConvBERT's [k, 1] span")
    yield Sample((rand(rng, 1, 2, 7, 8), [3, 2], [2, 1], [1, 2], [2, 3]), note="dilation, padding, stride")
    yield Sample((rand(rng, 3, 5, 4, dtype="float64"), [2, 2], [1, 1], [1, 1], [1, 1]), note="unbatched")
    yield Sample((rand(rng, 0, 2, 4, 4), [2, 2], [1, 1], [0, 0], [2, 2]), note="empty batch")


@samples("aten.upsample_bicubic2d.vec")
def _upsample_bicubic(rng):
    for align in (False, True):
        yield Sample((rand(rng, 2, 3, 4, 5), [7, 9], align, None), note=f"align_corners={align}")
        yield Sample((rand(rng, 1, 2, 6, 5), [3, 2], align, None), note=f"downsample, align_corners={align}")
        yield Sample((rand(rng, 1, 2, 3, 4), None, align, [1.7, 2.5]), note=f"scale factors, align_corners={align}")
    yield Sample((rand(rng, 1, 3, 4, 4), [4, 4], False, None), note="same size: a copy")
    yield Sample((rand(rng, 1, 2, 4, 4), [1, 1], True, None), note="one output pixel with align_corners")
    yield Sample((rand(rng, 1, 1, 3, 5, dtype="float64"), [7, 5], False, None), note="float64")
    yield Sample((rand(rng, 1, 2, 3, 3, dtype="float16"), [5, 4], True, None), note="float16")
    yield Sample((rand(rng, 1, 2, 3, 3, dtype="bfloat16"), [6, 7], False, None), note="bfloat16")


@samples("aten.conv1d.padding")
def _conv1d_padding(rng):
    yield Sample((rand(rng, 2, 3, 9), rand(rng, 4, 3, 3), rand(rng, 4), [1], "same"), note="same, odd kernel")
    yield Sample((rand(rng, 2, 3, 9), rand(rng, 4, 3, 4), None, [1], "same", [1]), note="same, even kernel")
    yield Sample((rand(rng, 3, 9), rand(rng, 4, 3, 3), rand(rng, 4), [2], "valid"), note="unbatched, valid, stride")


@samples("aten.conv2d.padding")
def _conv2d_padding(rng):
    yield Sample((rand(rng, 2, 4, 7, 6), rand(rng, 4, 1, 3, 3), rand(rng, 4), [1, 1], "same", [1, 1], 4),
                 note="same, depthwise")
    yield Sample((rand(rng, 1, 3, 7, 6), rand(rng, 2, 3, 2, 4), None, [1, 1], "same", [1, 2]),
                 note="same, even kernel, dilation: padded right")
    yield Sample((rand(rng, 3, 7, 6), rand(rng, 2, 3, 3, 3), rand(rng, 2), [2, 1], "valid"), note="unbatched, valid")


@samples("aten.conv3d.padding")
def _conv3d_padding(rng):
    yield Sample((rand(rng, 1, 2, 5, 4, 6), rand(rng, 3, 2, 2, 3, 2), rand(rng, 3), [1, 1, 1], "same"))
    yield Sample((rand(rng, 1, 2, 5, 4, 6), rand(rng, 3, 2, 3, 3, 3), None, [1, 1, 1], "valid"), note="valid")


@samples("aten.glu.default")
def _glu(rng):
    yield Sample((rand(rng, 2, 6, 5), 1))
    yield Sample((rand(rng, 3, 4),), note="last dim")
    yield Sample((rand(rng, 4, 2, 3, dtype="float64"), 0), note="float64, dim 0")
    yield Sample((np.array([[40.0, -40.0, 0.0, 1000.0], [-1000.0, 2.0, np.nan, 3.0]], np.float32), -1),
                 note="saturating, nan")
    yield Sample((rand(rng, 2, 8, dtype="float16"), -1), note="float16")
    yield Sample((rand(rng, 0, 4), 1), note="empty")


@samples("aten._weight_norm.default")
def _weight_norm(rng):
    yield Sample((rand(rng, 4, 3, 5), positive(rng, 4, 1, 1)), note="dim 0")
    yield Sample((rand(rng, 8, 2, 5), positive(rng, 1, 1, 5), 2), note="last dim (wav2vec2's positional conv)")
    yield Sample((rand(rng, 3, 4, 5), positive(rng, 1, 4, 1), 1), note="middle dim")
    yield Sample((rand(rng, 3, 4), positive(rng), -1), note="dim -1: the whole tensor's norm")
    yield Sample((rand(rng, 5), positive(rng, 5), 0), note="1-d")
    yield Sample((rand(rng, 4, 3, dtype="float64"), positive(rng, 4, 1, dtype="float64")), note="float64")
