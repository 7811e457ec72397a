"""Rewrites that put layers in the form quantizers match: Hugging Face's Conv1D (GPT-2) exports as
`addmm(bias, x, W)` with W stored [in, out]; as `linear(x, Wᵀ, bias)` it is annotated like any linear layer."""

from __future__ import annotations

import numpy as np

from kiln.ir.registry import ops
from kiln.passes.base import register_pass
from kiln.passes.rewrite import RewritePass, constant, pattern, value_of

aten = ops.aten


@register_pass
class AddmmToLinear(RewritePass):
    """Rewrite addmm(bias, x, W) with a constant [in, out] weight as linear(x, Wᵀ, bias)."""

    name = "addmm-to-linear"

    @pattern(aten.addmm.default)
    def addmm(self, bias, x, weight, beta=1, alpha=1):
        array = value_of(weight)
        if array is None or beta != 1 or alpha != 1 or array.ndim != 2 or len(bias.type.shape) != 1:
            return None
        return aten.linear.default(x, constant(np.ascontiguousarray(array.T), "linear_weight"), bias)


def linear_layers(program):
    """`program` with GPT-2-style Conv1D layers (addmm with a constant weight) as linear layers: what quantizers
    match."""
    from kiln.passes.pipeline import run
    return run(program, AddmmToLinear.name)
