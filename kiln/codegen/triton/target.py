"""The Triton backend's `Target`: the ops render.py has kernels and rules for, the dtypes they take, and the
argument forms beyond the shared ones (kiln/codegen/target.py) that its math helpers render exactly."""

from __future__ import annotations

from typing import Any

from kiln.codegen.cost import kernel_work
from kiln.codegen.schedule import (
    CHANNEL_OPS, CONCAT_OPS, CONV_OPS, INDEX_OPS, MATMUL_OPS, PAD_OPS, POINTWISE_OPS, SOURCE_OPS, VIEW_OPS,
)
from kiln.codegen.target import Target, kernel_argument_limits
from kiln.codegen.triton.render import POINTWISE_RULES, POW_EXPONENTS, ROW_OPS
from kiln.ir import dtypes
from kiln.ir.dialect import bound_arguments

POOLS = {"aten.max_pool2d_with_indices.default", "aten.max_pool3d_with_indices.default", "aten.avg_pool2d.default",
         "aten.avg_pool3d.default", "aten._adaptive_avg_pool2d.default", "aten._adaptive_avg_pool3d.default"}
DTYPES = frozenset({dtypes.float32, dtypes.float64, dtypes.float16, dtypes.bfloat16, dtypes.int64, dtypes.int32,
                    dtypes.int16, dtypes.int8, dtypes.uint8, dtypes.bool_})
OPS = frozenset((POINTWISE_OPS & set(POINTWISE_RULES)) | SOURCE_OPS | INDEX_OPS | VIEW_OPS | MATMUL_OPS
                | CHANNEL_OPS | ROW_OPS | CONCAT_OPS | CONV_OPS | POOLS | PAD_OPS)
# Ops whose Triton rule is floating-point math: integer results would need C's integer forms.
FLOAT_ONLY = {"aten.div.Tensor_mode", "aten.div.Scalar_mode", "aten.fmod.Tensor", "aten.fmod.Scalar",
              "aten.remainder.Tensor", "aten.remainder.Scalar", "aten.round.default", "aten.trunc.default",
              "aten.ceil.default", "aten.floor.default"}


def unsupported_arguments(op: Any) -> str | None:
    shared = kernel_argument_limits(op)
    if shared:
        return shared
    name = op.opdef.name
    args = bound_arguments(op)
    if name in FLOAT_ONLY and not op.results[0].type.dtype.is_floating_point:
        return "integer results are not supported"
    if name == "aten.pow.Tensor_Scalar" and (isinstance(args[1], bool) or float(args[1]) not in POW_EXPONENTS):
        return f"exponent {args[1]!r} (Triton renders {', '.join(map(str, POW_EXPONENTS))})"
    if name in MATMUL_OPS | CONV_OPS and op.results[0].type.dtype not in (dtypes.float32, dtypes.float64):
        return "only float32 and float64 matmuls and convolutions are supported"
    if name in CONV_OPS and (args[6] or not all(isinstance(d, int) for d in op.operands[1].type.shape[2:])):
        return "only non-transposed convolutions with static kernel sizes are supported"
    if name.startswith("aten._adaptive") and not all(
            isinstance(d, int) for value in (op.operands[0], op.results[0]) for d in value.type.shape[2:]):
        return "only adaptive pooling over static spatial sizes is supported"
    return None


def unsupported_sparse(op: Any, name: str, layouts: list[str]) -> str:
    return f"no Triton kernel for {', '.join(dict.fromkeys(layouts))} operands (compile for target 'c')"


TARGET = Target("Triton", "triton", DTYPES, OPS, unsupported_arguments, unsupported_sparse, kernel_work)
