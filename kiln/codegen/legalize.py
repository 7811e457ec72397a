"""Core ATen ops a backend computes through other core ops it has kernels for, applied by the compile driver
before scheduling (like a backend's legalization table; the ops stay core everywhere else): the rewrites of
LEGALIZATIONS, and the registered decomposition of every core op the target has no kernel for (the backward ops of
a training program)."""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import sympy

from kiln.codegen.target import (
    HALF_ARITHMETIC, Target, half_native, mask_put_fits, put_fits, tensor_dtypes, tensor_value,
)
from kiln.ir import dtypes
from kiln.ir.dialect import bound_arguments
from kiln.ir.meta import dtype_of, shape_of
from kiln.ir.ops.shape import slice_bounds
from kiln.ir.program import ExportedProgram, result_types
from kiln.ir.pytree import tree_flatten
from kiln.ir.registry import REGISTRY, OpDef, OpOverload, handle, ops, split_bound
from kiln.ir.retrace import default_decompositions, retrace
from kiln.ir.symbolic import provably
from kiln.ir.types import TensorType
from kiln.passes import run as run_passes

aten = ops.aten


def _batch_norm_batch_stats(input, weight, bias, training, momentum, eps):
    """Batch norm on the batch's statistics (`F.batch_norm(training=True)` without running stats, e.g. BiT's
    weight standardization) is a group norm with one group per channel over (batch, spatial): channels first, one
    row per channel, then back. A channel count that may be 0 (a slice of a symbolic dim) would make a group norm
    of 0 groups, which ATen refuses, so then the statistics are reductions."""
    shape = list(shape_of(input))
    channels, rows = shape[1], shape[0] * math.prod(shape[2:])
    if provably(sympy.Gt(channels, 0)) is not True:
        return _batch_norm_by_reductions(input, weight, bias, eps)
    order = [1, 0, *range(2, len(shape))]  # swapping the first two dims is its own inverse
    by_channel = aten.reshape.default(aten.permute.default(input, order), [1, channels, rows])
    out, mean, rstd = aten.native_group_norm.default(by_channel, weight, bias, 1, channels, rows, channels, eps)
    out = aten.permute.default(aten.reshape.default(out, [channels, shape[0], *shape[2:]]), order)
    return out, aten.reshape.default(mean, [channels]), aten.reshape.default(rstd, [channels])


def _batch_norm_by_reductions(input, weight, bias, eps):
    """Batch statistics as a mean and a biased variance over every dim but the channels', in the statistics'
    dtype (float32 for float16/bfloat16 input with float32 parameters, as ATen's CPU kernel)."""
    rank = len(shape_of(input))
    stats_dtype = next((dtype_of(p) for p in (weight, bias) if p is not None), dtype_of(input))
    x = input if stats_dtype is dtype_of(input) else aten._to_copy.default(input, dtype=stats_dtype)
    others = [d for d in range(rank) if d != 1]
    mean = aten.mean.dim(x, others, True)
    rstd = aten.rsqrt.default(aten.add.Scalar(aten.var.correction(x, others, correction=0, keepdim=True), eps))
    out = aten.mul.Tensor(aten.sub.Tensor(x, mean), rstd)
    per_channel = [-1, *[1] * (rank - 2)]
    if weight is not None:
        out = aten.mul.Tensor(out, aten.view.default(weight, per_channel))
    if bias is not None:
        out = aten.add.Tensor(out, aten.view.default(bias, per_channel))
    if stats_dtype is not dtype_of(input):
        out = aten._to_copy.default(out, dtype=dtype_of(input))
    channels = shape_of(input)[1]
    return out, aten.view.default(mean, [channels]), aten.view.default(rstd, [channels])


