"""Core ATen ops the C backend computes through other core ops it has kernels for, applied by `kiln.compile`
before scheduling (like a backend's legalization table; the ops stay core everywhere else)."""

from __future__ import annotations

import math
from typing import Any, Callable

from kiln.ir.meta import shape_of
from kiln.ir.program import ExportedProgram
from kiln.ir.registry import OpOverload, handle, ops
from kiln.ir.retrace import default_decompositions, retrace

aten = ops.aten


def _batch_norm_batch_stats(input, weight, bias, training, momentum, eps):
    """Batch norm on the batch's statistics (`F.batch_norm(training=True)` without running stats, e.g. BiT's
    weight standardization) is a group norm with one group per channel over (batch, spatial): channels first, one
    row per channel, then back."""
    shape = list(shape_of(input))
    channels, rows = shape[1], shape[0] * math.prod(shape[2:])
    order = [1, 0, *range(2, len(shape))]  # swapping the first two dims is its own inverse
    by_channel = aten.reshape.default(aten.permute.default(input, order), [1, channels, rows])
    out, mean, rstd = aten.native_group_norm.default(by_channel, weight, bias, 1, channels, rows, channels, eps)
    out = aten.permute.default(aten.reshape.default(out, [channels, shape[0], *shape[2:]]), order)
    return out, aten.reshape.default(mean, [channels]), aten.reshape.default(rstd, [channels])


C_LEGALIZATIONS: dict[str, Callable[..., Any]] = {
    "aten._native_batch_norm_legit.no_stats": _batch_norm_batch_stats,
}


def legalize(program: ExportedProgram) -> ExportedProgram:
    """`program` with the ops of C_LEGALIZATIONS rewritten (unchanged when it has none)."""
    present = {op.name for op in program.nodes()} & set(C_LEGALIZATIONS)
    if not present:
        return program
    table: dict[OpOverload, Callable[..., Any]] = {handle(name): C_LEGALIZATIONS[name] for name in present}
    return retrace(program, {**default_decompositions(), **table})  # what they emit is decomposed too
