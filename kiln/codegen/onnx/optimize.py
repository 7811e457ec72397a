"""Clean an ONNX graph after lowering: what onnxruntime would otherwise redo at every load (or warn about).

Each lowering emits what its op needs on its own, so seams between ops leave work behind: Identity nodes, a
Transpose of a Transpose, a Reshape of a Reshape (or of an Unsqueeze), a Transpose or Cast of a weight, and
constants or whole nodes nothing reads. `clean_graph` removes them, repeating until nothing changes. It rewrites the
main graph; subgraphs (If, Scan, Loop bodies) are left as they are, and what they read from the outer scope counts
as used.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper

# A weight is folded through a Transpose/Cast/Reshape only if nothing else reads it (else the file would hold
# both forms: tied embeddings stay one array), or if it is small.
_SMALL_BYTES = 4096
_RESHAPES = ("Reshape", "Unsqueeze", "Squeeze", "Flatten")


def clean_graph(nodes: list[onnx.NodeProto], initializers: list[tuple[str, np.ndarray]],
                outputs: set[str]) -> tuple[list[onnx.NodeProto], list[tuple[str, np.ndarray]]]:
    """The graph's nodes and initializers without removable work; `outputs` (graph output names) are kept."""
    cleaner = _Cleaner(nodes, initializers, outputs)
    changed = True
    while changed:
        changed = cleaner.pass_once()
    return cleaner.result()


