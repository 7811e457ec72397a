"""`kiln sparsify`: prune linear (and convolution) weights and store them in sparse layouts, from the command line.

    kiln sparsify kiln.models:mlp --sparsity 0.9 -o mlp_pkg                      # C package, CSR kernels
    kiln sparsify model.pt2 --pattern block --block 16,16 --sparsity 0.8 --layout bsr -o pkg
    kiln sparsify net.py:Net --input x=8,64 --pattern semi_structured -o net.onnx   # weights written densified
    kiln sparsify kiln.models:mlp --sparsity 0.9 -o mlp_sparse.pt2               # sparse weights; torch loads it

It runs `prune{...},sparsify{...}` (kiln/passes/sparsity.py) on MODEL and prints one line per pruned weight: its
name, shape, achieved sparsity and the layout it is stored in. `-o X.pt2` writes the sparse program: torch loads
it too, building each sparse weight from its components (kiln/ir/serde/sparse_graph.py), and `kiln compile X.pt2`
runs the sparse kernels.
"""

from __future__ import annotations

import argparse
import math
import re
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from kiln.cli.compile import _check_output, _replace_dir, staging_dir
from kiln.cli.export import _progress, add_model_arguments, example_inputs, load_export_request
from kiln.ir.errors import KilnError

PATTERNS = ("unstructured", "block", "semi_structured")
SCOPES = ("layer", "global")
LAYOUTS = ("auto", "csr", "bsr", "semi_structured")
_BLOCK = re.compile(r"\s*(\d+)\s*,\s*(\d+)\s*")


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "sparsify", help="prune a model's weights and store them sparse (CSR, BSR, 2:4); write a C package or ONNX",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Prune MODEL's linear and convolution weights by magnitude, store the pruned linear weights in a\n"
                    "sparse layout, and write the result. Runs the passes prune{...},sparsify{...}; prints one line\n"
                    "per pruned weight: name, shape, achieved sparsity, layout.\n\n"
                    "Outputs (by -o):\n"
                    "  PKG       a folder, or a name without extension: a C package whose linear layers run CSR,\n"
                    "            BSR or 2:4 kernels\n"
                    "  OUT.onnx  ONNX: sparse weights are written densified\n"
                    "  OUT.pt2   the sparse program, which kiln compile and torch.export.load read (torch builds\n"
                    "            each sparse weight from its components)\n\n"
                    "Patterns:\n"
                    "  unstructured     zero the smallest weights of each layer (--scope global: across all)\n"
                    "  block            zero whole --block R,C blocks (for the BSR layout)\n"
                    "  semi_structured  2:4, two zeros in every group of four inputs (always sparsity 0.5)\n\n"
                    "Examples:\n"
                    "  kiln sparsify kiln.models:mlp --sparsity 0.9 -o mlp_pkg\n"
                    "  kiln sparsify model.pt2 --pattern block --block 16,16 --sparsity 0.8 --layout bsr -o pkg\n"
                    "  kiln sparsify kiln.models:mlp --pattern semi_structured -o mlp_24.onnx\n\n"
                    "Errors exit with status 2 and write nothing; files and packages appear atomically.")
    parser.add_argument("model", metavar="MODEL", help="as in `kiln compile`: a .pt2 file, kiln.models:NAME, or "
                                                       "path/to/file.py:NAME (a kiln or torch module)")
    parser.add_argument("--pattern", default="unstructured", metavar="{" + ",".join(PATTERNS) + "}",
                        help="what to zero (default: unstructured)")
    parser.add_argument("--sparsity", default=None, metavar="F",
                        help="fraction of weights (of blocks, for --pattern block) to zero, in [0, 1] (default 0.5; "
                             "2:4 is always 0.5)")
    parser.add_argument("--block", default="16,16", metavar="R,C",
                        help="block shape of --pattern block and of the BSR layout (default 16,16)")
    parser.add_argument("--scope", default="layer", metavar="{" + ",".join(SCOPES) + "}",
                        help="layer: every weight to --sparsity; global: one magnitude threshold across all "
                             "(unstructured only)")
    parser.add_argument("--layout", default="auto", metavar="{" + ",".join(LAYOUTS) + "}",
                        help="sparse layout of the pruned linear weights (auto: the measured cost model, see "
                             "docs/sparsity.md: 2:4 for one activation row, BSR, CSR where they beat dense)")
    parser.add_argument("--min-sparsity", default="0.5", metavar="F",
                        help="keep weights with fewer zeros (zero blocks, for BSR) than this dense (default 0.5)")
    parser.add_argument("-o", "--output", required=True, help="package folder, OUT.onnx, or OUT.pt2")
    add_model_arguments(parser)
    parser.set_defaults(handler=run_sparsify)


# ---------------------------------------------------------------------------------------------
# Flags: checked before MODEL loads; each error is one line


