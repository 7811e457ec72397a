"""kiln.nn.Module: torch.nn.Module's bookkeeping (parameters, buffers, submodules, state dicts, modes).

While tracing, calling a module pushes its qualified name onto the tracer's module stack, so every
recorded op knows its `nn_module_stack` like torch.export's nodes do.
"""

from __future__ import annotations

from collections import OrderedDict, namedtuple
from typing import Any, Callable, Iterator

import numpy as np

from kiln.frontend.tensor import Parameter, Tensor
from kiln.ir import dtypes
from kiln.ir.errors import KilnError, ShapeError

IncompatibleKeys = namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])


def _to_array(value: Any) -> np.ndarray:
    """A state-dict value from kiln, numpy, or torch (converted through numpy; bfloat16 via float32)."""
    if isinstance(value, Tensor):
        return value.numpy()
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "detach") and hasattr(value, "numpy"):  # a torch.Tensor, without importing torch
        tensor = value.detach().cpu()
        if str(tensor.dtype) == "torch.bfloat16":
            return tensor.float().numpy().astype(dtypes.bfloat16.numpy)
        return tensor.numpy()
    return np.asarray(value)


def empty_storage(shape: Any, dtype: Any) -> np.ndarray:
    """Storage for a parameter that reset_parameters() fills (torch.empty's values are unspecified)."""
    target = dtypes.default_float_dtype() if dtype is None else dtypes.dtype(dtype)
    return np.zeros(tuple(shape) if isinstance(shape, (tuple, list)) else (shape,), dtype=target.numpy)


def new_parameter(shape: Any, dtype: Any) -> Parameter:
    return Parameter(empty_storage(shape, dtype))


def check_device(device: Any) -> None:
    """Layers accept torch's `device=` argument; only the CPU exists for kiln's eager mode."""
    if device is not None and str(device) != "cpu":
        raise KilnError(f"device {device!r} is not available: kiln's eager mode runs on the CPU",
                        fix="create the module without device=..., then compile for your target")


