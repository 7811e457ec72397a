"""ONNX lowerings of the autograd (`*_backward`) ops and `_embedding_bag`, registered into `LOWERING_TABLE`.

Pool backwards scatter into constant window positions, convolution_backward gathers the input windows
(im2col with a constant index) and contracts them with Einsum, and the scatters accumulate with ONNX's
`reduction="add"`. Like kiln's reference kernels, convolution and normalization backwards compute in float64.
ATen adds float16/bfloat16 gradients one at a time, rounding each sum; onnxruntime has no reduced-float
scatter-add, so those add in rounds (the r-th contribution of every target in round r), rounded after each.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from onnx import TensorProto, helper

from kiln.ir import dtypes
from kiln.ir.ops.backward import _adaptive_windows, _avg_pool_windows

from kiln.codegen.onnx.context import LoweringContext
from kiln.codegen.onnx.graph import OnnxGraph, Value, onnx_dtype
from kiln.codegen.onnx.lowerings import _compute_dtype, _index64, _static_ints, lowers

_F64 = dtypes.float64


def _zeros(ctx: LoweringContext, shape: list[Any], dtype: dtypes.DType, fill: Any = 0) -> str:
    return ctx.node("Expand", [ctx.const(fill, dtype), ctx.dims(shape)])


def _reshape(ctx: LoweringContext, value: str, shape: list[Any]) -> str:
    return ctx.node("Reshape", [value, ctx.dims(shape)], allowzero=1)  # sizes may be 0: never "copy the input dim"


def _results(ctx: LoweringContext, values: list[str], t: dtypes.DType) -> list[str]:
    return [ctx.graph.cast(v, t, r.dtype) for v, r in zip(values, ctx.result_types)]


# ---------------------------------------------------------------------------------------------
# Pooling backward


def _rounded(ctx: LoweringContext, value: str, t: dtypes.DType, dtype: dtypes.DType) -> str:
    """`value` (computed in `t`) rounded to `dtype`, as ATen rounds each reduced-float quotient."""
    return ctx.graph.cast(ctx.node("Cast", [value], to=onnx_dtype(dtype)), dtype, t) if dtype is not t else value


def _spread(ctx: LoweringContext, grad_delta: str, x: Value, inside_h: np.ndarray, inside_w: np.ndarray,
            t: dtypes.DType) -> str:
    """Add each output's value to every input of its window in ATen's order (outputs in raster order), rounding
    to x's dtype after every addition: the r-th contribution of every input is added in round r, one scatter per
    round (the window structure is static, so the rounds are known at export time)."""
    height, width = inside_h.shape[1], inside_w.shape[1]
    out_h, in_h = np.nonzero(inside_h)  # sorted by output
    out_w, in_w = np.nonzero(inside_w)
    planes = ctx.sizes(x, range(x.rank - 2))
    values = ctx.node("Gather", [ctx.node("Gather", [grad_delta, ctx.const(out_h)], axis=-2), ctx.const(out_w)],
                      axis=-1)
    values = _reshape(ctx, values, [planes, out_h.size * out_w.size])
    targets = (in_h[:, None] * width + in_w[None, :]).reshape(-1)
    order = np.argsort(targets, kind="stable")
    rank = np.empty(targets.size, np.int64)
    rank[order] = np.arange(targets.size) - np.searchsorted(targets[order], targets[order])
    result = _zeros(ctx, [planes, height * width], t)
    for round_ in range(int(rank.max()) + 1 if rank.size else 0):
        chosen = np.flatnonzero(rank == round_)
        updates = ctx.node("Gather", [values, ctx.const(chosen)], axis=1)
        positions = ctx.node("Expand", [ctx.const(targets[chosen][None, :]), ctx.dims([planes, chosen.size])])
        added = ctx.node("ScatterElements", [_zeros(ctx, [planes, height * width], t), positions, updates], axis=1)
        result = _rounded(ctx, ctx.node("Add", [result, added]), t, ctx.declared_dtype)
    return ctx.graph.cast(_reshape(ctx, result, list(x.shape)), t, x.dtype)


def _static_spatial(grad: Value, x: Value) -> tuple[list[int], list[int]]:
    return (_static_ints(list(x.shape[-2:]), "spatial size"), _static_ints(list(grad.shape[-2:]), "spatial size"))


@lowers("aten.avg_pool2d_backward.default")
def _avg_pool2d_backward(ctx: LoweringContext, grad: Value, x: Value, kernel_size: list[int], stride: list[int],
                         padding: list[int], ceil_mode: bool, count_include_pad: bool,
                         divisor_override: int | None) -> str:
    t = _compute_dtype(x.dtype)
    (height, width), (out_h, out_w) = _static_spatial(grad, x)
    stride = list(stride) if stride else list(kernel_size)
    (inside_h, padded_h, clipped_h), (inside_w, padded_w, clipped_w) = (
        _avg_pool_windows(size, out, k, s, p)
        for size, out, k, s, p in zip((height, width), (out_h, out_w), kernel_size, stride, padding))
    if divisor_override is not None:
        divisor = np.full((out_h, out_w), divisor_override)
    elif count_include_pad:
        divisor = padded_h[:, None] * padded_w[None, :]
    else:
        divisor = clipped_h[:, None] * clipped_w[None, :]
    quotient = ctx.node("Div", [ctx.as_dtype(grad, t), ctx.const(divisor.astype(t.numpy))])
    return _spread(ctx, _rounded(ctx, quotient, t, ctx.declared_dtype), x, inside_h, inside_w, t)


@lowers("aten._adaptive_avg_pool2d_backward.default")
def _adaptive_avg_pool2d_backward(ctx: LoweringContext, grad: Value, x: Value) -> str:
    t = _compute_dtype(x.dtype)
    (height, width), (out_h, out_w) = _static_spatial(grad, x)
    (inside_h, length_h), (inside_w, length_w) = _adaptive_windows(height, out_h), _adaptive_windows(width, out_w)
    value = ctx.as_dtype(grad, t)
    for length in (length_h[:, None], length_w[None, :]):  # ATen divides twice, rounding each time
        value = _rounded(ctx, ctx.node("Div", [value, ctx.const(length.astype(t.numpy))]), t, ctx.declared_dtype)
    return _spread(ctx, value, x, inside_h, inside_w, t)


@lowers("aten.max_pool2d_with_indices_backward.default")
def _max_pool2d_backward(ctx: LoweringContext, grad: Value, x: Value, kernel_size: list[int], stride: list[int],
                         padding: list[int], dilation: list[int], ceil_mode: bool, indices: Value) -> str:
    """Each output's gradient is added to the input its (in-plane) index names; -1 (no input seen) is skipped."""
    t = _compute_dtype(x.dtype)
    planes = ctx.sizes(x, range(x.rank - 2))
    flat_grad = _reshape(ctx, ctx.as_dtype(grad, t), [planes, ctx.sizes(grad, [grad.rank - 2, grad.rank - 1])])
    flat_index = _reshape(ctx, indices.name, [planes, ctx.sizes(grad, [grad.rank - 2, grad.rank - 1])])
    kept = ctx.node("Not", [ctx.node("Equal", [flat_index, ctx.const(-1, dtypes.int64)])])
    updates = ctx.node("Where", [kept, flat_grad, ctx.const(0, t)])
    targets = ctx.node("Where", [kept, flat_index, ctx.const(0, dtypes.int64)])
    zeros = _zeros(ctx, [planes, ctx.sizes(x, [x.rank - 2, x.rank - 1])], t)
    result = ctx.node("ScatterElements", [zeros, targets, updates], axis=1, reduction="add")
    return ctx.graph.cast(_reshape(ctx, result, list(x.shape)), t, x.dtype)


