"""kiln.optim.Optimizer: torch.optim.Optimizer's bookkeeping (param groups, per-parameter state, state dicts).

Subclasses write `step` as torch's single-tensor implementations do, with in-place kiln Tensor ops run under
`kiln.no_grad()`, so a step updates `param._value` like torch updates storage and records nothing.
"""

from __future__ import annotations

import functools
import warnings
from collections import defaultdict
from copy import deepcopy
from itertools import chain
from typing import Any, Callable

import numpy as np

from kiln.frontend import autograd
from kiln.frontend.tensor import Tensor
from kiln.ir import dtypes
from kiln.ir.errors import KilnError, OpArgumentError, UnsupportedError

__all__ = ["Optimizer", "OptimizerArgumentError", "required"]


class OptimizerArgumentError(KilnError, ValueError):
    """A hyperparameter or parameter group that torch.optim refuses with a ValueError (same message)."""


class _RequiredParameter:
    """Marks a hyperparameter without a default (torch.optim.optimizer.required)."""

    def __repr__(self) -> str:
        return "<required parameter>"


required = _RequiredParameter()


def step_without_grad(step: Callable[..., Any]) -> Callable[..., Any]:
    """Run an optimizer's `step` with grad mode off, as torch's `_use_grad_for_differentiable` does."""

    @functools.wraps(step)
    def wrapper(self: "Optimizer", *args: Any, **kwargs: Any) -> Any:
        with autograd.no_grad():
            return step(self, *args, **kwargs)
    return wrapper


def evaluate_closure(closure: Callable[[], Any] | None) -> Any:
    """The loss a step's closure returns, computed with grad mode on (its backward fills `.grad`)."""
    if closure is None:
        return None
    with autograd.enable_grad():
        return closure()


def to_scalar(value: Any) -> Any:
    """A hyperparameter as the update reads it: a 1-element Tensor becomes its Python number."""
    return value.item() if isinstance(value, Tensor) else value


def check_single_implementation(foreach: Any, fused: Any, differentiable: bool) -> None:
    """kiln has torch's single-tensor update only; `foreach` picks torch's kernel and changes nothing here."""
    if fused:
        raise UnsupportedError("fused optimizers are not supported: kiln runs torch's single-tensor update",
                               fix="leave fused=None (or False)")
    if differentiable:
        raise UnsupportedError("differentiable optimizer steps are not supported yet",
                               fix="leave differentiable=False")


def _is_torch_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "detach") and hasattr(value, "numpy")


def _as_kiln_tensor(value: Any) -> Tensor:
    """A state tensor from a kiln or torch state_dict, as a kiln.Tensor that shares nothing with it."""
    if isinstance(value, Tensor):
        return value.clone()
    tensor = value.detach().cpu()
    if str(tensor.dtype) == "torch.bfloat16":
        return Tensor(tensor.float().numpy().astype(dtypes.bfloat16.numpy))
    return Tensor(np.array(tensor.numpy(), copy=True))


