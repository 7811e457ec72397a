"""kiln.optim.lr_scheduler: torch.optim.lr_scheduler's schedules, with the same (recursive) formulas.

Each scheduler rewrites its optimizer's `param_group["lr"]` on `step()`; most compute the new rate from the current
one (torch's chainable form), so two schedulers on one optimizer compose, and the values equal torch's exactly.
"""

from __future__ import annotations

import contextlib
import math
import types
import warnings
from bisect import bisect_right
from collections import Counter
from functools import wraps
from typing import Any, Callable, Iterable, Iterator, Literal, Sequence
from weakref import ref

from kiln.frontend.optim.optimizer import Optimizer, OptimizerArgumentError, to_scalar
from kiln.frontend.tensor import Tensor
from kiln.ir.errors import OpArgumentError

__all__ = ["LRScheduler", "LambdaLR", "StepLR", "MultiStepLR", "ExponentialLR", "CosineAnnealingLR", "OneCycleLR"]

EPOCH_DEPRECATION_WARNING = (
    "The epoch parameter in `scheduler.step()` was not necessary and is being deprecated where possible. Please use "
    "`scheduler.step()` to step the scheduler. During the deprecation, if epoch is different from None, the closed "
    "form is used instead of the new chainable form, where available. Please open an issue if you are unable to "
    "replicate your use case: https://github.com/pytorch/pytorch/issues/new/choose."
)


def _format_param(name: str, optimizer: Optimizer, param: Any) -> list[Any]:
    """One value per param group: a list is checked for length, a single value repeated."""
    if isinstance(param, (list, tuple)):
        if len(param) != len(optimizer.param_groups):
            raise OptimizerArgumentError(
                f"{name} must have the same length as optimizer.param_groups. {name} has {len(param)} values, "
                f"param_groups has {len(optimizer.param_groups)}.")
    else:
        param = [param] * len(optimizer.param_groups)
    return [value.clone() if isinstance(value, Tensor) else value for value in param]


def _param_groups_val_list(optimizer: Optimizer, key: str) -> list[Any]:
    """Each group's `key`, tensors cloned so callers never alias the optimizer's values."""
    return [group[key].clone() if isinstance(group[key], Tensor) else group[key] for group in optimizer.param_groups]


def _update_param_group_val(param_group: dict[str, Any], key: str, value: Any) -> None:
    """Set `param_group[key]`, filling a tensor hyperparameter in place rather than replacing it."""
    if isinstance(param_group[key], Tensor):
        param_group[key].fill_(to_scalar(value))
    else:
        param_group[key] = value


@contextlib.contextmanager
def _flag(scheduler: "LRScheduler", name: str) -> Iterator[None]:
    """`scheduler.<name>` is True inside the block (torch's _enable_get_lr_call and _initial_mode)."""
    setattr(scheduler, name, True)
    try:
        yield
    finally:
        setattr(scheduler, name, False)


def _warn_get_lr_called_within_step(scheduler: "LRScheduler") -> None:
    if not scheduler._get_lr_called_within_step:
        warnings.warn("To get the last learning rate computed by the scheduler, please use `get_last_lr()`.",
                      UserWarning, stacklevel=3)


