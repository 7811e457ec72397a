"""kiln.runtime.load: a compiled package (a folder written by kiln.codegen.driver) and its callable.

C packages (manifest.json, weights.bin, model.c, model.so) load through ctypes; Triton packages (model.py) through
kiln/runtime/triton.py. Loading a package runs its code, as unpickling would: load only packages you trust.
"""

from __future__ import annotations

import ctypes
import _ctypes  # dlclose; imported here, as __del__ may run while Python shuts down
import json
import math
import os
import pathlib
import re
import threading
from types import SimpleNamespace
from typing import Any, Callable, Iterator, NoReturn

import numpy as np
import sympy

from kiln.codegen.c import MAX_ALLOCATED_RANK
from kiln.ir import dtypes
from kiln.ir.errors import InputError, KilnError
from kiln.ir.files import path_inside
from kiln.ir.interpreter import bind_symbols
from kiln.ir.symbolic import ValueRange, dims_function, parse_dim
from kiln.ir.types import TensorType


MANIFEST = "manifest.json"
_MAX_MANIFEST_BYTES = 256 << 20
_RECOMPILE = "recompile the package with kiln.compile or `kiln compile`, and don't edit or mix its files"
# What each package format's manifest names beyond the shared keys: the files its loader opens (each must be a
# regular file inside the package folder) and other string keys.
PACKAGE_FILES = {"kiln-c-package": (("weights_file", "library"), ("build_id",)),
                 "kiln-triton-package": (("weights_file", "source"), ("source_sha256",))}


def read_manifest(folder: pathlib.Path) -> dict:
    """A package's manifest.json as a dict, read without letting a huge or deeply nested file exhaust anything."""
    from kiln.ir.serde.safe_json import load_json
    path = folder / MANIFEST
    try:
        if path.stat().st_size > _MAX_MANIFEST_BYTES:
            raise KilnError(f"cannot read the package manifest {path}: it is over {_MAX_MANIFEST_BYTES} bytes",
                            fix=_RECOMPILE)
        manifest = load_json(path.read_bytes(), str(path))
    except OSError as error:
        raise KilnError(f"cannot read the package manifest {path}: {error.strerror}",
                        fix="give the folder kiln.compile or `kiln compile` wrote") from None
    except KilnError as error:
        raise KilnError(f"cannot read the package manifest {path}: {error.cause}", fix=_RECOMPILE) from None
    if not isinstance(manifest, dict):
        raise KilnError(f"the package manifest {path} is a JSON {type(manifest).__name__}, not an object",
                        fix=_RECOMPILE)
    return manifest


