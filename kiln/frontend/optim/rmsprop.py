"""kiln.optim.RMSprop (torch.optim.RMSprop): RMSprop, optionally centered and with momentum.

`rmsprop` is torch's `_single_tensor_rmsprop`, op for op, on kiln Tensors.
"""

from __future__ import annotations

from typing import Any, Callable

from kiln.frontend.functions import zeros_like
from kiln.frontend.optim.optimizer import (
    Optimizer, OptimizerArgumentError, check_single_implementation, evaluate_closure, new_step, step_as_tensor,
    step_without_grad, to_scalar,
)
from kiln.frontend.tensor import Tensor
from kiln.ir.errors import UnsupportedError

__all__ = ["RMSprop", "rmsprop"]


class RMSprop(Optimizer):
    """RMSprop (Hinton), as torch.optim.RMSprop."""

    def __init__(self, params: Any, lr: float | Tensor = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0, momentum: float = 0, centered: bool = False, capturable: bool = False,
                 foreach: bool | None = None, maximize: bool = False, differentiable: bool = False) -> None:
        if isinstance(lr, Tensor) and lr.numel() != 1:
            raise OptimizerArgumentError("Tensor lr must be 1-element")
        if not 0.0 <= lr:
            raise OptimizerArgumentError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise OptimizerArgumentError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= momentum:
            raise OptimizerArgumentError(f"Invalid momentum value: {momentum}")
        if not 0.0 <= weight_decay:
            raise OptimizerArgumentError(f"Invalid weight_decay value: {weight_decay}")
        if not 0.0 <= alpha:
            raise OptimizerArgumentError(f"Invalid alpha value: {alpha}")
        defaults = {"lr": lr, "momentum": momentum, "alpha": alpha, "eps": eps, "centered": centered,
                    "weight_decay": weight_decay, "capturable": capturable, "foreach": foreach, "maximize": maximize,
                    "differentiable": differentiable}
        super().__init__(params, defaults)
        check_single_implementation(foreach, None, differentiable)
        if capturable:
            raise UnsupportedError("capturable=True needs parameters on an accelerator (CUDA graphs); kiln's eager "
                                   "optimizers run on the CPU", fix="leave capturable=False")

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("momentum", 0)
            group.setdefault("centered", False)
            group.setdefault("foreach", None)
            group.setdefault("maximize", False)
            group.setdefault("differentiable", False)
            group.setdefault("capturable", False)
            for param in group["params"]:
                step_as_tensor(self.state.get(param, {}))

    def _init_state(self, param: Tensor, group: dict[str, Any]) -> None:
        state = self.state[param]
        state["step"] = new_step()
        state["square_avg"] = zeros_like(param)
        if group["momentum"] > 0:
            state["momentum_buffer"] = zeros_like(param)
        if group["centered"]:
            state["grad_avg"] = zeros_like(param)

    @step_without_grad
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One RMSprop update of every parameter that has a `.grad`."""
        loss = evaluate_closure(closure)
        for group in self.param_groups:
            params, grads, square_avgs, grad_avgs, momentum_buffers, state_steps = [], [], [], [], [], []
            for param, state in self._with_grads(group):
                params.append(param)
                grads.append(param.grad)
                square_avgs.append(state["square_avg"])
                state_steps.append(state["step"])
                if group["momentum"] > 0:
                    momentum_buffers.append(state["momentum_buffer"])
                if group["centered"]:
                    grad_avgs.append(state["grad_avg"])
            rmsprop(params, grads, square_avgs, grad_avgs, momentum_buffers, state_steps, lr=group["lr"],
                    alpha=group["alpha"], eps=group["eps"], weight_decay=group["weight_decay"],
                    momentum=group["momentum"], centered=group["centered"], maximize=group["maximize"])
        return loss


def rmsprop(params: list[Tensor], grads: list[Tensor], square_avgs: list[Tensor], grad_avgs: list[Tensor],
            momentum_buffer_list: list[Tensor], state_steps: list[Tensor], *, lr: float | Tensor, alpha: float,
            eps: float, weight_decay: float, momentum: float, centered: bool, maximize: bool) -> None:
    """The RMSprop update (torch.optim.rmsprop's single-tensor path); advances each `state_steps` tensor."""
    lr = to_scalar(lr)
    for i, param in enumerate(params):
        step = state_steps[i]
        grad = grads[i] if not maximize else -grads[i]
        square_avg = square_avgs[i]
        step += 1
        if weight_decay != 0:
            grad = grad.add(param, alpha=weight_decay)
        square_avg.mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
        if centered:
            grad_avg = grad_avgs[i]
            grad_avg.lerp_(grad, 1 - alpha)
            avg = square_avg.addcmul(grad_avg, grad_avg, value=-1).sqrt_()
        else:
            avg = square_avg.sqrt()
        avg = avg.add_(eps)
        if momentum > 0:
            buffer = momentum_buffer_list[i]
            buffer.mul_(momentum).addcdiv_(grad, avg)
            param.add_(buffer, alpha=-lr)
        else:
            param.addcdiv_(grad, avg, value=-lr)
