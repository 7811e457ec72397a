"""kiln.optim.Adam and AdamW (torch.optim.Adam, torch.optim.AdamW): Adam with L2 or decoupled weight decay.

`adam` is torch's `_single_tensor_adam` (the path torch takes on the CPU), op for op, on kiln Tensors.
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

__all__ = ["Adam", "AdamW", "adam"]


class Adam(Optimizer):
    """Adam (Kingma & Ba), optionally AMSGrad, as torch.optim.Adam."""

    def __init__(self, params: Any, lr: float | Tensor = 1e-3, betas: tuple[Any, Any] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0, amsgrad: bool = False, *, foreach: bool | None = None,
                 maximize: bool = False, capturable: bool = False, differentiable: bool = False,
                 fused: bool | None = None, decoupled_weight_decay: bool = False) -> None:
        if isinstance(lr, Tensor):
            if foreach and not capturable:
                raise OptimizerArgumentError("lr as a Tensor is not supported for capturable=False and foreach=True")
            if lr.numel() != 1:
                raise OptimizerArgumentError("Tensor lr must be 1-element")
        if not 0.0 <= lr:
            raise OptimizerArgumentError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise OptimizerArgumentError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0:
            raise OptimizerArgumentError(f"Invalid beta parameter at index 0: {betas[0]}")
        if not 0.0 <= betas[1] < 1.0:
            raise OptimizerArgumentError(f"Invalid beta parameter at index 1: {betas[1]}")
        if not 0.0 <= weight_decay:
            raise OptimizerArgumentError(f"Invalid weight_decay value: {weight_decay}")
        if not (isinstance(betas[0], float) and isinstance(betas[1], float)
                or isinstance(betas[0], Tensor) and isinstance(betas[1], Tensor)):
            raise OptimizerArgumentError("betas must be either both floats or both Tensors",
                                         fix="write integer betas as floats, e.g. (0.0, 0.999)")
        for index, beta in enumerate(betas):
            if isinstance(beta, Tensor):
                if not capturable and foreach:
                    raise OptimizerArgumentError(
                        f"betas[{index}] as a Tensor is not supported for capturable=False and foreach=True")
                if beta.numel() != 1:
                    raise OptimizerArgumentError(f"Tensor betas[{index}] must be 1-element")
        betas = tuple(beta.squeeze() if isinstance(beta, Tensor) and beta.dim() != 0 else beta for beta in betas)
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay, "amsgrad": amsgrad,
                    "maximize": maximize, "foreach": foreach, "capturable": capturable,
                    "differentiable": differentiable, "fused": fused, "decoupled_weight_decay": decoupled_weight_decay}
        super().__init__(params, defaults)
        check_single_implementation(foreach, fused, differentiable)
        if capturable:
            raise UnsupportedError("capturable=True needs parameters on an accelerator (CUDA graphs); kiln's eager "
                                   "optimizers run on the CPU", fix="leave capturable=False")

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("amsgrad", False)
            group.setdefault("maximize", False)
            group.setdefault("foreach", None)
            group.setdefault("capturable", False)
            group.setdefault("differentiable", False)
            group.setdefault("decoupled_weight_decay", False)
            group.setdefault("fused", None)
            for param in group["params"]:
                step_as_tensor(self.state.get(param, {}))

    def _init_state(self, param: Tensor, group: dict[str, Any]) -> None:
        state = self.state[param]
        state["step"] = new_step()
        state["exp_avg"] = zeros_like(param)
        state["exp_avg_sq"] = zeros_like(param)
        if group["amsgrad"]:
            state["max_exp_avg_sq"] = zeros_like(param)

    @step_without_grad
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One Adam update of every parameter that has a `.grad`."""
        loss = evaluate_closure(closure)
        for group in self.param_groups:
            params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps = [], [], [], [], [], []
            for param, state in self._with_grads(group):
                params.append(param)
                grads.append(param.grad)
                exp_avgs.append(state["exp_avg"])
                exp_avg_sqs.append(state["exp_avg_sq"])
                if group["amsgrad"]:
                    max_exp_avg_sqs.append(state["max_exp_avg_sq"])
                state_steps.append(state["step"])
            beta1, beta2 = group["betas"]
            adam(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, amsgrad=group["amsgrad"],
                 beta1=beta1, beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"],
                 maximize=group["maximize"], decoupled_weight_decay=group["decoupled_weight_decay"])
        return loss


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter), as torch.optim.AdamW."""

    def __init__(self, params: Any, lr: float | Tensor = 1e-3, betas: tuple[Any, Any] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False, *, maximize: bool = False,
                 foreach: bool | None = None, capturable: bool = False, differentiable: bool = False,
                 fused: bool | None = None) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach, maximize=maximize,
                         capturable=capturable, differentiable=differentiable, fused=fused,
                         decoupled_weight_decay=True)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            group["decoupled_weight_decay"] = True  # AdamW stays AdamW whatever state it loads


def adam(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], exp_avg_sqs: list[Tensor],
         max_exp_avg_sqs: list[Tensor], state_steps: list[Tensor], *, amsgrad: bool, beta1: float | Tensor,
         beta2: float | Tensor, lr: float | Tensor, weight_decay: float, eps: float, maximize: bool,
         decoupled_weight_decay: bool = False) -> None:
    """The Adam update (torch.optim.adam's single-tensor, non-capturable path); advances each `state_steps` tensor."""
    lr, beta1, beta2 = to_scalar(lr), to_scalar(beta1), to_scalar(beta2)
    for i, param in enumerate(params):
        grad = grads[i] if not maximize else -grads[i]
        exp_avg, exp_avg_sq, step_t = exp_avgs[i], exp_avg_sqs[i], state_steps[i]
        step_t += 1
        if weight_decay != 0:
            if decoupled_weight_decay:
                param.mul_(1 - lr * weight_decay)
            else:
                grad = grad.add(param, alpha=weight_decay)

        # Decay the first and second moment running average coefficient
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)

        if step_t.is_traced:
            # A traced training step reads the step count as a tensor: torch's capturable formula.
            bias_correction1 = 1 - beta1**step_t
            bias_correction2 = 1 - beta2**step_t
            step_size_neg = (lr / bias_correction1).neg()
            bias_correction2_sqrt = bias_correction2.sqrt()
            if amsgrad:
                max_exp_avg_sqs[i].copy_(max_exp_avg_sqs[i].maximum(exp_avg_sq))
                second_moment = max_exp_avg_sqs[i]
            else:
                second_moment = exp_avg_sq
            denom = (second_moment.sqrt() / (bias_correction2_sqrt * step_size_neg)).add_(eps / step_size_neg)
            param.addcdiv_(exp_avg, denom)
            continue
        step = step_t.item()
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        step_size = lr / bias_correction1
        bias_correction2_sqrt = bias_correction2**0.5
        if amsgrad:  # keep the largest second moment seen so far, and normalize by it
            max_exp_avg_sqs[i].copy_(max_exp_avg_sqs[i].maximum(exp_avg_sq))
            denom = (max_exp_avg_sqs[i].sqrt() / bias_correction2_sqrt).add_(eps)
        else:
            denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
        param.addcdiv_(exp_avg, denom, value=-step_size)
