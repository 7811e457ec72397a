"""Composite ATen ops lowered to the highest-level ONNX op that computes them exactly, instead of to what their
decompositions emit: onnxruntime fuses and runs Gemm, LayerNormalization, BatchNormalization, Softmax, MaxPool and
Attention far better than the equivalent chains of small ops (and torch.onnx emits them too).

Each pattern is one entry of the lowering table: the exporter decomposes only ops the table lacks, so these
ops reach here whole. Each lowering covers every case of its op (dtype, rank, options), falling back to a longer
exact form where the ONNX op cannot express a case. docs/onnx.md lists what each op becomes per opset.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import sympy

from kiln.ir import dtypes
from kiln.ir.errors import UnsupportedError

from kiln.codegen.onnx.context import LoweringContext, normalize_axis
from kiln.codegen.onnx.graph import Value, onnx_dtype
from kiln.codegen.onnx.lowerings import (
    LOWERING_TABLE, _compute_dtype, _layer_norm, _matmul_dtype, _softmax_like, lowers, max_pool_values,
)
from kiln.codegen.onnx.lowerings import _batch_norm as batch_norm_formula
from kiln.codegen.onnx.quantized import dynamic_linear, int4_weight_linear


def _matmul_result(ctx: LoweringContext, result: str, t: dtypes.DType) -> str:
    if ctx.out_dtype.is_bool:
        return ctx.node("Not", [ctx.node("Equal", [result, ctx.const(0, t)])])
    return ctx.graph.cast(result, t, ctx.out_dtype)


@lowers("aten.linear.default")
def _linear(ctx: LoweringContext, x: Value, weight: Value, bias: Value | None = None) -> str:
    """Gemm (transB) for a 2-D input, as onnxruntime runs it best; MatMul with the transposed weight plus Add
    otherwise (onnxruntime fuses that Transpose into its MatMul kernel, and an initializer's is folded)."""
    quantized = dynamic_linear(ctx, bias) or int4_weight_linear(ctx, x, bias) if ctx.out_dtype is dtypes.float32 \
        else None
    if quantized is not None:
        return quantized
    t = _matmul_dtype(ctx.out_dtype)
    value, matrix = ctx.as_dtype(x, t), ctx.as_dtype(weight, t)
    if x.rank == 2 and weight.rank == 2 and t in (dtypes.float32, dtypes.float64):
        inputs = [value, matrix] + ([ctx.as_dtype(bias, t)] if bias is not None else [])
        return ctx.graph.cast(ctx.node("Gemm", inputs, transB=1), t, ctx.out_dtype)
    if weight.rank == 2:
        matrix = ctx.node("Transpose", [matrix], perm=[1, 0])
    result = ctx.node("MatMul", [value, matrix])
    if bias is not None:
        result = ctx.node("Add", [result, ctx.as_dtype(bias, t)])
    return _matmul_result(ctx, result, t)


@lowers("aten.matmul.default")
def _matmul(ctx: LoweringContext, a: Value, b: Value) -> str:
    """torch.matmul and ONNX MatMul both follow numpy.matmul (1-D operands, broadcast batch dims). A 1-D second
    operand after a matrix is written as a column, [K, 1], and the result squeezed: onnxruntime 1.32 fuses a
    Transpose before a MatMul into FusedMatMul, which ignores the transpose when the other operand is 1-D
    (A^T v came out as A viewed as [K, M] times v; tests/regressions/test_onnx_matrix_vector_after_transpose.py)."""
    t = _matmul_dtype(ctx.out_dtype)
    left, right = ctx.as_dtype(a, t), ctx.as_dtype(b, t)
    if b.rank == 1 and a.rank >= 2:
        column = ctx.node("MatMul", [left, ctx.node("Unsqueeze", [right, ctx.ints([1])])])
        return _matmul_result(ctx, ctx.node("Squeeze", [column, ctx.ints([-1])]), t)
    return _matmul_result(ctx, ctx.node("MatMul", [left, right]), t)


@lowers("aten.layer_norm.default")
def _layer_norm_composite(ctx: LoweringContext, x: Value, normalized_shape: list[Any], weight: Value | None = None,
                          bias: Value | None = None, eps: float = 1e-5, cudnn_enable: bool = True) -> str:
    return _layer_norm(ctx, x, normalized_shape, weight, bias, eps)[0]  # the one-output form: no statistics


@lowers("aten.batch_norm.default")
def _batch_norm(ctx: LoweringContext, x: Value, weight: Value | None, bias: Value | None, running_mean: Value | None,
                running_var: Value | None, training: bool, momentum: float, eps: float,
                cudnn_enabled: bool = True) -> str:
    """Inference batch norm is BatchNormalization, which onnxruntime folds into a preceding Conv (kiln's export
    folds it into the weights first where it can); batch statistics are computed in the graph."""
    t = _compute_dtype(ctx.out_dtype)
    if training or running_mean is None or running_var is None or x.rank < 2:
        ctx.result_types = ctx.result_types * 3
        return batch_norm_formula(ctx, x, weight, bias, running_mean, running_var, True, eps)[0]
    channels = x.shape[1]
    scale = ctx.as_dtype(weight, t) if weight is not None else ctx.node(
        "Expand", [ctx.const(1, t), ctx.dims([channels])])
    shift = ctx.as_dtype(bias, t) if bias is not None else ctx.node("Expand", [ctx.const(0, t), ctx.dims([channels])])
    result = ctx.node("BatchNormalization", [ctx.as_dtype(x, t), scale, shift, ctx.as_dtype(running_mean, t),
                                             ctx.as_dtype(running_var, t)], epsilon=float(eps))
    return ctx.graph.cast(result, t, ctx.out_dtype)


@lowers("aten.max_pool1d.default", "aten.max_pool2d.default", "aten.max_pool3d.default")
def _max_pool_composite(ctx: LoweringContext, x: Value, kernel_size: list[int], stride: list[int] = (),
                        padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False) -> str:
    spatial = int(ctx.op.name.split("max_pool")[1][0])
    return max_pool_values(ctx, x, kernel_size, stride, padding, dilation, ceil_mode, spatial=spatial)


def _softmax_int(op_type: str) -> Any:
    lower = _softmax_like(op_type)

    def softmax(ctx: LoweringContext, x: Value, dim: int, dtype: Any = None) -> str:
        declared = ctx.declared_dtype
        if dtype is not None and ctx.original_dtype(x) is not declared and declared.is_floating_point:
            # ATen converts the input to `dtype` first: round to it, then compute as that dtype computes
            compute = _compute_dtype(declared)
            rounded = ctx.operand(x, declared, compute)
            if compute is not declared:
                ctx.graph.widened[rounded] = declared
            x = Value(rounded, x.type.with_dtype(compute))
        return lower(ctx, x, dim)
    return softmax


LOWERING_TABLE["aten.softmax.int"] = _softmax_int("Softmax")
LOWERING_TABLE["aten.log_softmax.int"] = _softmax_int("LogSoftmax")


@lowers("aten.flatten.using_ints")
def _flatten(ctx: LoweringContext, x: Value, start_dim: int = 0, end_dim: int = -1) -> str:
    """ONNX Flatten always makes a matrix: torch's flatten(1, -1) on rank >= 2; other ranges are a Reshape."""
    start, end = normalize_axis(start_dim, max(x.rank, 1)), normalize_axis(end_dim, max(x.rank, 1))
    if x.rank >= 2 and start == 1 and end == x.rank - 1:
        return ctx.node("Flatten", [x.name], axis=1)
    shape = list(ctx.out.shape)
    return ctx.node("Reshape", [x.name, ctx.dims(shape)])  # (allowzero: a symbolic dim may be 0 at run time)


@lowers("aten.rms_norm.default")
def _rms_norm(ctx: LoweringContext, x: Value, normalized_shape: list[Any], weight: Value | None = None,
              eps: float | None = None) -> str:
    """RMSNormalization from opset 23; before it x / sqrt(mean(x^2) + eps) * weight, which onnxruntime fuses
    into its SimplifiedLayerNormalization kernel. eps defaults to the dtype's machine epsilon, as in ATen."""
    t = _compute_dtype(ctx.out_dtype)
    eps = float(np.finfo(t.numpy).eps if eps is None else eps)  # t: float32 for float16/bfloat16, as in ATen
    axis = x.rank - len(normalized_shape)
    value = ctx.as_dtype(x, t)
    # onnxruntime's kernels refuse an empty normalized shape (a symbolic dim may be 0 at run time); x * x instead
    # of x ** 2 keeps its fusion from matching
    nonempty = all(isinstance(d, int) and d > 0 for d in normalized_shape)
    if ctx.opset >= 23 and t is dtypes.float32 and nonempty:
        scale = ctx.as_dtype(weight, t) if weight is not None else ctx.node(
            "Expand", [ctx.const(1, t), ctx.dims(list(normalized_shape))])
        result = ctx.node("RMSNormalization", [value, scale], axis=axis, epsilon=eps, stash_type=onnx_dtype(t))
        return ctx.graph.cast(result, t, ctx.out_dtype)
    square = ctx.node("Pow", [value, ctx.const(2, t)]) if nonempty else ctx.node("Mul", [value, value])
    mean_square = ctx.node("ReduceMean", [square, ctx.ints(range(axis, x.rank))], keepdims=1)
    result = ctx.node("Div", [value, ctx.node("Sqrt", [ctx.node("Add", [mean_square, ctx.const(eps, t)])])])
    if weight is not None:
        result = ctx.node("Mul", [result, ctx.as_dtype(weight, t)])
    return ctx.graph.cast(result, t, ctx.out_dtype)


@lowers("aten.scaled_dot_product_attention.default")
def _attention(ctx: LoweringContext, query: Value, key: Value, value: Value, attn_mask: Value | None = None,
               dropout_p: float = 0.0, is_causal: bool = False, *, scale: float | None = None,
               enable_gqa: bool = False) -> str:
    """softmax(q k^T * scale + mask) v as MatMul/Softmax/MatMul (onnxruntime's attention fusions match it), or
    the Attention op from opset 23. Rows that an explicit mask hides entirely give zeros, like torch's
    _safe_softmax; a causal mask never hides a whole row."""
    t = _compute_dtype(ctx.out_dtype)
    q, k, v = (ctx.as_dtype(item, t) for item in (query, key, value))
    head_dim = query.shape[-1]
    if scale is None:
        if not isinstance(head_dim, int):
            raise UnsupportedError("the default attention scale needs a static head dim", fix="pass scale=")
        scale = 1 / math.sqrt(head_dim)
    # opset 23's Attention takes fewer key/value heads than query heads itself (GQA), so the cache is not copied
    attention_op = ctx.opset >= 23 and query.rank == 4 and key.rank == 4 and value.rank == 4 \
        and t is dtypes.float32 and dropout_p == 0
    if enable_gqa and not attention_op and query.rank >= 3 and key.rank >= 3 and key.shape[-3] != query.shape[-3]:
        k, v = (_repeat_heads(ctx, item, source, query.shape[-3]) for item, source in ((k, key), (v, value)))
    mask = None
    if attn_mask is not None:
        mask = attn_mask.name if attn_mask.dtype.is_bool else ctx.as_dtype(attn_mask, t)
    hidden = _hidden_rows(ctx, attn_mask, mask, t) if mask is not None else None
    if attention_op:
        inputs = [q, k, v] + ([mask] if mask is not None else [])
        result = ctx.node("Attention", inputs, scale=float(scale), is_causal=int(is_causal))
        if hidden is not None:
            result = ctx.node("Where", [hidden, ctx.const(0, t), result])
        return ctx.graph.cast(result, t, ctx.out_dtype)
    rank = key.rank
    scores = ctx.node("MatMul", [ctx.node("Mul", [q, ctx.const(scale, t)]),
                                 ctx.node("Transpose", [k], perm=[*range(rank - 2), rank - 1, rank - 2])])
    if is_causal:
        length, source = query.shape[-2], key.shape[-2]
        rows = ctx.node("Range", [ctx.scalar(0), ctx.scalar(length), ctx.scalar(1)])
        cols = ctx.node("Range", [ctx.scalar(0), ctx.scalar(source), ctx.scalar(1)])
        allowed = ctx.node("LessOrEqual", [ctx.node("Unsqueeze", [cols, ctx.ints([0])]),
                                           ctx.node("Unsqueeze", [rows, ctx.ints([1])])])
        scores = ctx.node("Where", [allowed, scores, ctx.const(-math.inf, t)])
    elif mask is not None:  # a bool mask as ATen's math attention applies it: made additive (0 / -inf), once
        additive = ctx.graph.memo(("additive_mask", mask, t), lambda: ctx.node(
            "Where", [mask, ctx.const(0, t), ctx.const(-math.inf, t)])) if attn_mask.dtype.is_bool else mask
        scores = ctx.node("Add", [scores, additive])
    weights = ctx.node("Softmax", [scores], axis=-1)
    # A fully hidden row's softmax is NaN; torch gives it zero weights, so a zero output row. Zero whichever of the
    # two is smaller: the weights [.., L, S] or the output [.., L, Ev].
    zero_output = hidden is not None and not (isinstance(key.shape[-2], int) and isinstance(value.shape[-1], int)
                                              and key.shape[-2] < value.shape[-1])
    if hidden is not None and not zero_output:
        weights = ctx.node("Where", [hidden, ctx.const(0, t), weights])
    if dropout_p > 0:  # training: onnxruntime's Dropout draws the mask (a random op, as in ATen)
        weights = ctx.node("Dropout", [weights, ctx.const(np.asarray(min(dropout_p, 1.0), dtype=t.numpy)),
                                       ctx.const(np.asarray(True))]) if dropout_p < 1 else \
            ctx.node("Mul", [weights, ctx.const(0, t)])
    result = ctx.node("MatMul", [weights, v])
    if zero_output:
        result = ctx.node("Where", [hidden, ctx.const(0, t), result])
    return ctx.graph.cast(result, t, ctx.out_dtype)


def _hidden_rows(ctx: LoweringContext, attn_mask: Value, mask: str, t: dtypes.DType) -> str | None:
    """Where the mask hides every key of a query row (torch's _safe_softmax gives those rows zero weights), computed
    once per mask for all the layers that share it; None when the mask is a constant that hides no row. With finite
    scores this is exactly where the masked scores are all -inf."""
    constant = ctx.graph.model.constant(mask)
    if constant is not None:
        hidden = ~constant.any(axis=-1, keepdims=True) if constant.dtype == np.bool_ else \
            (constant.max(axis=-1, keepdims=True, initial=-np.inf) == -np.inf)
        return ctx.const(hidden) if hidden.any() else None

    def build() -> str:
        if attn_mask.dtype.is_bool:
            visible = ctx.node("ReduceMax", [ctx.graph.cast(mask, dtypes.bool_, dtypes.int32), ctx.ints([-1])],
                               keepdims=1)
            return ctx.node("Equal", [visible, ctx.const(0, dtypes.int32)])
        return ctx.node("Equal", [ctx.node("ReduceMax", [mask, ctx.ints([-1])], keepdims=1), ctx.const(-math.inf, t)])
    return ctx.graph.memo(("hidden_rows", mask), build)


def _repeat_heads(ctx: LoweringContext, name: str, original: Value, heads: Any) -> str:
    """[..., H_kv, S, E] -> [..., H, S, E], each key/value head repeated in place (enable_gqa)."""
    shape = list(original.shape)
    repeats = sympy.sympify(heads) / shape[-3]
    grown = shape[:-2] + [repeats] + shape[-2:]
    grown[-4] = shape[-3]
    expanded = ctx.node("Expand", [ctx.node("Unsqueeze", [name, ctx.ints([len(shape) - 2])]), ctx.dims(grown)])
    return ctx.node("Reshape", [expanded, ctx.dims([*shape[:-3], heads, *shape[-2:]])])
