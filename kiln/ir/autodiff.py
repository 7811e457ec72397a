"""Calling an op's VJP rule: the one convention shared by eager autograd (frontend) and the joint-program pass.

An op's tensor arguments are flattened into *slots* (one per Tensor argument, one per element of a Tensor[]);
`call_vjp` hands the rule the op's arguments and results in the schema's shapes and returns one gradient per
slot, None where there is none.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from kiln.ir.errors import KilnError
from kiln.ir.registry import OpDef, split_bound


class NoDerivativeError(KilnError):
    """The op has no VJP rule (and no decomposition to differentiate through)."""


def tensor_slots(opdef: OpDef, bound: Sequence[Any]) -> list[Any]:
    """The op's tensor arguments, flattened: one slot per Tensor argument, one per element of a Tensor[]."""
    slots: list[Any] = []
    for argument, value in zip(opdef.schema.arguments, bound):
        if argument.type.is_tensor:
            if argument.type.is_list:
                slots.extend(value if value is not None else [])
            else:
                slots.append(value)
    return slots


def slot_names(opdef: OpDef, bound: Sequence[Any]) -> list[str]:
    """The argument name of each tensor slot, in `tensor_slots` order."""
    names: list[str] = []
    for argument, value in zip(opdef.schema.arguments, bound):
        if argument.type.is_tensor:
            names.extend([argument.name] * (len(value or []) if argument.type.is_list else 1))
    return names


def replace_slots(opdef: OpDef, bound: Sequence[Any], values: Iterable[Any]) -> list[Any]:
    """`bound` with its tensor slots replaced, in `tensor_slots` order."""
    source = iter(values)
    result = []
    for argument, value in zip(opdef.schema.arguments, bound):
        if argument.type.is_tensor:
            if argument.type.is_list:
                value = None if value is None else [next(source) for _ in value]
            else:
                value = next(source)
        result.append(value)
    return result


def arrange_results(opdef: OpDef, flat: Sequence[Any]) -> Any:
    """Flat per-result values (gradients or results) in the shape the op returns them: a value, a list, a tuple."""
    returns = opdef.schema.returns
    if len(returns) == 1 and not returns[0].type.is_list:
        return flat[0]
    if len(returns) == 1:
        return list(flat)
    return tuple(flat)


def call_vjp(opdef: OpDef, output_grads: Sequence[Any], outputs: Sequence[Any], bound: Sequence[Any],
             source: str | None = None) -> list[Any]:
    """The gradient of each tensor slot of the op, given the gradients of its (flat) results."""
    if opdef.vjp is None:
        raise NoDerivativeError(f"the derivative of {opdef.name} is not implemented in kiln", source=source,
                                fix="detach this op's input (tensor.detach()) or file an issue for its VJP rule")
    positional, keywords = split_bound(opdef, list(bound))
    result = opdef.vjp(arrange_results(opdef, output_grads), arrange_results(opdef, outputs), *positional,
                       **keywords)
    tensor_arguments = [(a, v) for a, v in zip(opdef.schema.arguments, bound) if a.type.is_tensor]
    if len(tensor_arguments) == 1:
        result = (result,)
    if len(result) != len(tensor_arguments):
        raise KilnError(f"the VJP rule of {opdef.name} returned {len(result)} gradients for "
                        f"{len(tensor_arguments)} tensor arguments")
    flat: list[Any] = []
    for (argument, value), gradient in zip(tensor_arguments, result):
        if argument.type.is_list:
            count = len(value or [])
            flat.extend(gradient if gradient is not None else [None] * count)
        else:
            flat.append(gradient)
    return flat
