"""The Triton backend's `Target`: the ops its kernel renderers (render.py and the modules beside it) take, the
dtypes they take, and the argument forms beyond the shared ones (kiln/codegen/target.py) they render exactly."""

from __future__ import annotations

from typing import Any

from kiln.codegen.cost import kernel_work
from kiln.codegen.schedule import CONV_OPS, LOOP_OPS, MATMUL_OPS, POINTWISE_OPS, QCONV_OPS, SCHEDULED_OPS
from kiln.codegen.target import Target, kernel_argument_limits, tensor_value
from kiln.codegen.triton.render import POINTWISE_RULES
from kiln.ir import dtypes
from kiln.ir.dialect import bound_arguments

DTYPES = frozenset({dtypes.float32, dtypes.float64, dtypes.float16, dtypes.bfloat16, dtypes.int64, dtypes.int32,
                    dtypes.int16, dtypes.int8, dtypes.uint8, dtypes.bool_})
# Every op the scheduler groups into kernels (each kind has a renderer in module.KERNEL_RENDERERS), the pointwise
# ones that have a rule, and the loops.
OPS = frozenset((SCHEDULED_OPS - POINTWISE_OPS) | (POINTWISE_OPS & set(POINTWISE_RULES)) | LOOP_OPS)
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


# The sparse weights sparse.py's kernels take (schedule_sparse_linear / schedule_sparse_conv's forms).
SPARSE_LINEAR_LAYOUTS = ("sparse_csr", "sparse_bsr", "semi_structured")
SPARSE_CONV_LAYOUTS = ("sparse_csr", "sparse_bsr")


def unsupported_sparse(op: Any, name: str, layouts: list[str]) -> str | None:
    """Why an op with sparse operands has no Triton kernel (None for linear on a CSR, BSR or 2:4 weight, and for an
    ungrouped, non-transposed convolution on a CSR or BSR weight whose taps are dense dims; float32 or float64)."""
    refusal = (f"no Triton kernel for {', '.join(dict.fromkeys(layouts))} operands (Triton, like target 'c', runs "
               f"sparse weights as linear layers on {', '.join(SPARSE_LINEAR_LAYOUTS)} weights and convolutions on "
               f"{' or '.join(SPARSE_CONV_LAYOUTS)} weights whose kernel taps are dense dims, as `sparsify` stores "
               "them)")
    data, weight = op.operands[0].type, op.operands[1].type if len(op.operands) > 1 else None
    if weight is None or data.is_sparse or any(v.type.is_sparse for v in op.operands[2:] if tensor_value(v)):
        return refusal
    if name == "aten.linear.default":
        if weight.layout.kind not in SPARSE_LINEAR_LAYOUTS:
            return refusal
    elif name == "aten.convolution.default":
        args = bound_arguments(op)
        if weight.layout.kind not in SPARSE_CONV_LAYOUTS or weight.layout.dense_dim != len(weight.shape) - 2:
            return refusal
        if args[6] or args[8] != 1:
            return "sparse convolutions run ungrouped and not transposed in Triton"
        if not all(isinstance(d, int) for d in weight.shape):
            return "a sparse convolution's weight needs a static shape"
    else:
        return refusal
    values = [v for v in [*op.operands, *op.results] if tensor_value(v)]
    if len({v.type.dtype for v in values}) != 1 or values[0].type.dtype not in (dtypes.float32, dtypes.float64):
        return "sparse linear layers and convolutions take float32 or float64 operands of one dtype in Triton"
    return None


TARGET = Target("Triton", "triton", DTYPES, OPS, unsupported_arguments, unsupported_sparse, kernel_work)
