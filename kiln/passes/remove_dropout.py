"""Dropout removal: in eval mode (train=False) dropout is the identity; `force` also drops training-mode
dropout, for programs exported in train mode but deployed for inference."""

from __future__ import annotations

from typing import Any

from xdsl.ir import SSAValue

from kiln.ir.registry import ops
from kiln.passes.base import option, register_pass
from kiln.passes.rewrite import RewritePass, current_op, pattern

aten = ops.aten


@register_pass
class RemoveDropout(RewritePass):
    """Remove eval-mode dropout (the identity)."""

    name = "remove-dropout"

    force: bool = option(False, "also remove dropout in training mode (changes what the program computes)")

    @pattern(aten.dropout.default)
    def dropout(self, input: SSAValue, p: float, train: bool) -> SSAValue | None:
        return input if self.force or not train or p == 0 else None

    @pattern(aten.native_dropout.default)
    def native_dropout(self, input: SSAValue, p: float, train: Any) -> Any:
        if not (self.force or train is False or p == 0):
            return None  # train=None means "training mode", like ATen
        mask = current_op().results[1]
        if not mask.uses:
            return input, None
        return input, aten.full_like.default(input, True, dtype=mask.type.dtype)
