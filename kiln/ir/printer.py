"""torch.export's readable program form: `linear: "f32[s0, 32]" = aten.linear.default(x, p_weight, p_bias)`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from xdsl.dialects import func
from xdsl.ir import Block, SSAValue

from kiln.ir.types import TensorType

if TYPE_CHECKING:
    from kiln.ir.program import ExportedProgram


def _annotation(value_type: object) -> str:
    return value_type.short() if isinstance(value_type, TensorType) else "Sym"


def format_program(program: "ExportedProgram") -> str:
    from kiln.ir.program import value_names

    names = value_names(program.body)
    subgraphs: list[tuple[str, Block]] = []
    lines = ["ExportedProgram:", "    class GraphModule(torch.nn.Module):"]
    lines += _format_block(program.body, names, subgraphs, indent=8)
    index = 0
    while index < len(subgraphs):  # subgraphs may hold subgraphs of their own
        label, block = subgraphs[index]
        lines += ["", f"        class {label}(torch.nn.Module):"]
        lines += _format_block(block, names, subgraphs, indent=12)
        index += 1
    lines += ["", "Graph signature:", str(program.graph_signature), ""]
    ranges = ", ".join(f"{s}: {r}" for s, r in sorted(program.range_constraints.items(), key=lambda kv: str(kv[0])))
    lines.append(f"Range constraints: {{{ranges}}}")
    if program.runtime_asserts:
        lines.append("Runtime assertions: " + ", ".join(str(guard.expr) for guard in program.runtime_asserts))
    return "\n".join(lines) + "\n"


def _format_block(block: Block, names: dict[SSAValue, str], subgraphs: list[tuple[str, Block]],
                  indent: int) -> list[str]:
    from kiln.ir.control_flow import CondOp, MapOp, ScanOp, WhileLoopOp, YieldOp
    from kiln.ir.dialect import bound_arguments
    from kiln.ir.program import format_value

    pad = " " * indent
    params = ", ".join(f'{names[a]}: "{_annotation(a.type)}"' for a in block.args)
    lines = [f"{pad}def forward(self{', ' if params else ''}{params}):"]
    body = pad + "    "
    for op in block.ops:
        if isinstance(op, (func.ReturnOp, YieldOp)):
            returned = ", ".join(names[v] for v in op.operands)
            lines.append(f"{body}return ({returned}{',' if len(op.operands) == 1 else ''})")
            continue
        targets = ", ".join(f'{names[r]}: "{_annotation(r.type)}"' for r in op.results)
        source = op.attributes.get("kiln.source")
        comment = f"  # {source.data}" if source is not None else ""  # type: ignore[union-attr]
        if isinstance(op, CondOp):
            labels = [_subgraph(subgraphs, f"{kind}_graph", region.block)
                      for kind, region in (("true", op.true_region), ("false", op.false_region))]
            operands = format_value(list(op.operands_), names)
            call = f"torch.ops.higher_order.cond({names[op.pred]}, {labels[0]}, {labels[1]}, {operands})"
            lines.append(f"{body}{targets} = {call}{comment}")
            continue
        if isinstance(op, MapOp):
            label = _subgraph(subgraphs, "body_graph", op.body.block)
            xs, operands = (format_value(list(group), names) for group in (op.xs, op.operands_))
            call = f"torch.ops.higher_order.map_impl({label}, {xs}, {operands})"
            lines.append(f"{body}{targets} = {call}{comment}")
            continue
        if isinstance(op, ScanOp):
            label = _subgraph(subgraphs, "scan_combine_graph", op.body.block)
            init, xs, operands = (format_value(list(group), names) for group in (op.init, op.xs, op.operands_))
            call = f"torch.ops.higher_order.scan({label}, {init}, {xs}, {operands})"
            lines.append(f"{body}{targets} = {call}{comment}")
            continue
        if isinstance(op, WhileLoopOp):
            labels = [_subgraph(subgraphs, f"while_loop_{kind}_graph", region.block)
                      for kind, region in (("cond", op.cond_region), ("body", op.body))]
            carried, operands = (format_value(list(group), names) for group in (op.carried, op.operands_))
            call = f"torch.ops.higher_order.while_loop({labels[0]}, {labels[1]}, {carried}, {operands})"
            lines.append(f"{body}{targets} = {call}{comment}")
            continue
        opdef = op.opdef  # type: ignore[attr-defined]
        arguments = opdef.schema.arguments
        values = bound_arguments(op)
        # Trailing arguments equal to their defaults are left out, as torch.fx prints them.
        last = len(arguments)
        while last > 0 and arguments[last - 1].has_default and _is_default(arguments[last - 1], values[last - 1]):
            last -= 1
        pieces = []
        for argument, value in zip(arguments[:last], values[:last]):
            if argument.kwarg_only:
                if not (argument.has_default and _is_default(argument, value)):
                    pieces.append(f"{argument.name} = {format_value(value, names)}")
            else:
                pieces.append(format_value(value, names))
        lines.append(f"{body}{targets} = {opdef.name}({', '.join(pieces)}){comment}")
    return lines


def _subgraph(subgraphs: list[tuple[str, Block]], kind: str, block: Block) -> str:
    """Queue a region's block to be printed as a nested GraphModule; its label (`true_graph_0`), as torch names it."""
    label = f"{kind}_{sum(1 for lab, _ in subgraphs if lab.startswith(kind))}"
    subgraphs.append((label, block))
    return label


def _is_default(argument: Any, value: object) -> bool:
    from kiln.ir.dialect import _same_value
    return _same_value(value, argument.default)
