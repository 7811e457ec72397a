"""Pytrees: nested tuples, lists, dicts, namedtuples and registered dataclasses, like torch.utils._pytree.

`tree_flatten` gives the leaves and a TreeSpec; `tree_unflatten` rebuilds the structure. Exported programs
keep the specs of their inputs and outputs and check calls against them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

from kiln.ir.errors import InputError

_DATACLASSES: dict[type, tuple[list[str], list[str]]] = {}


def register_dataclass(cls: type, *, field_names: list[str] | None = None,
                       drop_field_names: list[str] | None = None) -> type:
    """Let a dataclass be an export input or output (its fields are flattened in declaration order)."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__} is not a dataclass")
    names = field_names or [f.name for f in dataclasses.fields(cls) if f.name not in (drop_field_names or [])]
    _DATACLASSES[cls] = (names, list(drop_field_names or []))
    return cls


@dataclass(frozen=True)
class TreeSpec:
    # "leaf", "none", "tuple", "list", "dict", "namedtuple", "dataclass", or "record": a keyed node of a type
    # registered in another program's pytree (e.g. Hugging Face's ModelOutput), which kiln rebuilds as a dict.
    kind: str
    context: Any = None  # dict keys, namedtuple/dataclass type, (record type name, keys)
    children: tuple["TreeSpec", ...] = field(default=())

    @property
    def num_leaves(self) -> int:
        if self.kind == "leaf":
            return 1
        return sum(child.num_leaves for child in self.children)

    def __str__(self) -> str:
        if self.kind == "leaf":
            return "*"
        if self.kind == "none":
            return "None"
        inner = ", ".join(str(c) for c in self.children)
        if self.kind == "dict":
            inner = ", ".join(f"{k!r}: {c}" for k, c in zip(self.context, self.children))
            return "{" + inner + "}"
        if self.kind == "list":
            return f"[{inner}]"
        if self.kind in ("namedtuple", "dataclass"):
            return f"{self.context.__name__}({inner})"
        if self.kind == "record":
            type_name, keys = self.context
            fields = ", ".join(f"{k}={c}" for k, c in zip(keys, self.children))
            return f"{type_name.rsplit('.', 1)[-1]}({fields})"
        return f"({inner}{',' if len(self.children) == 1 else ''})"


LEAF = TreeSpec("leaf")


def tree_flatten(tree: Any) -> tuple[list[Any], TreeSpec]:
    leaves: list[Any] = []
    return leaves, _flatten(tree, leaves)


def _flatten(tree: Any, leaves: list[Any]) -> TreeSpec:
    if tree is None:
        return TreeSpec("none")
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return TreeSpec("namedtuple", type(tree), tuple(_flatten(v, leaves) for v in tree))
    if isinstance(tree, tuple):
        return TreeSpec("tuple", None, tuple(_flatten(v, leaves) for v in tree))
    if isinstance(tree, list):
        return TreeSpec("list", None, tuple(_flatten(v, leaves) for v in tree))
    if isinstance(tree, dict):
        keys = tuple(tree.keys())
        return TreeSpec("dict", keys, tuple(_flatten(tree[k], leaves) for k in keys))
    if type(tree) in _DATACLASSES:
        names, _ = _DATACLASSES[type(tree)]
        return TreeSpec("dataclass", type(tree), tuple(_flatten(getattr(tree, n), leaves) for n in names))
    leaves.append(tree)
    return LEAF


def tree_unflatten(leaves: list[Any], spec: TreeSpec) -> Any:
    iterator = iter(leaves)
    result = _unflatten(iterator, spec)
    return result


def _unflatten(leaves: Any, spec: TreeSpec) -> Any:
    if spec.kind == "leaf":
        return next(leaves)
    if spec.kind == "none":
        return None
    children = [_unflatten(leaves, c) for c in spec.children]
    if spec.kind == "tuple":
        return tuple(children)
    if spec.kind == "list":
        return children
    if spec.kind == "dict":
        return dict(zip(spec.context, children))
    if spec.kind == "record":
        return dict(zip(spec.context[1], children))
    if spec.kind == "namedtuple":
        return spec.context(*children)
    names, _ = _DATACLASSES[spec.context]
    return spec.context(**dict(zip(names, children)))


def leaf_paths(spec: TreeSpec) -> list[tuple[Any, ...]]:
    """The path to each leaf, in flattening order: dict and record keys, namedtuple and dataclass field names, and
    tuple and list positions (`{"logits": *, "hidden": (*, *)}` gives ("logits",), ("hidden", 0), ("hidden", 1))."""
    if spec.kind == "leaf":
        return [()]
    if spec.kind in ("dict", "record"):
        keys = spec.context if spec.kind == "dict" else spec.context[1]
    elif spec.kind == "namedtuple":
        keys = spec.context._fields
    elif spec.kind == "dataclass":
        keys = _DATACLASSES[spec.context][0]
    else:
        keys = range(len(spec.children))
    return [(key, *path) for key, child in zip(keys, spec.children) for path in leaf_paths(child)]


def tree_map(fn: Callable[[Any], Any], tree: Any) -> Any:
    leaves, spec = tree_flatten(tree)
    return tree_unflatten([fn(leaf) for leaf in leaves], spec)


def check_structure(spec: TreeSpec, tree: Any, what: str = "inputs") -> list[Any]:
    """Flatten `tree`, refusing a structure that differs from `spec` with both shown."""
    leaves, actual = tree_flatten(tree)
    if actual != spec:
        raise InputError(f"the {what} have structure {actual} but the program was exported with {spec}",
                         fix="call the program with the same nesting of tuples, lists and dicts as at export")
    return leaves