# ---------------------------------------------------------------------------------------------
# Embedding backward and embedding bags


@lowers("aten.embedding_dense_backward.default")
def _embedding_dense_backward(ctx: LoweringContext, grad: Value, indices: Value, num_weights: Any, padding_idx: Any,
                              scale_grad_by_freq: bool) -> str:
    """ScatterND-add of the gradient rows into the rows their indices name (padding_idx gets none)."""
    t = _compute_dtype(grad.dtype)
    count, dim = ctx.sizes(indices, range(indices.rank)), grad.shape[-1]
    flat = _reshape(ctx, _index64(ctx, indices), [count])
    rows = _reshape(ctx, ctx.as_dtype(grad, t), [count, dim])
    if scale_grad_by_freq:
        ones = _zeros(ctx, [count], dtypes.int64, fill=1)
        counts = ctx.node("ScatterElements", [_zeros(ctx, [num_weights], dtypes.int64), flat, ones], axis=0,
                          reduction="add")
        # ATen's scale is the double 1/count converted to the gradient's dtype.
        scale = ctx.node("Div", [ctx.const(1.0, _F64), ctx.graph.cast(ctx.node("Gather", [counts, flat]),
                                                                       dtypes.int64, _F64)])
        scale = _rounded(ctx, scale, _F64, ctx.declared_dtype)
        scale = ctx.graph.cast(scale, _F64, t)
        rows = ctx.node("Mul", [rows, ctx.node("Unsqueeze", [scale, ctx.ints([1])])])
    kept = ctx.node("Not", [ctx.node("Equal", [flat, ctx.as_dtype(padding_idx, dtypes.int64)])])
    rows = ctx.node("Where", [ctx.node("Unsqueeze", [kept, ctx.ints([1])]), rows, ctx.const(0, t)])
    zeros, targets = _zeros(ctx, [num_weights, dim], t), ctx.node("Unsqueeze", [flat, ctx.ints([1])])
    if ctx.declared_dtype is t:  # onnxruntime adds the rows in index order, rounding like ATen
        return ctx.node("ScatterND", [zeros, targets, rows], reduction="add")
    return _rounding_scatter_add(ctx, zeros, targets, rows, flat, count, t)