class LRScheduler:
    """Base class of the schedulers: subclasses implement `get_lr` (the rates after one more `step()`)."""

    _get_lr_called_within_step: bool = False
    _is_initial: bool = False

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1) -> None:
        if not isinstance(optimizer, Optimizer):
            raise OpArgumentError(f"{type(optimizer).__name__} is not an Optimizer",
                                  fix="pass a kiln.optim optimizer (kiln.optim.SGD, kiln.optim.Adam, ...)")
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                initial_lr = group["lr"]
                group.setdefault("initial_lr", initial_lr.clone() if isinstance(initial_lr, Tensor) else initial_lr)
        else:
            for i, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise KeyError(f"param 'initial_lr' is not specified in param_groups[{i}] when resuming "
                                   "scheduler with last_epoch >= 0")
        self.base_lrs: list[Any] = _param_groups_val_list(optimizer, "initial_lr")
        self.last_epoch = last_epoch
        self._track_optimizer_steps()
        self._initial_step()

    def _track_optimizer_steps(self) -> None:
        """Wrap `optimizer.step` to note that it ran, so a scheduler stepped first can warn (as torch does)."""
        optimizer = self.optimizer
        if hasattr(optimizer.step, "_wrapped_by_lr_sched"):
            return
        optimizer_ref = ref(optimizer)
        function = optimizer.step.__func__

        @wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            opt = optimizer_ref()
            opt._opt_called = True  # type: ignore[union-attr]
            return function.__get__(opt, opt.__class__)(*args, **kwargs)
        wrapper._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
        optimizer.step = wrapper  # type: ignore[method-assign]

    def _initial_step(self) -> None:
        self._step_count = 0
        with _flag(self, "_is_initial"):
            self.step()

    def state_dict(self) -> dict[str, Any]:
        """Every attribute except the optimizer."""
        return {key: value for key, value in self.__dict__.items() if key != "optimizer"}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.__dict__.update(state_dict)

    def get_last_lr(self) -> list[Any]:
        """The learning rates the last `step()` set, one per param group."""
        return self._last_lr

    def get_lr(self) -> list[Any]:
        raise NotImplementedError

    def step(self, epoch: int | None = None) -> None:
        """Advance one epoch (or batch) and set the optimizer's learning rates; call it after `optimizer.step()`."""
        if self._step_count == 1:
            if not hasattr(self.optimizer.step, "_wrapped_by_lr_sched"):
                warnings.warn("Seems like `optimizer.step()` has been overridden after learning rate scheduler "
                              "initialization. Please, make sure to call `optimizer.step()` before "
                              "`lr_scheduler.step()`.", UserWarning, stacklevel=2)
            elif not getattr(self.optimizer, "_opt_called", False):
                warnings.warn("Detected call of `lr_scheduler.step()` before `optimizer.step()`. In PyTorch 1.1.0 "
                              "and later, you should call them in the opposite order: `optimizer.step()` before "
                              "`lr_scheduler.step()`.  Failure to do this will result in PyTorch skipping the first "
                              "value of the learning rate schedule.", UserWarning, stacklevel=2)
        self._step_count += 1
        if epoch is not None:
            warnings.warn(EPOCH_DEPRECATION_WARNING, UserWarning, stacklevel=2)
        self._update_lr(epoch)

    def _update_lr(self, epoch: int | None = None) -> None:
        with _flag(self, "_get_lr_called_within_step"):
            if epoch is None:
                self.last_epoch += 1
                values = self.get_lr()
            else:
                self.last_epoch = epoch
                values = self._get_closed_form_lr() if hasattr(self, "_get_closed_form_lr") else self.get_lr()
        for param_group, lr in zip(self.optimizer.param_groups, values):
            _update_param_group_val(param_group, "lr", lr)
        self._last_lr: list[Any] = _param_groups_val_list(self.optimizer, "lr")


class LambdaLR(LRScheduler):
    """lr = initial lr × `lr_lambda(epoch)` (one function, or one per param group)."""

    def __init__(self, optimizer: Optimizer, lr_lambda: Callable[[int], float] | Sequence[Callable[[int], float]],
                 last_epoch: int = -1) -> None:
        self.optimizer = optimizer
        if not isinstance(lr_lambda, (list, tuple)):
            self.lr_lambdas = [lr_lambda] * len(optimizer.param_groups)
        else:
            if len(lr_lambda) != len(optimizer.param_groups):
                raise OptimizerArgumentError(
                    f"Expected {len(optimizer.param_groups)} lr_lambdas, but got {len(lr_lambda)}")
            self.lr_lambdas = list(lr_lambda)
        super().__init__(optimizer, last_epoch)

    def state_dict(self) -> dict[str, Any]:
        """The attributes except the optimizer; a lambda is saved only if it is a callable object (its __dict__)."""
        state = {key: value for key, value in self.__dict__.items() if key not in ("optimizer", "lr_lambdas")}
        state["lr_lambdas"] = [None if isinstance(fn, types.FunctionType) else fn.__dict__.copy()
                               for fn in self.lr_lambdas]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        lr_lambdas = state_dict.pop("lr_lambdas")
        self.__dict__.update(state_dict)
        state_dict["lr_lambdas"] = lr_lambdas  # leave the caller's dict as it was
        for index, fn in enumerate(lr_lambdas):
            if fn is not None:
                self.lr_lambdas[index].__dict__.update(fn)

    def get_lr(self) -> list[Any]:
        _warn_get_lr_called_within_step(self)
        return [base_lr * lmbda(self.last_epoch) for lmbda, base_lr in zip(self.lr_lambdas, self.base_lrs)]


