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
# A folded constant may grow (Expand, Tile) up to this size, or up to its inputs' size.
_FOLDED_BYTES = 1 << 20
_RESHAPES = ("Reshape", "Unsqueeze", "Squeeze", "Flatten")
# Ops folded when every input is a constant: data movement (exact in any dtype), and integer/bool arithmetic and
# logic (exact). Float arithmetic stays for onnxruntime to compute, with its own rounding.
_MOVES = {"Transpose", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Expand", "Tile", "Gather", "GatherElements",
          "GatherND", "Concat", "Slice", "Identity", "Shape", "Size", "ConstantOfShape", "Cast", "Where", "Split"}
_EXACT_ON_INTEGERS = {"Add", "Sub", "Mul", "Div", "Mod", "Neg", "Abs", "Max", "Min", "Range", "Equal", "Less",
                      "LessOrEqual", "Greater", "GreaterOrEqual", "Not", "And", "Or", "Xor", "ReduceProd", "ReduceSum"}


def clean_graph(nodes: list[onnx.NodeProto], initializers: list[tuple[str, np.ndarray]],
                outputs: set[str]) -> tuple[list[onnx.NodeProto], list[tuple[str, np.ndarray]]]:
    """The graph's nodes and initializers without removable work; `outputs` (graph output names) are kept."""
    cleaner = _Cleaner(nodes, initializers, outputs)
    changed = True
    while changed:
        changed = cleaner.pass_once()
    cleaner.empty_expands_as_slices()
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
                        self.fold_relu_into_clip, self.drop_dead):
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
        """A node whose inputs are all constants is the constants it computes (data movement, or integer and bool
        arithmetic). Nodes that compute the same from the same constants (a weight shared by repeated layers, each
        transposing it) share one folded constant; a large weight read elsewhere as it is stays one copy."""
        changed = False
        uses = self.uses()
        same: dict[tuple[Any, ...], list[onnx.NodeProto]] = {}
        for node in self.nodes:
            inputs = [name for name in node.input if name]
            if inputs and all(name in self.constants for name in inputs) and _foldable(node, self.constants) \
                    and not set(node.output) & self.outputs:
                key = (node.op_type, tuple(node.input), tuple(a.SerializeToString() for a in node.attribute))
                same.setdefault(key, []).append(node)
        for group in same.values():
            first = group[0]
            arrays = [self.constants[name] if name else None for name in first.input]
            size = sum(a.nbytes for a in arrays if a is not None)
            if any(uses.get(name, 0) > len(group) for name in first.input if name) and size > _SMALL_BYTES:
                continue  # the weight is read elsewhere as it is: one copy of it, transposed where read
            folded = _evaluate(first, arrays)
            if folded is None or sum(a.nbytes for a in folded) > max(_FOLDED_BYTES, size):
                continue
            if first.op_type == "Cast" and size > _SMALL_BYTES and folded[0].nbytes > size:
                continue  # a widened weight (int8 or float16 to float32) would grow the file: onnxruntime casts it
            names = [self.new_constant(array, first.input[0] if first.op_type in ("Transpose", "Cast", *_RESHAPES)
                                       else first.output[index]) for index, array in enumerate(folded)]
            for node in group:
                self.nodes.remove(node)
                for output, name in zip(node.output, names):
                    if output:
                        self.replace_uses(output, name)
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

    def fold_relu_into_clip(self) -> bool:
        """Clip(Relu(x), lo, hi) is Clip(x, max(lo, 0), hi) when lo is a constant and the Relu is read only there
        (a relu before hardtanh or clamp). onnxruntime 1.32 makes the same fusion at load, but its rule fails on a
        float64 Clip ("Unexpected data type for Clip 'min' input of 11") and the session does not load."""
        changed = False
        uses, producers = self.uses(), self.producers()
        for node in list(self.nodes):
            if node.op_type != "Clip" or len(node.input) < 2 or not node.input[1]:
                continue
            relu, lower = producers.get(node.input[0]), self.constant(node.input[1])
            if relu is None or relu.op_type != "Relu" or lower is None or uses.get(relu.output[0], 0) != 1 \
                    or relu.output[0] in self.outputs:
                continue
            raised = np.maximum(lower, np.zeros((), lower.dtype)).astype(lower.dtype)  # a NaN bound stays NaN
            node.input[0] = relu.input[0]
            node.input[1] = self.new_constant(raised, node.output[0] + "_min")
            self.nodes.remove(relu)
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

    def empty_expands_as_slices(self) -> None:
        """An Expand to a constant shape with a 0 becomes an Expand with 1 there, sliced to nothing.

        onnxruntime 1.32's optimizer drops an Expand to such a shape when it infers the input's shape ([2, 1] to
        [2, 0] looks like a broadcast that changes nothing to it) and the 1 reaches the next node: a ScatterND
        then refuses updates of [1, 2] where [0, 2] (an index_put with an empty index). A Slice of the empty
        extent is dtype-agnostic and keeps what broadcasting means: a dim of 1 or 0 against 0 is 0."""
        for node in list(self.nodes):
            shape = self.constant(node.input[1]) if node.op_type == "Expand" else None
            if shape is None or not (shape == 0).any():
                continue
            axes = [int(axis) for axis in np.flatnonzero(shape == 0)]
            ones = self.new_constant(np.where(shape == 0, 1, shape).astype(np.int64), node.output[0] + "_ones")
            expanded = node.output[0] + "_ones_expanded"
            zeros = self.new_constant(np.zeros(len(axes), np.int64), node.output[0] + "_empty")
            picked = self.new_constant(np.asarray(axes, np.int64), node.output[0] + "_axes")
            index = self.nodes.index(node)
            self.nodes[index:index + 1] = [
                helper.make_node("Expand", [node.input[0], ones], [expanded], name=expanded),
                helper.make_node("Slice", [expanded, zeros, zeros, picked], list(node.output), name=node.name)]
        self.drop_dead()

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
        if output.name == old:  # an output passing an outer value on (subgraph outputs are matched by position)
            output.name = new


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