def _rounding_scatter_add(ctx: LoweringContext, zeros: str, targets: str, rows: str, flat: str, count: Any,
                          t: dtypes.DType) -> str:
    """ScatterND-add that rounds to the reduced dtype after every addition, in index order, like ATen's loop
    (onnxruntime has no float16/bfloat16 scatter-add). A `Loop` adds, in round r, the r-th occurrence of every
    index: one addition per row and round, so rounding each round's sum rounds each addition."""
    dtype = ctx.declared_dtype
    positions = ctx.node("Range", [ctx.const(0, dtypes.int64), ctx.scalar(count), ctx.const(1, dtypes.int64)])
    same = ctx.node("Equal", [ctx.node("Unsqueeze", [flat, ctx.ints([1])]),
                              ctx.node("Unsqueeze", [flat, ctx.ints([0])])])
    earlier = ctx.node("Less", [ctx.node("Unsqueeze", [positions, ctx.ints([0])]),
                                ctx.node("Unsqueeze", [positions, ctx.ints([1])])])
    occurrence = ctx.node("ReduceSum", [ctx.graph.cast(ctx.node("And", [same, earlier]), dtypes.bool_, dtypes.int64),
                                        ctx.ints([1])], keepdims=0)
    # rounds = max occurrence + 1 (0 without indices)
    rounds = ctx.node("Add", [ctx.node("ReduceMax", [ctx.node("Concat", [occurrence, ctx.ints([-1])], axis=0)],
                                       keepdims=0), ctx.const(1, dtypes.int64)])
    body = OnnxGraph(ctx.graph.model, ctx.graph.dim_sources, parent=ctx.graph)
    step, keep_going, total = (ctx.graph.model.fresh(hint) for hint in ("round", "keep_going", "total"))
    chosen = body.node("Unsqueeze", [body.node("Equal", [occurrence, step]), body.ints([1])])
    added = body.node("ScatterND", [zeros, targets, body.node("Where", [chosen, rows, body.const(0, t)])],
                      reduction="add")
    rounded = body.node("Cast", [body.node("Cast", [body.node("Add", [total, added])], to=onnx_dtype(dtype))],
                        to=onnx_dtype(t))
    carried = body.node("Identity", [keep_going])
    graph = helper.make_graph(
        body.nodes, ctx.graph.model.fresh("rounds"),
        [helper.make_tensor_value_info(step, TensorProto.INT64, []),
         helper.make_tensor_value_info(keep_going, TensorProto.BOOL, []),
         helper.make_tensor_value_info(total, onnx_dtype(t), None)],
        [helper.make_tensor_value_info(carried, TensorProto.BOOL, []),
         helper.make_tensor_value_info(rounded, onnx_dtype(t), None)])
    return ctx.node("Loop", [rounds, "", zeros], body=graph)


