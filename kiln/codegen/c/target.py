"""The C backend's `Target`: the dtypes and ops its kernels (render.py) handle, the sparse forms it runs, and its
cost model."""

from __future__ import annotations

from typing import Any

from kiln.codegen.c import recurrent
from kiln.codegen.cost import team_work
from kiln.codegen.schedule import LOOP_OPS, SCHEDULED_OPS
from kiln.codegen.target import Target, kernel_argument_limits, sparse_kernel_limits, tensor_value
from kiln.ir import dtypes

# (float16 and bfloat16 are stored only: ops on them compute in float32, legalize.py)
DTYPES = frozenset({dtypes.float32, dtypes.float64, dtypes.float16, dtypes.bfloat16, dtypes.int64, dtypes.int32,
                    dtypes.int16, dtypes.int8, dtypes.uint8, dtypes.bool_})


def _unsupported_sparse(op: Any, name: str, layouts: list[str]) -> str | None:
    """The shared sparse forms, float32 only."""
    limits = sparse_kernel_limits(op, name, layouts, "C")
    if limits is None and any(v.type.dtype != dtypes.float32 for v in [*op.operands, *op.results] if tensor_value(v)):
        return "sparse linear layers and convolutions are float32 only"
    return limits


TARGET = Target("C", "c", DTYPES, frozenset(SCHEDULED_OPS | LOOP_OPS), kernel_argument_limits, _unsupported_sparse,
                team_work, fuses_lstm_cell=recurrent.fuses, gathers_matrix_vector_batches=True,
                places_cat_parts=True, transposes_24_activations=False,
                binds_data_dependent_sizes=True, keeps_state=True, computes_half=False)
