"""`kiln export`: trace a model and write it in a deployable format (`EXPORT_FORMATS`: onnx, ...).

    kiln export kiln.models:gpt --format onnx -o gpt.onnx --verify
    kiln export my_model.py:Net --format onnx -o net.onnx --input x=batch,3,64,64:float32 --dynamic batch=1:64
    kiln export model.pt2 --format onnx -o model.onnx

`load_export_request` (MODEL, --input, --dynamic → an ExportedProgram with example inputs) is shared by every
format and by `kiln compile`. MODEL is a kiln.nn.Module or a torch.nn.Module (traced through the torch bridge),
or a .pt2 file (read without torch). A format is an entry of EXPORT_FORMATS with a writer. Errors exit with
status 2 and write nothing.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import re
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from kiln.ir.errors import KilnError

_INPUT = re.compile(r"^(?P<name>[A-Za-z_]\w*)=(?P<dims>[^:]*)(?::(?P<dtype>\w+))?$")
_DYNAMIC = re.compile(r"^(?P<name>[A-Za-z_]\w*)=(?P<min>\d+)?:(?P<max>\d+|inf)?$")


@dataclass
class InputDecl:
    """`--input NAME=DIMS:DTYPE`: dims are ints or symbolic names (`batch,3,64,64`)."""

    name: str
    dims: list[int | str]
    dtype: str = "float32"


@dataclass
class ExportRequest:
    """Everything a format writer needs: the traced program, the model and the example inputs it was traced with."""

    model: Any  # None for a .pt2
    program: Any  # kiln.ExportedProgram
    args: tuple | None  # None for a .pt2: `example_inputs(program)` makes some when --verify needs them
    source: str
    dims: dict[str, tuple[int, float]] = field(default_factory=dict)  # Dim name -> (min, max)


def parse_input(text: str) -> InputDecl:
    match = _INPUT.match(text)
    if match is None:
        raise KilnError(f"malformed --input {text!r}", fix="write NAME=DIMS:DTYPE, e.g. x=batch,3,64,64:float32")
    dims: list[int | str] = []
    for token in filter(None, (t.strip() for t in match["dims"].split(","))):
        if token.isdigit():
            dims.append(int(token))
        elif token.isidentifier():
            dims.append(token)
        else:
            raise KilnError(f"malformed dim {token!r} in --input {text!r}",
                            fix="each dim is a non-negative integer or a name (a dynamic dim)")
    dtype = match["dtype"] or "float32"
    import kiln
    if not isinstance(getattr(kiln, dtype, None), kiln.dtype):
        raise KilnError(f"unknown dtype {dtype!r} in --input {text!r}", fix="use float32, int64, bool, ...")
    return InputDecl(match["name"], dims, dtype)


def parse_dynamic(text: str) -> tuple[str, int, float]:
    match = _DYNAMIC.match(text)
    if match is None:
        raise KilnError(f"malformed --dynamic {text!r}", fix="write DIM=MIN:MAX, e.g. batch=1:64 (MAX may be inf)")
    low = int(match["min"]) if match["min"] else 1
    high = float("inf") if match["max"] in (None, "inf") else int(match["max"])
    if low > high:
        raise KilnError(f"--dynamic {text!r}: the minimum {low} is above the maximum {high}")
    return match["name"], low, high


TORCH_INSTALL = "pip install 'kiln[torch]' (or pip install torch==2.13.0)"


def is_torch_module(value: Any) -> bool:
    """A torch.nn.Module instance, recognised by its classes' modules so that asking never imports torch."""
    return any(cls.__name__ == "Module" and cls.__module__ == "torch.nn.modules.module"
               for cls in type(value).__mro__)


def _is_module(value: Any) -> bool:
    import kiln
    return isinstance(value, kiln.nn.Module) or is_torch_module(value)


def _torch_missing(error: BaseException) -> bool:
    """An ImportError for torch itself (ModuleNotFoundError's `name`; `import torch.nn` names `torch` first)."""
    return isinstance(error, ImportError) and (getattr(error, "name", None) or "").split(".")[0] == "torch"


