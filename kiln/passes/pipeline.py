"""Pipelines: parse `"decompose,canonicalize,fold-constants{freeze=true}"` and run it on a program.

The text syntax is xDSL's (options separated by spaces, list values by commas); kiln adds error messages
that name the pass and list the valid passes or options. Running verifies after each pass when asked (or
when KILN_DEBUG is set), prints IR after chosen passes, and times each pass.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence, TextIO

from xdsl.utils.arg_spec import parse_pipeline as parse_xdsl_pipeline
from xdsl.utils.exceptions import ArgSpecParseError

from kiln.ir.errors import KilnError, VerificationError
from kiln.ir.program import ExportedProgram
from kiln.passes.base import (
    PASSES, Pass, PassError, PipelineError, check_signature, clone_program, finish_pass, lookup_pass,
)

DEFAULT_PIPELINE = "remove-dropout,fold-batchnorm,decompose,canonicalize,fold-constants,cse,dce"

# Op names like aten.gelu.default are not identifiers to xDSL's lexer; quote them so they can be option values.
_DOTTED_VALUE = re.compile(r"(?<=[=,])([A-Za-z_][\w-]*(?:\.[\w-]+)+)(?=[,}\s])")


def parse_pipeline(text: str) -> list[Pass]:
    """The passes named by a pipeline string, with their options; PipelineError if anything is wrong."""
    quoted = _DOTTED_VALUE.sub(r'"\1"', _without_spaces_between_passes(text))
    try:
        specs = list(parse_xdsl_pipeline(quoted))
    except ArgSpecParseError as error:
        lines = str(error).splitlines()
        where = next((line for line in lines if line.startswith("pass-pipeline:")), "")
        column = where.rsplit(":", 1)[-1] if where else "?"
        raise PipelineError(f"malformed pass pipeline {text!r} at column {column}: {lines[-1].strip()}",
                            fix="write passes as name or name{key=value other=value}, separated by commas "
                                "(list values are comma-separated: keep=gelu,layer_norm)") from None
    passes = []
    for spec in specs:
        pass_class = lookup_pass(spec.name)
        options = {o.name: o for o in pass_class.options()}
        by_field = {o.field: o for o in options.values()}
        values: dict[str, Any] = {}
        for key, raw in spec.parameters.items():
            info = options.get(key) or by_field.get(key)
            if info is None:
                valid = ", ".join(f"{o.name} ({o.type_name})" for o in options.values()) or "none"
                raise PipelineError(f"unknown option '{key}' for pass '{spec.name}'",
                                    fix=f"options of {spec.name}: {valid}")
            values[info.field] = info.convert(spec.name, raw)
        passes.append(build_pass(pass_class, values))
    return passes


def _without_spaces_between_passes(text: str) -> str:
    """`decompose, dce` reads like `decompose,dce` (xDSL's lexer takes spaces only inside braces)."""
    pieces, depth, quoted = [], 0, False
    for char in text.strip():
        if char == '"':
            quoted = not quoted
        elif not quoted:
            depth += {"{": 1, "}": -1}.get(char, 0)
            if depth == 0 and char.isspace() and (not pieces or pieces[-1] in ",}" or pieces[-1].isspace()):
                continue
        pieces.append(char)
    return "".join(pieces)


def build_pass(pass_class: type[Pass], values: dict[str, Any]) -> Pass:
    """Instantiate a pass; its own validation errors become PipelineErrors naming it."""
    try:
        return pass_class(**values)
    except PipelineError:
        raise
    except KilnError as error:
        raise PipelineError(f"pass '{pass_class.name}': {error.cause}", fix=error.fix) from None
    except (TypeError, ValueError) as error:
        raise PipelineError(f"pass '{pass_class.name}': {error}") from None


@dataclass
class PassTiming:
    name: str
    seconds: float


@dataclass
class PassManager:
    """Runs a pipeline on programs. `run(program)` never edits its argument; `timings` keeps the last run's."""

    pipeline: str | Sequence[Pass]
    verify_each: bool = False
    print_ir_after: Sequence[str] = ()
    print_ir_after_all: bool = False
    timing: bool = False
    stream: TextIO | None = None  # where IR dumps and the timing report go (default: stderr)
    timings: list[PassTiming] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.passes = parse_pipeline(self.pipeline) if isinstance(self.pipeline, str) else list(self.pipeline)
        for name in self.print_ir_after:
            lookup_pass(name)
        self.verify_each = self.verify_each or bool(os.environ.get("KILN_DEBUG"))

    def run(self, program: ExportedProgram) -> ExportedProgram:
        self.timings = []
        current = finish_pass(clone_program(program))
        for pass_ in self.passes:
            start = time.perf_counter()
            try:
                current = finish_pass(pass_.apply_program(current))
            except KilnError as error:
                raise _in_pass(error, pass_) from error
            self.timings.append(PassTiming(str(pass_), time.perf_counter() - start))
            if self.verify_each:
                self._verify(pass_, current)
            if self.print_ir_after_all or pass_.name in self.print_ir_after:
                print(f"// -----// IR Dump After {pass_} //----- //\n{current.to_mlir()}\n", file=self._stream)
        if self.timing:
            print(self.report(), file=self._stream)
        return current

    @property
    def _stream(self) -> TextIO:
        return self.stream or sys.stderr

    @staticmethod
    def _verify(pass_: Pass, program: ExportedProgram) -> None:
        try:
            program.verify()
            check_signature(program)
        except KilnError as error:
            raise VerificationError(f"the program does not verify after pass '{pass_}': {error.cause}",
                                    source=error.source, fix=error.fix) from error

    def report(self) -> str:
        """mlir-opt's `--mlir-timing` layout: wall time per pass and the total."""
        total = sum(t.seconds for t in self.timings) or 1e-12
        width = max([len(t.name) for t in self.timings] + [5])
        lines = ["===" + "-" * 73 + "===", "Pass execution timing report".center(79), "===" + "-" * 73 + "===",
                 f"  Total Execution Time: {total:.4f} seconds", "", f"  ----Wall Time----  {'----Name----':<{width}}"]
        for entry in self.timings:
            lines.append(f"  {entry.seconds:8.4f} ({100 * entry.seconds / total:5.1f}%)  {entry.name}")
        lines.append(f"  {total:8.4f} (100.0%)  Total")
        return "\n".join(lines)


def _in_pass(error: KilnError, pass_: Pass) -> KilnError:
    """The same error (same class, so callers can still catch it) with the failing pass named."""
    cause = f"in pass '{pass_}': {error.cause}"
    try:
        return type(error)(cause, source=error.source, fix=error.fix)
    except TypeError:  # a subclass with its own constructor
        return PassError(cause, source=error.source, fix=error.fix)


def run(ep: ExportedProgram, pipeline: str | Sequence[Pass] = DEFAULT_PIPELINE, *, verify_each: bool = False,
        print_ir_after: Sequence[str] = (), print_ir_after_all: bool = False, timing: bool = False) -> ExportedProgram:
    """Run a pass pipeline on `ep`; return a new program (signature and weights kept consistent).

        optimized = kiln.passes.run(ep, "decompose,canonicalize,fold-constants{freeze=true},cse,dce")
    """
    manager = PassManager(pipeline, verify_each=verify_each, print_ir_after=tuple(print_ir_after),
                          print_ir_after_all=print_ir_after_all, timing=timing)
    return manager.run(ep)


_PLUGINS: dict[Path, Any] = {}


def load_plugin(path: str | os.PathLike[str]) -> Any:
    """Import a Python file of user passes (its `@register_pass` classes register on import); once per file."""
    resolved = Path(path).resolve()
    if resolved in _PLUGINS:
        return _PLUGINS[resolved]
    if not resolved.is_file():
        raise KilnError(f"pass plugin {str(path)!r} does not exist", fix="give the path of a .py file")
    module_name = f"kiln_pass_plugin_{len(_PLUGINS)}_{re.sub(r'[^A-Za-z0-9_]', '_', resolved.stem)}"
    spec = importlib.util.spec_from_file_location(module_name, resolved)
    if spec is None or spec.loader is None:
        raise KilnError(f"cannot import pass plugin {str(path)!r}", fix="give the path of a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    before = set(PASSES)
    try:
        spec.loader.exec_module(module)
    except KilnError:
        del sys.modules[module_name]
        raise
    except Exception as error:
        del sys.modules[module_name]
        raise KilnError(f"pass plugin {str(path)!r} failed to import: {type(error).__name__}: {error}",
                        fix="run the file with python to see the full traceback") from error
    module.__kiln_new_passes__ = sorted(set(PASSES) - before)
    _PLUGINS[resolved] = module
    return module
