"""kiln.compile / kiln.runtime.load: the compiled package (directory) and its ctypes-backed callable.

Layout: manifest.json (ABI version, signature, symbols and ranges, input/output dtypes and shapes, weight
offsets), weights.bin (raw little-endian, 64-byte aligned, mmap-able), model.c and model.so.
"""

from __future__ import annotations

import ctypes
import concurrent.futures
import json
import os
import pathlib
import shutil
import tempfile
import threading
from types import SimpleNamespace
from typing import Any

import numpy as np
import sympy

from kiln.ir import dtypes
from kiln.ir.errors import InputError, KilnError
from kiln.ir.files import atomic_write
from kiln.ir.interpreter import bind_symbols
from kiln.ir.program import ExportedProgram
from kiln.ir.symbolic import ValueRange, format_dim, parse_dim
from kiln.ir.types import TensorType

# A compiled package is for inference: eval-mode batch norm folds into its convolution or linear layer (as
# onnxruntime and torch.compile's freezing do), so the kernel's epilogue has no per-element normalization.
# Quantized layers become integer kernels (lower-quantized); the weights of the layers left in float are dequantized
# once, here, and the quantize ops left around them compute in float.
DEFAULT_PIPELINE = ("remove-dropout,fold-batchnorm,lower-quantized,fold-dequantized-weights,"
                    "decompose{namespaces=aten,quantized_decomposed},canonicalize,cse,dce")
ALIGN = 64


def compile(ep_or_module: Any, target: str = "c", *, example_args: Any = None, dynamic_shapes: Any = None,
            pipeline: str | None = None, output: str | pathlib.Path | None = None,
            num_threads: int | None = None) -> "CompiledModel":
    """Compile a program (or a module, exported with `example_args`) into a package and load it.

    The code targets this CPU's capability (`kiln.codegen.c.get_cpu_capability()`); `num_threads` sets the
    loaded model's threads (default: OpenMP's)."""
    from kiln.codegen.c import ABI_VERSION, build_library, get_cpu_capability, render, runtime_memory, stamp_build_id
    from kiln.codegen.c.render import int4_weights
    from kiln.codegen.c.attention import fuse_attention
    from kiln.codegen.c.legalize import legalize
    from kiln.codegen.memory import format_bytes, plan_memory
    from kiln.codegen.schedule import schedule
    from kiln.passes import run as run_passes

    if target != "c":
        raise KilnError(f"unknown compile target {target!r}", fix="use target='c'")
    program = ep_or_module
    if not isinstance(program, ExportedProgram):
        import kiln
        if example_args is None:
            raise KilnError("compiling a module needs example_args to export it", fix="pass example_args=(x,)")
        program = kiln.export(program, tuple(example_args), dynamic_shapes=dynamic_shapes)
    program = legalize(run_passes(program, pipeline or DEFAULT_PIPELINE))
    plan = fuse_attention(schedule(program))
    memory = plan_memory(plan, program.range_constraints)
    weights, offsets, chunks, size = [], {}, [], 0
    nibbles = int4_weights(plan)
    for buf in plan.buffers:
        if buf.kind != "weight" or buf.weight_key in offsets:
            continue
        array = np.ascontiguousarray(_weight_array(program, buf.weight_key), dtype=buf.dtype.numpy)
        padding = -size % ALIGN
        offsets[buf.weight_key] = size = size + padding
        data = np.frombuffer(_nibbles(array), np.uint8) if buf.weight_key in nibbles else \
            array.astype(array.dtype.newbyteorder("<"), copy=False)
        weights.append({"name": buf.weight_key, "offset": size, "nbytes": data.nbytes, "dtype": buf.dtype.name,
                        "shape": list(array.shape), "bits": 4 if buf.weight_key in nibbles else 8 * array.itemsize})
        chunks.append((padding, data))
        size += data.nbytes
    source, build_id = stamp_build_id(render(plan, offsets, memory, program.range_constraints, program.runtime_asserts))
    runtime = runtime_memory(plan)
    capability = get_cpu_capability()
    out = pathlib.Path(output) if output is not None else pathlib.Path(tempfile.mkdtemp(prefix="kiln_pkg_"))
    out.mkdir(parents=True, exist_ok=True)

    def write_weights(handle: Any) -> None:
        for padding, data in chunks:  # straight from the arrays: no copy of the whole blob in memory
            handle.write(b"\0" * padding)
            handle.write(data.reshape(-1).view(np.uint8))

    # The C compiler runs while the weights are written (GPT-2 small: 3.6 s and 1.7 s).
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        building = pool.submit(build_library, source, capability)
        # Every file is replaced atomically (a new inode): a model already loaded from this folder keeps its mapped
        # model.so and weights.bin, and readers never see a half-written package file.
        atomic_write(out / "model.c", source.encode())
        atomic_write(out / "weights.bin", write_weights)
        library = building.result()
    with open(library, "rb") as built:
        atomic_write(out / "model.so", lambda handle: shutil.copyfileobj(built, handle))
    manifest = {
        "format": "kiln-c-package", "abi_version": ABI_VERSION, "cpu_capability": capability,
        "library": "model.so", "source": "model.c", "build_id": build_id,
        "weights_file": "weights.bin", "weights": weights,
        "symbols": [{"name": str(s), "lower": _bound(program.range_constraints.get(s), "lower"),
                     "upper": _bound(program.range_constraints.get(s), "upper")} for s in plan.symbols],
        "inputs": [{"name": b.name, "dtype": b.dtype.name, "shape": [format_dim(d) for d in b.shape]}
                   for b in plan.inputs],
        "outputs": [{"name": name, "dtype": buf.dtype.name, "shape": [format_dim(d) for d in shape]}
                    for name, (buf, shape) in zip(plan.output_names, plan.outputs)],
        "memory": {"arena_bytes": format_bytes(memory.arena_bytes),
                   "unplanned_bytes": format_bytes(memory.unplanned_bytes),
                   "slots": len(memory.slots), "temps": len(memory.offsets),
                   "scratch_bytes_per_thread": [format_bytes(need) for need in runtime["scratch_bytes_per_thread"]],
                   "packed_weight_bytes": runtime["packed_weight_bytes"]},
    }
    atomic_write(out / "manifest.json", json.dumps(manifest, indent=2).encode())
    return load(out, num_threads=num_threads)