class _Cleaner:
    def __init__(self, nodes: list[onnx.NodeProto], initializers: list[tuple[str, np.ndarray]], outputs: set[str]):
        self.nodes = list(nodes)
        self.constants = dict(initializers)
        self.order = [name for name, _ in initializers]
        self.outputs = outputs

    # -- facts
    def uses(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for node in self.nodes:
            for name in _reads(node):
                counts[name] = counts.get(name, 0) + 1
        for name in self.outputs:
            counts[name] = counts.get(name, 0) + 1
        return counts

    def producers(self) -> dict[str, onnx.NodeProto]:
        return {output: node for node in self.nodes for output in node.output}

    def constant(self, name: str) -> np.ndarray | None:
        return self.constants.get(name)

    def new_constant(self, array: np.ndarray, hint: str) -> str:
        name, index = f"{hint}_folded", 0
        taken = set(self.constants) | {o for n in self.nodes for o in n.output}
        while name in taken:
            index += 1
            name = f"{hint}_folded_{index}"
        self.constants[name] = array
        self.order.append(name)
        return name

    # -- one sweep of every rewrite
    def pass_once(self) -> bool:
        changed = False
        for rewrite in (self.fold_identities, self.fold_constants, self.fold_transposes, self.fold_reshapes,
                        self.drop_dead):
            changed |= rewrite()
        return changed

    def replace_uses(self, old: str, new: str) -> None:
        for node in self.nodes:
            if old in node.input:
                node.input[:] = [new if name == old else name for name in node.input]
            for attribute in node.attribute:  # subgraphs read outer values by name
                if attribute.type == onnx.AttributeProto.GRAPH:
                    _rename_reads(attribute.g, old, new)

    def fold_identities(self) -> bool:
        """Identity (and Transpose by the identity permutation) passes its input on."""
        changed = False
        for node in list(self.nodes):
            perm = _attribute(node, "perm", None)  # a Transpose without perm reverses the axes
            passes_through = node.op_type == "Identity" or (
                node.op_type == "Transpose" and perm is not None and list(perm) == list(range(len(perm))))
            if not passes_through or not node.input or node.output[0] in self.outputs:
                continue
            self.nodes.remove(node)
            self.replace_uses(node.output[0], node.input[0])
            changed = True
        return changed

    def fold_constants(self) -> bool:
        """A Transpose, Cast, Reshape, Unsqueeze or Squeeze of a constant is the constant it computes. Nodes that
        compute the same from the same constant (a weight shared by repeated layers) share one folded constant."""
        changed = False
        uses = self.uses()
        same: dict[tuple[Any, ...], list[onnx.NodeProto]] = {}
        for node in self.nodes:
            if node.op_type in ("Transpose", "Cast", *_RESHAPES) and node.input and node.input[0] in self.constants \
                    and node.output[0] not in self.outputs:
                key = (node.op_type, tuple(node.input), tuple(a.SerializeToString() for a in node.attribute))
                same.setdefault(key, []).append(node)
        for group in same.values():
            array = self.constants[group[0].input[0]]
            if uses.get(group[0].input[0], 0) > len(group) and array.nbytes > _SMALL_BYTES:
                continue  # the weight is read elsewhere as it is: one copy of it, transposed where read
            folded = _evaluate(group[0], array, [self.constant(name) for name in group[0].input[1:]])
            if folded is None:
                continue
            name = self.new_constant(folded, group[0].input[0])
            for node in group:
                self.nodes.remove(node)
                self.replace_uses(node.output[0], name)
            changed = True
        return changed

    def fold_transposes(self) -> bool:
        """Transpose(Transpose(x, p), q) is Transpose(x, p[q])."""
        changed = False
        uses, producers = self.uses(), self.producers()
        for node in list(self.nodes):
            inner = producers.get(node.input[0]) if node.op_type == "Transpose" and node.input else None
            if inner is None or inner.op_type != "Transpose" or uses.get(inner.output[0], 0) != 1:
                continue
            outer_perm, inner_perm = _attribute(node, "perm", None), _attribute(inner, "perm", None)
            if outer_perm is None or inner_perm is None:
                continue
            node.input[0] = inner.input[0]
            _set_ints(node, "perm", [inner_perm[axis] for axis in outer_perm])
            self.nodes.remove(inner)
            changed = True
        return changed

    def fold_reshapes(self) -> bool:
        """Reshape(r(x), shape) is Reshape(x, shape) for any reshape-like r (Reshape, Unsqueeze, Squeeze, Flatten)
        read only there, when `shape` is a constant that copies no dim from its input (no 0, or allowzero)."""
        changed = False
        uses, producers = self.uses(), self.producers()
        for node in list(self.nodes):
            if node.op_type != "Reshape" or len(node.input) < 2:
                continue
            inner = producers.get(node.input[0])
            shape = self.constant(node.input[1])
            if inner is None or inner.op_type not in _RESHAPES or uses.get(inner.output[0], 0) != 1:
                continue
            if shape is None or (0 in shape.tolist() and not _attribute(node, "allowzero", 0)):
                continue
            node.input[0] = inner.input[0]
            self.nodes.remove(inner)
            changed = True
        return changed

    def drop_dead(self) -> bool:
        """Nodes whose outputs nothing reads (none of them a graph output), then constants nothing reads."""
        changed = False
        while True:
            uses = self.uses()
            dead = [node for node in self.nodes if not any(uses.get(o, 0) for o in node.output if o)]
            if not dead:
                break
            for node in dead:
                self.nodes.remove(node)
            changed = True
        uses = self.uses()
        unused = [name for name in self.order if not uses.get(name)]
        for name in unused:
            del self.constants[name]
        self.order = [name for name in self.order if name in self.constants]
        return changed or bool(unused)

    def result(self) -> tuple[list[onnx.NodeProto], list[tuple[str, np.ndarray]]]:
        return self.nodes, [(name, self.constants[name]) for name in self.order]


def _reads(node: onnx.NodeProto) -> list[str]:
    names = [name for name in node.input if name]
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.GRAPH:
            names += _outer_reads(attribute.g)
    return names


def _outer_reads(graph: onnx.GraphProto) -> list[str]:
    """Names a subgraph reads but does not define (values of the enclosing graph)."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    reads = []
    for node in graph.node:
        reads += [name for name in _reads(node) if name and name not in defined]
        defined.update(node.output)
    reads += [o.name for o in graph.output if o.name not in defined]
    return reads


def _rename_reads(graph: onnx.GraphProto, old: str, new: str) -> None:
    if old in {i.name for i in graph.input} or any(old in node.output for node in graph.node):
        return  # the subgraph defines its own `old`
    for node in graph.node:
        node.input[:] = [new if name == old else name for name in node.input]
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                _rename_reads(attribute.g, old, new)
    for output in graph.output:
        if output.name == old:  # an output passing an outer value on: keep its name, read the new value
            graph.node.append(helper.make_node("Identity", [new], [old]))


def _attribute(node: onnx.NodeProto, name: str, default: Any) -> Any:
    for attribute in node.attribute:
        if attribute.name == name:
            return helper.get_attribute_value(attribute)
    return default


def _set_ints(node: onnx.NodeProto, name: str, values: list[int]) -> None:
    for attribute in node.attribute:
        if attribute.name == name:
            attribute.ints[:] = values
            return
    node.attribute.append(helper.make_attribute(name, values))


def _evaluate(node: onnx.NodeProto, array: np.ndarray, rest: list[np.ndarray | None]) -> np.ndarray | None:
    """What the node computes from constant inputs, or None where this cannot tell."""
    if any(value is None for value in rest):
        return None
    if node.op_type == "Transpose":
        perm = _attribute(node, "perm", None)
        return np.ascontiguousarray(np.transpose(array, perm))
    if node.op_type == "Cast":
        target = helper.tensor_dtype_to_np_dtype(_attribute(node, "to", 0))
        if array.dtype.kind == "f" and target.kind in "iub" or target.kind == "V" or array.dtype.kind == "V":
            return None  # float-to-int and bfloat16 casts: leave them to onnxruntime's own rules
        return array.astype(target)
    if node.op_type == "Reshape":
        shape = [int(d) for d in rest[0].tolist()]
        if 0 in shape and not _attribute(node, "allowzero", 0):
            shape = [array.shape[i] if d == 0 else d for i, d in enumerate(shape)]
        return array.reshape(shape)
    if node.op_type == "Unsqueeze":
        result = array
        for axis in sorted(int(a) % (array.ndim + len(rest[0])) for a in rest[0].tolist()):
            result = np.expand_dims(result, axis)
        return result
    if node.op_type == "Squeeze":
        axes = tuple(int(a) % array.ndim for a in rest[0].tolist()) if rest else None
        return np.squeeze(array, axis=axes)
    if node.op_type == "Flatten":
        axis = _attribute(node, "axis", 1) % max(array.ndim, 1)
        return array.reshape(int(np.prod(array.shape[:axis])), -1)
    return None