_BAG_SUM, _BAG_MEAN, _BAG_MAX = 0, 1, 2


@lowers("aten._embedding_bag.default")
def _embedding_bag(ctx: LoweringContext, weight: Value, indices: Value, offsets: Value,
                   scale_grad_by_freq: bool = False, mode: int = 0, sparse: bool = False,
                   per_sample_weights: Value | None = None, include_last_offset: bool = False,
                   padding_idx: int = -1) -> list[str]:
    """Each index's bag is the number of offsets at or before its position, minus one; bags are reduced with
    ScatterND (add or max), and the first maximum's position with ScatterND min."""
    acc = dtypes.float32 if weight.dtype in (dtypes.float16, dtypes.bfloat16) else _F64  # ATen's accumulation
    bags, dim, count = ctx.out.shape[0], weight.shape[1], indices.shape[0]
    index_dtype = ctx.result_types[1].dtype
    flat = _index64(ctx, indices)
    starts = ctx.node("Slice", [_index64(ctx, offsets), ctx.ints([0]), ctx.dims([bags]), ctx.ints([0])])
    positions = ctx.node("Range", [ctx.const(0, dtypes.int64), ctx.scalar(count), ctx.const(1, dtypes.int64)])
    started = ctx.node("LessOrEqual", [ctx.node("Unsqueeze", [starts, ctx.ints([0])]),
                                       ctx.node("Unsqueeze", [positions, ctx.ints([1])])])
    bag_of = ctx.node("Sub", [ctx.node("ReduceSum", [ctx.graph.cast(started, dtypes.bool_, dtypes.int64),
                                                     ctx.ints([1])], keepdims=0), ctx.const(1, dtypes.int64)])
    valid = (ctx.node("Not", [ctx.node("Equal", [flat, ctx.const(padding_idx, dtypes.int64)])]) if padding_idx >= 0
             else ctx.node("Expand", [ctx.const(True, dtypes.bool_), ctx.dims([count])]))
    valid_rows = ctx.node("Unsqueeze", [valid, ctx.ints([1])])
    targets = ctx.node("Unsqueeze", [bag_of, ctx.ints([1])])
    sizes = ctx.node("ScatterElements", [_zeros(ctx, [bags], dtypes.int64), bag_of,
                                         ctx.graph.cast(valid, dtypes.bool_, dtypes.int64)], axis=0, reduction="add")
    rows = ctx.as_dtype(Value(ctx.node("Gather", [weight.name, flat], axis=0), weight.type), acc)
    if per_sample_weights is not None:
        rows = ctx.node("Mul", [rows, ctx.node("Unsqueeze", [ctx.as_dtype(per_sample_weights, acc), ctx.ints([1])])])
    no_bags = _zeros(ctx, [bags], dtypes.int64)
    if mode == _BAG_MAX:
        # ATen scans a bag from its first row, replacing on a strictly greater value: the first maximum of the
        # bag's numbers wins, unless the first row is NaN (nothing is greater). Positions are exact in float64.
        column = ctx.graph.cast(ctx.node("Unsqueeze", [positions, ctx.ints([1])]), dtypes.int64, _F64)
        numbers = ctx.node("And", [valid_rows, ctx.node("Not", [ctx.node("IsNaN", [rows])])])
        masked = ctx.node("Where", [numbers, rows, ctx.const(-math.inf, acc)])
        best = ctx.node("ScatterND", [_zeros(ctx, [bags, dim], acc, fill=-math.inf), targets, masked],
                        reduction="max")
        is_best = ctx.node("And", [numbers, ctx.node("Equal", [rows, ctx.node("Gather", [best, bag_of], axis=0)])])
        no_position = ctx.node("Expand", [ctx.as_dtype(count, _F64), ctx.dims([bags, dim])])
        first = ctx.node("ScatterND", [no_position, targets,
                                       ctx.node("Where", [is_best, column, ctx.as_dtype(count, _F64)])],
                         reduction="min")
        start = ctx.node("ScatterND", [ctx.node("Expand", [ctx.as_dtype(count, _F64), ctx.dims([bags])]), targets,
                                       ctx.node("Where", [valid, ctx.graph.cast(positions, dtypes.int64, _F64),
                                                          ctx.as_dtype(count, _F64)])], reduction="min")
        start = ctx.node("Expand", [ctx.node("Unsqueeze", [ctx.graph.cast(start, _F64, dtypes.int64), ctx.ints([1])]),
                                    ctx.dims([bags, dim])])
        # position `count` (an empty bag's) reads a row of zeros after the last, which its result masks
        padded_rows = ctx.node("Concat", [rows, _zeros(ctx, [1, dim], acc)], axis=0)
        padded_flat = ctx.node("Concat", [flat, ctx.ints([0])], axis=0)
        first = ctx.graph.cast(first, _F64, dtypes.int64)
        first = ctx.node("Where", [ctx.node("IsNaN", [ctx.node("GatherElements", [padded_rows, start], axis=0)]),
                                   start, first])
        empty = ctx.node("Unsqueeze", [ctx.node("Equal", [sizes, ctx.const(0, dtypes.int64)]), ctx.ints([1])])
        output = ctx.node("Where", [empty, ctx.const(0, acc), ctx.node("GatherElements", [padded_rows, first], axis=0)])
        max_indices = ctx.node("Where", [empty, ctx.const(0, dtypes.int64), ctx.node("Gather", [padded_flat, first])])
    else:
        masked = ctx.node("Where", [valid_rows, rows, ctx.const(0, acc)])
        output = ctx.node("ScatterND", [_zeros(ctx, [bags, dim], acc), targets, masked], reduction="add")
        if mode == _BAG_MEAN:
            divisor = ctx.graph.cast(ctx.node("Max", [sizes, ctx.const(1, dtypes.int64)]), dtypes.int64, acc)
            output = ctx.node("Div", [output, ctx.node("Unsqueeze", [divisor, ctx.ints([1])])])
        # (distinct outputs need distinct ONNX names)
        max_indices = ctx.node("Identity", [sizes]) if mode == _BAG_MEAN else _zeros(ctx, [bags], dtypes.int64)
    # The fused float sum path produces no offset2bag (its result type is empty then).
    fast_sum = ctx.result_types[1].shape[0] == 0
    offset2bag = ctx.const(np.zeros(0, index_dtype.numpy)) if fast_sum else ctx.graph.cast(bag_of, dtypes.int64,
                                                                                           index_dtype)
    bag_size = sizes if mode != _BAG_SUM else no_bags
    return [ctx.graph.cast(output, acc, weight.dtype), offset2bag,
            ctx.graph.cast(bag_size, dtypes.int64, index_dtype), ctx.graph.cast(max_indices, dtypes.int64, index_dtype)]