def _weight_array(program: ExportedProgram, key: str) -> np.ndarray:
    """A weight buffer's values: a state-dict or constant entry, or one component of a sparse one (`target.values`,
    see schedule.sparse_weight_key)."""
    for store in (program.state_dict, program.constants):
        if key in store:
            return np.asarray(store[key])
    target, _, component = key.rpartition(".")
    store = program.state_dict if target in program.state_dict else program.constants
    return store[target].components[component]


def _nibbles(array: np.ndarray) -> bytes:
    """int4 values (int8 storage, in [-8, 7]) two per byte, element 2m in the low nibble of byte m."""
    flat = np.ascontiguousarray(array, np.int8).ravel().view(np.uint8) & 0x0F
    if flat.size % 2:
        flat = np.append(flat, np.uint8(0))
    return (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8).tobytes()


def _check_weights(manifest: dict, path: pathlib.Path, size: int) -> None:
    """Every weight the manifest lists lies inside the weights file, at the size its shape and bit width take:
    checked before any native code reads them."""
    for entry in manifest.get("weights", []):
        bits = entry.get("bits", 8 * dtypes.dtype(entry["dtype"]).itemsize)
        expected = -(-int(np.prod(entry["shape"], dtype=np.int64)) * bits // 8)
        if entry["nbytes"] != expected or entry["offset"] < 0 or entry["offset"] + entry["nbytes"] > size:
            raise KilnError(f"package {path}: weight {entry['name']!r} ({entry['nbytes']} bytes at offset "
                            f"{entry['offset']}) does not fit its shape {entry['shape']} at {bits} bits or the "
                            f"{size}-byte weights file", fix="recompile the package; its files do not belong together")


def _bound(allowed: ValueRange | None, which: str) -> int | None:
    if allowed is None:
        return None
    value = getattr(allowed, which)
    return None if value in (float("inf"), float("-inf")) else int(value)


# Identities (device, inode) of the library files loaded from each path, in load order; see _open_library.
_LOADED_FILES: dict[str, list[tuple[int, int]]] = {}
_LOADED_FILES_LOCK = threading.Lock()


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
        return ctypes.CDLL(spelling)


class CompiledModel:
    """A loaded package: call it with numpy arrays (or kiln Tensors) in the user-input order."""

    def __init__(self, path: str | pathlib.Path, num_threads: int | None = None):
        self.path = pathlib.Path(path)
        self.manifest = json.loads((self.path / "manifest.json").read_text())
        from kiln.codegen.c import ABI_VERSION, supported_capabilities
        if self.manifest.get("abi_version") != ABI_VERSION:
            raise KilnError(f"package {self.path} has ABI version {self.manifest.get('abi_version')}, "
                            f"this kiln reads {ABI_VERSION}", fix="recompile the model with this kiln")
        capability = self.manifest.get("cpu_capability", "DEFAULT")
        if capability not in supported_capabilities():
            raise KilnError(f"package {self.path} was built for {capability} but this CPU runs "
                            f"{', '.join(supported_capabilities())}",
                            fix="recompile it here, or build it with KILN_CPU_CAPABILITY set to a level both run")
        self.symbols = [parse_dim(s["name"]) for s in self.manifest["symbols"]]
        ranges = {sym: ValueRange(s["lower"] if s["lower"] is not None else 0,
                                  s["upper"] if s["upper"] is not None else float("inf"))
                  for sym, s in zip(self.symbols, self.manifest["symbols"])}
        specs = [SimpleNamespace(name=i["name"]) for i in self.manifest["inputs"]]
        args = [SimpleNamespace(type=TensorType.of([parse_dim(d) for d in i["shape"]], dtypes.dtype(i["dtype"])))
                for i in self.manifest["inputs"]]
        self._signature = SimpleNamespace(graph_signature=SimpleNamespace(input_specs=specs),
                                          body=SimpleNamespace(args=args), range_constraints=ranges)
        self._outputs = [([parse_dim(d) for d in o["shape"]], dtypes.dtype(o["dtype"]).numpy)
                         for o in self.manifest["outputs"]]
        self._prepare_fast_path()
        self._call_slots = threading.local()
        weights_path = self.path / self.manifest["weights_file"]
        _check_weights(self.manifest, self.path, weights_path.stat().st_size)
        self._weights = np.memmap(weights_path, dtype=np.uint8, mode="r") if weights_path.stat().st_size else None
        lib = _open_library(self.path / self.manifest["library"])
        lib.kiln_build_id.restype = ctypes.c_char_p
        if lib.kiln_build_id().decode() != self.manifest.get("build_id"):
            raise KilnError(f"package {self.path}: {self.manifest['library']} was not built from this package's "
                            "model.c (its build id differs from manifest.json's)",
                            fix="recompile the package, and don't mix files of different packages or change them "
                                "while loading")
        lib.kiln_create.restype = ctypes.c_void_p
        lib.kiln_create.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        lib.kiln_run.restype = ctypes.c_int
        lib.kiln_run.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_void_p),
                                 ctypes.POINTER(ctypes.c_void_p)]
        lib.kiln_error.restype = ctypes.c_char_p
        lib.kiln_error.argtypes = [ctypes.c_void_p]
        lib.kiln_destroy.argtypes = [ctypes.c_void_p]
        lib.kiln_set_num_threads.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.kiln_set_profiling.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.kiln_kernel_name.restype = ctypes.c_char_p
        lib.kiln_kernel_name.argtypes = [ctypes.c_int]
        lib.kiln_kernel_seconds.restype = ctypes.c_double
        lib.kiln_kernel_seconds.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.kiln_profiled_runs.restype = ctypes.c_int64
        lib.kiln_profiled_runs.argtypes = [ctypes.c_void_p]
        self._lib = lib
        address = self._weights.ctypes.data if self._weights is not None else None
        self._handle = lib.kiln_create(address, 0 if self._weights is None else self._weights.size)
        if not self._handle:
            raise KilnError(f"kiln_create failed for {self.path} (out of memory?)")
        self._num_threads = 0
        if num_threads is not None:
            self.num_threads = num_threads

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

    def __del__(self) -> None:
        handle, lib = getattr(self, "_handle", None), getattr(self, "_lib", None)
        if handle and lib is not None:
            lib.kiln_destroy(handle)
            self._handle = None

    def profile(self, *args: Any, runs: int = 10) -> list[tuple[str, float]]:
        """Run `runs` times with per-kernel timing; (kernel name, mean seconds per run), slowest first. Kernel
        names match the `kernel_N_<ops>` functions in the package's model.c."""
        if runs < 1:
            raise KilnError(f"runs must be at least 1, got {runs}", fix="e.g. runs=10")
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

    def _prepare_fast_path(self) -> None:
        """Precompute the checks of the common case (every dim static or a plain symbol) so a call validates with
        a few integer compares; anything else, and every failure, goes through bind_symbols for its full error."""
        self._output_shapes = [
            (sympy.lambdify(self.symbols, sympy.Tuple(*shape), modules="math") if self.symbols
             else (lambda shape=shape: shape), dtype) for shape, dtype in self._outputs]
        position = {sym: k for k, sym in enumerate(self.symbols)}
        bounds = [(s["lower"] if s["lower"] is not None else 0,
                   s["upper"] if s["upper"] is not None else np.iinfo(np.int64).max) for s in self.manifest["symbols"]]
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
            self._input_checks.append((dtypes.dtype(spec["dtype"]).numpy, len(dims), dims))
        if bound != set(range(len(self.symbols))):
            self._input_checks = None
            return
        self._symbol_bounds = bounds

    def _bind_fast(self, arrays: list) -> list[int] | None:
        """Symbol values (in kiln_run's order) when every input passes the precomputed checks, else None."""
        values = [-1] * len(self.symbols)
        for (dtype, rank, dims), array in zip(self._input_checks, arrays):
            if array.dtype != dtype or array.ndim != rank:
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

    def __call__(self, *args: Any) -> Any:
        specs = self.manifest["inputs"]
        if len(args) != len(specs):
            raise InputError(f"the compiled model takes {len(specs)} input(s) "
                             f"({', '.join(s['name'] for s in specs)}) but got {len(args)}")
        arrays = []
        for spec, value in zip(specs, args):
            if not isinstance(value, np.ndarray):
                if hasattr(value, "__kiln_array__"):
                    value = value.__kiln_array__()
                if not isinstance(value, np.ndarray):
                    raise InputError(f"input '{spec['name']}' must be a numpy array, got {type(value).__name__}")
            arrays.append(value if value.flags.c_contiguous else np.ascontiguousarray(value))
        values = self._bind_fast(arrays) if self._input_checks is not None else None
        if values is None:  # validates dtype, rank, dims, ranges and relations; raises naming the input
            bindings = bind_symbols(self._signature, arrays)
            values = [bindings.get(s, 0) for s in self.symbols]
        outputs = [np.empty(shape(*values), dtype) for shape, dtype in self._output_shapes]
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
            inputs[k] = array.ctypes.data
        for k, output in enumerate(outputs):
            outs[k] = output.ctypes.data
        status = self._lib.kiln_run(self._handle, symbols, inputs, outs)
        if status:
            raise KilnError(f"the compiled model failed: {self._lib.kiln_error(self._handle).decode()}")
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


def load(path: str | pathlib.Path, num_threads: int | None = None) -> CompiledModel:
    """Load a package written by kiln.compile; `num_threads` as for `CompiledModel.num_threads`."""
    return CompiledModel(path, num_threads)
