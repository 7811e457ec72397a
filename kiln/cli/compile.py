"""`kiln compile` and `kiln run`: compile a model to a C package, run a package on .npy inputs.

    kiln compile kiln.models:mlp --target c -o mlp_pkg
    kiln compile model.pt2 --target c -o pkg -p decompose,canonicalize,cse,dce
    kiln compile net.py:Net --target c -o pkg --input x=batch,3,64,64 --dynamic batch=1:64
    kiln run mlp_pkg --input x=x.npy --output out.npz --bench 100

MODEL is read by `kiln export`'s loader (kiln.cli.export.load_export_request): a kiln or torch module (torch ones
through torch.export), a zoo model, or a `.pt2` file (read with kiln.load, without torch).
Errors exit with status 2 and write nothing: the package is built in a temporary folder next to OUT and renamed
into place only when complete.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from kiln.cli.export import _progress, add_model_arguments, load_export_request
from kiln.codegen import COMPILE_TARGETS
from kiln.ir.errors import KilnError
from kiln.ir.files import atomic_write

TARGETS = tuple(COMPILE_TARGETS)


def register(commands: Any) -> None:
    """Add the `compile` and `run` subcommands to the `kiln` parser's subcommands."""
    parser = commands.add_parser(
        "compile", help="compile a model (MODEL spec or .pt2) to a C package (model.so + weights + manifest)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Compile MODEL to a package directory: manifest.json, weights.bin, model.c, model.so.\n\n"
                    "Examples:\n"
                    "  kiln compile kiln.models:mlp --target c -o mlp_pkg\n"
                    "  kiln compile model.pt2 --target c -o pkg -p decompose,canonicalize,cse,dce\n"
                    "  kiln compile net.py:Net --target c -o pkg --input x=batch,3,64,64 --dynamic batch=1:64\n"
                    "      (Net: a kiln.nn.Module or a torch.nn.Module)\n\n"
                    "Errors exit with status 2 and write nothing; the package appears atomically.")
    parser.add_argument("model", metavar="MODEL",
                        help="a .pt2 file (torch not needed), kiln.models:NAME, or path/to/file.py:NAME or "
                             "package.module:NAME, where NAME is a kiln.nn.Module or torch.nn.Module class, a "
                             "factory returning one, or a module instance (compiled in eval mode)")
    parser.add_argument("--target", default="c", choices=TARGETS, help="code generator (default: c)")
    parser.add_argument("-o", "--output", required=True, help="package directory to write")
    parser.add_argument("-p", "--pipeline", default=None,
                        help="pass pipeline run before scheduling (default: kiln.compile's, "
                             "remove-dropout,fold-batchnorm,decompose,canonicalize,cse,dce)")
    add_model_arguments(parser)
    parser.set_defaults(handler=run_compile)

    runner = commands.add_parser(
        "run", help="run a compiled package on .npy inputs",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run a package written by `kiln compile` (or kiln.compile).\n\n"
                    "Examples:\n"
                    "  kiln run mlp_pkg --input x=x.npy\n"
                    "  kiln run mlp_pkg --input x=x.npy --output out.npz --bench 100\n"
                    "  kiln run mlp_pkg --input x=x.npy --profile 20 --threads 1")
    runner.add_argument("package", metavar="PACKAGE", help="package directory")
    runner.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                        help="one input per model input, by name; repeatable")
    runner.add_argument("--output", default=None, metavar="OUT.npz", help="write the outputs, by name, to an .npz")
    runner.add_argument("--bench", type=int, default=0, metavar="N", help="also time N calls; print the median")
    runner.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also run N times with per-kernel timing; print the kernels, slowest first")
    runner.add_argument("--threads", type=int, default=None, metavar="T",
                        help="threads per call (default: OMP_NUM_THREADS or the CPU count)")
    runner.set_defaults(handler=run_package)


# ---------------------------------------------------------------------------------------------
# kiln compile

def _load_program(options: argparse.Namespace) -> Any:
    return load_export_request(options.model, options.input, options.dynamic, _progress(options)).program


def _check_output(output: Path) -> None:
    if output.name in ("", ".", ".."):  # `-o ""` or `-o .`: the current folder cannot be replaced
        raise KilnError(f"cannot write a package to {str(output)!r}, a folder it cannot replace",
                        fix="name the package folder, e.g. -o model_pkg")
    if not output.parent.is_dir():
        raise KilnError(f"cannot write {output}: folder {output.parent} does not exist")
    if output.exists():
        is_package = output.is_dir() and (output / "manifest.json").is_file()
        if not output.is_dir() or not (is_package or not any(output.iterdir())):
            raise KilnError(f"{output} exists and is not a kiln package",
                            fix="choose a new path, an empty folder, or an existing package to replace")


