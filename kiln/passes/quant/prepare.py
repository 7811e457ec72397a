"""prepare_pt2e: from a quantizer's annotations to observers, and calibration by calling the prepared program.

Each annotated input edge and output gets a spec; specs that point at each other (SharedQuantizationSpec) or that
describe the same tensor with equal settings (torch's implicit sharing) are merged with union-find, and each group
gets one observer. The program itself is not changed: calling the PreparedProgram runs it on the reference
interpreter and feeds every observed value to its observers.
"""

from __future__ import annotations

from typing import Any, Callable

from xdsl.ir import Operation, SSAValue

from kiln.ir.errors import KilnError
from kiln.ir.interpreter import watching
from kiln.ir.program import ExportedProgram
from kiln.passes.base import clone_program
from kiln.passes.quant.qat import ConvBatchNorm, fuse_conv_bn_qat
from kiln.passes.quant.quantizer import (
    DerivedQuantizationSpec, EdgeOrNode, Quantizer, Renaming, SharedQuantizationSpec, annotations,
)


class PreparedProgram:
    """A program with observers: call it on calibration data, then pass it to convert_pt2e."""

    def __init__(self, program: ExportedProgram, groups: dict[EdgeOrNode, int], specs: dict[EdgeOrNode, Any],
                 observers: dict[int, Any]):
        self.program = program
        self.groups = groups  # edge or node -> observer group
        self.specs = specs  # edge or node -> its root QuantizationSpec
        self.observers = observers  # group -> observer
        self.converted = False
        self.conv_batch_norms: list[ConvBatchNorm] = []  # QAT: convolution + batch norm pairs convert folds
        self._seen: set[int] = set()  # observers that received data
        self._watchers: dict[SSAValue, list[Any]] = {}
        for edge_or_node, group in groups.items():
            if observers[group] is None:
                continue
            value = edge_or_node[0] if isinstance(edge_or_node, tuple) else edge_or_node
            watchers = self._watchers.setdefault(value, [])
            if observers[group] not in watchers:
                watchers.append(observers[group])

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.converted:
            raise KilnError("this prepared program was already converted", fix="prepare the float program again")

        with watching(self.observe):
            return self.program(*args, **kwargs)

    def observe(self, value: SSAValue, array: Any) -> None:
        """Feed `array`, the value of `value` in a run, to the observers watching it."""
        for observer in self._watchers.get(value, ()):
            observer(array)
            self._seen.add(id(observer))

    def watched_values(self) -> list[SSAValue]:
        """The values some observer watches, in program order of first appearance."""
        return list(self._watchers)

    def saw(self, observer: Any) -> bool:
        """Whether calibration fed `observer` any data."""
        return id(observer) in self._seen

    def observer_of(self, edge_or_node: EdgeOrNode) -> Any:
        return self.observers[self.groups[edge_or_node]]

    def rename(self, renaming: Renaming) -> None:
        """Follow a rewrite of the program: its observed edges and values under their new names."""
        self.groups = {renaming(key): group for key, group in self.groups.items()}
        self.specs = {renaming(key): renaming.spec(spec) for key, spec in self.specs.items()}
        self._watchers = {renaming(value): watchers for value, watchers in self._watchers.items()}

    def __repr__(self) -> str:
        return f"PreparedProgram({len(self.observers)} observers)"


