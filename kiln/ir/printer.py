"""torch.export's readable program form: `linear: "f32[s0, 32]" = aten.linear.default(x, p_weight, p_bias)`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from xdsl.dialects import func

from kiln.ir.types import TensorType

if TYPE_CHECKING:
    from kiln.ir.program import ExportedProgram


def _annotation(value_type: object) -> str:
    return value_type.short() if isinstance(value_type, TensorType) else "Sym"


def format_program(program: "ExportedProgram") -> str:
    from kiln.ir.dialect import bound_arguments
    from kiln.ir.program import format_value, value_names

    body = program.body
    names = value_names(body)
    params = ", ".join(f'{names[a]}: "{_annotation(a.type)}"' for a in body.args)
    lines = ["ExportedProgram:", "    class GraphModule(torch.nn.Module):",
             f"        def forward(self{', ' if params else ''}{params}):"]
    for op in body.ops:
        if isinstance(op, func.ReturnOp):
            returned = ", ".join(names[v] for v in op.operands)
            lines.append(f"            return ({returned}{',' if len(op.operands) == 1 else ''})")
            continue
        opdef = op.opdef  # type: ignore[attr-defined]
        pieces = []
        arguments = opdef.schema.arguments
        values = bound_arguments(op)
        # Trailing arguments equal to their defaults are left out, as torch.fx prints them.
        last = len(arguments)
        while last > 0 and arguments[last - 1].has_default and _is_default(arguments[last - 1], values[last - 1]):
            last -= 1
        for argument, value in zip(arguments[:last], values[:last]):
            if argument.kwarg_only:
                if not (argument.has_default and _is_default(argument, value)):
                    pieces.append(f"{argument.name} = {format_value(value, names)}")
            else:
                pieces.append(format_value(value, names))
        targets = ", ".join(f'{names[r]}: "{_annotation(r.type)}"' for r in op.results)
        source = op.attributes.get("kiln.source")
        comment = f"  # {source.data}" if source is not None else ""  # type: ignore[union-attr]
        lines.append(f"            {targets} = {opdef.name}({', '.join(pieces)}){comment}")
    lines += ["", "Graph signature:", str(program.graph_signature), ""]
    ranges = ", ".join(f"{s}: {r}" for s, r in sorted(program.range_constraints.items(), key=lambda kv: str(kv[0])))
    lines.append(f"Range constraints: {{{ranges}}}")
    return "\n".join(lines) + "\n"


def _is_default(argument: object, value: object) -> bool:
    from kiln.ir.dialect import _same_value
    return _same_value(value, argument.default)  # type: ignore[attr-defined]
