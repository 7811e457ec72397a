"""`kiln quantize`: post-training quantization from the command line, written as .pt2 or ONNX (QDQ).

    kiln quantize kiln.models:mlp --scheme static --calibration calib.npz -o mlp_int8.pt2 --report
    kiln quantize model.pt2 --scheme dynamic -o model_int8.onnx
    kiln quantize net.py:Net --input x=8,64 --scheme weight-only-int4 --group-size 32 -o net_w4.pt2

The calibration file holds one array per model input, named like the input; its first axis counts calibration
batches, and each entry is one batch as the model takes it (`np.savez("calib.npz", x=np.stack(batches))`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

from kiln.cli.export import _progress, add_model_arguments, load_export_request, read_named_arrays
from kiln.ir.errors import KilnError, UnsupportedError

SCHEMES = {
    "static": "int8: uint8 activations calibrated per tensor, int8 per-channel weights (X86InductorQuantizer)",
    "dynamic": "int8: activation qparams chosen at run time, int8 per-channel weights",
    "weight-only-int8": "int8 per-channel weights of linear layers, float activations",
    "weight-only-int4": "int4 weights of linear layers in groups (--group-size), float activations",
    "fp16": "float16 weights of linear layers, float32 activations",
}
FORMATS = (".pt2", ".onnx")


def register(commands: Any) -> None:
    schemes = "\n".join(f"  {name:<17} {text}" for name, text in SCHEMES.items())
    parser = commands.add_parser(
        "quantize", help="quantize a model (PT2E post-training quantization) and write .pt2 or ONNX",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Quantize MODEL and write the quantized program (quantize/dequantize ops around float ops).\n\n"
                    f"Schemes:\n{schemes}\n\n"
                    "Calibration data (--calibration DATA.npz): one array per model input, named like it, whose\n"
                    "first axis counts batches: np.savez('calib.npz', x=np.stack(batches)).\n\n"
                    "Examples:\n"
                    "  kiln quantize kiln.models:mlp --scheme static --calibration calib.npz -o mlp.pt2 --report\n"
                    "  kiln quantize model.pt2 --scheme dynamic -o model_int8.onnx\n\n"
                    "Errors exit with status 2 and write nothing; files are written atomically.")
    parser.add_argument("model", metavar="MODEL", help="as in `kiln export`: a .pt2 file, kiln.models:NAME, or "
                                                       "path/to/file.py:NAME (a kiln or torch module)")
    parser.add_argument("--scheme", required=True, choices=sorted(SCHEMES), help="quantization scheme")
    parser.add_argument("--calibration", metavar="DATA.npz", default=None,
                        help="calibration batches (required for static; used by --report)")
    parser.add_argument("--reduce-range", action="store_true",
                        help="7-bit activations, for x86 CPUs without VNNI (static and dynamic)")
    parser.add_argument("--group-size", type=int, default=32, help="int4 group size: 32, 64, 128 or 256")
    parser.add_argument("--calibrate-with", choices=("c", "interpreter"), default="c",
                        help="run calibration batches compiled to C (default; falls back to the interpreter for "
                             "programs the C backend cannot build) or on the reference interpreter")
    parser.add_argument("--report", action="store_true",
                        help="print each quantized layer's SQNR and max error against the float model")
    parser.add_argument("--opset", type=int, default=None,
                        help="ONNX opset for OUT.onnx (18 to 23); default 20, and 21 for weight-only-int4, the first "
                             "with 4-bit weights (onnxruntime runs them as MatMulNBits)")
    parser.add_argument("-o", "--output", required=True, help="OUT.pt2 or OUT.onnx")
    add_model_arguments(parser)
    parser.set_defaults(handler=run_quantize)


def quantizer_for(scheme: str, reduce_range: bool = False, group_size: int = 32, for_onnx: bool = False) -> Any:
    """The quantizer of a scheme; for ONNX, static biases are int32 (the form onnxruntime fuses into QGemm)."""
    from kiln import quantization as kq
    if scheme in ("static", "dynamic"):
        config = kq.get_default_x86_inductor_quantization_config(is_dynamic=scheme == "dynamic",
                                                                 reduce_range=reduce_range, int32_bias=for_onnx)
        return kq.X86InductorQuantizer().set_global(config)
    return kq.WeightOnlyQuantizer(scheme.removeprefix("weight-only-"), group_size=group_size)  # int8, int4, fp16


def load_calibration(path: str, program: Any) -> list[tuple[np.ndarray, ...]]:
    """The batches of DATA.npz as argument tuples, in the order of the program's user inputs."""
    from kiln.ir.program import InputKind
    file = Path(path)
    specs = [(spec, arg) for spec, arg in zip(program.graph_signature.input_specs, program.body.args)
             if spec.kind is InputKind.USER_INPUT]
    names = [spec.name for spec, _ in specs]
    arrays = read_named_arrays(path, names, "calibration")
    scalars = [name for name in names if np.ndim(arrays[name]) == 0]
    if scalars:
        raise KilnError(f"the array {scalars[0]!r} in {file} is a scalar, without an axis of batches",
                        fix="stack the batches: numpy.savez(FILE, x=numpy.stack(batches))")
    counts = {len(arrays[name]) for name in names}
    if len(counts) != 1:
        raise KilnError(f"the arrays in {file} hold different numbers of batches: {sorted(counts)}")
    batches = []
    for index in range(counts.pop()):
        batch = []
        for (spec, arg), name in zip(specs, names):
            value = arrays[name][index]
            expected = arg.type.dtype.numpy
            if value.dtype != expected:
                raise KilnError(f"calibration input '{name}' is {value.dtype}, the model takes {expected}",
                                fix=f"save it as {expected}")
            batch.append(value)
        batches.append(tuple(batch))
    if not batches:
        raise KilnError(f"{file} holds no calibration batches")
    return batches