class Optimizer:
    """Base class of kiln's optimizers, with torch.optim.Optimizer's API and semantics."""

    def __init__(self, params: Any, defaults: dict[str, Any]) -> None:
        self.defaults = defaults
        if isinstance(params, Tensor):
            raise OpArgumentError("params argument given to the optimizer should be an iterable of Tensors or "
                                  f"dicts, but got {_typename(params)}",
                                  fix="pass model.parameters() or a list of tensors")
        self.state: defaultdict[Tensor, Any] = defaultdict(dict)
        self.param_groups: list[dict[str, Any]] = []
        param_groups = list(params)
        if len(param_groups) == 0:
            raise OptimizerArgumentError("optimizer got an empty parameter list")
        if not isinstance(param_groups[0], dict):
            param_groups = [{"params": param_groups}]
        for param_group in param_groups:
            self.add_param_group(param_group)

    def __getstate__(self) -> dict[str, Any]:
        return {"defaults": self.defaults, "state": self.state, "param_groups": self.param_groups}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.defaults.setdefault("differentiable", False)

    def __repr__(self) -> str:
        text = self.__class__.__name__ + " ("
        for index, group in enumerate(self.param_groups):
            text += f"\nParameter Group {index}\n"
            for key in sorted(group.keys()):
                if key != "params":
                    text += f"    {key}: {group[key]}\n"
        return text + ")"

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Update the parameters from their `.grad` once; `closure` re-evaluates the model and returns the loss."""
        raise NotImplementedError

    def _with_grads(self, group: dict[str, Any]) -> list[tuple[Tensor, dict[str, Any]]]:
        """The group's parameters that have a gradient, each with its state (created on first use, as torch's
        lazy state initialization)."""
        found = []
        for param in group["params"]:
            if param.grad is None:
                continue
            if param.dtype.is_complex:
                raise UnsupportedError(f"{type(self).__name__} on complex parameters is not supported yet",
                                       fix="optimize the real and imaginary parts as two real parameters")
            state = self.state[param]
            if len(state) == 0:
                self._init_state(param, group)
            found.append((param, state))
        return found

    def _init_state(self, param: Tensor, group: dict[str, Any]) -> None:
        """Create `param`'s state as the first step would (kiln.training calls it before tracing a step)."""
        raise NotImplementedError(f"{type(self).__name__} does not say how its state starts")

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Set every parameter's `.grad` to None, or with `set_to_none=False` zero it in place."""
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    if set_to_none:
                        param.grad = None
                    else:
                        clear_grad_in_place(param.grad)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group of parameters (with its own hyperparameters, defaults filled in) to `param_groups`."""
        if not isinstance(param_group, dict):
            raise OpArgumentError(f"param_group must be a dict, but got {type(param_group)}")
        params = param_group["params"]
        if isinstance(params, Tensor):
            param_group["params"] = [params]
        elif isinstance(params, set):
            raise OpArgumentError("optimizer parameters need to be organized in ordered collections, but the "
                                  "ordering of tensors in sets will change between runs. Please use a list instead.")
        else:
            param_group["params"] = list(params)

        tensors, names = [], []
        for param in param_group["params"]:
            if isinstance(param, tuple):  # named_parameters()
                names.append(param[0])
                tensors.append(param[1])
            else:
                tensors.append(param)
        param_group["params"] = tensors
        if names:
            if len(names) != len(tensors):
                raise OptimizerArgumentError(
                    "all optimizer params should be with/without names. Some param names are missing")
            param_group["param_names"] = names

        for param in param_group["params"]:
            if not isinstance(param, Tensor):
                raise OpArgumentError("optimizer can only optimize Tensors, but one of the params is "
                                      f"{_typename(param)}")
            if not self.defaults.get("differentiable", None) and not (param.is_leaf or param.retains_grad):
                raise OptimizerArgumentError("can't optimize a non-leaf Tensor",
                                             fix="optimize the leaf tensors, or `.detach().requires_grad_()` it")

        for name, default in self.defaults.items():
            if default is required and name not in param_group:
                raise OptimizerArgumentError(
                    f"parameter group didn't specify a value of required optimization parameter {name}")
            param_group.setdefault(name, default)

        ids = [id(param) for param in param_group["params"]]
        if len(ids) != len(set(ids)):
            warnings.warn("optimizer contains a parameter group with duplicate parameters; in future, this will "
                          "cause an error; see github.com/pytorch/pytorch/issues/40967 for more information",
                          stacklevel=3)
        seen: set[int] = set()
        for group in self.param_groups:
            seen.update(id(param) for param in group["params"])
            if ("param_names" in param_group) != ("param_names" in group):
                named = "with names" if "param_names" in param_group else "without names"
                raise OptimizerArgumentError("all optimizer param groups should be with/without names. "
                                             f"cannot add param group {named} to the optimizer")
        if not seen.isdisjoint(ids):
            raise OptimizerArgumentError("some parameters appear in more than one parameter group")
        self.param_groups.append(param_group)

    def state_dict(self) -> dict[str, Any]:
        """`{"state": {id: {...}}, "param_groups": [{..., "params": [ids]}]}`, ids numbering the parameters in
        group order; the state's tensors are the optimizer's own (as in torch), not copies."""
        mapping: dict[int, int] = {}
        start = 0

        def pack_group(group: dict[str, Any]) -> dict[str, Any]:
            nonlocal start
            packed = {key: value for key, value in group.items() if key != "params"}
            mapping.update({id(p): i for i, p in enumerate(group["params"], start) if id(p) not in mapping})
            packed["params"] = [mapping[id(p)] for p in group["params"]]
            start += len(packed["params"])
            return packed

        param_groups = [pack_group(group) for group in self.param_groups]
        packed_state = {(mapping[id(key)] if isinstance(key, Tensor) else key): value
                        for key, value in self.state.items()}
        return {"state": packed_state, "param_groups": param_groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state_dict from kiln's or torch's `state_dict()` (tensors are copied into kiln Tensors, cast to
        their parameter's dtype except `step`), matching parameters by position as torch does."""
        state_dict = state_dict.copy()
        groups = self.param_groups
        saved_groups = deepcopy(state_dict["param_groups"])
        if len(groups) != len(saved_groups):
            raise OptimizerArgumentError("loaded state dict has a different number of parameter groups")
        if any(len(g["params"]) != len(s["params"]) for g, s in zip(groups, saved_groups)):
            raise OptimizerArgumentError(
                "loaded state dict contains a parameter group that doesn't match the size of optimizer's group")
        id_map = dict(zip(chain.from_iterable(g["params"] for g in saved_groups),
                          chain.from_iterable(g["params"] for g in groups)))

        def cast(param: Tensor, value: Any, key: Any = None) -> Any:
            if isinstance(value, Tensor) or _is_torch_tensor(value):
                tensor = _as_kiln_tensor(value)
                if key != "step" and param.is_floating_point():
                    tensor = tensor.to(param.dtype)
                return tensor
            if isinstance(value, dict):
                return {k: cast(param, v, k) for k, v in value.items()}
            if isinstance(value, (list, tuple)):
                return type(value)(cast(param, v) for v in value)
            return value

        state: defaultdict[Any, dict[Any, Any]] = defaultdict(dict)
        for key, value in state_dict["state"].items():
            if key in id_map:
                param = id_map[key]
                state[param] = cast(param, value)
            else:
                state[key] = value

        def update_group(group: dict[str, Any], new_group: dict[str, Any]) -> dict[str, Any]:
            new_group["params"] = group["params"]
            if "param_names" in group and "param_names" not in new_group:
                new_group["param_names"] = group["param_names"]
            return new_group

        param_groups = [update_group(g, ng) for g, ng in zip(groups, saved_groups)]
        for group in param_groups:  # torch's scalar hyperparameters may come as torch tensors
            for key, value in group.items():
                if _is_torch_tensor(value):
                    group[key] = _as_kiln_tensor(value)
        self.__setstate__({"state": state, "param_groups": param_groups})


def clear_grad_in_place(grad: Tensor) -> None:
    """`grad.zero_()` as torch's zero_grad(set_to_none=False) does it: out of the graph first."""
    if grad.grad_fn is not None:
        grad.detach_()
    else:
        grad.requires_grad_(False)
    grad.zero_()


def new_step(value: float = 0.0) -> Tensor:
    """A step counter as torch keeps it off the fused/capturable paths: a 0-d tensor of the default float dtype."""
    return Tensor(np.array(value, dtypes.default_float_dtype().numpy))


def step_as_tensor(state: dict[str, Any]) -> None:
    """A `step` loaded as a Python number becomes a 0-d tensor, as torch's __setstate__ does."""
    if len(state) != 0 and not isinstance(state["step"], Tensor):
        state["step"] = new_step(float(state["step"]))


def _typename(value: Any) -> str:
    kind = type(value)
    if isinstance(value, Tensor):
        return f"kiln.{kind.__name__}"
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