def prepare_pt2e(program: ExportedProgram, quantizer: Quantizer, is_qat: bool = False) -> PreparedProgram:
    """Annotate a copy of `program` with `quantizer` and place observers (torch.ao's prepare_pt2e). `is_qat`
    (prepare_qat_pt2e) also rewrites convolution + training-mode batch norm to fake-quantize the folded weight."""
    if not isinstance(program, ExportedProgram):
        raise KilnError(f"prepare_pt2e takes a kiln ExportedProgram, got {type(program).__name__}",
                        fix="export the model first: kiln.export(model, args) or kiln.from_torch(module, args)")
    prepared = quantizer.transform_for_annotation(clone_program(program))
    prepared = quantizer.annotate(prepared) or prepared
    quantizer.validate(prepared)
    conv_batch_norms = fuse_conv_bn_qat(prepared) if is_qat else []
    specs = _edge_or_node_specs(prepared)
    table = annotations(prepared)
    groups = group_edges_and_nodes(specs, lambda op: table[op].allow_implicit_sharing)
    roots = {edge_or_node: _root_spec(specs[edge_or_node], specs) for edge_or_node in specs}
    observers: dict[int, Any] = {}
    for edge_or_node, group in groups.items():
        if group not in observers:  # a derived spec observes nothing: convert computes its qparams from others'
            root = roots[edge_or_node]
            observers[group] = None if isinstance(root, DerivedQuantizationSpec) else root.make_observer()
    result = PreparedProgram(prepared, groups, roots, observers)
    result.conv_batch_norms = conv_batch_norms
    return result


def _edge_or_node_specs(program: ExportedProgram) -> dict[EdgeOrNode, Any]:
    specs: dict[EdgeOrNode, Any] = {}
    for op in program.walk_nodes():
        annotation = annotations(program).get(op)
        if annotation is None:
            continue
        for value, spec in annotation.input_qspec_map.items():
            if spec is not None:
                specs[(value, op)] = spec
        if annotation.output_qspec is not None:
            specs[op.results[0]] = annotation.output_qspec
    return specs


def _find(item: EdgeOrNode, parent: dict[EdgeOrNode, EdgeOrNode]) -> EdgeOrNode:
    while parent[item] != item:
        parent[item] = parent[parent[item]]
        item = parent[item]
    return item


def _root_spec(spec: Any, specs: dict[EdgeOrNode, Any]) -> Any:
    while isinstance(spec, SharedQuantizationSpec):
        if spec.edge_or_node not in specs:
            raise KilnError(f"a SharedQuantizationSpec points at {spec.edge_or_node!r}, which has no spec",
                            fix="share with an input edge (value, op) or an output the quantizer annotated")
        spec = specs[spec.edge_or_node]
    return spec


_SHARING_FIELDS = ("dtype", "is_dynamic", "quant_min", "quant_max", "qscheme", "ch_axis", "scale", "zero_point")


def group_edges_and_nodes(specs: dict[EdgeOrNode, Any],
                          implicit_sharing: Callable[[Operation], bool]) -> dict[EdgeOrNode, int]:
    """Observer groups (torch's _get_edge_or_node_to_group_id): explicit sharing, then implicit sharing between the
    input edges of one value and its output spec when their root specs agree on every quantization setting."""
    parent: dict[EdgeOrNode, EdgeOrNode] = {key: key for key in specs}

    def union(into: EdgeOrNode, child: EdgeOrNode) -> None:
        root_into, root_child = _find(into, parent), _find(child, parent)
        shared = specs[root_into]
        if isinstance(shared, SharedQuantizationSpec) and shared.edge_or_node == root_child:
            parent[root_into] = root_child
        else:
            parent[root_child] = root_into

    def root_spec(key: EdgeOrNode) -> Any:
        spec = specs[key]
        while isinstance(spec, SharedQuantizationSpec):
            spec = specs[_find(spec.edge_or_node, parent)]
        return spec

    def same(a: Any, b: Any) -> bool:
        return all(getattr(a, name, None) == getattr(b, name, None) for name in _SHARING_FIELDS)

    for key, spec in specs.items():
        if isinstance(key, tuple):
            value, op = key
            root = root_spec(key)
            if implicit_sharing(op):
                for use in value.uses:
                    other = (value, use.operation)
                    if use.operation is not op and other in specs and same(root_spec(other), root):
                        union(other, key)
                if value in specs and same(root_spec(value), root):
                    union(value, key)
        if isinstance(spec, SharedQuantizationSpec):
            union(spec.edge_or_node, key)
    ids: dict[EdgeOrNode, int] = {}
    groups: dict[EdgeOrNode, int] = {}
    for key in specs:
        root = _find(key, parent)
        groups[key] = ids.setdefault(root, len(ids))
    return groups

