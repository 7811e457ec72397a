"""Common-subexpression elimination: an op identical to an earlier one (same name, operands, properties and
result types) is replaced by it. Random ops are never merged. A region's ops (a kiln.cond branch, a loop body)
are merged only with ops of that region: its block reads nothing from outside but its arguments, as torch's
subgraphs take every outside value as an input, so the interpreter and the .pt2 writer can run and write it."""

from __future__ import annotations

from typing import Any, Hashable

from xdsl.ir import Block, Operation

from kiln.ir.program import ExportedProgram
from kiln.passes.base import Pass, register_pass


@register_pass
class CommonSubexpressionElimination(Pass):
    """Merge identical ops (same op, operands and properties)."""

    name = "cse"

    def apply_program(self, program: ExportedProgram) -> ExportedProgram:
        _eliminate(program.body)
        return program


def _key(op: Operation) -> Hashable | None:
    opdef = getattr(op, "opdef", None)
    if opdef is None or "random" in opdef.tags or op.regions:
        return None
    properties = tuple(sorted(op.properties.items()))
    # Result types tell apart ops whose results carry fresh unbacked sizes (two nonzero calls).
    return (op.name, tuple(op.operands), properties, tuple(r.type for r in op.results))


def _eliminate(block: Block) -> None:
    # Each block starts afresh: only an operand-free op (zeros, arange) of a region could match an outer op, and
    # reusing that would be a read from outside the region.
    seen: dict[Any, Operation] = {}
    for op in list(block.ops):
        for region in op.regions:
            for nested in region.blocks:
                _eliminate(nested)
        key = _key(op)
        if key is None:
            continue
        earlier = seen.get(key)
        if earlier is None:
            seen[key] = op
            continue
        for old, new in zip(op.results, earlier.results):
            old.replace_all_uses_with(new)
        block.erase_op(op)
