"""kiln.optim.SGD: stochastic gradient descent with momentum, dampening, Nesterov and weight decay (torch.optim.SGD).

`sgd` is torch's `_single_tensor_sgd`, op for op, on kiln Tensors.
"""

from __future__ import annotations

from typing import Any, Callable

from kiln.frontend.optim.optimizer import (
    Optimizer, OptimizerArgumentError, check_single_implementation, evaluate_closure, step_without_grad, to_scalar,
)
from kiln.frontend.functions import zeros_like
from kiln.frontend.tensor import Tensor
from kiln.ir.errors import UnsupportedError

__all__ = ["SGD", "sgd"]


class SGD(Optimizer):
    """Stochastic gradient descent (optionally with momentum), as torch.optim.SGD."""

    def __init__(self, params: Any, lr: float | Tensor = 1e-3, momentum: float = 0, dampening: float = 0,
                 weight_decay: float = 0, nesterov: bool = False, *, maximize: bool = False,
                 foreach: bool | None = None, differentiable: bool = False, fused: bool | None = None) -> None:
        if isinstance(lr, Tensor) and lr.numel() != 1:
            raise OptimizerArgumentError("Tensor lr must be 1-element")
        if lr < 0.0:
            raise OptimizerArgumentError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise OptimizerArgumentError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise OptimizerArgumentError(f"Invalid weight_decay value: {weight_decay}")
        defaults = {"lr": lr, "momentum": momentum, "dampening": dampening, "weight_decay": weight_decay,
                    "nesterov": nesterov, "maximize": maximize, "foreach": foreach,
                    "differentiable": differentiable, "fused": fused}
        if nesterov and (momentum <= 0 or dampening != 0):
            raise OptimizerArgumentError("Nesterov momentum requires a momentum and zero dampening")
        super().__init__(params, defaults)
        check_single_implementation(foreach, fused, differentiable)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("nesterov", False)
            group.setdefault("maximize", False)
            group.setdefault("foreach", None)
            group.setdefault("differentiable", False)
            group.setdefault("fused", False)

    def _init_state(self, param: Tensor, group: dict[str, Any]) -> None:
        """The state a first step would create, made up front (for a traced step): a momentum buffer of zeros takes
        the first step exactly as torch's copy of the gradient does when there is no dampening."""
        if group["momentum"] == 0:
            return
        if group["dampening"] != 0:
            raise UnsupportedError("SGD with dampening creates its momentum buffer on the first step",
                                   fix="take one optimizer step eagerly before exporting the training step")
        self.state[param]["momentum_buffer"] = zeros_like(param)

    @step_without_grad
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One SGD update of every parameter that has a `.grad`."""
        loss = evaluate_closure(closure)
        for group in self.param_groups:
            params: list[Tensor] = []
            grads: list[Tensor] = []
            momentum_buffers: list[Tensor | None] = []
            for param in group["params"]:
                if param.grad is not None:
                    params.append(param)
                    grads.append(param.grad)
                    if group["momentum"] != 0:
                        momentum_buffers.append(self.state[param].get("momentum_buffer"))
            sgd(params, grads, momentum_buffers, weight_decay=group["weight_decay"], momentum=group["momentum"],
                lr=group["lr"], dampening=group["dampening"], nesterov=group["nesterov"],
                maximize=group["maximize"])
            if group["momentum"] != 0:
                for param, buffer in zip(params, momentum_buffers):
                    self.state[param]["momentum_buffer"] = buffer
        return loss


def sgd(params: list[Tensor], d_p_list: list[Tensor], momentum_buffer_list: list[Tensor | None], *,
        weight_decay: float, momentum: float, lr: float | Tensor, dampening: float, nesterov: bool,
        maximize: bool) -> None:
    """The SGD update (torch.optim.sgd's single-tensor path); fills `momentum_buffer_list`'s Nones on step 1."""
    lr = to_scalar(lr)
    weight_decay = to_scalar(weight_decay)
    for i, param in enumerate(params):
        grad = d_p_list[i] if not maximize else -d_p_list[i]
        if weight_decay != 0:
            grad = grad.add(param, alpha=weight_decay)
        if momentum != 0:
            buffer = momentum_buffer_list[i]
            if buffer is None:
                buffer = grad.detach().clone()
                momentum_buffer_list[i] = buffer
            else:
                buffer.mul_(momentum).add_(grad, alpha=1 - dampening)
            grad = grad.add(buffer, alpha=momentum) if nesterov else buffer
        param.add_(grad, alpha=-lr)
