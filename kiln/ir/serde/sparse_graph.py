"""Sparse weights in a .pt2 that torch loads and runs.

torch 2.13 cannot serialize a sparse tensor ("Cannot access storage of SparseTensorImpl"), but it loads and runs a
graph that builds one. So kiln writes each sparse weight as its component weights (`fqn.crow_indices`, ...), read
by placeholders of their own, and the nodes that build torch's tensor from them in front of the graph:

- COO: `aten._sparse_coo_tensor_unsafe(indices, values, size, is_coalesced=...)`;
- CSR, CSC, BSR, BSC (hybrid too): `aten._sparse_compressed_tensor_unsafe(compressed, plain, values, size,
  layout=...)`, the block size and dense dims following from the values' shape as in torch;
- kiln's 2:4 layout, which torch has on CUDA only: the dense weight, its kept values scattered to the columns
  the 2-bit metadata names (decoded with integer ops), so torch computes the same products;
- a convolution, which torch refuses to take a sparse weight, reads a `_to_dense` copy.

The sparse member (formats.KILN_SPARSE_MEMBER) records what each weight's input was, and `kiln.load` puts it back
(`fold_sparse_constructors`) before reading the graph: kiln's program is the one it wrote.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from kiln.ir import dtypes
from kiln.ir.serde import formats
from kiln.ir.serde.errors import SerdeError
from kiln.ir.serde.writer import static_meta
from kiln.ir.sparse import SparseArray

_SPEC_NAME_KEYS = {"parameter": "parameter_name", "buffer": "buffer_name", "tensor_constant": "tensor_constant_name"}
_INT64 = formats.scalar_type_code(dtypes.int64)


class _Nodes:
    """The nodes (and their values' metadata) that build one weight in torch."""

    def __init__(self, graph: dict[str, Any], prefix: str):
        self.graph, self.prefix = graph, prefix
        self.nodes: list[dict[str, Any]] = []
        self.outputs: list[str] = []

    def add(self, target: str, arguments: list[tuple[str, Any, bool]], dtype: Any, shape: list[int],
            name: str | None = None) -> str:
        """A node of `torch.ops.<target>`; arguments are (name, serialized arg, keyword-only)."""
        name = name or f"{self.prefix}_{len(self.nodes)}"
        self.nodes.append({"target": f"torch.ops.{target}", "outputs": [{"as_tensor": {"name": name}}],
                           "inputs": [{"name": key, "arg": arg, "kind": 2 if keyword else 1}
                                      for key, arg, keyword in arguments],
                           "metadata": {}, "is_hop_single_tensor_return": None, "name": name})
        self.graph["tensor_values"][name] = static_meta(dtype, shape)
        self.outputs.append(name)
        return name


def _tensor(name: str) -> dict[str, Any]:
    return {"as_tensor": {"name": name}}


def _build(nodes: _Nodes, value: SparseArray, placeholders: dict[str, str], output: str) -> None:
    """The nodes that compute `value` in torch from its component placeholders, the last one named `output`."""
    kind, shape = value.layout.kind, [int(d) for d in value.shape]
    if kind == "sparse_coo":
        nodes.add("aten._sparse_coo_tensor_unsafe.default", [
            ("indices", _tensor(placeholders["indices"]), False), ("values", _tensor(placeholders["values"]), False),
            ("size", {"as_ints": shape}, False), ("is_coalesced", {"as_bool": bool(value.layout.coalesced)}, True)],
            value.dtype, shape, name=output)
    elif kind != "semi_structured":
        compressed, plain, _ = (placeholders[c] for c in value.components)
        nodes.add("aten._sparse_compressed_tensor_unsafe.default", [
            ("compressed_indices", _tensor(compressed), False), ("plain_indices", _tensor(plain), False),
            ("values", _tensor(placeholders["values"]), False), ("size", {"as_ints": shape}, False),
            ("layout", {"as_layout": formats.LAYOUT_CODES[kind]}, True)], value.dtype, shape, name=output)
    else:
        # Each metadata byte holds two groups of four columns, two 2-bit positions each, low nibble first
        # (kiln.ir.sparse._unpack_metadata): column = 8 * byte + [p0, p1, 4 + p2, 4 + p3].
        rows, columns = shape
        meta = nodes.add("aten._to_copy.default", [("self", _tensor(placeholders["metadata"]), False),
                                                   ("dtype", {"as_scalar_type": _INT64}, True)],
                         dtypes.int64, [rows, columns // 8])
        positions = []
        for shift, base in ((0, 0), (2, 0), (4, 4), (6, 4)):
            shifted = nodes.add("aten.bitwise_right_shift.Tensor_Scalar", [
                ("self", _tensor(meta), False), ("other", {"as_int": shift}, False)],
                dtypes.int64, [rows, columns // 8]) if shift else meta
            position = nodes.add("aten.bitwise_and.Scalar", [
                ("self", _tensor(shifted), False), ("other", {"as_int": 3}, False)],
                dtypes.int64, [rows, columns // 8])
            if base:
                position = nodes.add("aten.add.Scalar", [("self", _tensor(position), False),
                                                         ("other", {"as_int": base}, False)],
                                     dtypes.int64, [rows, columns // 8])
            positions.append(position)
        within = nodes.add("aten.stack.default", [("tensors", {"as_tensors": [{"name": p} for p in positions]}, False),
                                                  ("dim", {"as_int": -1}, False)], dtypes.int64,
                           [rows, columns // 8, 4])
        starts = nodes.add("aten.arange.start_step", [
            ("start", {"as_int": 0}, False), ("end", {"as_int": columns}, False),
            ("step", {"as_int": 8}, False), ("dtype", {"as_scalar_type": _INT64}, True)],
            dtypes.int64, [columns // 8])
        starts = nodes.add("aten.unsqueeze.default", [("self", _tensor(starts), False), ("dim", {"as_int": 1}, False)],
                           dtypes.int64, [columns // 8, 1])
        absolute = nodes.add("aten.add.Tensor", [("self", _tensor(within), False), ("other", _tensor(starts), False)],
                             dtypes.int64, [rows, columns // 8, 4])
        index = nodes.add("aten.reshape.default", [("self", _tensor(absolute), False),
                                                   ("shape", {"as_ints": [rows, columns // 2]}, False)],
                          dtypes.int64, [rows, columns // 2])
        zeros = nodes.add("aten.zeros.default", [("size", {"as_ints": shape}, False),
                                                 ("dtype", {"as_scalar_type": formats.scalar_type_code(
                                                     dtypes.dtype(value.dtype))}, True)], value.dtype, shape)
        nodes.add("aten.scatter.src", [("self", _tensor(zeros), False), ("dim", {"as_int": 1}, False),
                                       ("index", _tensor(index), False), ("src", _tensor(placeholders["values"]),
                                                                          False)],
                  value.dtype, shape, name=output)


# kiln's convolutions take a (hybrid BSR) sparse weight; torch's refuse one ("weight type (SparseCsr...) should be
# the same"), so in torch's graph they read a dense copy
_CONVOLUTIONS = {f"torch.ops.aten.{name}" for name in (
    "conv1d.default", "conv2d.default", "conv3d.default", "convolution.default", "conv1d.padding",
    "conv2d.padding", "conv3d.padding")}


def _densify_for_convolutions(graph: dict[str, Any], nodes: _Nodes, name: str, value: SparseArray) -> None:
    readers = [node for node in graph["nodes"] if node.get("target") in _CONVOLUTIONS and any(
        argument.get("arg") == _tensor(name) for argument in node["inputs"])]
    if not readers:
        return
    dense = nodes.add("aten._to_dense.default", [("self", _tensor(name), False)], value.dtype,
                      [int(d) for d in value.shape])
    for node in readers:
        for argument in node["inputs"]:
            if argument.get("arg") == _tensor(name):
                argument["arg"] = _tensor(dense)


def construct_sparse_weights(document: dict[str, Any], weights: dict[str, SparseArray]) -> dict[str, Any]:
    """Rewrite `document` (a program kiln wrote) so that each sparse weight in `weights` (by fqn) is built from its
    component weights; returns, by fqn, what `fold_sparse_constructors` needs to undo it."""
    module = document["graph_module"]
    graph, specs = module["graph"], module["signature"]["input_specs"]
    taken = set(graph["tensor_values"]) | {n["name"] for n in graph["nodes"]}
    records: dict[str, Any] = {}
    built: list[dict[str, Any]] = []
    for position in range(len(specs) - 1, -1, -1):
        kind = next(iter(specs[position]))
        fqn = specs[position][kind].get(_SPEC_NAME_KEYS.get(kind, ""))
        if fqn not in weights:
            continue
        value, name = weights[fqn], specs[position][kind]["arg"]["name"]
        placeholders = {}
        for component, array in value.components.items():
            placeholder = f"{name}_{component}"
            while placeholder in taken:
                placeholder += "_"
            taken.add(placeholder)
            placeholders[component] = placeholder
            graph["tensor_values"][placeholder] = static_meta(np.asarray(array).dtype, list(np.shape(array)))
        component_specs = [
            {"tensor_constant": {"arg": {"name": p}, "tensor_constant_name": f"{fqn}.{c}"}} if kind == "tensor_constant"
            else {"buffer": {"arg": {"name": p}, "buffer_name": f"{fqn}.{c}", "persistent": True}}
            for c, p in placeholders.items()]
        records[fqn] = {"spec": specs[position], "input": graph["inputs"][position],
                        "tensor_value": graph["tensor_values"][name], "placeholders": list(placeholders.values())}
        specs[position:position + 1] = component_specs
        graph["inputs"][position:position + 1] = [_tensor(p) for p in placeholders.values()]
        nodes = _Nodes(graph, f"{name}_build")
        _build(nodes, value, placeholders, name)
        _densify_for_convolutions(graph, nodes, name, value)
        records[fqn]["nodes"] = nodes.outputs
        built = nodes.nodes + built
    graph["nodes"][:0] = built
    return records


def _strings(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SerdeError(f"malformed {formats.KILN_SPARSE_MEMBER}: {what} is not a list of names")
    return value


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _input_name(spec: Any) -> str | None:
    """The graph input an input spec (`{"buffer": {"arg": {"name": ...}, ...}}`) names, or None if it is malformed."""
    if not isinstance(spec, dict) or len(spec) != 1:
        return None
    body = next(iter(spec.values()))
    arg = body.get("arg") if isinstance(body, dict) else None
    return _text(arg.get("name")) if isinstance(arg, dict) else None


def fold_sparse_constructors(document: Any, described: dict[str, Any]) -> None:
    """Undo `construct_sparse_weights` on a document read from a file (in place): each built weight becomes the
    input it was, and the component weights are left for `assemble_sparse_weights` to rebuild."""
    try:
        module = document["graph_module"]
        graph, specs = module["graph"], module["signature"]["input_specs"]
        inputs, nodes, values = graph["inputs"], graph["nodes"], graph["tensor_values"]
    except (KeyError, TypeError):
        raise SerdeError("the program document lacks its graph or signature") from None
    if not (isinstance(specs, list) and isinstance(inputs, list) and isinstance(nodes, list) and
            isinstance(values, dict)):
        raise SerdeError("malformed program: its graph's inputs, nodes, tensor values or input specs")
    for fqn, entry in described.items():
        record = entry.get("graph") if isinstance(entry, dict) else None
        if record is None:
            continue  # written before kiln built sparse weights in the graph: the input is still there
        if not isinstance(record, dict) or not all(isinstance(record.get(k), dict) for k in
                                                   ("spec", "input", "tensor_value")):
            raise SerdeError(f"malformed {formats.KILN_SPARSE_MEMBER}: the graph record of {fqn!r}")
        placeholders = _strings(record.get("placeholders"), f"{fqn!r}'s placeholders")
        built = set(_strings(record.get("nodes"), f"{fqn!r}'s nodes"))
        spec_names = [_input_name(spec) for spec in specs]
        if not placeholders or placeholders[0] not in spec_names or \
                len(specs) != len(inputs) or not set(placeholders) <= set(spec_names):
            raise SerdeError(f"{formats.KILN_SPARSE_MEMBER} names placeholders of {fqn!r} the graph does not have",
                             fix="the file was changed after kiln wrote it; write it again")
        position = spec_names.index(placeholders[0])
        keep = [i for i, name in enumerate(spec_names) if name not in placeholders]
        specs[:] = [specs[i] for i in keep[:position]] + [copy.deepcopy(record["spec"])] + \
            [specs[i] for i in keep[position:]]
        inputs[:] = [inputs[i] for i in keep[:position]] + [copy.deepcopy(record["input"])] + \
            [inputs[i] for i in keep[position:]]
        name = _input_name(record["spec"])
        if name is None:
            raise SerdeError(f"malformed {formats.KILN_SPARSE_MEMBER}: the input spec of {fqn!r}")
        nodes[:] = [node for node in nodes if not (isinstance(node, dict) and _text(node.get("name")) in built)]
        for node in nodes:  # a convolution read a dense copy of the weight: it reads the weight again
            arguments = node.get("inputs") if isinstance(node, dict) else None
            for argument in arguments if isinstance(arguments, list) else []:
                arg = argument.get("arg") if isinstance(argument, dict) else None
                tensor = arg.get("as_tensor") if isinstance(arg, dict) else None
                if isinstance(tensor, dict) and _text(tensor.get("name")) in built:
                    tensor["name"] = name
        for built_name in [*placeholders, *built]:
            values.pop(built_name, None)
        values[name] = copy.deepcopy(record["tensor_value"])