# ---------------------------------------------------------------------------------------------
# Convolution backward


def _window_index(padded: list[int], out_size: list[int], kernel: list[int], stride: list[int],
                  dilation: list[int]) -> np.ndarray:
    """Flat positions in the padded spatial grid of element [*o, *k] of every window: o*stride + k*dilation."""
    spatial = len(kernel)
    grids = np.meshgrid(*[np.arange(o) * s for o, s in zip(out_size, stride)],
                        *[np.arange(k) * d for k, d in zip(kernel, dilation)], indexing="ij")
    position = np.zeros_like(grids[0])
    for axis in range(spatial):
        position = position * padded[axis] + grids[axis] + grids[spatial + axis]
    return position.reshape(-1).astype(np.int64)


def _windows(ctx: LoweringContext, value: str, shape: list[Any], padding: list[int], kernel: list[int],
             stride: list[int], dilation: list[int], out_size: list[int]) -> tuple[str, np.ndarray, list[int]]:
    """value zero-padded, as (N, C, *out_size, *kernel) windows (im2col), with the flat index and padded sizes."""
    padded = [size + 2 * p for size, p in zip(shape[2:], padding)]
    if any(padding):
        value = ctx.node("Pad", [value, ctx.ints([0, 0] + padding + [0, 0] + padding)])
    index = _window_index(padded, out_size, kernel, stride, dilation)
    flat = _reshape(ctx, value, shape[:2] + [int(np.prod(padded))])
    windows = ctx.node("Gather", [flat, ctx.const(index)], axis=2)
    return _reshape(ctx, windows, shape[:2] + out_size + kernel), index, padded


