"""The `kiln` command line: `kiln --version`, `kiln ops`; later issues add export, opt, compile, run."""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
from typing import Sequence

import kiln
from kiln.cli import compile, export, inspect, opt, quantize, sparsify, verify
from kiln.ir.errors import KilnError


class _Parser(argparse.ArgumentParser):
    """argparse that exits with status 2 and a one-line message (its default), plus a hint."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(2, f"kiln: error: {message}\n  fix: run `{self.prog} --help`\n")


def _ops_command(args: argparse.Namespace) -> int:
    from kiln.codegen import backends_lowering
    from kiln.ir.registry import REGISTRY

    rows = []
    for name, opdef in sorted(REGISTRY.items()):
        if args.pattern and not fnmatch.fnmatch(name, f"*{args.pattern}*"):
            continue
        if args.core and not opdef.is_core:
            continue
        lowered = ["interpreter"] if opdef.kernel is not None else []
        lowered += backends_lowering(name)
        if opdef.decomposition is not None:
            lowered.append("decomposes")
        kind = "core" if opdef.is_core else ("composite" if opdef.decomposition else "extra")
        rows.append({"op": name, "kind": kind, "tags": sorted(opdef.tags - {"core"}),
                     "schema": opdef.schema.text, "lowered_by": lowered})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    width = max((len(r["op"]) for r in rows), default=10)
    print(f"{'op':<{width}}  {'kind':<9}  {'lowered by':<28}  schema")
    for row in rows:
        print(f"{row['op']:<{width}}  {row['kind']:<9}  {', '.join(row['lowered_by']) or '-':<28}  {row['schema']}")
    core = sum(1 for r in rows if r["kind"] == "core")
    print(f"\n{len(rows)} ops ({core} core ATen)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kiln", description="Export and compile ML models: trace, optimize, emit .pt2/ONNX/C.")
    parser.add_argument("--version", action="version", version=f"kiln {kiln.__version__}")
    commands = parser.add_subparsers(dest="command", parser_class=_Parser)
    ops_parser = commands.add_parser("ops", help="list registered ops, their schemas and which backends lower them",
                                     description="List the op registry. Example: kiln ops --core conv")
    ops_parser.add_argument("pattern", nargs="?", help="only ops whose name contains this (glob allowed)")
    ops_parser.add_argument("--core", action="store_true", help="only core ATen ops")
    ops_parser.add_argument("--json", action="store_true", help="machine-readable output")
    ops_parser.set_defaults(handler=_ops_command)
    opt.register(commands)
    export.register(commands)
    inspect.register(commands)
    compile.register(commands)
    quantize.register(commands)
    sparsify.register(commands)
    verify.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return args.handler(args)
    except KilnError as error:
        print(f"kiln: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
