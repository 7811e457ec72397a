"""The compile driver: a program through the compile pipeline, legalization for the target, the shared scheduler
and memory plan, then the backend's renderer, into a package folder.

A package is manifest.json (format, signature, symbols and their ranges, input/output dtypes and shapes, weight
offsets, memory), weights.bin (raw little-endian, 64-byte aligned, mmap-able) and the backend's files (C: model.c
and model.so; Triton: model.py). Backends are the packages of COMPILE_TARGETS; each has a `package` module with
`TARGET`, `plan(program)`, `nibble_weights(plan)` and `emit(...)`. `kiln.runtime.load` loads what this writes.
"""

from __future__ import annotations

import importlib
import json
import pathlib
import tempfile
from typing import Any, Callable

import numpy as np

from kiln.codegen import COMPILE_TARGETS
from kiln.codegen.legalize import legalize
from kiln.codegen.memory import format_bytes, plan_memory
from kiln.codegen.schedule import data_dependent_problems, refuse
from kiln.codegen.kernels import Schedule
from kiln.ir.dtypes import pack_nibbles
from kiln.ir.errors import GuardError, KilnError
from kiln.ir.files import atomic_write
from kiln.ir.program import ExportedProgram
from kiln.ir.symbolic import ValueRange, format_dim
from kiln.passes import run as run_passes

# A compiled package is for inference: eval-mode batch norm folds into its convolution or linear layer (as
# onnxruntime and torch.compile's freezing do), so the kernel's epilogue has no per-element normalization.
# A convolution drops the weight taps that only read padding (a 3x3 one over a 1x1 image keeps its centre tap).
# A GELU written out in elementary ops becomes one op (recognize-gelu), which an integer layer fuses. Attention over
# keys and values repeated per query head reads them unrepeated (group-query-attention: no copy of a KV cache).
# Quantized layers become integer kernels (lower-quantized); the weights of the layers left in float are dequantized
# once, here, and the quantize ops left around them compute in float. What else is computed from weights alone
# (wav2vec2's weight-normalized convolution: its weight's norm took a quarter of a run) is computed once, here, too;
# views of weights stay views, as before (a GEMM's packing reads a transposed weight where it lies; a materialized
# transpose would be a second plain copy wherever something else reads it).
DEFAULT_PIPELINE = ("lower-complex,remove-dropout,fold-batchnorm,trim-convolution-taps,recognize-gelu,"
                    "group-query-attention,lower-quantized,fold-dequantized-weights,"
                    "decompose{namespaces=aten,quantized_decomposed},canonicalize,"
                    "fold-constants{freeze=true views=false},cse,dce")
ALIGN = 64


def backend(target: str) -> Any:
    """The `package` module of compile target `target` ("c", "triton")."""
    if target not in COMPILE_TARGETS:
        raise KilnError(f"unknown compile target {target!r}", fix="one of " + ", ".join(sorted(COMPILE_TARGETS)))
    return importlib.import_module(f"{COMPILE_TARGETS[target]}.package")