def _foldable(node: onnx.NodeProto, constants: dict[str, np.ndarray]) -> bool:
    if any(a.type == onnx.AttributeProto.GRAPH for a in node.attribute):
        return False
    dtypes = [constants[name].dtype for name in node.input if name]
    if any(d.kind not in "biuf?" or d.itemsize == 2 and d.kind == "f" and d != np.float16 for d in dtypes):
        return False  # bfloat16 and float8 (ml_dtypes): leave them to onnxruntime
    if node.op_type in _MOVES:
        target = _attribute(node, "to", None) if node.op_type == "Cast" else None
        if target is not None:
            to = helper.tensor_dtype_to_np_dtype(target)
            if to.kind not in "biuf" or (dtypes[0].kind == "f" and to.kind != "f") or (to.kind == "f" and to.itemsize
                                                                                          not in (2, 4, 8)):
                return False  # float-to-integer and exotic float casts: onnxruntime's rules
        return True
    return node.op_type in _EXACT_ON_INTEGERS and all(d.kind in "biu?" for d in dtypes)


def _evaluate(node: onnx.NodeProto, arrays: list[np.ndarray | None]) -> list[np.ndarray] | None:
    """What the node computes from constant inputs (ONNX's reference implementation), or None if it cannot."""
    from onnx.reference import ReferenceEvaluator
    feeds = {name: array for name, array in zip(node.input, arrays) if name}
    try:
        results = ReferenceEvaluator(node).run(None, feeds)
    except Exception:  # noqa: BLE001  (an op the reference lacks, or inputs it refuses: keep the node)
        return None
    return [np.asarray(result, order="C") for result in results]  # (ascontiguousarray makes 0-d arrays 1-d)