def load_model(spec: str) -> tuple[Any, tuple | None, Any]:
    """MODEL → (module in eval mode, default example args or None, default dynamic_shapes or None).

    `kiln.models:NAME` is a zoo entry (its inputs and dynamic shapes are the defaults); `path/to/file.py:Name`
    and `package.module:Name` name a kiln.nn.Module or torch.nn.Module: a class or a factory (called without
    arguments), or a module instance.
    """
    location, _, name = spec.rpartition(":")
    if not location or not name:
        raise KilnError(f"malformed MODEL {spec!r}",
                        fix="write path/to/file.py:ClassOrFactory, kiln.models:NAME, or a .pt2 file")
    if location == "kiln.models":
        import kiln.models
        if name not in {**kiln.models.MODELS, **kiln.models.LARGE_MODELS}:
            raise KilnError(f"unknown zoo model {name!r}",
                            fix="choose one of " + ", ".join([*kiln.models.MODELS, *kiln.models.LARGE_MODELS]))
        entry = kiln.models.get(name)
        return entry.model, tuple(entry.args), entry.dynamic_shapes
    if location.endswith(".py"):
        path = Path(location)
        if not path.is_file():
            raise KilnError(f"model file {location} does not exist")
        module_spec = importlib.util.spec_from_file_location(f"kiln_user_model_{path.stem}", path)
        module = importlib.util.module_from_spec(module_spec)  # type: ignore[arg-type]
        sys.modules[module.__name__] = module
        try:
            module_spec.loader.exec_module(module)  # type: ignore[union-attr]
        except Exception as error:
            if _torch_missing(error):
                raise KilnError(f"{location} imports torch, which is not installed", fix=TORCH_INSTALL) from None
            raise KilnError(f"importing {location} failed: {type(error).__name__}: {error}") from error
    else:
        try:
            module = importlib.import_module(location)
        except ImportError as error:
            if _torch_missing(error):
                raise KilnError(f"{location} imports torch, which is not installed", fix=TORCH_INSTALL) from None
            raise KilnError(f"cannot import module {location!r}: {error}") from None
    target = getattr(module, name, None)
    if target is None or not callable(target):
        found = [n for n, v in vars(module).items()
                 if (inspect.isclass(v) or _is_module(v)) and not n.startswith("_")]
        raise KilnError(f"{location} has no class or factory named {name!r}",
                        fix=("it defines " + ", ".join(found)) if found else "check the name after ':'")
    if _is_module(target):
        model = target  # a module instance (`model = Net()` in the file)
    else:
        try:
            model = target()
        except Exception as error:
            if _torch_missing(error):
                raise KilnError(f"{spec}() imports torch, which is not installed", fix=TORCH_INSTALL) from None
            raise KilnError(f"{spec}() failed: {type(error).__name__}: {error}",
                            fix="MODEL must be constructible without arguments (write a factory function)") from error
    if not _is_module(model):
        raise KilnError(f"{spec}() returned a {type(model).__name__}, not a kiln.nn.Module or torch.nn.Module",
                        fix="name a module class, a module, or a function that returns one")
    return model.eval(), None, None  # inference export, as kiln.models' entries are


def _example_size(low: int, high: float) -> int:
    return int(min(max(2, low), high))  # 2: sizes 0 and 1 are where tracing specializes


