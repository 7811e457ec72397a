"""Core ATen ops a backend computes through other core ops it has kernels for, applied by the compile driver
before scheduling (like a backend's legalization table; the ops stay core everywhere else): the rewrites of
LEGALIZATIONS, and the registered decomposition of every core op the target has no kernel for (the backward ops of
a training program)."""

from __future__ import annotations

import math
from typing import Any, Callable

from kiln.codegen.target import Target
from kiln.ir.meta import shape_of
from kiln.ir.program import ExportedProgram
from kiln.ir.registry import REGISTRY, OpOverload, handle, ops
from kiln.ir.retrace import default_decompositions, retrace
from kiln.passes import run as run_passes

aten = ops.aten


def _batch_norm_batch_stats(input, weight, bias, training, momentum, eps):
    """Batch norm on the batch's statistics (`F.batch_norm(training=True)` without running stats, e.g. BiT's
    weight standardization) is a group norm with one group per channel over (batch, spatial): channels first, one
    row per channel, then back."""
    shape = list(shape_of(input))
    channels, rows = shape[1], shape[0] * math.prod(shape[2:])
    if isinstance(channels, int) and channels == 0:  # no channel, no group: the empty results as they are
        empty = aten.sum.dim_IntList(input, [d for d in range(len(shape)) if d != 1])
        return aten.clone.default(input), empty, empty
    order = [1, 0, *range(2, len(shape))]  # swapping the first two dims is its own inverse
    by_channel = aten.reshape.default(aten.permute.default(input, order), [1, channels, rows])
    out, mean, rstd = aten.native_group_norm.default(by_channel, weight, bias, 1, channels, rows, channels, eps)
    out = aten.permute.default(aten.reshape.default(out, [channels, shape[0], *shape[2:]]), order)
    return out, aten.reshape.default(mean, [channels]), aten.reshape.default(rstd, [channels])


LEGALIZATIONS: dict[str, Callable[..., Any]] = {
    "aten._native_batch_norm_legit.no_stats": _batch_norm_batch_stats,
}


def target_decompositions(target: Target) -> dict[OpOverload, Callable[..., Any]]:
    """What `legalize` rewrites, by op: LEGALIZATIONS, then every core aten op `target` has no kernel for but the
    registry can decompose. Ops of other namespaces stay, so their own error can say how to lower them."""
    table: dict[OpOverload, Callable[..., Any]] = {handle(name): fn for name, fn in LEGALIZATIONS.items()}
    for opdef in REGISTRY.values():
        if (opdef.is_core and opdef.decomposition is not None and opdef.name not in target.ops
                and opdef.name not in LEGALIZATIONS and opdef.schema.namespace == "aten"):
            table[OpOverload(opdef)] = opdef.decomposition
    return table


def legalize(program: ExportedProgram, target: Target) -> ExportedProgram:
    """`program` with the ops of `target_decompositions(target)` rewritten (unchanged when it has none)."""
    table = target_decompositions(target)
    present = {op.name for op in program.nodes()} & {op.name for op in table}
    if not present:
        return program
    # What they emit is decomposed too. A decomposition computes every result, as the op's kernel does; dce drops
    # those the program never reads (the input gradient of a network's first convolution).
    return run_passes(retrace(program, {**default_decompositions(), **table}), "cse,dce")
