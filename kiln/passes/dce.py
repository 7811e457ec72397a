"""Dead-code elimination: ops whose results nothing uses (ops feeding outputs are used by the return)."""

from __future__ import annotations

from kiln.ir.program import ExportedProgram
from kiln.passes.base import Pass, erase_dead_program_ops, register_pass


@register_pass
class DeadCodeElimination(Pass):
    """Erase ops whose results are unused (unused weights leave the signature too)."""

    name = "dce"

    def apply_program(self, program: ExportedProgram) -> ExportedProgram:
        erase_dead_program_ops(program)
        return program  # the pass manager's bookkeeping drops the weights no op reads any more