def build_package(program: ExportedProgram, target: str = "c", *, pipeline: str | None = None,
                  output: str | pathlib.Path | None = None) -> pathlib.Path:
    """Compile `program` for `target` into the package folder `output` (a new temporary folder when None) and
    return the folder. Every file is replaced atomically, so a model loaded from the folder keeps running."""
    emitter = backend(target)
    try:
        program = legalize(run_passes(program, pipeline or DEFAULT_PIPELINE), emitter.TARGET)
    except GuardError:
        # a pass asked a question of a data-dependent size (a batch norm's check that a mask's count is not 0):
        # the target could not size that op's buffers anyway, and saying so is the error the user can act on
        refuse(data_dependent_problems(program, emitter.TARGET), emitter.TARGET)
        raise
    plan = emitter.plan(program)
    memory = plan_memory(plan, program.range_constraints)
    packs, read_as_is = emitter.packed_weights(plan) if hasattr(emitter, "packed_weights") else ([], None)
    weights, write_weights = _weights_file(program, plan, emitter.nibble_weights(plan), packs, read_as_is)
    out = pathlib.Path(output) if output is not None else pathlib.Path(tempfile.mkdtemp(prefix="kiln_pkg_"))
    out.mkdir(parents=True, exist_ok=True)
    offsets = {entry["name"]: entry["offset"] for entry in weights}
    manifest = emitter.emit(out, plan, program, memory, offsets, write_weights)
    allocated = plan.allocated_outputs()
    manifest.update({
        "weights_file": "weights.bin", "weights": weights,
        "symbols": [{"name": str(s), "lower": _bound(program.range_constraints.get(s), "lower"),
                     "upper": _bound(program.range_constraints.get(s), "upper")} for s in plan.symbols],
        "inputs": [{"name": b.name, "dtype": b.dtype.name, "shape": [format_dim(d) for d in b.shape]}
                   for b in plan.inputs],
        "outputs": [{"name": name, "dtype": buf.dtype.name, "shape": [format_dim(d) for d in shape],
                     **({"data_dependent": True} if buf in allocated else {})}
                    for name, (buf, shape) in zip(plan.output_names, plan.outputs)],
    })
    if plan.state:  # buffers the program mutates: the package keeps them, starting from their weights.bin values
        manifest["states"] = [{"name": buf.weight_key, "dtype": buf.dtype.name, "shape": [int(d) for d in buf.shape]}
                             for buf, _ in plan.state]
    if plan.unbacked:  # sizes the run reads from values: an output it allocates may be sized by them
        manifest["data_dependent_symbols"] = [
            {"name": str(s), "lower": _bound(program.range_constraints.get(s), "lower"),
             "upper": _bound(program.range_constraints.get(s), "upper")} for s in plan.unbacked]
    manifest.setdefault("memory", {}).update({
        "arena_bytes": format_bytes(memory.arena_bytes), "unplanned_bytes": format_bytes(memory.unplanned_bytes),
        "slots": len(memory.slots), "temps": len(memory.offsets)})
    atomic_write(out / "manifest.json", json.dumps(manifest, indent=2).encode())
    return out


def _weights_file(program: ExportedProgram, plan: Schedule, nibbles: set[str], packs: list[Any],
                  read_as_is: set[str] | None) -> tuple[list[dict], Callable[[pathlib.Path], None]]:
    """The manifest's weight entries (64-byte aligned offsets) and a function writing weights.bin to a path: the
    weights kernels read as they are (all of them when `read_as_is` is None), then the backend's packed forms
    (`packs`, each with a `name`, its `source` weight and a `pack` function)."""
    weights, written, chunks, size = [], set(), [], 0
    packed_only = {pack.source for pack in packs} - (read_as_is if read_as_is is not None else set())
    entries = []
    for buf in plan.buffers:
        if buf.kind not in ("weight", "state") or buf.weight_key in written or buf.weight_key in packed_only:
            continue
        written.add(buf.weight_key)
        array = np.ascontiguousarray(weight_array(program, buf.weight_key), dtype=buf.dtype.numpy)
        entries.append((buf.weight_key, array, buf.dtype.name, buf.weight_key in nibbles, {}))
    entries += [(pack.name, pack.pack(weight_array(program, pack.source)), "float32", False,
                 {"packed_from": pack.source, "layout": pack.layout}) for pack in packs]
    for name, array, dtype_name, nibbled, packing in entries:
        padding = -size % ALIGN
        size += padding
        data = pack_nibbles(array) if nibbled else array.astype(array.dtype.newbyteorder("<"), copy=False)
        weights.append({"name": name, "offset": size, "nbytes": data.nbytes, "dtype": dtype_name,
                        "shape": list(array.shape), "bits": 4 if nibbled else 8 * array.itemsize, **packing})
        chunks.append((padding, data))
        size += data.nbytes

    def write(path: pathlib.Path) -> None:
        def chunked(handle: Any) -> None:
            for padding, data in chunks:  # straight from the arrays: no copy of the whole blob in memory
                handle.write(b"\0" * padding)
                handle.write(data.reshape(-1).view(np.uint8))
        atomic_write(path, chunked)
    return weights, write


def weight_array(program: ExportedProgram, key: str) -> np.ndarray:
    """A weight buffer's values: a state-dict or constant entry, or one component of a sparse one (`target.values`,
    see schedule.sparse_weight_key)."""
    whole = program.stored(key, None)
    if whole is not None:
        return np.asarray(whole)
    target, _, component = key.rpartition(".")
    return program.stored(target).components[component]


def _bound(allowed: ValueRange | None, which: str) -> int | None:
    if allowed is None:
        return None
    value = getattr(allowed, which)
    return None if value in (float("inf"), float("-inf")) else int(value)
