"""`kiln.compile`: export (for a module), build a package for a target, and load it.

The C target builds a shared library for this CPU's capability (`kiln.codegen.c.get_cpu_capability()`); the Triton
target writes Triton kernels and a launcher that run on the tensors' device (needs torch and triton).
"""

from __future__ import annotations

import pathlib
from typing import Any

from kiln.codegen.driver import build_package
from kiln.frontend.export import export
from kiln.ir.errors import KilnError
from kiln.ir.program import ExportedProgram
from kiln.runtime import load


def compile(ep_or_module: Any, target: str = "c", *, example_args: Any = None, dynamic_shapes: Any = None,
            pipeline: str | None = None, output: str | pathlib.Path | None = None,
            num_threads: int | None = None) -> Any:
    """Compile a program (or a module, exported with `example_args`) into a package at `output` (a temporary folder
    when None) and load it. `target`: "c" or "triton"; `num_threads` sets a C model's threads (default: OpenMP's)."""
    program = ep_or_module
    if not isinstance(program, ExportedProgram):
        if example_args is None:
            raise KilnError("compiling a module needs example_args to export it", fix="pass example_args=(x,)")
        program = export(program, tuple(example_args), dynamic_shapes=dynamic_shapes)
    return load(build_package(program, target, pipeline=pipeline, output=output), num_threads=num_threads)