def check_manifest(folder: pathlib.Path, manifest: dict) -> dict[str, pathlib.Path]:
    """Check a manifest before anything it names is opened and before any native code runs: every key the loaders
    read has its type; the files it names lie inside the package folder; symbol ranges are sound; inputs, outputs
    and weights have known dtypes and well-formed shapes; every weight lies inside the weights file at the size its
    shape and bit width take. Returns the resolved paths of the files (by manifest key); else one KilnError."""
    def refuse(cause: str) -> NoReturn:
        raise KilnError(f"package {folder}: {cause}", fix=_RECOMPILE)

    def typed(entry: dict, key: str, kind: str, where: str = "manifest") -> Any:
        value = entry.get(key)
        is_int = isinstance(value, int) and not isinstance(value, bool)
        if not {"str": isinstance(value, str), "int": is_int and value >= 0, "bound": value is None or is_int,
                "list": isinstance(value, list)}[kind]:
            expected = {"str": "a string", "int": "a non-negative integer", "bound": "an integer or null",
                        "list": "a list"}[kind]
            refuse(f"{where} key {key!r} must be {expected}, got {json.dumps(value)[:60]}")
        return value

    def entries(key: str) -> list[dict]:
        value = typed(manifest, key, "list")
        if not all(isinstance(entry, dict) for entry in value):
            refuse(f"manifest key {key!r} must be a list of objects")
        return value

    def dtype_of(entry: dict, where: str) -> dtypes.DType:
        name = typed(entry, "dtype", "str", where)
        try:
            return dtypes.dtype(name)
        except KilnError:
            refuse(f"{where} has an unknown dtype {name!r}")

    package_format = manifest.get("format")
    if not isinstance(package_format, str) or package_format not in PACKAGE_FILES:
        refuse(f"its manifest has format {json.dumps(package_format)[:60]}, not one of {', '.join(PACKAGE_FILES)}")
    file_keys, string_keys = PACKAGE_FILES[package_format]
    files = {}
    for key in file_keys:
        name = typed(manifest, key, "str")
        files[key] = path_inside(folder, name)
        if files[key] is None:
            refuse(f"manifest key {key!r} names {name!r}, which is outside the package folder")
        if not files[key].is_file():
            refuse(f"{name} (manifest key {key!r}) is missing or not a regular file")
    for key in string_keys:
        typed(manifest, key, "str")
    symbols, read_while_running = set(), set()
    for number, entry in enumerate(entries("symbols")):
        where = f"symbol {number}"
        name, lower, upper = typed(entry, "name", "str", where), typed(entry, "lower", "bound", where), \
            typed(entry, "upper", "bound", where)
        if not re.fullmatch(r"[A-Za-z_]\w*", name):
            refuse(f"{where} has the malformed name {name!r}")
        if (lower is not None and lower < 0) or (upper is not None and not (lower or 0) <= upper < 2**63):
            refuse(f"symbol {name!r} has the range [{lower}, {upper}]: it needs 0 <= lower <= upper < 2**63")
        symbols.add(name)
    for number, entry in enumerate(entries("data_dependent_symbols") if "data_dependent_symbols" in manifest else []):
        name = typed(entry, "name", "str", f"data-dependent symbol {number}")
        if not re.fullmatch(r"[A-Za-z_]\w*", name) or name in symbols:
            refuse(f"data-dependent symbol {number} has the malformed name {name!r}")
        read_while_running.add(name)
    for key in ("inputs", "outputs"):
        for number, entry in enumerate(entries(key)):
            where = f"{key[:-1]} {number}"
            typed(entry, "name", "str", where)
            dtype_of(entry, where)
            # an output the run allocates has a shape over the sizes it reads, too
            allowed = symbols | read_while_running if key == "outputs" and entry.get("data_dependent") is True \
                else symbols
            for dim in typed(entry, "shape", "list", where):
                try:
                    parsed = parse_dim(dim) if isinstance(dim, str) else None
                except KilnError:
                    parsed = None
                free = {str(s) for s in getattr(parsed, "free_symbols", ())}
                if parsed is None or (isinstance(parsed, int) and parsed < 0) or not free <= allowed:
                    refuse(f"{where} ({entry['name']!r}) has the malformed dim {json.dumps(dim)[:60]}")
    for number, entry in enumerate(entries("states") if "states" in manifest else []):
        where = f"state {number}"
        typed(entry, "name", "str", where)
        dtype_of(entry, where)
        shape = typed(entry, "shape", "list", where)
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            refuse(f"{where} ({entry['name']!r}) has the malformed shape {json.dumps(shape)[:60]}")
    size = files["weights_file"].stat().st_size
    for number, entry in enumerate(entries("weights")):
        where = f"weight {number}"
        name, offset, nbytes = typed(entry, "name", "str", where), typed(entry, "offset", "int", where), \
            typed(entry, "nbytes", "int", where)
        itemsize = dtype_of(entry, where).itemsize
        shape = typed(entry, "shape", "list", where)
        bits = entry.get("bits", 8 * itemsize)
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            refuse(f"weight {name!r} has the malformed shape {json.dumps(shape)[:60]}")
        if bits not in (4, 8 * itemsize):
            refuse(f"weight {name!r} has {json.dumps(bits)[:20]} bits per value, not {8 * itemsize} (or 4)")
        if nbytes != -(-math.prod(shape) * bits // 8) or offset + nbytes > size:
            refuse(f"weight {name!r} ({nbytes} bytes at offset {offset}) does not fit its shape {shape} at {bits} "
                   f"bits or the {size}-byte weights file")
    return files


# Identities (device, inode) of the library files loaded from each path, in load order; see _open_library.
_LOADED_FILES: dict[str, list[tuple[int, int]]] = {}
# Reentrant: the garbage collector may run a dropped model's __del__ (which closes its library under this lock)
# inside ctypes.CDLL's allocations, while _open_library holds the lock in the same thread (a plain lock hung CI).
_LOADED_FILES_LOCK = threading.RLock()


def _open_library(path: pathlib.Path) -> ctypes.CDLL:
    """dlopen the library file at `path` now, never one loaded earlier from a file since replaced at that path.

    The dynamic loader hands back the library already loaded under the same path string, even when the file at
    that path has since been replaced (as recompiling into a folder does), and would run the old code. So each
    file (device, inode) seen at a path gets its own spelling of it: `dir/model.so`, `dir/./model.so`,
    `dir/././model.so`, ... An unchanged file keeps its spelling, and the loader shares its one copy. A loaded
    library keeps its file's inode alive, so an identity in this table is never reused by another file."""
    resolved = path.resolve()
    with _LOADED_FILES_LOCK:
        status = os.stat(resolved)
        seen = _LOADED_FILES.setdefault(str(resolved), [])
        identity = (status.st_dev, status.st_ino)
        if identity not in seen:
            seen.append(identity)
        spelling = f"{resolved.parent}/{'./' * seen.index(identity)}{resolved.name}"
        library = ctypes.CDLL(spelling)
        _pin_openmp_runtime()
        return library


# The OpenMP runtimes a compiled library may load (GCC's, LLVM's, Intel's), by soname.
_OPENMP_RUNTIMES = ("libgomp.so.1", "libomp.so", "libomp.so.5", "libiomp5.so")
_PINNED: list[ctypes.CDLL] = []


def _pin_openmp_runtime() -> None:
    """Keep the OpenMP runtime a library brought in loaded for the rest of the process. Its worker threads outlive
    the parallel regions, waiting in its code; closing the last model library would otherwise unload the runtime
    under them, and they would crash. RTLD_NOLOAD takes a reference only to a runtime already loaded."""
    if _PINNED:
        return
    for soname in _OPENMP_RUNTIMES:
        try:
            _PINNED.append(ctypes.CDLL(soname, mode=os.RTLD_NOLOAD))
        except OSError:
            continue


def _close_library(lib: ctypes.CDLL) -> None:
    """dlclose what `_open_library` opened. The loader unmaps the library when its last handle closes; until then
    its file's inode stays alive, so `_LOADED_FILES` never sees that identity reused by another file meanwhile."""
    with _LOADED_FILES_LOCK:
        _ctypes.dlclose(lib._handle)


class Signature:
    """A package's inputs, outputs and symbols, from its manifest: validates a call's arguments, binds the symbols
    and sizes the outputs (shared by the C and Triton loaders)."""

    def __init__(self, manifest: dict):
        self.manifest = manifest
        self.symbols = [parse_dim(s["name"]) for s in manifest["symbols"]]
        ranges = {sym: ValueRange(s.get("lower") if s.get("lower") is not None else 0,  # null or absent: none
                                  s.get("upper") if s.get("upper") is not None else float("inf"))
                  for sym, s in zip(self.symbols, manifest["symbols"])}
        specs = [SimpleNamespace(name=i["name"]) for i in manifest["inputs"]]
        args = [SimpleNamespace(type=TensorType.of([parse_dim(d) for d in i["shape"]], dtypes.dtype(i["dtype"])))
                for i in manifest["inputs"]]
        self._signature = SimpleNamespace(graph_signature=SimpleNamespace(input_specs=specs),
                                          body=SimpleNamespace(args=args), range_constraints=ranges)
        # an output the run allocates (its size is read while running) has no shape before the call: None
        self._outputs = [(None if o.get("data_dependent") else [parse_dim(d) for d in o["shape"]],
                          dtypes.dtype(o["dtype"]).numpy) for o in manifest["outputs"]]
        self._prepare_fast_path()

    def arrays(self, args: tuple, accept: Callable[[Any], bool] = lambda value: False) -> list:
        """The call's arguments as C-contiguous numpy arrays (kiln Tensors converted), or as they are where `accept`
        takes them (the Triton loader's torch tensors); one per input, else an InputError."""
        specs = self.manifest["inputs"]
        if len(args) != len(specs):
            raise InputError(f"the compiled model takes {len(specs)} input(s) "
                             f"({', '.join(s['name'] for s in specs)}) but got {len(args)}")
        arrays = []
        for spec, value in zip(specs, args):
            if type(value) is np.ndarray and value.flags.c_contiguous and value.dtype.isnative:  # the common case
                arrays.append(value)
                continue
            if accept(value):
                arrays.append(value)
                continue
            if not isinstance(value, np.ndarray):
                if hasattr(value, "__kiln_array__"):
                    value = value.__kiln_array__()
                if not isinstance(value, np.ndarray):
                    raise InputError(f"input '{spec['name']}' must be a numpy array, got {type(value).__name__}")
            if not value.dtype.isnative:  # byte-swapped (e.g. '>f4' read from a file): the kernels read native order
                value = value.astype(value.dtype.newbyteorder("="))
            arrays.append(value if value.flags.c_contiguous else np.ascontiguousarray(value))
        return arrays

    def bind(self, arrays: list) -> list[int]:
        """Symbol values in manifest order; validates dtype, rank, dims, ranges and relations (anything with a numpy
        `dtype`, `ndim` and `shape`), raising InputError naming the input."""
        values = self._bind_fast(arrays) if self._input_checks is not None else None
        if values is None:
            bindings = bind_symbols(self._signature, arrays)
            values = [bindings.get(s, 0) for s in self.symbols]
        return values

    def outputs(self, values: list[int]) -> list[tuple[tuple | None, Any]]:
        """(shape, numpy dtype) of each output at these symbol values (shape None: the run allocates it)."""
        if self._static_outputs is not None:
            return self._static_outputs
        return [(None if shape is None else tuple(shape(*values)), dtype) for shape, dtype in self._output_shapes]

    def _prepare_fast_path(self) -> None:
        """Precompute the checks of the common case (every dim static or a plain symbol) so a call validates with
        a few integer compares; anything else, and every failure, goes through bind_symbols for its full error."""
        self._output_shapes = [
            (None if shape is None else dims_function(self.symbols, shape) if self.symbols else
             (lambda shape=shape: shape), dtype) for shape, dtype in self._outputs]
        self._static_outputs = None if self.symbols else [
            (None if shape is None else tuple(shape), dtype) for shape, dtype in self._outputs]
        position = {sym: k for k, sym in enumerate(self.symbols)}
        bounds = [(s.get("lower") if s.get("lower") is not None else 0,
                   s.get("upper") if s.get("upper") is not None else np.iinfo(np.int64).max)
                  for s in self.manifest["symbols"]]
        self._input_checks = []
        bound: set[int] = set()
        for spec in self.manifest["inputs"]:
            dims = []
            for dim in map(parse_dim, spec["shape"]):
                if isinstance(dim, int):
                    dims.append((dim, -1))
                elif isinstance(dim, sympy.Symbol) and dim in position:
                    dims.append((None, position[dim]))
                    bound.add(position[dim])
                else:
                    self._input_checks = None
                    return
            static_shape = tuple(d for d, _ in dims) if all(symbol < 0 for _, symbol in dims) else None
            self._input_checks.append((np.dtype(dtypes.dtype(spec["dtype"]).numpy), static_shape, len(dims), dims))
        if bound != set(range(len(self.symbols))):
            self._input_checks = None
            return
        self._symbol_bounds = bounds

    def _bind_fast(self, arrays: list) -> list[int] | None:
        """Symbol values (in kiln_run's order) when every input passes the precomputed checks, else None."""
        values = [-1] * len(self.symbols)
        for (dtype, static_shape, rank, dims), array in zip(self._input_checks, arrays):
            if array.dtype != dtype:
                return None
            if static_shape is not None:  # every dim static: one compare
                if array.shape != static_shape:
                    return None
                continue
            if array.ndim != rank:
                return None
            for (static, symbol), size in zip(dims, array.shape):
                if symbol < 0:
                    if size != static:
                        return None
                elif values[symbol] < 0:
                    lower, upper = self._symbol_bounds[symbol]
                    if not lower <= size <= upper:
                        return None
                    values[symbol] = size
                elif values[symbol] != size:
                    return None
        return values


# The C ABI functions the loader calls (kiln/codegen/c/kiln.h): name -> (result type, argument types).
_ABI_FUNCTIONS = {
    "kiln_abi_version": (ctypes.c_int, []),
    "kiln_build_id": (ctypes.c_char_p, []),
    "kiln_num_inputs": (ctypes.c_int, []),
    "kiln_num_outputs": (ctypes.c_int, []),
    "kiln_num_symbols": (ctypes.c_int, []),
    "kiln_input_name": (ctypes.c_char_p, [ctypes.c_int]),
    "kiln_output_name": (ctypes.c_char_p, [ctypes.c_int]),
    "kiln_output_allocated": (ctypes.c_int, [ctypes.c_int]),
    "kiln_free": (None, [ctypes.c_void_p]),
    "kiln_symbol_name": (ctypes.c_char_p, [ctypes.c_int]),
    "kiln_create": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t]),
    "kiln_destroy": (None, [ctypes.c_void_p]),
    "kiln_run": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_void_p),
                                ctypes.POINTER(ctypes.c_void_p)]),
    "kiln_error": (ctypes.c_char_p, [ctypes.c_void_p]),
    "kiln_set_num_threads": (None, [ctypes.c_void_p, ctypes.c_int]),
    "kiln_last_run_threads": (ctypes.c_int, [ctypes.c_void_p]),
    "kiln_set_profiling": (None, [ctypes.c_void_p, ctypes.c_int]),
    "kiln_num_kernels": (ctypes.c_int, []),
    "kiln_kernel_name": (ctypes.c_char_p, [ctypes.c_int]),
    "kiln_kernel_seconds": (ctypes.c_double, [ctypes.c_void_p, ctypes.c_int]),
    "kiln_profiled_runs": (ctypes.c_int64, [ctypes.c_void_p]),
    "kiln_num_states": (ctypes.c_int, []),
    "kiln_state_name": (ctypes.c_char_p, [ctypes.c_int]),
    "kiln_state_nbytes": (ctypes.c_size_t, [ctypes.c_int]),
    "kiln_state_data": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_int]),
    "kiln_reset_state": (None, [ctypes.c_void_p]),
}


