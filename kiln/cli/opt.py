"""`kiln opt`: run a pass pipeline on a program file, like mlir-opt / xdsl-opt.

    kiln opt model.pt2 -p "decompose,canonicalize,cse,dce" -o out.pt2 [--timing] [--pass-plugin my_passes.py]
    kiln opt --list-passes

.pt2 files (torch.export's format) carry their weights. .mlir carries none: values that passes create
(folded constants) are written next to the output as `<output>.npz`, and an input's `<input>.npz`, when
present, is read back as its weights.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

from kiln.ir.errors import KilnError
from kiln.ir.files import atomic_write
from kiln.ir.program import ExportedProgram


def register(commands: Any) -> None:
    """Add the `opt` subcommand to the `kiln` parser's subcommands."""
    parser = commands.add_parser(
        "opt", help="run a pass pipeline on a program (.pt2 or .mlir)",
        description="Run a pass pipeline on a program, like mlir-opt. "
                    "Example: kiln opt model.pt2 -p 'decompose,canonicalize,cse,dce' -o out.pt2. "
                    ".mlir holds no weights: INPUT.npz, if present, is read as the input's weights, and weights "
                    "the program ends up with are written to OUTPUT.npz.")
    parser.add_argument("input", nargs="?", help="program file (.pt2 or .mlir; '-' reads MLIR from stdin)")
    parser.add_argument("-p", "--pipeline", default="",
                        help="passes, comma-separated, with options as name{key=value other=value}")
    parser.add_argument("-o", "--output", default="-", help="where to write the result (default: stdout)")
    parser.add_argument("--print-ir-after-all", action="store_true", help="print the IR after every pass (stderr)")
    parser.add_argument("--print-ir-after", action="append", default=[], metavar="PASS",
                        help="print the IR after each run of PASS (stderr); repeatable")
    parser.add_argument("--timing", action="store_true", help="report each pass's wall time (stderr)")
    parser.add_argument("--pass-plugin", action="append", default=[], metavar="FILE",
                        help="Python file registering passes (imported before the pipeline is parsed); repeatable")
    parser.add_argument("--no-verify-each", dest="verify_each", action="store_false",
                        help="skip verifying the program after each pass")
    parser.add_argument("--list-passes", action="store_true", help="list the passes, their options and exit")
    parser.set_defaults(handler=run_opt)


def run_opt(args: argparse.Namespace) -> int:
    import kiln.passes

    for plugin in args.pass_plugin:
        kiln.passes.load_plugin(plugin)
    if args.list_passes:
        print(list_passes())
        return 0
    if args.input is None:
        raise KilnError("kiln opt needs an input program", fix="kiln opt model.mlir -p PIPELINE -o out.mlir")
    _check_format(args.input, "input")
    if args.output != "-":
        _check_format(args.output, "output")
    manager = kiln.passes.PassManager(args.pipeline, verify_each=args.verify_each,
                                      print_ir_after=tuple(args.print_ir_after),
                                      print_ir_after_all=args.print_ir_after_all, timing=args.timing)
    program = _read(args.input)
    result = manager.run(program)
    _write(result, args.output)
    return 0


def list_passes() -> str:
    from kiln.passes import LAYOUTS, PASSES

    lines = ["Passes (pipeline syntax: name{option=value other=a,b}, passes separated by commas):", ""]
    for name in sorted(PASSES):
        pass_class = PASSES[name]
        lines.append(f"  {name:<18} {pass_class.description()}")
        for info in pass_class.options():
            default = repr(info.default) if not info.from_text else info.format(info.default) or "none"
            lines.append(f"      {info.name}: {info.type_name} = {default}  {info.help}".rstrip())
    lines += ["", "Prepack layouts (prepack{layouts=...}):"]
    lines += [f"  {name:<18} {layout.description}" for name, layout in sorted(LAYOUTS.items())]
    from kiln.passes import DEFAULT_PIPELINE
    lines += ["", f"Default pipeline: {DEFAULT_PIPELINE}"]
    return "\n".join(lines)


def _check_format(path: str, role: str) -> None:
    if path == "-":
        return
    suffix = Path(path).suffix
    if suffix not in (".mlir", ".pt2"):
        raise KilnError(f"unknown {role} format {suffix or '(no extension)'!r} for {path}",
                        fix="kiln opt reads and writes .pt2 files (torch.export's format) and .mlir files")


def _read(path: str) -> ExportedProgram:
    if path == "-":
        return ExportedProgram.from_mlir(sys.stdin.read())
    if not Path(path).is_file():  # a missing file, a folder, or a device or pipe that would be read forever
        raise KilnError(f"cannot read {path}: it does not exist or is not a regular file")
    if Path(path).suffix == ".pt2":
        from kiln.ir.serde import load
        return load(path)  # weights travel inside the archive
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise KilnError(f"cannot read {path}: {error.strerror}") from None
    weights: dict[str, np.ndarray] = {}
    sidecar = Path(path + ".npz")
    if sidecar.is_file():
        with np.load(sidecar) as stored:
            weights = {key: stored[key] for key in stored.files}
    program = ExportedProgram.from_mlir(text)
    constant_targets = {s.target for s in program.graph_signature.input_specs if s.kind.value == "CONSTANT_TENSOR"}
    program.constants = {k: v for k, v in weights.items() if k in constant_targets}
    program.state_dict = {k: v for k, v in weights.items() if k not in constant_targets}
    return program


def _write(program: ExportedProgram, path: str) -> None:
    if path != "-" and Path(path).suffix == ".pt2":
        from kiln.ir.serde import save
        save(program, path)  # atomic, like every kiln writer
        return
    text = program.to_mlir() + "\n"
    if path == "-":
        sys.stdout.write(text)
        return
    weights = {**program.state_dict, **program.constants}
    atomic_write(Path(path), lambda handle: handle.write(text.encode()))
    sidecar = Path(path + ".npz")
    if weights:
        atomic_write(sidecar, lambda handle: np.savez(handle, **weights))
    elif sidecar.exists():
        sidecar.unlink()  # a stale one from an earlier run would be read back as this program's weights


__all__ = ["register", "run_opt", "list_passes"]
