"""The Triton backend's part of a package: model.py (kernels and launcher) rendered from the schedule, and the
manifest fields the Triton loader reads."""

from __future__ import annotations

import hashlib
import pathlib
from typing import Any, Callable

from kiln.codegen.attention import fuse_attention
from kiln.codegen.memory import MemoryPlan
from kiln.codegen.kernels import Schedule
from kiln.codegen.schedule import schedule
from kiln.codegen.triton.module import render
from kiln.codegen.triton.target import TARGET
from kiln.ir.files import atomic_write
from kiln.ir.program import ExportedProgram

FORMAT = "kiln-triton-package"


def plan(program: ExportedProgram) -> Schedule:
    """The schedule, attention chains fused into one flash-attention kernel each (triton/attention.py)."""
    return fuse_attention(schedule(program, TARGET))


def nibble_weights(plan: Schedule) -> set[str]:
    return set()


def emit(out: pathlib.Path, plan: Schedule, program: ExportedProgram, memory: MemoryPlan, offsets: dict[str, int],
         write_weights: Callable[[pathlib.Path], None]) -> dict[str, Any]:
    """Write model.py and weights.bin into `out`; the manifest's Triton fields."""
    source = render(plan, memory)
    atomic_write(out / "model.py", source.encode())
    write_weights(out / "weights.bin")
    return {"format": FORMAT, "source": "model.py", "source_sha256": hashlib.sha256(source.encode()).hexdigest(),
            "kernels": len(plan.kernels)}
