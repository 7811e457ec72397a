"""`kiln verify`: run a model on the reference interpreter and on a backend, and name the first op that differs.

    kiln verify kiln.models:mlp --target c
    kiln verify model.pt2 --target onnx --inputs x.npz --rtol 1e-4 --atol 1e-5

MODEL is read by `kiln export`'s loader (kiln.cli.export.load_export_request). The inputs are an .npz (one array per
model input, named like it), else a zoo model's example inputs, else random ones. Exit status 0 when every op
agrees, 1 when one diverges (it is described on stdout), 2 on a usage error.
"""

from __future__ import annotations

import argparse
from typing import Any

from kiln.cli.export import _progress, add_model_arguments, load_export_request, read_named_arrays
from kiln.ir.errors import KilnError
from kiln.verification import TARGETS


def register(commands: Any) -> None:
    """Add the `verify` subcommand to the `kiln` parser's subcommands."""
    parser = commands.add_parser(
        "verify", help="find the first op where a backend (onnx, c, triton) disagrees with the reference interpreter",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run MODEL on kiln's reference interpreter and on a backend with every intermediate value\n"
                    "exposed (debug outputs in ONNX, a debug build in C), and name the first op whose result\n"
                    "differs beyond tolerance: the op, its source line, its inputs' statistics and the error.\n\n"
                    "Examples:\n"
                    "  kiln verify kiln.models:mlp --target c\n"
                    "  kiln verify model.pt2 --target onnx --inputs x.npz --rtol 1e-4 --atol 1e-5\n\n"
                    "Exit status: 0 when every op agrees, 1 when one diverges, 2 on a usage error.")
    parser.add_argument("model", metavar="MODEL",
                        help="a .pt2 file, kiln.models:NAME, or path/to/file.py:NAME or package.module:NAME "
                             "(a kiln.nn.Module or torch.nn.Module class, factory or instance), as in `kiln export`")
    parser.add_argument("--target", default="onnx", metavar="TARGET",
                        help=f"backend to check: {', '.join(TARGETS)} (default: onnx)")
    parser.add_argument("--inputs", default=None, metavar="INPUTS.npz",
                        help="the model's inputs, one array per input named like it (numpy.savez('x.npz', x=x)); "
                             "default: a zoo model's example inputs, else random values")
    parser.add_argument("--rtol", type=float, default=None, help="relative tolerance (with --atol; default: "
                        "torch.testing.assert_close's for the dtype)")
    parser.add_argument("--atol", type=float, default=None, help="absolute tolerance (with --rtol)")
    parser.add_argument("-p", "--pipeline", default=None,
                        help="pass pipeline run before lowering (default: the target's, as `kiln compile`)")
    parser.add_argument("--opset", type=int, default=None, help="ONNX opset (default: the exporter's)")
    add_model_arguments(parser)
    parser.set_defaults(handler=run_verify)


def run_verify(options: argparse.Namespace) -> int:
    from kiln.verification import verify
    if options.target not in TARGETS:  # before loading the model: a typo costs nothing
        raise KilnError(f"unknown verify target {options.target!r}", fix="choose one of " + ", ".join(TARGETS))
    if (options.rtol is None) != (options.atol is None):
        raise KilnError("--rtol and --atol go together", fix="pass both, e.g. --rtol 1e-4 --atol 1e-5")
    progress = _progress(options)
    request = load_export_request(options.model, options.input, options.dynamic, progress)
    names = list(request.program.graph_signature.user_inputs)
    inputs = read_named_arrays(options.inputs, names, "inputs") if options.inputs is not None else request.args
    progress(f"verifying {options.target} against the reference interpreter")
    result = verify(request.program, inputs, target=options.target, rtol=options.rtol, atol=options.atol,
                    pipeline=options.pipeline, opset_version=options.opset)
    print(result)
    return 0 if result.ok else 1


__all__ = ["register", "run_verify"]
