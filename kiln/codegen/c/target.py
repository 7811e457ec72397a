"""The C backend's `Target`: the dtypes, ops and argument forms its kernels (render.py) handle, and its cost model."""

from __future__ import annotations

from typing import Any

import sympy

from kiln.codegen.cost import kernel_work
from kiln.codegen.schedule import (
    CHANNEL_OPS, CONV_OPS, MATMUL_OPS, REDUCTION_OPS, SCHEDULED_OPS, SORT_OPS, WINDOW_OPS, same_dim,
)
from kiln.codegen.target import Target
from kiln.codegen.target import _tensor as _is_tensor
from kiln.ir import dtypes
from kiln.ir.dialect import bound_arguments

DTYPES = frozenset({dtypes.float32, dtypes.float64, dtypes.int64, dtypes.int32, dtypes.int8, dtypes.uint8,
                    dtypes.bool_})


def _unsupported_arguments(op: Any) -> str | None:
    """Why this op's arguments fall outside what the C kernels handle (None when they fit)."""
    name = op.opdef.name
    args = bound_arguments(op)
    rank = len(op.operands[0].type.shape) if op.operands else 0
    if name in REDUCTION_OPS:
        dtype_position = {"aten.sum.dim_IntList": 3, "aten.mean.dim": 3, "aten.prod.dim_int": 3,
                          "aten.mean.default": 1, "aten.prod.default": 1}.get(name)
        if dtype_position is not None and args[dtype_position] is not None:
            return "dtype= is not supported"
        if not name.startswith("aten.any.") and op.operands[0].type.dtype not in (dtypes.float32, dtypes.float64):
            return "only floating reductions are supported (any accepts every dtype)"
    if name in ("aten._softmax.default", "aten._log_softmax.default"):
        if rank == 0 or args[2]:
            return "only softmax of a tensor with dims, without half_to_float, is supported"
    if name == "aten.cumsum.default":
        if rank == 0:
            return "only cumsum of a tensor with dims is supported"
        if args[2] is not None and (args[2] != op.operands[0].type.dtype or args[2] == dtypes.bool_):
            return "dtype= other than the input's dtype is not supported"
    if name in SORT_OPS:
        if rank == 0 or op.operands[0].type.dtype not in (dtypes.float32, dtypes.float64, dtypes.int64):
            return "only sorting a float32, float64 or int64 tensor with dims is supported"
    if name in ("aten.index_select.default", "aten.gather.default"):
        if rank == 0 or len(op.operands[1].type.shape) not in ((0, 1) if "index_select" in name else (rank,)):
            return "only indexing a tensor with dims (gather: an index of the same rank) is supported"
    if name in ("aten.index.Tensor", "aten.index_put.default"):
        given = [i for i in args[1] if i is not None]
        masks = [i for i in given if i.type.dtype not in (dtypes.int64, dtypes.int32)]
        if masks and name == "aten.index.Tensor":
            return ("a boolean mask index makes the result's size depend on the mask's values (an unbacked size "
                    "symbol), and the C ABI sizes every output from the input shapes; index with integer tensors "
                    "(or use where / masked_fill)")
        if masks and not _mask_put_fits(op, args):
            return ("index_put with a boolean mask is supported only as the sole index (the other entries None) with "
                    "values that broadcast along the mask's count (size 1 or absent there)")
    if name == "aten.scatter_reduce.two" and args[4] not in ("sum", "prod", "mean", "amax", "amin", "max", "min"):
        return f"reduce={args[4]!r}"
    if name == "aten.native_layer_norm.default" and (len(args[1]) != 1 or rank == 0):
        return "only layer norm over the last dim is supported"
    if name == "aten.native_group_norm.default":
        shape = op.operands[0].type.shape
        if not isinstance(shape[1], int) or any(same_dim(d, 0) for d in shape[1:]):
            return "only group norm with a static channel count and non-empty channels and spatial dims is supported"
        if any(_is_tensor(a) and a.type.dtype not in (dtypes.float32, dtypes.float64) for a in args[:3]):
            return "only floating inputs are supported"
    if name in ("aten.div.Scalar_mode", "aten.fmod.Scalar", "aten.remainder.Scalar") and args[1] == 0:
        if not op.results[0].type.dtype.is_floating_point:
            return "integer division by zero"  # the interpreter raises; a C kernel cannot
    if name == "aten.gelu.default" and args[1] not in ("none", "tanh"):
        return f"approximate={args[1]!r}"
    if name == "aten.convolution.default":
        if len(op.results[0].type.shape) < 3:
            return "only batched convolutions are supported"
    if name in CONV_OPS | WINDOW_OPS | CHANNEL_OPS:
        # max pools also take the int8/uint8 values of quantized programs (kiln/passes/quant/lower.py)
        allowed = (dtypes.float32, dtypes.float64) + ((dtypes.int8, dtypes.uint8) if "max_pool" in name else ())
        for value in op.operands:
            if value.type.dtype not in allowed:
                return "only floating inputs are supported" + (" (and int8/uint8 for max pools)" if allowed[2:] else
                                                               "")
    if name in CHANNEL_OPS and rank < 2:
        return "only inputs with a channel dim are supported"
    if name in MATMUL_OPS:
        for value in op.operands:
            if value.type.dtype not in (dtypes.float32, dtypes.float64):
                return "only floating matmuls are supported"
    return None


