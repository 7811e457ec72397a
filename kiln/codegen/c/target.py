"""The C backend's `Target`: the dtypes and ops its kernels (render.py) handle, the sparse forms it runs, and its
cost model."""

from __future__ import annotations

from typing import Any

import sympy

from kiln.codegen.cost import team_work
from kiln.codegen.schedule import LOOP_OPS, SCHEDULED_OPS
from kiln.codegen.target import Target, kernel_argument_limits, tensor_value
from kiln.ir import dtypes
from kiln.ir.dialect import bound_arguments

DTYPES = frozenset({dtypes.float32, dtypes.float64, dtypes.int64, dtypes.int32, dtypes.int8, dtypes.uint8,
                    dtypes.bool_})


SPARSE_LINEAR_LAYOUTS = ("sparse_csr", "sparse_bsr", "semi_structured")


def _unsupported_sparse(op: Any, name: str, layouts: list[str]) -> str | None:
    """Why an op with sparse operands has no C kernel (None for linear on a float32 CSR, BSR or 2:4 weight, and for
    a float32 convolution on a hybrid CSR or BSR weight whose taps are dense dims)."""
    supported = (f"the C backend runs linear layers with {', '.join(SPARSE_LINEAR_LAYOUTS)} weights, and "
                 "convolutions with sparse_bsr or sparse_csr weights whose kernel taps are dense dims, as `sparsify` "
                 "stores them")
    refusal = f"no C kernel for {', '.join(dict.fromkeys(layouts))} operands ({supported})"
    data, weight = op.operands[0].type, op.operands[1].type if len(op.operands) > 1 else None
    if weight is None or data.is_sparse or any(v.type.is_sparse for v in op.operands[2:] if tensor_value(v)):
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
    if any(v.type.dtype != dtypes.float32 for v in [*op.operands, *op.results] if tensor_value(v)):
        return "sparse linear layers and convolutions are float32 only"
    return None


TARGET = Target("C", "c", DTYPES, frozenset(SCHEDULED_OPS | LOOP_OPS), kernel_argument_limits, _unsupported_sparse,
                team_work)