class StepLR(LRScheduler):
    """Multiply the lr by `gamma` every `step_size` epochs."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1) -> None:
        self.step_size = step_size
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[Any]:
        _warn_get_lr_called_within_step(self)
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return _param_groups_val_list(self.optimizer, "lr")
        return [group["lr"] * self.gamma for group in self.optimizer.param_groups]

    def _get_closed_form_lr(self) -> list[Any]:
        return [base_lr * self.gamma ** (self.last_epoch // self.step_size) for base_lr in self.base_lrs]


class MultiStepLR(LRScheduler):
    """Multiply the lr by `gamma` at each milestone epoch (by gamma**n for a milestone listed n times)."""

    def __init__(self, optimizer: Optimizer, milestones: Iterable[int], gamma: float = 0.1,
                 last_epoch: int = -1) -> None:
        self.milestones = Counter(milestones)
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[Any]:
        _warn_get_lr_called_within_step(self)
        if self.last_epoch not in self.milestones:
            return _param_groups_val_list(self.optimizer, "lr")
        return [group["lr"] * self.gamma ** self.milestones[self.last_epoch]
                for group in self.optimizer.param_groups]

    def _get_closed_form_lr(self) -> list[Any]:
        milestones = sorted(self.milestones.elements())
        return [base_lr * self.gamma ** bisect_right(milestones, self.last_epoch) for base_lr in self.base_lrs]


class ExponentialLR(LRScheduler):
    """Multiply the lr by `gamma` every epoch."""

    def __init__(self, optimizer: Optimizer, gamma: float, last_epoch: int = -1) -> None:
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[Any]:
        _warn_get_lr_called_within_step(self)
        if self._is_initial:  # resuming from a checkpoint must not advance the lr one step ahead
            return _param_groups_val_list(self.optimizer, "lr")
        return [group["lr"] * self.gamma for group in self.optimizer.param_groups]

    def _get_closed_form_lr(self) -> list[Any]:
        return [base_lr * self.gamma**self.last_epoch for base_lr in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """Cosine annealing from the initial lr to `eta_min` over `T_max` epochs (no restarts), in torch's recursive
    form: eta_{t+1} = eta_min + (eta_t - eta_min) (1 + cos((t+1)π/T_max)) / (1 + cos(tπ/T_max))."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1) -> None:
        self.T_max = T_max
        self.eta_min = eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[Any]:
        _warn_get_lr_called_within_step(self)
        if self._is_initial:
            return _param_groups_val_list(self.optimizer, "lr")
        if self._step_count == 1 and self.last_epoch > 0:
            return [self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(self.last_epoch * math.pi / self.T_max))
                    / 2 for base_lr in self.base_lrs]
        if (self.last_epoch - 1 - self.T_max) % (2 * self.T_max) == 0:
            return [group["lr"] + (base_lr - self.eta_min) * (1 - math.cos(math.pi / self.T_max)) / 2
                    for base_lr, group in zip(self.base_lrs, self.optimizer.param_groups)]
        return [(1 + math.cos(math.pi * self.last_epoch / self.T_max))
                / (1 + math.cos(math.pi * (self.last_epoch - 1) / self.T_max))
                * (group["lr"] - self.eta_min) + self.eta_min
                for group in self.optimizer.param_groups]

    def _get_closed_form_lr(self) -> list[Any]:
        return [self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
                for base_lr in self.base_lrs]