def load_export_request(model_spec: str, inputs: list[str], dynamic: list[str],
                        progress: Callable[[str], None] = lambda message: None) -> ExportRequest:
    """Load MODEL, build example inputs from --input (or the zoo entry), apply --dynamic ranges, and trace.

    A torch.nn.Module goes through torch.export (kiln.from_torch) with the same inputs as torch tensors and
    the same dims as torch.export.Dim; a .pt2 file is read with kiln.load.
    """
    import kiln

    if model_spec.endswith(".pt2"):
        return _load_pt2_request(model_spec, inputs, dynamic, progress)
    progress(f"loading {model_spec}")
    model, default_args, default_dynamic = load_model(model_spec)
    declared = [parse_input(text) for text in inputs]
    ranges: dict[str, tuple[int, float]] = {}
    for text in dynamic:
        name, low, high = parse_dynamic(text)
        ranges[name] = (low, high)
    forward_names = list(inspect.signature(model.forward).parameters)
    if declared:
        unknown = [d.name for d in declared if d.name not in forward_names]
        if unknown:
            raise KilnError(f"--input names {unknown} are not parameters of {type(model).__name__}.forward",
                            fix=f"its inputs are {', '.join(forward_names)}")
        symbolic = {dim for d in declared for dim in d.dims if isinstance(dim, str)}
        stray = sorted(set(ranges) - symbolic)
        if stray:
            raise KilnError(f"--dynamic names {stray} do not appear in any --input",
                            fix="name the dim in --input, e.g. --input x=batch,32 --dynamic batch=1:64")
        dims = {name: kiln.Dim(name, min=ranges.get(name, (1, float("inf")))[0],
                               max=None if ranges.get(name, (1, float("inf")))[1] == float("inf")
                               else int(ranges[name][1])) for name in sorted(symbolic)}
        by_name = {d.name: d for d in declared}
        missing = [n for n in forward_names if n not in by_name
                   and inspect.signature(model.forward).parameters[n].default is inspect.Parameter.empty]
        if missing:
            raise KilnError(f"no --input for {', '.join(missing)}", fix="declare every input: --input NAME=DIMS:DTYPE")
        kiln.manual_seed(0)
        args = []
        dynamic_shapes: dict[str, Any] = {}
        for name in [n for n in forward_names if n in by_name]:
            decl = by_name[name]
            shape = [dim if isinstance(dim, int) else _example_size(dims[dim].min, dims[dim].max) for dim in decl.dims]
            dtype = getattr(kiln, decl.dtype)
            args.append(kiln.randn(*shape).to(dtype) if dtype.is_floating_point else kiln.zeros(shape, dtype=dtype))
            spec = {axis: dims[dim] for axis, dim in enumerate(decl.dims) if isinstance(dim, str)}
            dynamic_shapes[name] = spec or None
        example_args = tuple(args)
        used_ranges = {name: (dims[name].min, dims[name].max) for name in dims}
    else:
        if default_args is None:
            raise KilnError(f"{model_spec} has no example inputs", fix="declare them: --input NAME=DIMS:DTYPE ...")
        example_args, dynamic_shapes = default_args, default_dynamic
        used_ranges = {}
        if ranges:
            dynamic_shapes, used_ranges = _override_ranges(default_dynamic, ranges, example_args, forward_names)
    if is_torch_module(model):
        progress("tracing with torch.export")
        program = _export_torch(model, example_args, dynamic_shapes, model_spec)
    else:
        progress("tracing")
        program = kiln.export(model, example_args, dynamic_shapes=dynamic_shapes)
    return ExportRequest(model, program, example_args, model_spec, used_ranges)


def _export_torch(model: Any, args: tuple, dynamic_shapes: dict[str, Any] | None, spec: str) -> Any:
    """kiln.from_torch with the example inputs as torch tensors and each kiln.Dim as a torch.export.Dim."""
    import numpy as np
    import torch

    import kiln
    torch_dims: dict[str, Any] = {}

    def torch_dim(dim: Any) -> Any:
        if dim.name not in torch_dims:
            bounds = {"min": dim.min} if dim.max == float("inf") else {"min": dim.min, "max": int(dim.max)}
            torch_dims[dim.name] = torch.export.Dim(dim.name, **bounds)
        return torch_dims[dim.name]

    torch_args = []
    for arg in args:  # every dtype --input accepts has torch's name
        array = np.asarray(arg.__kiln_array__())
        if array.dtype.kind not in "biufc":  # ml_dtypes' bfloat16: through float32, which holds it exactly
            array = array.astype(np.float32)
        torch_args.append(torch.from_numpy(np.array(array, copy=True)).to(getattr(torch, arg.dtype.name)))
    torch_shapes = None if dynamic_shapes is None else {
        name: {axis: torch_dim(dim) for axis, dim in axes.items()} if axes else None
        for name, axes in dynamic_shapes.items()}
    try:
        return kiln.from_torch(model, tuple(torch_args), dynamic_shapes=torch_shapes)
    except KilnError:
        raise
    except Exception as error:  # torch's messages span many lines; keep them, on one
        message = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
        if len(message) > 600:
            message = message[:600] + " ..."
        raise KilnError(f"torch.export failed on {spec}: {type(error).__name__}: {message}",
                        fix="check --input and --dynamic against the model, or run torch.export.export on it "
                            "in Python for torch's full report") from None


def _load_pt2_request(model_spec: str, inputs: list[str], dynamic: list[str],
                      progress: Callable[[str], None]) -> ExportRequest:
    """A .pt2 file (kiln's or torch.export's) read with kiln.load: torch is not needed, nor imported."""
    import kiln
    if inputs or dynamic:
        raise KilnError("--input and --dynamic apply to a MODEL spec, not to a .pt2",
                        fix="a .pt2 already records its inputs and dynamic dims")
    path = Path(model_spec)
    if not path.is_file():
        raise KilnError(f"model file {path} does not exist")
    progress(f"loading {path}")
    with warnings.catch_warnings(record=True) as caught:  # e.g. pickled sample inputs, skipped: one line each
        warnings.simplefilter("always")
        program = kiln.load(path)
    for warning in caught:
        print(f"kiln: warning: {warning.message}", file=sys.stderr)
    return ExportRequest(None, program, None, model_spec)


