"""Enumerations of torch's serde schema (torch/_export/serde/schema.py, SCHEMA_VERSION (8, 20))."""

from __future__ import annotations

import json
from typing import Any

from kiln.ir import dtypes
from kiln.ir.pytree import TreeSpec
from kiln.ir.serde.errors import SerdeError

SCHEMA_VERSION = (8, 20)
TORCH_VERSION = "2.13.0"
OPSET_VERSION = {"aten": 10}

SCALAR_TYPE_CODES = {
    "uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "float16": 6, "float32": 7, "float64": 8,
    "complex64": 10, "complex128": 11, "bool": 12, "bfloat16": 13,
}
DTYPE_BY_CODE = {code: name for name, code in SCALAR_TYPE_CODES.items()}
LAYOUT_STRIDED = 7
# torch's Layout enum (schema.py); kiln's 2:4 layout has none, so it is written as Unknown
LAYOUT_CODES = {"sparse_coo": 1, "sparse_csr": 2, "sparse_csc": 3, "sparse_bsr": 4, "sparse_bsc": 5,
                "semi_structured": 0, "strided": LAYOUT_STRIDED}
# kiln's description of sparse tensors, which torch's TensorMeta cannot hold (block size, index dtype, 2:4 format):
# {"inputs": {graph input name: layout text}, "weights": {fqn: {"layout", "shape", "components", "graph"}}}; each
# component is stored as the buffer `fqn.component`, and "graph" records the nodes that build the weight for torch
# and the input they replaced (sparse_graph.py).
KILN_SPARSE_MEMBER = "kiln_sparse.json"
MEMORY_FORMAT_CODES = {"contiguous_format": 1, "channels_last": 2, "channels_last_3d": 3, "preserve_format": 4}


def scalar_type_code(dtype: dtypes.DType) -> int:
    code = SCALAR_TYPE_CODES.get(dtype.name)
    if code is None:
        raise SerdeError(f"dtype {dtype.name} has no torch.export encoding")
    return code


def dtype_of_code(code: Any) -> dtypes.DType:
    name = DTYPE_BY_CODE.get(code) if isinstance(code, int) else None
    if name is None:
        raise SerdeError(f"unsupported torch scalar type code {code!r}",
                         fix="kiln reads " + ", ".join(sorted(SCALAR_TYPE_CODES)))
    return dtypes.dtype(name)


# -- pytree specs: torch writes `[1, {"type": ..., "context": ..., "children_spec": [...]}]`

def treespec_to_json(spec: TreeSpec) -> str:
    return json.dumps([1, _treespec_node(spec)])


def _treespec_node(spec: TreeSpec) -> dict[str, Any]:
    children = [_treespec_node(child) for child in spec.children]
    if spec.kind == "leaf":
        return {"type": None, "context": None, "children_spec": []}
    if spec.kind == "none":
        return {"type": "builtins.NoneType", "context": "null", "children_spec": []}
    if spec.kind in ("tuple", "list"):
        return {"type": f"builtins.{spec.kind}", "context": "null", "children_spec": children}
    if spec.kind == "dict":
        return {"type": "builtins.dict", "context": json.dumps(list(spec.context)), "children_spec": children}
    if spec.kind == "namedtuple":
        return {"type": "collections.namedtuple", "context": spec.context.__name__, "children_spec": children}
    if spec.kind == "record":
        type_name, keys = spec.context
        return {"type": type_name, "context": json.dumps(list(keys)), "children_spec": children}
    raise SerdeError(f"a {spec.kind} in the program's input or output structure has no torch.export encoding",
                     fix="return tuples, lists, dicts or namedtuples")


def treespec_from_json(text: Any, namedtuple_fields: dict[str, Any]) -> TreeSpec:
    from kiln.ir.serde.safe_json import load_json
    if not isinstance(text, str):
        raise SerdeError("a pytree spec in the program is not a string")
    data = load_json(text.encode("utf-8"), "a pytree spec")
    if not (isinstance(data, list) and len(data) == 2 and data[0] == 1 and isinstance(data[1], dict)):
        raise SerdeError("unsupported pytree spec protocol (kiln reads protocol 1)")
    return _treespec_from_node(data[1], namedtuple_fields)


def _treespec_from_node(node: dict[str, Any], namedtuple_fields: dict[str, Any]) -> TreeSpec:
    import collections

    from kiln.ir.serde.safe_json import load_json
    children_spec = node.get("children_spec") if isinstance(node, dict) else None
    if not isinstance(children_spec, (list, type(None))):
        raise SerdeError("a pytree spec in the program is malformed (a node is not an object with a list of children)")
    kind = node.get("type")
    children = tuple(_treespec_from_node(c, namedtuple_fields) for c in children_spec or [])
    if kind is None:
        return TreeSpec("leaf")
    if kind == "builtins.NoneType":
        return TreeSpec("none")
    if kind in ("builtins.tuple", "builtins.list"):
        return TreeSpec(kind.split(".")[1], None, children)
    if kind in ("builtins.dict", "collections.OrderedDict"):
        keys = load_json(str(node.get("context")).encode("utf-8"), "a dict's keys")
        if not isinstance(keys, list) or len(keys) != len(children) or \
                not all(isinstance(k, (str, int, float, bool, type(None))) for k in keys):
            raise SerdeError("a pytree spec in the program is malformed (a dict's keys are not a list of constants, "
                             "one per child)")
        return TreeSpec("dict", tuple(keys), children)
    if kind == "collections.namedtuple":
        name = str(node.get("context"))
        entry = namedtuple_fields.get(name) if isinstance(namedtuple_fields, dict) else None
        fields = entry.get("field_names") if isinstance(entry, dict) else None
        if not (isinstance(fields, list) and len(fields) == len(children) and all(isinstance(f, str) for f in fields)):
            fields = [f"field{i}" for i in range(len(children))]
        cls = collections.namedtuple(name.rsplit(".", 1)[-1].replace("<", "_").replace(">", "_") or "NamedTuple",
                                     fields, rename=True)
        return TreeSpec("namedtuple", cls, children)
    # Another library's registered node (Hugging Face's ModelOutput): readable when its context is its keys.
    try:
        keys = load_json(str(node.get("context")).encode("utf-8"), f"the context of a {kind} node")
    except SerdeError:
        keys = None
    if isinstance(keys, list) and len(keys) == len(children) and all(isinstance(k, str) for k in keys):
        return TreeSpec("record", (str(kind), tuple(keys)), children)
    raise SerdeError(f"unsupported pytree node type {kind!r} in the program's calling convention",
                     fix="return tuples, lists, dicts, namedtuples, or a registered type whose context is its keys")
