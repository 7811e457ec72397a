"""The Triton backend's `Target`: the ops its kernel renderers (render.py and the modules beside it) take, the
dtypes they take, and the argument forms beyond the shared ones (kiln/codegen/target.py) they render exactly."""

from __future__ import annotations

from typing import Any

from kiln.codegen.cost import kernel_work
from kiln.codegen.schedule import (
    BIND_OPS, CONV_OPS, LOOP_OPS, MATMUL_OPS, POINTWISE_OPS, QCONV_OPS, SCHEDULED_OPS, SORT_OPS,
)
from kiln.codegen.target import (INTEGER_REDUCTIONS, Target, kernel_argument_limits, sparse_kernel_limits,
                                 tensor_value)
from kiln.codegen.triton.render import POINTWISE_RULES
from kiln.ir import dtypes
from kiln.ir.dialect import bound_arguments

DTYPES = frozenset({dtypes.float32, dtypes.float64, dtypes.float16, dtypes.bfloat16, dtypes.int64, dtypes.int32,
                    dtypes.int16, dtypes.int8, dtypes.uint8, dtypes.bool_})
# Every op the scheduler groups into kernels (each kind has a renderer in module.KERNEL_RENDERERS), the pointwise
# ones that have a rule, and the loops.
# (no sizes read while running: every launch grid is sized from the input shapes)
OPS = frozenset((SCHEDULED_OPS - POINTWISE_OPS - BIND_OPS) | (POINTWISE_OPS & set(POINTWISE_RULES)) | LOOP_OPS)
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
    if name in INTEGER_REDUCTIONS and op.operands[0].type.dtype not in (dtypes.float32, dtypes.float64):
        return "only floating reductions are supported (any accepts every dtype)"
    if name in FLOAT_ONLY and not op.results[0].type.dtype.is_floating_point:
        return "integer results are not supported"
    if name in SORT_OPS and op.operands[0].type.dtype not in (dtypes.float32, dtypes.float64, dtypes.int64):
        return "only sorting a float32, float64 or int64 tensor is supported"
    if name in MATMUL_OPS | CONV_OPS and op.results[0].type.dtype not in (dtypes.float32, dtypes.float64):
        return "only float32 and float64 matmuls and convolutions are supported"
    if name in CONV_OPS and (args[6] or not all(isinstance(d, int) for d in op.operands[1].type.shape[2:])):
        return "only non-transposed convolutions with static kernel sizes are supported"
    spatial = 3 if name.endswith("3d.default") else 2  # (the trailing dims: a 2d pool may take an unbatched input)
    if name.startswith("aten._adaptive") and not all(
            isinstance(d, int) for value in (op.operands[0], op.results[0]) for d in value.type.shape[-spatial:]):
        return "only adaptive pooling over static spatial sizes is supported"
    if name in QCONV_OPS and isinstance(args[2], int) and any(args[7]) and not (
            (-128 if op.operands[0].type.dtype is dtypes.int8 else 0) <= args[2] <= (
            127 if op.operands[0].type.dtype is dtypes.int8 else 255)):
        # (the im2col tile pads with the zero point as one of the activations' bytes)
        return f"a padded convolution whose activations' zero point {args[2]} lies outside their dtype's range"
    return None


def unsupported_sparse(op: Any, name: str, layouts: list[str]) -> str | None:
    """The shared sparse forms, on float32 or float64 operands of one dtype."""
    limits = sparse_kernel_limits(op, name, layouts, "Triton")
    values = [v for v in [*op.operands, *op.results] if tensor_value(v)]
    if limits is None and (len({v.type.dtype for v in values}) != 1
                           or values[0].type.dtype not in (dtypes.float32, dtypes.float64)):
        return "sparse linear layers and convolutions take float32 or float64 operands of one dtype in Triton"
    return limits


TARGET = Target("Triton", "triton", DTYPES, OPS, unsupported_arguments, unsupported_sparse, kernel_work,
                keeps_state=True)