def _fraction(flag: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= 1:  # NaN too
        raise KilnError(f"{flag} must be a number in [0, 1], got {text!r}")
    return value


def _choice(flag: str, text: str, choices: tuple[str, ...]) -> str:
    if text not in choices:
        raise KilnError(f"unknown {flag} {text!r}: choose {', '.join(choices)}")
    return text


def parse_block(text: str) -> tuple[int, int]:
    match = _BLOCK.fullmatch(text)
    if match is None or min(int(match[1]), int(match[2])) < 1:
        raise KilnError(f"malformed --block {text!r}: write two positive sizes R,C, e.g. --block 16,16")
    return int(match[1]), int(match[2])


def output_kind(output: Path) -> str:
    """pt2, onnx or package (a folder, or a name without extension)."""
    if output.suffix in (".pt2", ".onnx"):
        return output.suffix[1:]
    if output.is_dir() or not output.suffix:
        return "package"
    raise KilnError(f"cannot tell what to write to {output}: give a package folder, OUT.onnx or OUT.pt2")


def _passes(options: argparse.Namespace) -> tuple[Any, Any]:
    from kiln.passes.sparsity import Prune, Sparsify
    pattern = _choice("--pattern", options.pattern, PATTERNS)
    scope = _choice("--scope", options.scope, SCOPES)
    layout = _choice("--layout", options.layout, LAYOUTS)
    sparsity = 0.5 if options.sparsity is None else _fraction("--sparsity", options.sparsity)
    min_sparsity = _fraction("--min-sparsity", options.min_sparsity)
    block = parse_block(options.block)
    if pattern == "semi_structured" and sparsity != 0.5:
        raise KilnError(f"--sparsity {options.sparsity} does not apply to --pattern semi_structured: 2:4 zeroes "
                        "exactly two of every four weights")
    if scope == "global" and pattern != "unstructured":
        raise KilnError(f"--scope global applies to --pattern unstructured, not {pattern}")
    return (Prune(sparsity=sparsity, pattern=pattern, block=block, scope=scope),
            Sparsify(layout=layout, block=block, min_sparsity=min_sparsity))


# ---------------------------------------------------------------------------------------------
# The summary


def layer_summary(pruned: Any, final: Any) -> list[tuple[str, list[int], float, str]]:
    """(weight name, shape, fraction of zeros, layout) of every weight `prune` acted on, in program order;
    `final` is `pruned` after `sparsify` (or `pruned` itself), whose weight types give the layouts."""
    from kiln.passes.base import input_spec
    from kiln.passes.sparsity import prunable_weights
    rows, seen = [], set()
    for weight, stored in zip(prunable_weights(pruned), prunable_weights(final), strict=True):
        spec = input_spec(pruned, weight)
        target = spec.target if spec is not None else None
        value = pruned.stored(target, None) if target else None
        if target in seen or not isinstance(value, np.ndarray) or value.dtype.kind != "f":
            continue
        seen.add(target)
        layout = stored.type.layout
        name = "dense" if not layout.is_sparse else layout.kind + (
            f" {layout.blocksize[0]}x{layout.blocksize[1]}" if layout.blocksize else "")
        rows.append((target, list(value.shape), 1 - np.count_nonzero(value) / max(value.size, 1), name))
    return rows


def _print_summary(rows: list[tuple[str, list[int], float, str]]) -> None:
    width = max(len(name) for name, *_ in rows)
    shape_width = max(len(str(shape)) for _, shape, *_ in rows)
    for name, shape, zeros, layout in rows:
        print(f"{name:<{width}}  {str(shape):<{shape_width}}  sparsity {zeros:.3f}  {layout}")


# ---------------------------------------------------------------------------------------------
# The command


def run_sparsify(options: argparse.Namespace) -> int:
    import kiln

    prune, sparsify = _passes(options)
    output = Path(options.output)
    kind = output_kind(output)
    if not output.parent.is_dir():
        raise KilnError(f"cannot write {output}: folder {output.parent} does not exist")
    if kind == "package":
        _check_output(output)
    progress = _progress(options)
    request = load_export_request(options.model, options.input, options.dynamic, progress)
    progress(f"running {prune}")
    pruned = kiln.passes.run(request.program, [prune])
    progress(f"running {sparsify}")
    final = kiln.passes.run(pruned, [sparsify])
    rows = layer_summary(pruned, final)
    if not rows:
        raise KilnError(f"{options.model} has no linear or convolution weights to prune")
    progress(f"writing {output}")
    if kind == "pt2":
        kiln.save(final, output)
    elif kind == "onnx":
        args = request.args if request.args is not None else example_inputs(final)[0]
        with warnings.catch_warnings(record=True) as caught:  # e.g. "computed densely": one line each
            warnings.simplefilter("always")
            exported = kiln.onnx.export(final, tuple(args))
        for warning in caught:
            print(f"kiln: warning: {warning.message}", file=sys.stderr)
        exported.save(output)
    else:
        staging = staging_dir(output)
        try:
            kiln.compile(final, output=staging)
            _replace_dir(staging, output)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    _print_summary(rows)
    progress("done")
    return 0


__all__ = ["LAYOUTS", "PATTERNS", "SCOPES", "layer_summary", "output_kind", "parse_block", "register",
           "run_sparsify"]
