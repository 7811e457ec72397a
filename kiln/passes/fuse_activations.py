"""Activation fusion, as annotations codegen consumes: an activation applied to the only use of a
linear/conv/matmul (or of an add, for relu) is marked as that op's epilogue.

Both ops get a `kiln.fuse` dictionary attribute with the same `group` number: the anchor op has
`role = "anchor"` and `epilogue = <activation op>`, the activation has `role = "epilogue"`; pure reshapes
in between (`view` after an `addmm`) get `role = "view"`. What the program computes is unchanged.
Run it last: passes that rebuild ops (decompose) do not carry the annotations over.
"""

from __future__ import annotations

from xdsl.dialects.builtin import DictionaryAttr, IntegerAttr, StringAttr, i64
from xdsl.ir import Operation

from kiln.ir.program import ExportedProgram
from kiln.passes.base import Pass, option, register_pass, walk_blocks
from kiln.passes.decompose import kept_op_names

FUSE_ATTRIBUTE = "kiln.fuse"

_GEMM_LIKE = {
    "aten.linear.default", "aten.addmm.default", "aten.mm.default", "aten.bmm.default", "aten.matmul.default",
    "aten.conv1d.default", "aten.conv2d.default", "aten.conv3d.default", "aten.convolution.default",
}
_ADDS = {"aten.add.Tensor"}
_VIEWS = {"aten.view.default", "aten._unsafe_view.default", "aten.reshape.default"}


@register_pass
class FuseActivations(Pass):
    """Mark add+relu and linear/conv+activation pairs with `kiln.fuse` for codegen to fuse."""

    name = "fuse-activations"

    activations: tuple[str, ...] = option(("relu", "gelu", "silu"), "activation ops fused into a GEMM/conv epilogue")
    add_relu: bool = option(True, "also fuse relu into a preceding add.Tensor")

    def __post_init__(self) -> None:
        kept_op_names(self.activations)  # validates the names

    def apply_program(self, program: ExportedProgram) -> ExportedProgram:
        activations = kept_op_names(self.activations)
        relus = kept_op_names(("relu",))
        group = 1 + max((_group(op) for block in walk_blocks(program.body) for op in block.ops), default=-1)
        for block in walk_blocks(program.body):
            for op in block.ops:
                if op.name not in activations or FUSE_ATTRIBUTE in op.attributes or not op.operands:
                    continue
                chain = _single_use_producers(op)
                if not chain:
                    continue
                anchor = chain[-1]
                fusible = anchor.name in _GEMM_LIKE or (self.add_relu and anchor.name in _ADDS and op.name in relus)
                if not fusible or FUSE_ATTRIBUTE in anchor.attributes:
                    continue
                _mark(anchor, group, "anchor", op.name)
                for view in chain[:-1]:
                    _mark(view, group, "view")
                _mark(op, group, "epilogue")
                group += 1
        return program


def _single_use_producers(op: Operation) -> list[Operation]:
    """The ops from `op`'s input back to the first non-view producer, each used only by the next one."""
    chain: list[Operation] = []
    value = op.operands[0]
    while isinstance(value.owner, Operation) and value.has_one_use() and len(value.owner.results) == 1:
        producer = value.owner
        chain.append(producer)
        if producer.name not in _VIEWS:
            return chain
        value = producer.operands[0]
    return []


def _group(op: Operation) -> int:
    marked = op.attributes.get(FUSE_ATTRIBUTE)
    return marked.data["group"].value.data if isinstance(marked, DictionaryAttr) else -1  # type: ignore[union-attr]


def _mark(op: Operation, group: int, role: str, epilogue: str | None = None) -> None:
    entries = {"group": IntegerAttr(group, i64), "role": StringAttr(role)}
    if epilogue is not None:
        entries["epilogue"] = StringAttr(epilogue)
    op.attributes[FUSE_ATTRIBUTE] = DictionaryAttr(entries)
