"""Loads a Triton package (kiln/codegen/triton): model.py's kernels and launcher, the weights as torch tensors on
the inputs' device, and the same input validation as the C loader. Needs torch and triton at run time."""

from __future__ import annotations

import hashlib
import importlib.util
import pathlib
import threading
from types import SimpleNamespace
from typing import Any, Iterator

import numpy as np

from kiln.ir import dtypes
from kiln.ir.errors import InputError, KilnError
from kiln.runtime.package import Signature, check_manifest

SOURCE = "model.py"


def _torch() -> Any:
    try:
        import torch
        import triton  # noqa: F401
    except ImportError as error:
        raise KilnError(f"the Triton target needs torch and triton at run time ({error.name} is not installed)",
                        fix="pip install torch triton (Triton's interpreter, TRITON_INTERPRET=1, runs it on CPU)"
                        ) from None
    return torch


def _check_interpreter() -> None:
    """Triton runs CPU tensors only through its interpreter, which must have been on when triton was first imported
    (it decides then how its own library functions run)."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    if not isinstance(tl.zeros, InterpretedFunction):
        raise KilnError("Triton runs kernels on CPU tensors only through its interpreter, which is off in this process",
                        fix="set TRITON_INTERPRET=1 before triton is first imported, or pass tensors on a GPU")


def _from_numpy(torch: Any, array: np.ndarray) -> Any:
    """A CPU tensor sharing `array` (bfloat16, which numpy knows through ml_dtypes, by its bits)."""
    if array.dtype == dtypes.bfloat16.numpy:
        return torch.from_numpy(array.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def _to_numpy(torch: Any, tensor: Any) -> np.ndarray:
    tensor = tensor.cpu()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.uint16).numpy().view(dtypes.bfloat16.numpy)
    return tensor.numpy()


class TritonModel:
    """A loaded Triton package: call it with torch tensors (it runs on their device and returns torch tensors) or
    numpy arrays (run on CPU tensors, which needs TRITON_INTERPRET=1; returns numpy arrays).

    Buffers the program mutates (a KV cache) are state the model keeps from call to call, on the device of the
    latest call, as the C package keeps them: `named_buffers`, `load_state_dict` and `reset_state` read, set and
    restore them."""

    def __init__(self, path: str | pathlib.Path, manifest: dict):
        self.path = pathlib.Path(path)
        self.manifest = manifest
        self._torch = torch = _torch()
        if manifest.get("source") != SOURCE:
            raise KilnError(f"package {self.path}: its manifest names source {manifest.get('source')!r}, not "
                            f"{SOURCE!r} in the package folder", fix="recompile the package")
        files = check_manifest(self.path, manifest)
        text = files["source"].read_bytes()
        if hashlib.sha256(text).hexdigest() != manifest.get("source_sha256"):
            raise KilnError(f"package {self.path}: {SOURCE} is not the one this manifest was written with",
                            fix="recompile the package, and don't mix files of different packages")
        weights_path = files["weights_file"]
        self.signature = Signature(manifest)
        spec = importlib.util.spec_from_file_location(f"kiln_triton_{manifest['source_sha256'][:16]}",
                                                      files["source"])
        self._module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self._module)
        blob = np.fromfile(weights_path, np.uint8) if weights_path.stat().st_size else np.zeros(0, np.uint8)
        self._weights = {}
        for entry in manifest["weights"]:
            dtype = dtypes.dtype(entry["dtype"])
            raw = blob[entry["offset"]:entry["offset"] + entry["nbytes"]]
            array = raw.view(dtype.numpy.newbyteorder("<")).astype(dtype.numpy)
            self._weights[entry["name"]] = _from_numpy(torch, array.reshape(-1).copy())
        self._on_device: dict[Any, dict[str, Any]] = {}
        self._state_shapes = {entry["name"]: list(entry["shape"]) for entry in manifest.get("states", [])}
        stored = {entry["name"]: entry for entry in manifest["weights"]}
        for entry in manifest.get("states", []):  # the kernels index the state as compiled: it must be that size
            name, shape = entry["name"], entry["shape"]
            weight = stored.get(name)
            if weight is None or weight["dtype"] != entry["dtype"] or \
                    self._weights[name].numel() != int(np.prod(shape)):
                raise KilnError(f"package {self.path}: state {name!r} has no {entry['dtype']}{shape} values in "
                                "weights.bin", fix="recompile the package")
        self._state: dict[str, Any] = {}  # name -> flat tensor; empty until the first call (or after a reset)
        self._state_lock = threading.Lock()  # runs that read and replace the state take turns

    def _weights_on(self, device: Any) -> dict[str, Any]:
        if device not in self._on_device:
            self._on_device[device] = {name: w.to(device) for name, w in self._weights.items()
                                       if name not in self._state_shapes}  # the state has copies of its own
        return self._on_device[device]

    def _state_on(self, device: Any) -> dict[str, Any]:
        """The state on `device`: the exported values at first, then wherever the latest call left them."""
        for name in self._state_shapes:
            current = self._state.get(name)
            if current is None:
                self._state[name] = self._weights[name].to(device, copy=True)
            elif current.device != device:
                self._state[name] = current.to(device)
        return self._state

    def named_buffers(self) -> Iterator[tuple[str, np.ndarray]]:
        """(name, copy of the values) of each buffer the program mutates, which the model keeps from run to run."""
        for name, shape in self._state_shapes.items():
            current = self._state.get(name, self._weights[name])
            yield name, _to_numpy(self._torch, current).reshape(shape).copy()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Set state buffers by name (numpy arrays or torch tensors of the shapes named_buffers gives)."""
        torch = self._torch
        with self._state_lock:
            for name, value in state.items():
                if name not in self._state_shapes:
                    raise KilnError(f"'{name}' is not a buffer this package keeps",
                                    fix=f"its state buffers: {', '.join(self._state_shapes) or 'none'}")
                tensor = value if isinstance(value, torch.Tensor) else _from_numpy(torch, np.array(value))
                if list(tensor.shape) != self._state_shapes[name]:
                    raise InputError(f"state '{name}' has shape {self._state_shapes[name]}, got {list(tensor.shape)}")
                current = self._state.get(name, self._weights[name])
                self._state[name] = tensor.reshape(-1).to(current.device, current.dtype, copy=True)

    def reset_state(self) -> None:
        """Every state buffer back to its exported value (a KV cache emptied for the next sequence)."""
        with self._state_lock:
            self._state = {}

    def __call__(self, *args: Any) -> Any:
        if self._state_shapes:
            with self._state_lock:
                return self._call(args)
        return self._call(args)

    def _call(self, args: tuple) -> Any:
        torch = self._torch
        values = self.signature.arrays(args, accept=lambda value: isinstance(value, torch.Tensor))
        as_numpy = not any(isinstance(v, torch.Tensor) for v in values) if values else True
        described = [SimpleNamespace(dtype=dtypes.dtype(str(v.dtype).removeprefix("torch.")).numpy, ndim=v.ndim,
                                     shape=tuple(v.shape)) if isinstance(v, torch.Tensor) else v for v in values]
        symbols = self.signature.bind(described)
        tensors = [v.contiguous() if isinstance(v, torch.Tensor) else _from_numpy(torch, v) for v in values]
        devices = {t.device for t in tensors}
        if len(devices) > 1:
            raise InputError(f"the inputs are on several devices ({', '.join(sorted(map(str, devices)))})",
                             fix="move them to one device")
        device = next(iter(devices)) if devices else torch.device("cpu")
        if device.type == "cpu":
            _check_interpreter()
        error = torch.zeros(4, dtype=torch.int64, device=device)
        state = self._state_on(device) if self._state_shapes else {}
        outputs, new_state = self._module.run(tensors, self._weights_on(device), symbols, error, state)
        op, index, dim, size = error.tolist()
        if op:  # the state updated in place keeps what the run wrote; the others keep their old values
            raise KilnError(f"the compiled model failed: index {index} is out of bounds for dimension {dim} with "
                            f"size {size} in {self._module.CHECKED_OPS[op - 1]}")
        state.update(new_state)
        if as_numpy:
            outputs = [_to_numpy(torch, o) for o in outputs]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)
