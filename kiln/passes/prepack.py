"""Weight pre-layout folding: backends request weights stored in the layout their kernels read, and this pass
bakes the layout change into constants (prepacking, as in torch's mobile_optimizer).

A layout is a named rule registered with `register_layout`; `prepack{layouts=...}` applies the chosen ones.
Weights it touches are frozen: the parameter leaves the signature and the packed array becomes a constant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from xdsl.ir import SSAValue

from kiln.ir.errors import KilnError
from kiln.ir.meta import numel
from kiln.ir.registry import ops
from kiln.passes.base import option, register_pass
from kiln.passes.rewrite import Handler, RewritePass, constant, current_op, op_names, producer, value_of

aten = ops.aten


@dataclass(frozen=True)
class Layout:
    """A prepacking rule: `rewrite` is a pattern body (like a @pattern method without self) for `ops`."""

    name: str
    description: str
    ops: tuple[str, ...]
    rewrite: Callable[..., Any]


LAYOUTS: dict[str, Layout] = {}


def register_layout(name: str, *op_handles: Any, description: str) -> Callable[[Handler], Handler]:
    """Register a prepack layout for backends to request: `@register_layout("name", aten.linear.default, ...)`."""
    def register(rewrite: Handler) -> Handler:
        LAYOUTS[name] = Layout(name, description, tuple(n for h in op_handles for n in op_names(h)), rewrite)
        return rewrite
    return register


@register_pass
class Prepack(RewritePass):
    """Store weights in the layouts backends request (e.g. linear weights as [in, out]) as constants."""

    name = "prepack"

    layouts: tuple[str, ...] = option(("linear-transposed",), "registered layouts to apply (see kiln.passes.LAYOUTS)")

    def __post_init__(self) -> None:
        unknown = [name for name in self.layouts if name not in LAYOUTS]
        if unknown:
            raise KilnError(f"unknown prepack layout(s) {', '.join(unknown)}",
                            fix=f"choose from {', '.join(sorted(LAYOUTS))}")

    def handlers(self) -> dict[str, list[Handler]]:
        table: dict[str, list[Handler]] = {}
        for name in self.layouts:
            layout = LAYOUTS[name]
            for op_name in layout.ops:
                table.setdefault(op_name, []).append(layout.rewrite)
        return table


_TRANSPOSES = (aten.permute.default, aten.transpose.int, aten.t.default)


@register_layout("linear-transposed", aten.linear.default, aten.addmm.default, aten.mm.default,
                 description="linear/matmul weights stored transposed ([in, out]), read by mm/addmm directly")
def _linear_transposed(*args: Any, **kwargs: Any) -> SSAValue | None:
    if current_op().name == "aten.linear.default":
        return _linear_as_mm(*args)
    mat2 = args[-1]  # addmm(bias, x, mat2) / mm(x, mat2)
    transposed = producer(mat2, *_TRANSPOSES)
    if transposed is None:
        return None
    weight = value_of(transposed.args[0])
    if weight is None or weight.ndim != 2:
        return None
    packed = constant(np.ascontiguousarray(weight.T), _hint(transposed.args[0]))
    handle = aten.addmm.default if current_op().name == "aten.addmm.default" else aten.mm.default
    return handle(*args[:-1], packed, **kwargs)


def _linear_as_mm(input: SSAValue, weight: SSAValue, bias: Any = None) -> SSAValue | None:
    shape = list(input.type.shape)
    array = value_of(weight)
    if len(shape) < 2 or array is None or array.ndim != 2:
        return None
    packed = constant(np.ascontiguousarray(array.T), _hint(weight))
    flat = input if len(shape) == 2 else aten.view.default(input, [numel(shape[:-1]), shape[-1]])
    out = aten.mm.default(flat, packed) if bias is None else aten.addmm.default(bias, flat, packed)
    return out if len(shape) == 2 else aten.view.default(out, [*shape[:-1], packed.type.shape[1]])


def _hint(weight: SSAValue) -> str:
    return f"{(weight.name_hint or 'weight').removeprefix('p_')}_packed"