def example_inputs(program: Any) -> tuple[tuple, dict[str, Any]]:
    """(args, kwargs) of random values that fit a program's user inputs (kiln.verification.random_inputs), in the
    structure the program was called with."""
    from kiln.ir.pytree import tree_unflatten
    from kiln.verification import random_inputs
    arrays = random_inputs(program)
    if program.in_spec is None:
        return tuple(arrays), {}
    supplied = iter(arrays)
    leaves = [program.input_constants[index] if index in program.input_constants else next(supplied)
              for index in range(program.in_spec.num_leaves)]
    args, kwargs = tree_unflatten(leaves, program.in_spec)
    return tuple(args), dict(kwargs)


def _override_ranges(dynamic_shapes: Any, ranges: dict[str, tuple[int, float]], args: tuple,
                     forward_names: list[str]) -> tuple[Any, dict[str, tuple[int, float]]]:
    """The zoo entry's dynamic shapes with --dynamic's ranges; the example sizes must lie inside them."""
    import kiln
    known: dict[str, list[tuple[int, int]]] = {}
    for index, name in enumerate(forward_names[:len(args)]):
        for axis, dim in ((dynamic_shapes or {}).get(name) or {}).items():
            known.setdefault(dim.name, []).append((index, axis))
    unknown = sorted(set(ranges) - set(known))
    if unknown:
        raise KilnError(f"--dynamic names {unknown} are not dynamic dims of this model",
                        fix=f"its dynamic dims are {', '.join(sorted(known)) or '(none)'}")
    new_dims = {}
    for name, (low, high) in ranges.items():
        for index, axis in known[name]:
            size = args[index].shape[axis]
            if not low <= size <= high:
                raise KilnError(f"--dynamic {name}={low}:{high}: the example input has {name} = {size}, "
                                "outside the declared range", fix=f"choose a range containing {size}")
        new_dims[name] = kiln.Dim(name, min=low, max=None if high == float("inf") else int(high))
    result = {name: ({axis: new_dims.get(dim.name, dim) for axis, dim in spec.items()} if spec else spec)
              for name, spec in (dynamic_shapes or {}).items()}
    return result, {name: ranges[name] for name in new_dims}


# ---------------------------------------------------------------------------------------------
# Formats

@dataclass
class ExportFormat:
    """A format `kiln export --format NAME` writes: `write(request, output_path, options)`."""

    suffix: str
    write: Callable[[ExportRequest, Path, argparse.Namespace], None]
    help: str


def _write_onnx(request: ExportRequest, output: Path, options: argparse.Namespace) -> None:
    from kiln.codegen.onnx import export_program, require_match
    progress = _progress(options)
    progress("lowering to ONNX")
    onnx_program = export_program(request.program, opset_version=options.opset,
                                  external_data=True if options.external_data else None)
    if options.verify:
        progress("verifying: onnxruntime vs kiln's reference interpreter")
        args, kwargs = (request.args, {}) if request.args is not None else example_inputs(request.program)
        report = onnx_program.verify(*args, **kwargs)
        print(report, file=sys.stderr)
        require_match(report)
    progress(f"writing {output}")
    onnx_program.save(output)


def _write_pt2(request: ExportRequest, output: Path, options: argparse.Namespace) -> None:
    import kiln
    _progress(options)(f"writing {output}")
    kiln.save(request.program, output)


EXPORT_FORMATS: dict[str, ExportFormat] = {
    "onnx": ExportFormat(".onnx", _write_onnx, "ONNX model for onnxruntime (opset 20 by default, as torch.onnx)"),
    "pt2": ExportFormat(".pt2", _write_pt2, "torch.export archive (torch.export.load and kiln.load read it)"),
}


def _progress(options: argparse.Namespace) -> Callable[[str], None]:
    start = getattr(options, "_started", None) or time.perf_counter()
    options._started = start

    def report(message: str) -> None:
        if not getattr(options, "quiet", False):
            print(f"[{time.perf_counter() - start:6.2f}s] {message}", file=sys.stderr, flush=True)
    return report