def _batch_norm_legit(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """torch's training IR's batch norm (kiln's functional IR leaves the running statistics as they are): the
    batch's statistics when training, else the running ones, whose form the backends compile."""
    if training:
        return _batch_norm_batch_stats(input, weight, bias, training, momentum, eps)
    return aten._native_batch_norm_legit_no_training.default(input, weight, bias, running_mean, running_var,
                                                              momentum, eps)


def _layer_norm_flattened(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Layer norm over several trailing dims (`nn.LayerNorm([C, H, W])`) as one over their product, the last dim,
    which is what the kernels normalize; mean and rstd come back in ATen's shape, a 1 per normalized dim."""
    shape, count = list(shape_of(input)), len(normalized_shape)
    if count == 1:
        return NotImplemented
    outer, size = shape[:len(shape) - count], math.prod(normalized_shape)
    flat_weight = None if weight is None else aten.reshape.default(weight, [size])
    flat_bias = None if bias is None else aten.reshape.default(bias, [size])
    out, mean, rstd = aten.native_layer_norm.default(aten.reshape.default(input, [*outer, size]), [size],
                                                     flat_weight, flat_bias, eps)
    stats = [*outer, *[1] * count]
    return aten.reshape.default(out, shape), aten.reshape.default(mean, stats), aten.reshape.default(rstd, stats)


def _computed_in(dtype: dtypes.DType, op: Any, input: Any, *args: Any) -> Any:
    """`op` with dtype=: ATen converts the input to that dtype and computes there. The kernels compute in the
    input's own dtype, so the conversion comes first; an integer result, which ATen widens to int64 without dtype=, is
    converted back (the low bits of a wider sum or product are the narrower one's)."""
    result = op(aten._to_copy.default(input, dtype=dtype), *args)
    return result if dtype_of(result) is dtype else aten._to_copy.default(result, dtype=dtype)


def _reduced_in_dtype(op: Any) -> Callable[..., Any]:
    """sum / mean / prod with a dtype= (to bool it stays as it is, and refused)."""
    def rewrite(input, *args, dtype=None):
        if dtype is None or dtype is dtypes.bool_:
            return NotImplemented
        return _computed_in(dtype, op, input, *args)
    return rewrite


def _on_a_vector(op: Any) -> Callable[..., Any]:
    """softmax, log_softmax or cumsum of a 0-d tensor: the op along the one dim of its 1-element vector."""
    def rewrite(input, dim, *args, **kwargs):
        if shape_of(input):
            return NotImplemented
        return aten.reshape.default(op(aten.reshape.default(input, [1]), 0, *args, **kwargs), [])
    return rewrite


def _cumsum(input, dim, dtype=None):
    """cumsum of a 0-d tensor on its vector; with a dtype= other than the input's (but bool), converted first."""
    if not shape_of(input):
        return _on_a_vector(aten.cumsum.default)(input, dim, dtype=dtype)
    if dtype is None or dtype is dtype_of(input) or dtype is dtypes.bool_:
        return NotImplemented
    return _computed_in(dtype, aten.cumsum.default, input, dim)


def _slice_scatter(input, src, dim=0, start=None, end=None, step=1):
    """`src` written over a slice of `input`: a scatter along `dim` whose index runs over the slice's positions
    (ATen's slice arithmetic: negative bounds wrap, then clamp), the same for every other coordinate."""
    shape = list(shape_of(input))
    dim = dim % len(shape)
    first, _, length = slice_bounds("aten.slice_scatter.default", shape[dim], start, end, step)
    positions = aten.arange.start_step(first, first + length * step, step, dtype=dtypes.int64)
    along = [1] * len(shape)
    along[dim] = length
    index = aten.expand.default(aten.view.default(positions, along), list(shape_of(src)))
    if dtype_of(src) is not dtype_of(input):  # ATen copies src into the slice, converting it; scatter does not
        src = aten._to_copy.default(src, dtype=dtype_of(input))
    return aten.scatter.src(input, dim, index, src)


def _select_scatter(input, src, dim, index):
    """`src` written over one index of `dim`: a slice scatter of one position."""
    shape = list(shape_of(input))
    dim = dim % len(shape)
    if isinstance(index, int) and index < 0:
        index += shape[dim]
    return _slice_scatter(input, aten.unsqueeze.default(src, dim), dim, index, index + 1, 1)


MASK_DTYPES = (dtypes.bool_, dtypes.uint8)  # index dtypes ATen takes as masks


def _mask_coordinates(indices: list) -> list | None:
    """Boolean masks in an index as the coordinates of their true elements, ATen's own expansion: a mask of rank r
    becomes r integer indices, the columns of nonzero(mask), whose row count is a data-dependent size the target
    reads while running. None where there is no mask, or a 0-d one (which adds a dim instead)."""
    masks = [i is not None and dtype_of(i) in MASK_DTYPES for i in indices]
    if not any(masks) or any(m and not shape_of(i) for m, i in zip(masks, indices)):
        return None
    expanded = []
    for mask, index in zip(masks, indices):
        if not mask:
            expanded.append(index)
            continue
        coordinates = aten.nonzero.default(index)
        expanded += [aten.select.int(coordinates, 1, k) for k in range(len(shape_of(index)))]
    return expanded


def _index_by_masks(input, indices):
    """x[mask]: a gather at the mask's coordinates (an index without masks stays as it is)."""
    expanded = _mask_coordinates(indices)
    return NotImplemented if expanded is None else aten.index.Tensor(input, expanded)


def _index_put_by_masks(input, indices, values, accumulate=False):
    """x[mask] = values: a scatter to the mask's coordinates, where the values vary along the mask's count (the
    scatter kernel walks a mask itself only for values broadcast along it)."""
    if mask_put_fits(shape_of(input), [i if i is None else (dtype_of(i), shape_of(i)) for i in indices],
                     shape_of(values)):
        return NotImplemented
    expanded = _mask_coordinates(indices)
    return NotImplemented if expanded is None else aten.index_put.default(input, expanded, values, accumulate)


def _widened(value: Any) -> Any:
    """An argument in its opmath dtype: a half-precision tensor converted to float32 (exactly), a half dtype named
    float32."""
    if isinstance(value, (list, tuple)):
        return type(value)(_widened(v) for v in value)
    if isinstance(value, dtypes.DType):
        return dtypes.opmath_dtype(value)
    if tensor_value(value) and dtype_of(value) in dtypes.REDUCED_FLOATS:
        return aten._to_copy.default(value, dtype=dtypes.float32)
    return value


# Binary arithmetic whose ATen kernel reads its scalar arguments in the result's dtype: a float scalar, a float32 0-d
# tensor or add's alpha is rounded to float16 first for a float16 result; mul and div read them in float32 (opmath).
# (The ONNX lowering's `_arith` makes the same distinction.)
OPERANDS_IN_RESULT_DTYPE = frozenset(
    [f"aten.{op}.{overload}" for op in ("add", "sub", "remainder", "fmod") for overload in ("Tensor", "Scalar")] +
    ["aten.pow.Tensor_Tensor", "aten.pow.Tensor_Scalar", "aten.pow.Scalar", "aten.atan2.default",
     "aten.maximum.default", "aten.minimum.default"])
OPERANDS_IN_OPMATH = frozenset(f"aten.{op}.{overload}" for op in ("mul", "div")
                               for overload in ("Tensor", "Scalar", "Tensor_mode", "Scalar_mode"))


def _scalar_in(dtype: dtypes.DType, value: Any) -> Any:
    """A scalar argument as ATen reads it in `dtype`: a 0-d tensor converted, a number rounded (tensors with dims and
    symbolic sizes as they are)."""
    if tensor_value(value):
        return value if shape_of(value) or dtype_of(value) is dtype else aten._to_copy.default(value, dtype=dtype)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        with np.errstate(over="ignore"):
            return float(np.asarray(value, dtype=np.float64).astype(dtype.numpy))
    return value


def _in_float32(opdef: OpDef) -> Callable[..., Any]:
    """The op on half-precision values computed as ATen's CPU kernels do, for a target that only stores them: in
    float32 (every half operand converted, a half dtype= made float32), each half result rounded once."""
    def rewrite(*args: Any, **kwargs: Any) -> Any:
        bound = opdef.schema.bind(args, kwargs)
        wanted = [t.dtype if isinstance(t, TensorType) else None for t in result_types(opdef, bound)]
        operands = [dtype_of(v) for v in tree_flatten(bound)[0] if tensor_value(v)]
        if not _on_half(opdef.name, operands, [d for d in wanted if d is not None], bound):
            return NotImplemented
        if opdef.name in OPERANDS_IN_RESULT_DTYPE | OPERANDS_IN_OPMATH and wanted[0] in dtypes.REDUCED_FLOATS:
            dtype = wanted[0] if opdef.name in OPERANDS_IN_RESULT_DTYPE else dtypes.float32
            bound = [_scalar_in(dtype, v) for v in bound]
        positional, keywords = split_bound(opdef, [_widened(v) for v in bound])
        result = OpOverload(opdef)(*positional, **keywords)
        dtypes_left = iter(wanted)

        def narrowed(value: Any) -> Any:
            if isinstance(value, (list, tuple)):
                return type(value)(narrowed(v) for v in value)
            dtype = next(dtypes_left)
            return aten._to_copy.default(value, dtype=dtype) if dtype in dtypes.REDUCED_FLOATS else value
        return narrowed(result)
    return rewrite


def _log_softmax_in_half(input, dim, half_to_float):
    """ATen's CPU log_softmax over the last dim of float16/bfloat16 keeps the exp-sum and its log in the input dtype:
    (x - max) - round(log(round(sum(exp(x - max))))), float32 in between (as the ONNX lowering writes it). Rows
    that may be empty (whose max ATen refuses) are left to `_in_float32`: they hold nothing to round."""
    dtype, shape = dtype_of(input), shape_of(input)
    if dtype not in dtypes.REDUCED_FLOATS or half_to_float or not shape or dim % len(shape) != len(shape) - 1 or \
            provably(sympy.Gt(shape[-1], 0)) is not True:
        return NotImplemented

    def rounded(value: Any) -> Any:
        return aten._to_copy.default(aten._to_copy.default(value, dtype=dtype), dtype=dtypes.float32)
    x = aten._to_copy.default(input, dtype=dtypes.float32)
    shifted = aten.sub.Tensor(x, aten.amax.default(x, [dim], True))
    total = aten.sum.dim_IntList(aten.exp.default(shifted), [dim], True)
    return aten._to_copy.default(aten.sub.Tensor(shifted, rounded(aten.log.default(rounded(total)))), dtype=dtype)


def _addmm_in_half(input, mat1, mat2, *, beta=1, alpha=1):
    """addmm with alpha=0 on float16/bfloat16: ATen's half kernel multiplies the product by 0, so its NaN and
    infinities reach the result (float32's BLAS skips the product; a zero beta still ignores the bias)."""
    dtype = dtype_of(mat1)
    if dtype not in dtypes.REDUCED_FLOATS or alpha != 0:
        return NotImplemented
    product = aten.mul.Scalar(aten.mm.default(_widened(mat1), _widened(mat2)), 0)
    result = product if beta == 0 else aten.add.Tensor(aten.mul.Scalar(_widened(input), beta), product)
    return aten._to_copy.default(result, dtype=dtype)


# ops on half precision that ATen does not compute as float32 rounded once, rewritten to round where ATen's does
HALF_LEGALIZATIONS: dict[str, Callable[..., Any]] = {"aten._log_softmax.default": _log_softmax_in_half,
                                                     "aten.addmm.default": _addmm_in_half}


def _on_half(name: str, operands: list[dtypes.DType], results: list[dtypes.DType], arguments: list[Any]) -> bool:
    """Whether an op works on half-precision values other than as `half_native` allows: those it computes on, or
    makes (a half dtype= other than a conversion's)."""
    makes_half = any(isinstance(a, dtypes.DType) and a in dtypes.REDUCED_FLOATS for a in tree_flatten(arguments)[0])
    return makes_half and name != "aten._to_copy.default" or not half_native(name, operands, results)


LEGALIZATIONS: dict[str, Callable[..., Any]] = {
    "aten._native_batch_norm_legit.no_stats": _batch_norm_batch_stats,
    "aten._native_batch_norm_legit.default": _batch_norm_legit,
    "aten.native_layer_norm.default": _layer_norm_flattened,
    **{f"aten.{name}": _reduced_in_dtype(getattr(getattr(aten, name.split(".")[0]), name.split(".")[1]))
       for name in ("sum.dim_IntList", "mean.dim", "mean.default", "prod.dim_int", "prod.default")},
    "aten._softmax.default": _on_a_vector(aten._softmax.default),
    "aten._log_softmax.default": _on_a_vector(aten._log_softmax.default),
    "aten.cumsum.default": _cumsum,
    "aten.slice_scatter.default": _slice_scatter,
    "aten.select_scatter.default": _select_scatter,
    "aten.index.Tensor": _index_by_masks,
    "aten.index_put.default": _index_put_by_masks,
}


# rewrites whose result sizes a target reads while running: only for targets that bind data-dependent sizes
READS_SIZES = {"aten.index.Tensor", "aten.index_put.default"}


def _masked_index(op: Any) -> bool:
    return any(getattr(v.type, "dtype", None) in MASK_DTYPES for v in op.operands[1:])


# which instances of an op of LEGALIZATIONS need their rewrite (all, for ops not named here): a retrace for none
# would only cost time
NEEDED: dict[str, Callable[[Any], bool]] = {
    "aten.index.Tensor": _masked_index,
    "aten.index_put.default": lambda op: _masked_index(op) and not put_fits(op),
    "aten.native_layer_norm.default": lambda op: len(bound_arguments(op)[1]) > 1,
    **{f"aten.{name}": lambda op: bound_arguments(op)[-1] not in (None, dtypes.bool_)  # dtype=, the last
       for name in ("sum.dim_IntList", "mean.dim", "mean.default", "prod.dim_int", "prod.default")},
    **{f"aten.{name}.default": lambda op: not op.operands[0].type.shape for name in ("_softmax", "_log_softmax")},
    "aten.cumsum.default": lambda op: not op.operands[0].type.shape or
    bound_arguments(op)[2] not in (None, op.operands[0].type.dtype, dtypes.bool_),
}


def _first(*rewrites: Callable[..., Any]) -> Callable[..., Any]:
    """The first of `rewrites` that applies (returns something other than NotImplemented)."""
    def rewrite(*args: Any, **kwargs: Any) -> Any:
        for candidate in rewrites:
            result = candidate(*args, **kwargs)
            if result is not NotImplemented:
                return result
        return NotImplemented
    return rewrite


def target_decompositions(target: Target) -> dict[OpOverload, Callable[..., Any]]:
    """What `legalize` rewrites, by op: LEGALIZATIONS, then every core aten op `target` has no kernel for but the
    registry can decompose. Ops of other namespaces stay, so their own error can say how to lower them."""
    table: dict[OpOverload, Callable[..., Any]] = {
        handle(name): fn for name, fn in LEGALIZATIONS.items()
        if name not in READS_SIZES or target.binds_data_dependent_sizes}
    for opdef in REGISTRY.values():
        if (opdef.is_core and opdef.decomposition is not None and opdef.name not in target.ops
                and opdef.name not in LEGALIZATIONS and opdef.schema.namespace == "aten"):
            table[OpOverload(opdef)] = opdef.decomposition
    return table


def _with_half_rewrites(table: dict[OpOverload, Callable[..., Any]],
                        target: Target) -> dict[OpOverload, Callable[..., Any]]:
    """`table` with, for every op `target` lowers, the rewrite of its half-precision forms first."""
    table = dict(table)
    for name in target.ops - HALF_ARITHMETIC:
        if name in REGISTRY:
            overload = OpOverload(REGISTRY[name])
            rewrites = [HALF_LEGALIZATIONS.get(name), _in_float32(REGISTRY[name]), table.get(overload)]
            table[overload] = _first(*filter(None, rewrites))
    return table


def legalize(program: ExportedProgram, target: Target) -> ExportedProgram:
    """`program` with the ops of `target_decompositions(target)` rewritten, and for a target that only stores half
    precision its ops on half values (unchanged when there are none)."""
    table = target_decompositions(target)
    on_half = not target.computes_half and any(
        _on_half(op.name, *tensor_dtypes(op), bound_arguments(op)) for op in program.walk_nodes()
        if hasattr(op, "opdef") and op.name in target.ops - HALF_ARITHMETIC)
    present = {op.name for op in program.nodes() if NEEDED.get(op.name, lambda _: True)(op)} & {
        op.name for op in table}
    if not present and not on_half:
        return program
    if on_half:
        table = _with_half_rewrites(table, target)
    # What they emit is decomposed too. A decomposition computes every result, as the op's kernel does; dce drops
    # those the program never reads (the input gradient of a network's first convolution). Half-precision weights
    # converted to float32 become float32 weights, which GEMMs pack when the package is created.
    return run_passes(retrace(program, {**default_decompositions(), **table}),
                      "fold-constants{freeze=true views=false},cse,dce" if on_half else "cse,dce")