class _AllocatedOutput(ctypes.Structure):
    """kiln.h's kiln_allocated_output: an output kiln_run allocates, and its shape (KILN_MAX_RANK dims)."""

    _fields_ = [("data", ctypes.c_void_p), ("shape", ctypes.c_int64 * MAX_ALLOCATED_RANK)]


class CompiledModel:
    """A loaded package: call it with numpy arrays (or kiln Tensors) in the user-input order."""

    def __init__(self, path: str | pathlib.Path, num_threads: int | None = None, manifest: dict | None = None):
        self.path = pathlib.Path(path)
        self.manifest = manifest if manifest is not None else read_manifest(self.path)
        from kiln.codegen.c import ABI_VERSION, supported_capabilities
        if self.manifest.get("abi_version") != ABI_VERSION:
            raise KilnError(f"package {self.path} has ABI version {self.manifest.get('abi_version')}, "
                            f"this kiln reads {ABI_VERSION}", fix="recompile the model with this kiln")
        files = check_manifest(self.path, self.manifest)
        capability = self.manifest.get("cpu_capability", "DEFAULT")
        if not isinstance(capability, str) or capability not in supported_capabilities():
            raise KilnError(f"package {self.path} was built for {capability} but this CPU runs "
                            f"{', '.join(supported_capabilities())}",
                            fix="recompile it here, or build it with KILN_CPU_CAPABILITY set to a level both run")
        self.signature = Signature(self.manifest)
        self.symbols = self.signature.symbols
        self._call_slots = threading.local()
        self._state_lock = threading.Lock()
        self._stateful = bool(self.manifest.get("states"))
        self._allocates = any(output.get("data_dependent") for output in self.manifest["outputs"])
        weights_path = files["weights_file"]
        self._weights = np.memmap(weights_path, dtype=np.uint8, mode="r") if weights_path.stat().st_size else None
        try:
            lib = self._lib = _open_library(files["library"])
        except OSError as error:
            raise KilnError(f"package {self.path}: cannot load {self.manifest['library']}: {error}",
                            fix=_RECOMPILE) from None
        self._bind_abi(lib, ABI_VERSION)
        address = self._weights.ctypes.data if self._weights is not None else None
        self._handle = lib.kiln_create(address, 0 if self._weights is None else self._weights.size)
        if not self._handle:
            raise KilnError(f"kiln_create failed for {self.path} (out of memory?)")
        self._num_threads = 0
        if num_threads is not None:
            self.num_threads = num_threads

    def _bind_abi(self, lib: ctypes.CDLL, abi_version: int) -> None:
        """Declare the library's C ABI functions, then check it is this package's: every function exported, its ABI
        version and build id, and its inputs, outputs and symbols (counts, then names) those of the manifest. No
        function runs before all are found."""
        for name, (result, arguments) in _ABI_FUNCTIONS.items():
            try:
                function = getattr(lib, name)
            except AttributeError:
                raise KilnError(f"package {self.path}: {self.manifest['library']} does not export {name}, so it is "
                                f"not a kiln ABI {abi_version} library", fix=_RECOMPILE) from None
            function.restype, function.argtypes = result, arguments
        found = {"ABI version": (lib.kiln_abi_version(), abi_version),
                 "build id": ((lib.kiln_build_id() or b"").decode(errors="replace"), self.manifest["build_id"])}
        counts = {"inputs": lib.kiln_num_inputs(), "outputs": lib.kiln_num_outputs(), "symbols": lib.kiln_num_symbols(),
                  "states": lib.kiln_num_states()}
        for kind, count in counts.items():
            names = [entry["name"] for entry in self.manifest.get(kind, [])]
            found[f"number of {kind}"] = (count, len(names))
            if count == len(names):
                name_of = getattr(lib, f"kiln_{kind[:-1]}_name")
                found[f"{kind[:-1]} names"] = ([(name_of(k) or b"").decode(errors="replace") for k in range(count)],
                                               names)
        if found["number of outputs"][0] == found["number of outputs"][1]:
            flagged = [entry.get("data_dependent") is True for entry in self.manifest["outputs"]]
            found["outputs it allocates"] = ([bool(lib.kiln_output_allocated(k)) for k in range(counts["outputs"])],
                                             flagged)
        if found["number of states"][0] == found["number of states"][1]:
            found["state sizes"] = ([lib.kiln_state_nbytes(k) for k in range(counts["states"])],
                                    [math.prod(e["shape"]) * dtypes.dtype(e["dtype"]).itemsize
                                     for e in self.manifest.get("states", [])])
        for what, (library_value, expected) in found.items():
            if library_value != expected:
                raise KilnError(f"package {self.path}: {self.manifest['library']} was not built from this package's "
                                f"model.c ({what}: {library_value!r} in the library, {expected!r} in manifest.json)",
                                fix="recompile the package, and don't mix files of different packages or change "
                                    "them while loading")

    @property
    def num_threads(self) -> int | None:
        """Threads each call runs on (None: OpenMP's default, OMP_NUM_THREADS or the CPU count)."""
        return self._num_threads or None

    @num_threads.setter
    def num_threads(self, value: int | None) -> None:
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise KilnError(f"num_threads must be a positive int or None, got {value!r}", fix="e.g. num_threads=4")
        self._num_threads = value or 0
        self._lib.kiln_set_num_threads(self._handle, self._num_threads)

    @property
    def last_run_threads(self) -> int:
        """The threads the latest call ran on (1: the calling thread alone; 0 before the first call). Fewer than
        num_threads where the call had too little work to share, or where other processes kept the CPUs busy (a
        call measures the CPUs its threads had; kiln/codegen/c/kiln_threads.h)."""
        return self._lib.kiln_last_run_threads(self._handle)

    def __del__(self) -> None:
        handle, lib = getattr(self, "_handle", None), getattr(self, "_lib", None)
        if handle and lib is not None:
            lib.kiln_destroy(handle)
            self._handle = None
        if lib is not None:  # each load opened the library once: close it, so unloading a model unmaps its code
            self._lib = None
            _close_library(lib)

    def profile(self, *args: Any, runs: int = 10) -> list[tuple[str, float]]:
        """Run `runs` times with per-kernel timing; (kernel name, mean seconds per run), slowest first. Kernel
        names match the `kernel_N_<ops>` functions in the package's model.c."""
        if not isinstance(runs, int) or isinstance(runs, bool) or runs < 1:
            raise KilnError(f"runs must be a positive int, got {runs!r}", fix="e.g. runs=10")
        self._lib.kiln_set_profiling(self._handle, 1)
        try:
            for _ in range(runs):
                self(*args)
            count = self._lib.kiln_num_kernels()
            done = max(1, self._lib.kiln_profiled_runs(self._handle))
            timings = [(self._lib.kiln_kernel_name(i).decode(), self._lib.kiln_kernel_seconds(self._handle, i) / done)
                       for i in range(count)]
        finally:
            self._lib.kiln_set_profiling(self._handle, 0)
        return sorted(timings, key=lambda item: -item[1])

    def named_buffers(self) -> Iterator[tuple[str, np.ndarray]]:
        """(name, copy of the values) of each buffer the program mutates (a KV cache), which the package keeps from run
        to run; the other buffers are read-only weights."""
        for index, entry in enumerate(self.manifest.get("states", [])):
            yield entry["name"], self._state_view(index).copy()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Set state buffers by name (those named; shapes and dtypes as named_buffers gives them)."""
        slots = {entry["name"]: index for index, entry in enumerate(self.manifest.get("states", []))}
        with self._state_lock:
            for name, value in state.items():
                if name not in slots:
                    raise KilnError(f"'{name}' is not a buffer this package keeps",
                                    fix=f"its state buffers: {', '.join(slots) or 'none'}")
                view = self._state_view(slots[name])
                value = np.asarray(value)
                if value.shape != view.shape:
                    raise InputError(f"state '{name}' has shape {list(view.shape)}, got {list(value.shape)}")
                np.copyto(view, value, casting="same_kind")

    def reset_state(self) -> None:
        """Every state buffer back to its exported value (a KV cache emptied for the next sequence)."""
        with self._state_lock:
            self._lib.kiln_reset_state(self._handle)

    def _state_view(self, index: int) -> np.ndarray:
        """State buffer `index` as a numpy view of the model's memory (valid until the next run)."""
        entry = self.manifest["states"][index]
        dtype = dtypes.dtype(entry["dtype"]).numpy
        count = math.prod(entry["shape"]) * np.dtype(dtype).itemsize
        data = ctypes.cast(self._lib.kiln_state_data(self._handle, index), ctypes.POINTER(ctypes.c_uint8))
        return np.ctypeslib.as_array(data, (max(count, 1),))[:count].view(dtype).reshape(entry["shape"])

    def __call__(self, *args: Any) -> Any:
        if self._stateful:  # runs that read and replace the state take turns
            with self._state_lock:
                return self._call(args)
        return self._call(args)

    def _call(self, args: tuple) -> Any:
        arrays = self.signature.arrays(args)
        values = self.signature.bind(arrays)
        specs = self.signature.outputs(values)
        # an output the run allocates: kiln.h's kiln_allocated_output, which it fills
        outputs = [_AllocatedOutput() if shape is None else np.empty(shape, dtype) for shape, dtype in specs]
        try:  # argument arrays are per thread, so concurrent calls never share them
            symbols, inputs, outs = self._call_slots.arrays
        except AttributeError:
            symbols = (ctypes.c_int64 * max(1, len(values)))()
            inputs = (ctypes.c_void_p * max(1, len(arrays)))()
            outs = (ctypes.c_void_p * max(1, len(outputs)))()
            self._call_slots.arrays = (symbols, inputs, outs)
        for k, value in enumerate(values):
            symbols[k] = value
        for k, array in enumerate(arrays):
            inputs[k] = _address(array)
        for k, output in enumerate(outputs):
            outs[k] = ctypes.addressof(output) if isinstance(output, _AllocatedOutput) else _address(output)
        status = self._lib.kiln_run(self._handle, symbols, inputs, outs)
        if status:
            raise KilnError(f"the compiled model failed: {self._lib.kiln_error(self._handle).decode()}")
        if self._allocates:
            outputs = [self._take(output, dtype, len(spec["shape"])) if isinstance(output, _AllocatedOutput)
                       else output for output, (_, dtype), spec in zip(outputs, specs, self.manifest["outputs"])]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _take(self, output: "_AllocatedOutput", dtype: Any, rank: int) -> np.ndarray:
        """An output the run allocated, as a numpy array of its own (the run's memory goes back to the library)."""
        shape = tuple(output.shape[:rank])
        try:
            if math.prod(shape) == 0:
                return np.empty(shape, dtype)
            data = ctypes.cast(output.data, ctypes.POINTER(ctypes.c_uint8))
            count = math.prod(shape) * np.dtype(dtype).itemsize
            return np.ctypeslib.as_array(data, (count,)).view(dtype).reshape(shape).copy()
        finally:
            self._lib.kiln_free(output.data)


def _address(array: np.ndarray) -> int:
    """The address of a C-contiguous array's first element. Through the buffer protocol where numpy exports one (a
    writable, non-empty array of a numpy dtype, not ml_dtypes' bfloat16 or float8) it costs 0.4 us, a third of
    .ctypes.data, which was a quarter of a small model's call from Python."""
    if array.flags.writeable and array.size and array.dtype.isbuiltin == 1:
        return ctypes.addressof(ctypes.c_char.from_buffer(array))
    return array.ctypes.data


def load(path: str | pathlib.Path, num_threads: int | None = None) -> Any:
    """Load a package written by kiln.compile: a `CompiledModel` (C; `num_threads` as for its `num_threads`) or a
    `TritonModel`."""
    manifest = read_manifest(pathlib.Path(path))
    if manifest.get("format") == "kiln-triton-package":
        from kiln.runtime.triton import TritonModel
        return TritonModel(path, manifest)
    return CompiledModel(path, num_threads, manifest)