class Module:
    """Base class of every kiln.nn layer; subclasses define `forward`."""

    training: bool

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent_buffers", set())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    # -- attribute routing
    def __setattr__(self, name: str, value: Any) -> None:
        if "_parameters" not in self.__dict__:
            raise KilnError(f"cannot assign '{name}' before Module.__init__() was called",
                            fix="call super().__init__() first in your module's __init__")
        params, buffers, modules = self._parameters, self._buffers, self._modules
        if isinstance(value, Parameter):
            for table in (buffers, modules, self.__dict__):
                table.pop(name, None)
            params[name] = value
        elif isinstance(value, Module):
            for table in (params, buffers, self.__dict__):
                table.pop(name, None)
            modules[name] = value
        elif name in params:
            if value is not None:
                raise KilnError(f"cannot assign {type(value).__name__} as parameter '{name}'",
                                fix="wrap it in kiln.nn.Parameter(...) or assign None")
            params[name] = None
        elif name in buffers and (value is None or isinstance(value, Tensor)):
            buffers[name] = value
        elif name in modules and value is None:
            modules[name] = None
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        for table in ("_parameters", "_buffers", "_modules"):
            entries = self.__dict__.get(table)
            if entries is not None and name in entries:
                return entries[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name: str) -> None:
        for table in (self._parameters, self._buffers, self._modules):
            if name in table:
                del table[name]
                self._non_persistent_buffers.discard(name)
                return
        object.__delattr__(self, name)

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        self._parameters[name] = param

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        if "." in name or not name:
            raise KilnError(f"buffer name {name!r} must be non-empty and contain no '.'")
        if tensor is not None and not isinstance(tensor, Tensor):
            raise KilnError(f"cannot assign {type(tensor).__name__} as buffer '{name}' (kiln.Tensor or None expected)")
        self.__dict__.pop(name, None)
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers.discard(name)
        else:
            self._non_persistent_buffers.add(name)

    def add_module(self, name: str, module: "Module | None") -> None:
        self._modules[name] = module

    register_module = add_module

    def get_submodule(self, target: str) -> "Module":
        module: Module = self
        for part in filter(None, target.split(".")):
            module = getattr(module, part)
        return module

    # -- traversal
    def named_modules(self, memo: set | None = None, prefix: str = "",
                      remove_duplicate: bool = True) -> Iterator[tuple[str, "Module"]]:
        memo = set() if memo is None else memo
        if remove_duplicate:
            if id(self) in memo:
                return
            memo.add(id(self))
        yield prefix, self
        for name, child in self._modules.items():
            if child is not None:
                yield from child.named_modules(memo, f"{prefix}.{name}" if prefix else name, remove_duplicate)

    def modules(self) -> Iterator["Module"]:
        return (module for _, module in self.named_modules())

    def named_children(self) -> Iterator[tuple[str, "Module"]]:
        seen = set()
        for name, child in self._modules.items():
            if child is not None and id(child) not in seen:
                seen.add(id(child))
                yield name, child

    def children(self) -> Iterator["Module"]:
        return (child for _, child in self.named_children())

    def _named_members(self, table: str, prefix: str, recurse: bool,
                       remove_duplicate: bool = True) -> Iterator[tuple[str, Any]]:
        seen: set[int] = set()
        modules = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse else [(prefix, self)]
        for module_prefix, module in modules:
            for name, value in getattr(module, table).items():
                if value is None or (remove_duplicate and id(value) in seen):
                    continue
                seen.add(id(value))
                yield (f"{module_prefix}.{name}" if module_prefix else name), value

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True) -> Iterator[tuple[str, Parameter]]:
        return self._named_members("_parameters", prefix, recurse, remove_duplicate)

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        return (p for _, p in self.named_parameters(recurse=recurse))

    def named_buffers(self, prefix: str = "", recurse: bool = True,
                      remove_duplicate: bool = True) -> Iterator[tuple[str, Tensor]]:
        return self._named_members("_buffers", prefix, recurse, remove_duplicate)

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        return (b for _, b in self.named_buffers(recurse=recurse))

    # -- state dicts with torch's key names
    def state_dict(self, destination: dict | None = None, prefix: str = "", keep_vars: bool = False) -> dict:
        result: dict[str, Tensor] = OrderedDict() if destination is None else destination
        for name, param in self._parameters.items():
            if param is not None:
                result[prefix + name] = param if keep_vars else Tensor(param.numpy())
        for name, buffer in self._buffers.items():
            if buffer is not None and name not in self._non_persistent_buffers:
                result[prefix + name] = buffer if keep_vars else Tensor(buffer.numpy())
        for name, child in self._modules.items():
            if child is not None:
                child.state_dict(result, prefix + name + ".", keep_vars)
        return result

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True,
                        assign: bool = False) -> IncompatibleKeys:
        """Copy values in (from kiln tensors, numpy arrays or torch tensors); shapes must match."""
        own = self.state_dict(keep_vars=True)
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        if strict and (missing or unexpected):
            raise KilnError(f"error loading state_dict for {type(self).__name__}: missing keys {missing}, "
                            f"unexpected keys {unexpected}", fix="pass strict=False to ignore them")
        for key, target in own.items():
            if key not in state_dict:
                continue
            array = _to_array(state_dict[key])
            if tuple(array.shape) != tuple(target.shape):
                raise ShapeError(f"size mismatch for {key}: copying a param with shape {list(array.shape)}, "
                                 f"the shape in current model is {list(target.shape)}")
            target._value = np.array(array, dtype=target.dtype.numpy, copy=True)
        return IncompatibleKeys(missing, unexpected)

    # -- modes and conversions
    def train(self, mode: bool = True) -> "Module":
        for module in self.modules():
            object.__setattr__(module, "training", mode)
        return self

    def eval(self) -> "Module":
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> "Module":
        for param in self.parameters():
            param.requires_grad = requires_grad
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Set every parameter's `.grad` to None, or with `set_to_none=False` zero it in place (torch's semantics)."""
        for param in self.parameters():
            if param.grad is not None:
                if set_to_none:
                    param.grad = None
                else:
                    if param.grad.grad_fn is not None:
                        param.grad.detach_()
                    else:
                        param.grad.requires_grad_(False)
                    param.grad.zero_()

    def apply(self, fn: Callable[["Module"], None]) -> "Module":
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    def to(self, *args: Any, **kwargs: Any) -> "Module":
        """`to(dtype)` casts floating-point parameters and buffers; devices other than cpu are refused."""
        target = kwargs.get("dtype")
        for arg in args:
            if isinstance(arg, str):
                if arg != "cpu":
                    raise KilnError(f"device {arg!r} is not available: kiln's eager mode runs on the CPU",
                                    fix="compile with `kiln.compile(..., target='triton')` for GPUs")
            elif arg is not None:
                target = arg
        if target is not None:
            dtype = dtypes.dtype(target)
            for tensor in [*self.parameters(), *self.buffers()]:
                if tensor.dtype.is_floating_point:
                    tensor._value = tensor._value.astype(dtype.numpy)
        return self

    def float(self) -> "Module":
        return self.to(dtypes.float32)

    def double(self) -> "Module":
        return self.to(dtypes.float64)

    def half(self) -> "Module":
        return self.to(dtypes.float16)

    def bfloat16(self) -> "Module":
        return self.to(dtypes.bfloat16)

    def cpu(self) -> "Module":
        return self

    # -- calling
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise KilnError(f"{type(self).__name__} has no forward() method",
                        fix="define forward(self, ...) in your Module subclass")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from kiln.frontend.tracing import active_tracer
        tracer = active_tracer()
        path = tracer.module_paths.get(id(self), type(self).__name__) if tracer is not None else ""
        if not path:  # eager, or the exported root module (torch's nn_module_stack leaves it out too)
            return self.forward(*args, **kwargs)
        with tracer.module_scope(path, type(self).__qualname__):
            result = self.forward(*args, **kwargs)
        if path in tracer.preserve:
            tracer.record_call(path, (args, kwargs), result)
        return result

    # -- printing like torch
    def extra_repr(self) -> str:
        return ""

    def _get_name(self) -> str:
        return type(self).__name__

    def __repr__(self) -> str:
        lines = []
        extra = self.extra_repr()
        if extra:
            lines.extend(extra.split("\n"))
        for name, child in self._modules.items():
            child_repr = repr(child).replace("\n", "\n  ")
            lines.append(f"({name}): {child_repr}")
        if not lines:
            return f"{self._get_name()}()"
        if len(lines) == 1 and not self._modules:
            return f"{self._get_name()}({lines[0]})"
        return f"{self._get_name()}(\n  " + "\n  ".join(lines) + "\n)"

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._parameters) | set(self._buffers) | set(self._modules))