@lowers("aten.convolution_backward.default")
def _convolution_backward(ctx: LoweringContext, grad: Value, x: Value, weight: Value, bias_sizes: Any,
                          stride: list[Any], padding: list[Any], dilation: list[Any], transposed: bool,
                          output_padding: list[Any], groups: Any, output_mask: list[bool]) -> list[str]:
    """A regular conv's dW correlates x's windows with dy and its dx scatters dy·W back over the windows; a
    transposed conv is the adjoint, so its dx is the regular conv of dy and its dW correlates dy's windows with x."""
    spatial = x.rank - 2
    stride, padding, dilation = ([*_static_ints(list(v), name)] * (spatial if len(v) == 1 else 1)
                                 for v, name in ((stride, "stride"), (padding, "padding"), (dilation, "dilation")))
    kernel = _static_ints(list(weight.shape[2:]), "kernel size")
    x_spatial = _static_ints(list(x.shape[2:]), "spatial size")
    grad_spatial = _static_ints(list(grad.shape[2:]), "spatial size")
    groups = int(groups)
    t = _F64
    xv, wv, dy = ctx.as_dtype(x, t), ctx.as_dtype(weight, t), ctx.as_dtype(grad, t)
    batch = x.shape[0]
    sp, kn = "xyz"[:spatial], "ijk"[:spatial]
    if transposed:
        cols, _, _ = _windows(ctx, dy, list(grad.shape), padding, kernel, stride, dilation, x_spatial)
        cols = _reshape(ctx, cols, [batch, groups, -1] + x_spatial + kernel)
        xg = _reshape(ctx, xv, [batch, groups, -1] + x_spatial)
        wg = _reshape(ctx, wv, [groups, -1] + list(weight.shape[1:]))
        grad_input = ctx.node("Einsum", [cols, wg], equation=f"ngo{sp}{kn},gco{kn}->ngc{sp}")
        grad_weight = ctx.node("Einsum", [xg, cols],
                               equation=f"ngc{sp},ngo{sp}{kn}->gco{kn}")
    else:
        cols, index, padded = _windows(ctx, xv, list(x.shape), padding, kernel, stride, dilation, grad_spatial)
        cols = _reshape(ctx, cols, [batch, groups, -1] + grad_spatial + kernel)
        dyg = _reshape(ctx, dy, [batch, groups, -1] + grad_spatial)
        wg = _reshape(ctx, wv, [groups, -1] + list(weight.shape[1:]))
        grad_weight = ctx.node("Einsum", [cols, dyg],
                               equation=f"ngc{sp}{kn},ngo{sp}->goc{kn}")
        grad_cols = ctx.node("Einsum", [dyg, wg], equation=f"ngo{sp},goc{kn}->ngc{sp}{kn}")
        plane = [batch, x.shape[1]]
        grad_cols = _reshape(ctx, grad_cols, plane + [index.size])
        targets = ctx.node("Expand", [ctx.const(index.reshape(1, 1, -1)), ctx.dims(plane + [index.size])])
        summed = ctx.node("ScatterElements", [_zeros(ctx, plane + [int(np.prod(padded))], t), targets, grad_cols],
                          axis=2, reduction="add")
        summed = _reshape(ctx, summed, plane + padded)
        ends = [p + size for p, size in zip(padding, x_spatial)]
        grad_input = ctx.node("Slice", [summed, ctx.ints(padding), ctx.ints(ends), ctx.ints(range(2, 2 + spatial))])
    grad_input = _reshape(ctx, grad_input, list(x.shape))
    grad_weight = _reshape(ctx, grad_weight, list(weight.shape))
    grad_bias = ctx.node("ReduceSum", [dy, ctx.ints([0] + list(range(2, grad.rank)))], keepdims=0)
    return _results(ctx, [grad_input, grad_weight, grad_bias], t)