SPARSE_LINEAR_LAYOUTS = ("sparse_csr", "sparse_bsr", "semi_structured")


def _unsupported_sparse(op: Any, name: str, layouts: list[str]) -> str | None:
    """Why an op with sparse operands has no C kernel (None for linear on a float32 CSR, BSR or 2:4 weight, and for
    a float32 convolution on a hybrid CSR or BSR weight whose taps are dense dims)."""
    supported = (f"the C backend runs linear layers with {', '.join(SPARSE_LINEAR_LAYOUTS)} weights, and "
                 "convolutions with sparse_bsr or sparse_csr weights whose kernel taps are dense dims, as `sparsify` "
                 "stores them")
    refusal = f"no C kernel for {', '.join(dict.fromkeys(layouts))} operands ({supported})"
    data, weight = op.operands[0].type, op.operands[1].type if len(op.operands) > 1 else None
    if weight is None or data.is_sparse or any(v.type.is_sparse for v in op.operands[2:] if _is_tensor(v)):
        return refusal
    if name == "aten.linear.default":
        if weight.layout.kind not in SPARSE_LINEAR_LAYOUTS:
            return refusal
    elif name == "aten.convolution.default":
        args = bound_arguments(op)
        if weight.layout.kind not in ("sparse_bsr", "sparse_csr") or weight.layout.dense_dim != len(weight.shape) - 2:
            return refusal
        if args[6] or args[8] != 1:
            return "sparse convolutions run ungrouped and not transposed in C"
        if not all(sympy.sympify(d).is_Integer for d in weight.shape):
            return "a sparse convolution's weight needs a static shape"
    else:
        return refusal
    if any(v.type.dtype != dtypes.float32 for v in [*op.operands, *op.results] if _is_tensor(v)):
        return "sparse linear layers and convolutions are float32 only"
    return None


def _mask_put_fits(op: Any, args: list) -> bool:
    """index_put with one boolean mask (the other entries None) whose values do not vary along the mask's count."""
    given = [(d, value) for d, value in enumerate(args[1]) if value is not None]
    if len(given) != 1 or given[0][1].type.dtype != dtypes.bool_:
        return False
    shape, position, width = op.operands[0].type.shape, given[0][0], len(given[0][1].type.shape)
    values = list(args[2].type.shape)
    aligned = position - (len(shape) - width + 1 - len(values))  # the values dim lined up with the count
    return len(values) <= len(shape) - width + 1 and (aligned < 0 or same_dim(values[aligned], 1))


TARGET = Target("C", "c", DTYPES, frozenset(SCHEDULED_OPS), _unsupported_arguments, _unsupported_sparse, kernel_work)