def run_compile(options: argparse.Namespace) -> int:
    from kiln.compiler import compile as compile_package
    output = Path(options.output)
    _check_output(output)
    program = _load_program(options)
    progress = _progress(options)
    progress(f"compiling to {options.target}")
    staging = staging_dir(output)
    try:
        model = compile_package(program, target=options.target, pipeline=options.pipeline, output=staging)
        del model
        _replace_dir(staging, output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    progress(f"wrote {output}")
    return 0


def staging_dir(output: Path) -> Path:
    """A new empty folder beside `output` to build a package in, before `_replace_dir` moves it into place."""
    try:
        return Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    except OSError as error:
        raise KilnError(f"cannot write {output}: {error.strerror} in {output.parent}",
                        fix="choose a folder you can write to") from None


def _replace_dir(staging: Path, output: Path) -> None:
    """Move the complete package at `staging` to `output`, replacing an existing package or empty folder."""
    if not output.exists():
        os.replace(staging, output)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{output.name}.old.", dir=output.parent))
    os.replace(output, old / "package")
    try:
        os.replace(staging, output)
    except BaseException:
        os.replace(old / "package", output)
        raise
    finally:
        shutil.rmtree(old, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# kiln run

def _read_inputs(texts: list[str], names: list[str]) -> list[Any]:
    given: dict[str, Path] = {}
    for text in texts:
        name, sep, file = text.partition("=")
        if not sep or not name or not file:
            raise KilnError(f"malformed --input {text!r}", fix="write NAME=FILE.npy, e.g. x=x.npy")
        if name not in names:
            raise KilnError(f"--input {name!r} is not an input of the package",
                            fix=f"its inputs are {', '.join(names)}")
        if name in given:
            raise KilnError(f"--input {name!r} given twice")
        given[name] = Path(file)
    missing = [n for n in names if n not in given]
    if missing:
        raise KilnError(f"no --input for {', '.join(missing)}", fix="give every input: --input NAME=FILE.npy")
    return [_read_npy(given[name], name) for name in names]


def _read_npy(path: Path, name: str) -> Any:
    """The array of one .npy file, mapped rather than read: never unpickled, and a header declaring more data than
    the file holds is refused before anything is allocated."""
    import numpy as np
    if not path.is_file():
        raise KilnError(f"input file {path} (for {name!r}) " + ("is not a regular file" if path.exists()
                                                                else "does not exist"))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # numpy warns of the overflow before refusing an absurd header
            array = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as error:
        raise KilnError(f"cannot read {path} as .npy (for {name!r}): {error}",
                        fix="write it with numpy.save, of a numeric array") from None
    if not isinstance(array, np.ndarray):
        array.close()
        raise KilnError(f"{path} (for {name!r}) is an .npz archive, not an .npy file",
                        fix="pass one .npy file per input: numpy.save('x.npy', x)")
    return array


def _load_package(path: Path) -> Any:
    from kiln.runtime import load
    if not (path / "manifest.json").is_file():
        raise KilnError(f"{path} is not a kiln package (no manifest.json)", fix="write one with `kiln compile`")
    try:
        return load(path)
    except KilnError:
        raise
    except (OSError, ValueError, KeyError) as error:
        raise KilnError(f"cannot load package {path}: {type(error).__name__}: {error}") from None


def _format_time(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} us" if seconds < 1e-3 else f"{seconds * 1e3:.3f} ms"


def run_package(options: argparse.Namespace) -> int:
    import numpy as np
    for flag in ("bench", "profile"):
        if getattr(options, flag) < 0:
            raise KilnError(f"--{flag} {getattr(options, flag)} is negative",
                            fix=f"give a number of calls, e.g. --{flag} 100")
    if options.threads is not None and options.threads < 1:
        raise KilnError(f"--threads {options.threads} is not a positive count", fix="e.g. --threads 2")
    if options.output is not None and not Path(options.output).parent.is_dir():
        raise KilnError(f"cannot write {options.output}: folder {Path(options.output).parent} does not exist")
    model = _load_package(Path(options.package))
    model.num_threads = options.threads
    output_names = [o["name"] for o in model.manifest["outputs"]]
    arrays = _read_inputs(options.input, [i["name"] for i in model.manifest["inputs"]])
    results = model(*arrays)
    results = results if isinstance(results, tuple) else (results,)
    by_name = dict(zip(output_names, results))
    if options.output is not None:
        buffer = io.BytesIO()
        np.savez(buffer, **by_name)
        atomic_write(Path(options.output), buffer.getvalue())
        print(f"wrote {', '.join(output_names)} to {options.output}")
    else:
        for name, value in by_name.items():
            print(f"{name}: shape {list(value.shape)} {value.dtype}")
            print(np.array2string(value, threshold=64, edgeitems=3))
    if options.bench:
        model(*arrays)  # warm up
        times = []
        for _ in range(options.bench):
            start = time.perf_counter()
            model(*arrays)
            times.append(time.perf_counter() - start)
        print(f"bench: {options.bench} calls, median {_format_time(statistics.median(times))}, "
              f"min {_format_time(min(times))}")
    if options.profile:
        timings = model.profile(*arrays, runs=options.profile)
        total = sum(seconds for _, seconds in timings) or 1.0
        print(f"profile: mean per run over {options.profile} runs, {_format_time(total)} in kernels")
        for name, seconds in timings:
            print(f"  {_format_time(seconds):>10}  {100 * seconds / total:5.1f}%  {name}")
    return 0


__all__ = ["TARGETS", "register", "run_compile", "run_package"]
