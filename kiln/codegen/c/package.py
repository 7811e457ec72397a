"""The C backend's part of a package: model.c rendered from the schedule, built into model.so while the driver's
weights.bin is written, and the manifest fields the C loader checks (ABI version, CPU capability, build id)."""

from __future__ import annotations

import concurrent.futures
import pathlib
import shutil
from typing import Any, Callable

from kiln.codegen.c.attention import fuse_attention
from kiln.codegen.c.build import build_library, get_cpu_capability
from kiln.codegen.c.render import (
    ABI_VERSION, compile_time_packs, int4_weights, render, runtime_memory, stamp_build_id, weights_read_unpacked,
)
from kiln.codegen.c.target import TARGET
from kiln.codegen.memory import MemoryPlan, format_bytes
from kiln.codegen.kernels import Schedule
from kiln.codegen.schedule import schedule
from kiln.ir.files import atomic_write
from kiln.ir.program import ExportedProgram

FORMAT = "kiln-c-package"


def plan(program: ExportedProgram) -> Schedule:
    return fuse_attention(schedule(program, TARGET))


def packed_weights(plan: Schedule) -> tuple[list[Any], set[str]]:
    """The weights the compiler packs into the micro-kernels' layouts (packing.PackedWeight, one per layout), and
    the weights kernels read as they are (the others are stored packed only)."""
    capability = get_cpu_capability()
    packs = {pack.name: pack for pack in compile_time_packs(plan, capability).values()}
    return list(packs.values()), weights_read_unpacked(plan, capability)


def nibble_weights(plan: Schedule) -> set[str]:
    """Weights stored two int4 values per byte (the weight-only int4 linear layers)."""
    return int4_weights(plan)


def emit(out: pathlib.Path, plan: Schedule, program: ExportedProgram, memory: MemoryPlan, offsets: dict[str, int],
         write_weights: Callable[[pathlib.Path], None]) -> dict[str, Any]:
    """Write model.c, weights.bin and model.so into `out`; the manifest's C fields."""
    source, build_id = stamp_build_id(render(plan, offsets, memory, program.range_constraints,
                                             program.runtime_asserts))
    capability = get_cpu_capability()
    # The C compiler runs while the weights are written (GPT-2 small: 3.6 s and 1.7 s).
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        building = pool.submit(build_library, source, capability)
        # Every file is replaced atomically (a new inode): a model already loaded from this folder keeps its mapped
        # model.so and weights.bin, and readers never see a half-written package file.
        atomic_write(out / "model.c", source.encode())
        write_weights(out / "weights.bin")
        library = building.result()
    with open(library, "rb") as built:
        atomic_write(out / "model.so", lambda handle: shutil.copyfileobj(built, handle))
    runtime = runtime_memory(plan)
    return {"format": FORMAT, "abi_version": ABI_VERSION, "cpu_capability": capability,
            "library": "model.so", "source": "model.c", "build_id": build_id,
            "memory": {"scratch_bytes_per_thread": [format_bytes(need) for need in runtime["scratch_bytes_per_thread"]],
                       "packed_weight_bytes": runtime["packed_weight_bytes"]}}
