"""Decomposition to Core ATen through the op registry's decompositions (the mechanism behind
`ExportedProgram.run_decompositions`), with a keep-list like torch-mlir's backend-legal-ops."""

from __future__ import annotations

from dataclasses import field
from typing import Any, Callable, Mapping

from kiln.ir.program import ExportedProgram
from kiln.ir.registry import REGISTRY, OpOverload, lookup
from kiln.ir.retrace import default_decompositions, retrace
from kiln.passes.base import Pass, option, register_pass


@register_pass
class Decompose(Pass):
    """Rewrite composite ops into Core ATen ops using the registry's decompositions."""

    name = "decompose"

    keep: tuple[str, ...] = option((), "ops to leave alone (backend-legal): gelu (every overload), "
                                       "aten.layer_norm.default or layer_norm.default (one overload)")
    namespaces: tuple[str, ...] = option(("aten",), "op namespaces to decompose (add quantized_decomposed to "
                                                     "compute quantize/dequantize in float)")
    table: Mapping[OpOverload, Callable[..., Any]] | None = field(
        default=None, metadata={"help": "decomposition table keyed by kiln.ops handles (default: the registry's)"})

    def __post_init__(self) -> None:
        kept_op_names(self.keep)  # unknown op names fail when the pipeline is parsed, not halfway through it

    def decomposition_table(self) -> dict[OpOverload, Callable[..., Any]]:
        table = dict(default_decompositions(self.namespaces) if self.table is None else self.table)
        kept = kept_op_names(self.keep)
        return {handle: fn for handle, fn in table.items() if handle.name not in kept}

    def apply_program(self, program: ExportedProgram) -> ExportedProgram:
        return retrace(program, self.decomposition_table())


def kept_op_names(names: tuple[str, ...]) -> set[str]:
    """Qualified op names for a keep-list: `gelu` means every overload of aten.gelu; dotted names one overload."""
    kept: set[str] = set()
    for name in names:
        bare = name.removeprefix("aten.").replace("::", ".")
        if "." not in bare:
            overloads = {key for key in REGISTRY if key.startswith(f"aten.{bare}.")}
            if not overloads:
                lookup(bare)  # raises UnknownOpError with suggestions
            kept |= overloads
        else:
            kept.add(lookup(name).name)
    return kept