# ---------------------------------------------------------------------------------------------
# Normalization backward: with x̂ = (x - mean) * rstd and g = dy * weight, per normalized group
#   dx = rstd * (g - mean(g) - x̂ * mean(g * x̂)),  dweight = Σ dy * x̂,  dbias = Σ dy  (over the batch).


def _normalized_grads(ctx: LoweringContext, x: str, dy: str, mean: str, rstd: str, weight: str | None,
                      axes: list[int], sum_axes: list[int]) -> tuple[str, str, str]:
    x_hat = ctx.node("Mul", [ctx.node("Sub", [x, mean]), rstd])
    weighted = ctx.node("Mul", [dy, weight]) if weight is not None else dy
    group_axes = ctx.ints(axes)

    def group_mean(value: str) -> str:
        return ctx.node("ReduceMean", [value, group_axes], keepdims=1)

    centered = ctx.node("Sub", [weighted, group_mean(weighted)])
    correction = ctx.node("Mul", [x_hat, group_mean(ctx.node("Mul", [weighted, x_hat]))])
    grad_input = ctx.node("Mul", [rstd, ctx.node("Sub", [centered, correction])])
    grad_weight = ctx.node("ReduceSum", [ctx.node("Mul", [dy, x_hat]), ctx.ints(sum_axes)], keepdims=0)
    grad_bias = ctx.node("ReduceSum", [dy, ctx.ints(sum_axes)], keepdims=0)
    return grad_input, grad_weight, grad_bias


@lowers("aten.native_layer_norm_backward.default")
def _layer_norm_backward(ctx: LoweringContext, grad: Value, x: Value, normalized_shape: list[Any], mean: Value,
                         rstd: Value, weight: Value | None, bias: Value | None, output_mask: list[bool]) -> list[str]:
    t = _F64
    axis = x.rank - len(normalized_shape)
    rows, row_size = ctx.sizes(x, range(axis)), ctx.sizes(x, range(axis, x.rank))
    as_rows = lambda value, size: _reshape(ctx, ctx.as_dtype(value, t), [rows, size])  # noqa: E731
    weight_row = _reshape(ctx, ctx.as_dtype(weight, t), [1, row_size]) if weight is not None else None
    grads = _normalized_grads(ctx, as_rows(x, row_size), as_rows(grad, row_size), as_rows(mean, 1),
                              as_rows(rstd, 1), weight_row, [1], [0])
    shapes = [list(x.shape), list(normalized_shape), list(normalized_shape)]
    return _results(ctx, [_reshape(ctx, g, s) for g, s in zip(grads, shapes)], t)


@lowers("aten.native_group_norm_backward.default")
def _group_norm_backward(ctx: LoweringContext, grad: Value, x: Value, mean: Value, rstd: Value, weight: Value | None,
                         n: Any, c: Any, hxw: Any, group: int, output_mask: list[bool]) -> list[str]:
    t = _F64
    grouped = [n, group, c // group, hxw]
    stats = [n, group, 1, 1]
    weight_grouped = _reshape(ctx, ctx.as_dtype(weight, t), [1, group, -1, 1]) if weight is not None else None
    grads = _normalized_grads(ctx, _reshape(ctx, ctx.as_dtype(x, t), grouped), _reshape(ctx, ctx.as_dtype(grad, t),
                              grouped), _reshape(ctx, ctx.as_dtype(mean, t), stats),
                              _reshape(ctx, ctx.as_dtype(rstd, t), stats), weight_grouped, [2, 3], [0, 3])
    shapes = [list(x.shape), [c], [c]]
    return _results(ctx, [_reshape(ctx, g, s) for g, s in zip(grads, shapes)], t)

