"""Views and writing through them: how a view op's result aliases its base, and how to write a new value for the
view back into the base, functionally. Both of kiln's ways into a program need it for in-place ops on views
(`k[..., :8].copy_(k_pass)`): the .pt2 reader (torch's training IR keeps such ops) and the tracer (kiln.nn code
writes them too). Each runs the functional op, then writes its result into the view's base (`slice_scatter`,
`select_scatter`, or a scatter by element positions), base by base up to the root; views of a base that took a
write read it again afterwards, as torch's functionalization regenerates them. Call inside a builder."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kiln.ir.errors import OpArgumentError
from kiln.ir.registry import REGISTRY, call_op, ops
from kiln.ir.types import TensorType

aten = ops.aten

# Single-result ops whose result aliases their first operand, with the elements in the base's logical order kept:
# writing back is a reshape to the base's shape.
_RESHAPES = frozenset({
    "aten.view.default", "aten._unsafe_view.default", "aten.alias.default", "aten.view_as.default",
    "aten.squeeze.default", "aten.squeeze.dim", "aten.squeeze.dims", "aten.unsqueeze.default",
    "aten.flatten.using_ints", "aten.unflatten.int",
})
# Other single-result views: written back by their own inverse, or by element positions.
_VIEWS = _RESHAPES | {
    "aten.slice.Tensor", "aten.select.int", "aten.narrow.default", "aten.transpose.int", "aten.swapaxes.default",
    "aten.t.default", "aten.permute.default", "aten.movedim.int", "aten.diagonal.default",
    "aten.as_strided.default", "aten.expand.default", "aten.expand_as.default", "aten.unfold.default",
}
# Ops whose every result is a slice (or, for unbind, a select) of the first operand along `dim`.
_SPLITS = frozenset({"aten.split.Tensor", "aten.split_with_sizes.default", "aten.chunk.default",
                     "aten.unbind.int", "aten.tensor_split.indices", "aten.tensor_split.sections"})


@dataclass(frozen=True)
class ViewStep:
    """How a view is made from its base: `op(base, *args, **kwargs)`."""

    op: str
    args: tuple
    kwargs: tuple = ()  # sorted (key, value) pairs

    def read(self, base: Any) -> Any:
        return call_op(REGISTRY[self.op], (base, *self.args), dict(self.kwargs))

    def write(self, base: Any, value: Any) -> Any:
        """`base` with this view's elements replaced by `value`."""
        arguments = _bound(self.op, self.args, dict(self.kwargs))
        shape = list(base.type.shape)
        if self.op in _RESHAPES:
            return aten.view.default(value, shape)
        if self.op == "aten.slice.Tensor":
            return aten.slice_scatter.default(base, value, arguments["dim"], arguments["start"], arguments["end"],
                                              arguments["step"])
        if self.op == "aten.narrow.default":
            start = arguments["start"]
            return aten.slice_scatter.default(base, value, arguments["dim"], start, start + arguments["length"], 1)
        if self.op == "aten.select.int":
            return aten.select_scatter.default(base, value, arguments["dim"], arguments["index"])
        if self.op in ("aten.transpose.int", "aten.swapaxes.default"):
            return call_op(REGISTRY[self.op], (value, *self.args), dict(self.kwargs))
        if self.op == "aten.t.default":
            return aten.t.default(value)
        if self.op == "aten.permute.default":
            rank = len(shape)
            order = [d % rank for d in arguments["dims"]]
            return aten.permute.default(value, [order.index(d) for d in range(rank)])
        if self.op in ("aten.expand.default", "aten.expand_as.default", "aten.unfold.default"):
            raise OpArgumentError(f"an in-place op writes into the view {self.op.split('.')[1]} makes, where "
                                  "elements share memory", fix="clone the view before writing into it, as torch "
                                  "requires")
        # diagonal, as_strided, movedim: the base's flat positions, viewed the same way, say where each element goes
        positions = aten.view.default(aten.arange.default(_numel(shape)), shape)
        targets = aten.reshape.default(self.read(positions), [-1])
        flat = aten.reshape.default(base, [-1])
        return aten.view.default(aten.index_put.default(flat, [targets], aten.reshape.default(value, [-1])), shape)


def view_steps(op: str, args: list, kwargs: dict, result: Any) -> list[tuple[Any, ViewStep]]:
    """(result value, how it views `args[0]`) for each result of `op` that aliases its first operand; empty for an
    op that makes no view."""
    if not args or not isinstance(getattr(args[0], "type", None), TensorType):
        return []
    base, rest = args[0], tuple(args[1:])
    if op in _VIEWS and not isinstance(result, (list, tuple)):
        return [(result, ViewStep(op, rest, tuple(sorted(kwargs.items()))))]
    if op not in _SPLITS or not isinstance(result, (list, tuple)):
        return []
    dim = _bound(op, rest, kwargs)["dim"]
    rank = len(base.type.shape)
    dim = dim % rank if rank else 0
    steps, offset = [], 0
    for index, part in enumerate(result):
        if op == "aten.unbind.int":
            steps.append((part, ViewStep("aten.select.int", (dim, index))))
        else:
            length = part.type.shape[dim]
            steps.append((part, ViewStep("aten.slice.Tensor", (dim, offset, offset + length, 1))))
            offset = offset + length
    return steps


def erase_unused_reads(values: list[Any], kept: list[Any] = ()) -> None:
    """Erase the view ops that read `values` again after a write when nothing uses them (nor `kept`, the values a
    program is about to return), latest first, so a view's own views go before it."""
    keep = {id(v) for v in kept}
    for value in reversed(values):
        op = value.owner
        if op.parent is not None and id(value) not in keep and all(not r.uses for r in op.results):
            op.detach()
            op.erase()


def _numel(shape: list) -> Any:
    count: Any = 1
    for d in shape:
        count = count * d
    return count


def _bound(op: str, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The op's arguments after self by name, defaults filled in."""
    schema = REGISTRY[op].schema
    bound = {a.name: a.default for a in schema.arguments[1:] if a.has_default}
    bound.update(zip([a.name for a in schema.arguments[1:]], args))
    bound.update(kwargs)
    return bound