class OneCycleLR(LRScheduler):
    """The 1cycle policy (Smith & Topin): lr rises from max_lr/div_factor to max_lr, then anneals to
    initial_lr/final_div_factor; momentum (SGD) or beta1 (Adam) cycles inversely when `cycle_momentum`."""

    def __init__(self, optimizer: Optimizer, max_lr: float | list[float], total_steps: int | None = None,
                 epochs: int | None = None, steps_per_epoch: int | None = None, pct_start: float = 0.3,
                 anneal_strategy: Literal["cos", "linear"] = "cos", cycle_momentum: bool = True,
                 base_momentum: float | list[float] = 0.85, max_momentum: float | list[float] = 0.95,
                 div_factor: float = 25.0, final_div_factor: float = 1e4, three_phase: bool = False,
                 last_epoch: int = -1) -> None:
        if not isinstance(optimizer, Optimizer):
            raise OpArgumentError(f"{type(optimizer).__name__} is not an Optimizer",
                                  fix="pass a kiln.optim optimizer (kiln.optim.SGD, kiln.optim.Adam, ...)")
        self.optimizer = optimizer
        if total_steps is not None:
            if total_steps <= 0 or not isinstance(total_steps, int):
                raise OptimizerArgumentError(f"Expected positive integer total_steps, but got {total_steps}")
            self.total_steps = total_steps
        elif epochs is not None and steps_per_epoch is not None:
            if not isinstance(epochs, int) or epochs <= 0:
                raise OptimizerArgumentError(f"Expected positive integer epochs, but got {epochs}")
            if not isinstance(steps_per_epoch, int) or steps_per_epoch <= 0:
                raise OptimizerArgumentError(f"Expected positive integer steps_per_epoch, but got {steps_per_epoch}")
            self.total_steps = epochs * steps_per_epoch
        else:
            raise OptimizerArgumentError("You must define either total_steps OR (epochs AND steps_per_epoch)")

        if three_phase:
            self._schedule_phases = [
                {"end_step": float(pct_start * self.total_steps) - 1, "start_lr": "initial_lr",
                 "end_lr": "max_lr", "start_momentum": "max_momentum", "end_momentum": "base_momentum"},
                {"end_step": float(2 * pct_start * self.total_steps) - 2, "start_lr": "max_lr",
                 "end_lr": "initial_lr", "start_momentum": "base_momentum", "end_momentum": "max_momentum"},
                {"end_step": self.total_steps - 1, "start_lr": "initial_lr", "end_lr": "min_lr",
                 "start_momentum": "max_momentum", "end_momentum": "max_momentum"},
            ]
        else:
            self._schedule_phases = [
                {"end_step": float(pct_start * self.total_steps) - 1, "start_lr": "initial_lr",
                 "end_lr": "max_lr", "start_momentum": "max_momentum", "end_momentum": "base_momentum"},
                {"end_step": self.total_steps - 1, "start_lr": "max_lr", "end_lr": "min_lr",
                 "start_momentum": "base_momentum", "end_momentum": "max_momentum"},
            ]

        if pct_start < 0 or pct_start > 1 or not isinstance(pct_start, float):
            raise OptimizerArgumentError(f"Expected float between 0 and 1 pct_start, but got {pct_start}")
        if anneal_strategy not in ["cos", "linear"]:
            raise OptimizerArgumentError(
                f"anneal_strategy must be one of 'cos' or 'linear', instead got {anneal_strategy}")
        self._anneal_func_type = anneal_strategy

        max_lrs = _format_param("max_lr", self.optimizer, max_lr)
        if last_epoch == -1:
            for index, group in enumerate(self.optimizer.param_groups):
                group["initial_lr"] = max_lrs[index] / div_factor
                group["max_lr"] = max_lrs[index]
                group["min_lr"] = group["initial_lr"] / final_div_factor

        self.cycle_momentum = cycle_momentum
        if self.cycle_momentum:
            if "momentum" not in self.optimizer.defaults and "betas" not in self.optimizer.defaults:
                raise OptimizerArgumentError(
                    "optimizer must support momentum or beta1 with `cycle_momentum` option enabled")
            self.use_beta1 = "betas" in self.optimizer.defaults
            max_momentums = _format_param("max_momentum", optimizer, max_momentum)
            base_momentums = _format_param("base_momentum", optimizer, base_momentum)
            if last_epoch == -1:
                for m_momentum, b_momentum, group in zip(max_momentums, base_momentums, optimizer.param_groups):
                    if self.use_beta1:
                        group["betas"] = (m_momentum, *group["betas"][1:])
                    else:
                        group["momentum"] = m_momentum
                    group["max_momentum"] = m_momentum
                    group["base_momentum"] = b_momentum
        super().__init__(optimizer, last_epoch)

    def _anneal_func(self, start: float, end: float, pct: float) -> float:
        if self._anneal_func_type == "cos":
            return self._annealing_cos(start, end, pct)
        return self._annealing_linear(start, end, pct)

    @staticmethod
    def _annealing_cos(start: float, end: float, pct: float) -> float:
        """Cosine anneal from `start` to `end` as pct goes from 0.0 to 1.0."""
        cos_out = math.cos(math.pi * pct) + 1
        return end + (start - end) / 2.0 * cos_out

    @staticmethod
    def _annealing_linear(start: float, end: float, pct: float) -> float:
        """Linearly anneal from `start` to `end` as pct goes from 0.0 to 1.0."""
        return (end - start) * pct + start

    def get_lr(self) -> list[Any]:
        """The lr of the current phase; also sets each group's momentum (or beta1) when `cycle_momentum`."""
        _warn_get_lr_called_within_step(self)
        lrs = []
        step_num = self.last_epoch
        if step_num > self.total_steps:
            raise OptimizerArgumentError(
                f"Tried to step {step_num} times. The specified number of total steps is {self.total_steps}",
                fix="create the scheduler with total_steps (or epochs × steps_per_epoch) covering every step")
        for group in self.optimizer.param_groups:
            start_step = 0.0
            for index, phase in enumerate(self._schedule_phases):
                end_step = phase["end_step"]
                if step_num <= end_step or index == len(self._schedule_phases) - 1:
                    pct = (step_num - start_step) / (end_step - start_step)
                    computed_lr = self._anneal_func(group[phase["start_lr"]], group[phase["end_lr"]], pct)
                    if self.cycle_momentum:
                        computed_momentum = self._anneal_func(group[phase["start_momentum"]],
                                                              group[phase["end_momentum"]], pct)
                    break
                start_step = phase["end_step"]
            lrs.append(computed_lr)
            if self.cycle_momentum:
                if self.use_beta1:
                    group["betas"] = (computed_momentum, *group["betas"][1:])
                else:
                    group["momentum"] = computed_momentum
        return lrs