def read_named_arrays(path: str, names: list[str], what: str) -> dict[str, Any]:
    """The arrays of an .npz file (`what`: "inputs", "calibration") by model input name, one per name in `names` (a
    model with one input takes any single name). Never unpickles: object arrays are refused."""
    import zipfile

    import numpy as np
    file = Path(path)
    if not file.is_file():
        raise KilnError(f"{what} file {file} does not exist")
    try:
        archive = np.load(file, allow_pickle=False)  # never unpickle
        if not isinstance(archive, np.lib.npyio.NpzFile):
            raise ValueError("it holds one array (.npy), not named arrays (.npz)")
        with archive:
            arrays = {name: archive[name] for name in archive.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as error:
        raise KilnError(f"cannot read {file} as .npz: {error}", fix="write it with numpy.savez, of numeric arrays") \
            from None
    if len(names) == 1 and len(arrays) == 1:
        arrays = {names[0]: next(iter(arrays.values()))}  # one input: any key will do
    missing = [name for name in names if name not in arrays]
    if missing:
        raise KilnError(f"{file} has no array for input(s) {', '.join(missing)} (it has {', '.join(arrays)})",
                        fix=f"name the arrays like the inputs: {', '.join(names)}")
    extra = [name for name in arrays if name not in names]
    if extra:
        raise KilnError(f"{file} has array(s) {', '.join(extra)}, which are not inputs of the model",
                        fix=f"name the arrays like the inputs: {', '.join(names)}")
    return arrays


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """--input, --dynamic and -q for the commands that load MODEL like `kiln export` (compile, quantize)."""
    parser.add_argument("--input", action="append", default=[], metavar="NAME=DIMS:DTYPE",
                        help="an input of forward (as in `kiln export`); not with a .pt2")
    parser.add_argument("--dynamic", action="append", default=[], metavar="DIM=MIN:MAX",
                        help="range of a dynamic dim (as in `kiln export`); not with a .pt2")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress messages")


def register(commands: Any) -> None:
    """Add the `export` subcommand to the `kiln` parser's subcommands."""
    formats = "\n".join(f"  {name:<6} {fmt.help}" for name, fmt in EXPORT_FORMATS.items())
    parser = commands.add_parser(
        "export", help="trace a model and write it as ONNX (or another format)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Trace MODEL with symbolic shapes and write it in a deployable format.\n\n"
                    f"Formats:\n{formats}\n\n"
                    "Examples:\n"
                    "  kiln export kiln.models:gpt --format onnx -o gpt.onnx --verify\n"
                    "  kiln export net.py:Net --format onnx -o net.onnx \\\n"
                    "      --input x=batch,3,64,64:float32 --dynamic batch=1:64   # kiln or torch module\n"
                    "  kiln export model.pt2 --format onnx -o model.onnx\n\n"
                    "Errors exit with status 2 and write nothing; files are written atomically.")
    parser.add_argument("model", metavar="MODEL",
                        help="path/to/file.py:NAME or package.module:NAME, where NAME is a kiln.nn.Module or "
                             "torch.nn.Module class, a factory returning one, or a module instance (exported in "
                             "eval mode; torch modules through torch.export); kiln.models:NAME (zoo models bring "
                             "their own example inputs and dynamic dims); or a .pt2 file (torch not needed)")
    parser.add_argument("--format", required=True, choices=sorted(EXPORT_FORMATS), help="output format")
    parser.add_argument("-o", "--output", required=True, help="file to write")
    parser.add_argument("--input", action="append", default=[], metavar="NAME=DIMS:DTYPE",
                        help="an input of forward: dims are integers or names of dynamic dims "
                             "(x=batch,3,64,64:float32; dtype defaults to float32); repeatable")
    parser.add_argument("--dynamic", action="append", default=[], metavar="DIM=MIN:MAX",
                        help="range of a dynamic dim (batch=1:64; MAX may be inf); repeatable")
    parser.add_argument("--opset", type=int, default=None, help="ONNX opset (18 to 23; default 20, as torch.onnx)")
    parser.add_argument("--verify", action="store_true",
                        help="compare the exported model with kiln's reference interpreter on the example inputs")
    parser.add_argument("--external-data", action="store_true",
                        help="ONNX: write weights to OUTPUT.data (automatic above the 2 GB protobuf limit)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress messages")
    parser.set_defaults(handler=run_export)


def run_export(options: argparse.Namespace) -> int:
    fmt = EXPORT_FORMATS[options.format]
    output = Path(options.output)
    if not output.parent.is_dir():
        raise KilnError(f"cannot write {output}: folder {output.parent} does not exist")
    request = load_export_request(options.model, options.input, options.dynamic, _progress(options))
    fmt.write(request, output, options)
    _progress(options)("done")
    return 0


__all__ = ["EXPORT_FORMATS", "TORCH_INSTALL", "ExportFormat", "ExportRequest", "InputDecl", "add_model_arguments",
           "example_inputs",
           "is_torch_module", "load_export_request", "load_model", "parse_input", "parse_dynamic", "register",
           "run_export"]