def _progress_bar(done: int, total: int, quiet: bool) -> None:
    if quiet:
        return
    width = 30
    filled = width * done // total
    print(f"\rcalibrating [{'#' * filled}{'.' * (width - filled)}] {done}/{total}", end="", file=sys.stderr,
          flush=True)
    if done == total:
        print(file=sys.stderr)


def run_quantize(options: argparse.Namespace) -> int:
    import kiln
    from kiln import quantization as kq
    from kiln.codegen.onnx import MAX_OPSET, MIN_OPSET
    from kiln.codegen.onnx.quantized import BLOCKED_QDQ_OPSET

    output = Path(options.output)
    if output.suffix not in FORMATS:
        raise KilnError(f"cannot tell the format of {output}", fix="write OUT.pt2 or OUT.onnx")
    if not output.parent.is_dir():
        raise KilnError(f"cannot write {output}: folder {output.parent} does not exist")
    if options.opset is not None and output.suffix != ".onnx":
        raise KilnError(f"--opset applies to ONNX output, not {output.suffix}", fix="write OUT.onnx, or drop --opset")
    if options.opset is not None and not MIN_OPSET <= options.opset <= MAX_OPSET:  # before calibrating
        raise KilnError(f"opset {options.opset} is not supported by the ONNX emitter",
                        fix=f"choose {MIN_OPSET} to {MAX_OPSET}")
    if options.scheme == "static" and options.calibration is None:
        raise KilnError("static quantization needs calibration data", fix="pass --calibration DATA.npz")
    if options.report and options.calibration is None:
        raise KilnError("--report compares outputs on data", fix="pass --calibration DATA.npz")
    progress = _progress(options)
    request = load_export_request(options.model, options.input, options.dynamic, progress)
    batches = load_calibration(options.calibration, request.program) if options.calibration is not None else []
    quantizer = quantizer_for(options.scheme, options.reduce_range, options.group_size, output.suffix == ".onnx")
    prepared = kq.prepare_pt2e(request.program, quantizer)
    if options.scheme == "static":
        backend = options.calibrate_with
        if backend == "c":
            from kiln.codegen.c.build import compiler
            backend = "c" if compiler() is not None else "interpreter"
        bar = lambda done: _progress_bar(done, len(batches), options.quiet)  # noqa: E731
        try:
            kq.calibrate(prepared, batches, backend=backend, progress=bar)
        except UnsupportedError as error:
            progress(f"the C backend cannot build this program ({error.cause}); calibrating on the interpreter")
            kq.calibrate(prepared, batches, backend="interpreter", progress=bar)
    quantized = kq.convert_pt2e(prepared)
    if options.report:
        progress("comparing with the float model")
        print(kq.report(request.program, quantized, batches))
    progress(f"writing {output}")
    if output.suffix == ".onnx":
        args = batches[0] if batches else request.args
        if args is None:
            from kiln.cli.export import example_inputs
            args = example_inputs(request.program)[0]
        opset = options.opset or (BLOCKED_QDQ_OPSET if options.scheme == "weight-only-int4" else None)
        kiln.onnx.export(quantized, tuple(args), opset_version=opset).save(output)
    else:
        kiln.save(quantized, output)
    progress("done")
    return 0
