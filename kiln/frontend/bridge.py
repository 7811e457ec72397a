"""The torch bridge: `kiln.from_torch(module, args)` runs torch.export and converts its program in memory.

torch is imported lazily, only here; the conversion reuses the .pt2 reader on torch's own serde JSON, and
weights move as numpy arrays (nothing is pickled). Ops kiln lacks are decomposed by torch first. Symbols keep the
names of the torch.export.Dim objects they came from (`batch`, not torch's `s77`).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from kiln.ir.errors import KilnError
from kiln.ir.program import ExportedProgram


def _require_torch() -> Any:
    try:
        import torch
    except ImportError as error:
        raise KilnError("kiln.from_torch needs PyTorch, which is not installed",
                        fix="pip install torch==2.13.0, or load a saved .pt2 with kiln.load") from error
    return torch


def _to_numpy(tensor: Any) -> np.ndarray:
    torch = _require_torch()
    tensor = tensor.detach().cpu().contiguous()
    if tensor.dtype == torch.bfloat16:
        import ml_dtypes
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16).copy()
    return tensor.numpy().copy()


def _plain_structseqs(spec: Any) -> Any:
    """A pytree spec with torch.return_types named tuples (sort's, topk's, max's (values, indices)) as plain tuples:
    torch's serializer has no name for them (torch.export.save refuses such a program), and a tuple unpacks alike."""
    from torch.utils._pytree import TreeSpec
    children = [_plain_structseqs(child) for child in spec.children()]
    named = isinstance(spec.type, type) and issubclass(spec.type, tuple) and \
        spec.type.__module__ == "torch.return_types"
    if not named and all(new is old for new, old in zip(children, spec.children())):
        return spec
    return TreeSpec(tuple if named else spec.type, None if named else spec.context, children)


def program_from_torch(exported: Any, symbol_names: dict[str, str] | None = None) -> ExportedProgram:
    """Convert a `torch.export.ExportedProgram` to a kiln program without touching disk.

    `symbol_names` renames torch's symbols (`{"s77": "batch"}`), as kiln's own .pt2 files do.
    """
    from torch._export.serde.serialize import serialize

    from kiln.ir.serde.reader import load_json_document, program_from_document
    from kiln.ir.serde.writer import KILN_SYMBOLS_KEY
    signatures = [entry.signature for entry in exported.module_call_graph if entry.signature is not None]
    specs = [signature.out_spec for signature in signatures]
    try:  # (the caller's program is left as it was)
        for signature in signatures:
            signature.out_spec = _plain_structseqs(signature.out_spec)
        artifact = serialize(exported, serialize_state_dict=False, serialize_constants=False,
                             serialize_example_inputs=False)
    finally:
        for signature, spec in zip(signatures, specs):
            signature.out_spec = spec
    document = load_json_document(artifact.exported_program)
    if symbol_names and isinstance(document.get("graph_module"), dict):
        metadata = document["graph_module"].setdefault("metadata", {})
        if isinstance(metadata, dict):
            metadata[KILN_SYMBOLS_KEY] = json.dumps(symbol_names)
    state_dict = {name: _to_numpy(value) for name, value in exported.state_dict.items()}
    constants = {name: _to_numpy(value) for name, value in exported.constants.items()
                 if hasattr(value, "detach")}
    program = program_from_document(document, state_dict, constants)
    if exported.example_inputs is not None:  # torch's (args, kwargs), with numpy arrays for tensors
        from torch.utils._pytree import tree_map_only
        program.example_inputs = tree_map_only(_require_torch().Tensor, _to_numpy, exported.example_inputs)
    return program


def _dim_names(module: Any, args: tuple, kwargs: dict[str, Any] | None, dynamic_shapes: Any,
               exported: Any) -> dict[str, str]:
    """torch's symbol names -> the names of the torch.export.Dim objects the user gave for them.

    Pairs dynamic_shapes with the flat user inputs the way torch.export does. A derived dim (`2 * batch`), a
    Dim.AUTO hint, or a name that would clash with another symbol keeps torch's name.
    """
    if not dynamic_shapes:
        return {}
    try:  # torch's own pairing helpers are private; if they move, symbols keep torch's names
        from torch._export.non_strict_utils import _flatten_dynamic_shapes
        from torch.export.dynamic_shapes import Dim, _combine_args, _DerivedDim
        combined: Any = _combine_args(module, args, kwargs)
        if not isinstance(dynamic_shapes, dict):
            combined = type(dynamic_shapes)(combined.values())
        flat_shapes = _flatten_dynamic_shapes(combined, dynamic_shapes)
    except Exception:
        return {}
    user_inputs = list(exported.graph_signature.user_inputs)
    if len(flat_shapes) != len(user_inputs):
        return {}
    values = {node.name: node.meta.get("val") for node in exported.graph.nodes if node.op == "placeholder"}
    names: dict[str, str] = {}
    for input_name, shape in zip(user_inputs, flat_shapes):
        sizes = getattr(values.get(input_name), "shape", None)
        if sizes is None or not isinstance(shape, (dict, list, tuple)):
            continue
        for axis, dim in (shape.items() if isinstance(shape, dict) else enumerate(shape)):
            if not isinstance(dim, Dim) or isinstance(dim, _DerivedDim) or not 0 <= axis < len(sizes):
                continue
            expr = getattr(getattr(sizes[axis], "node", None), "expr", None)
            if expr is not None and getattr(expr, "is_Symbol", False):
                names[str(expr)] = dim.__name__
    kept = {str(symbol) for symbol in exported.range_constraints} - set(names)
    chosen = list(names.values())
    return {old: new for old, new in names.items()
            if new.isidentifier() and new not in kept and chosen.count(new) == 1}


def from_torch(module: Any, args: tuple, kwargs: dict[str, Any] | None = None, *, dynamic_shapes: Any = None,
               strict: bool = False) -> ExportedProgram:
    """torch.export.export(module, args, kwargs, dynamic_shapes=..., strict=...) as a kiln ExportedProgram.

    Ops outside kiln's registry (e.g. `aten.lstm.input`) are decomposed to core ATen by torch first. A symbol
    made for `torch.export.Dim("batch")` is named `batch` in the kiln program.
    """
    torch = _require_torch()
    exported = torch.export.export(module, tuple(args), kwargs, dynamic_shapes=dynamic_shapes, strict=strict)
    names = _dim_names(module, tuple(args), kwargs, dynamic_shapes, exported)
    # Decompose just the ops kiln lacks (torch's full run_decompositions() fails on some real models: GPT-2), again
    # while a decomposition leaves others kiln lacks (log_sigmoid becomes log_sigmoid_forward).
    table, decomposed = torch.export.default_decompositions(), set()
    while lacking := [op for op in _ops_kiln_lacks(exported) if op in table and op not in decomposed]:
        decomposed.update(lacking)
        exported = exported.run_decompositions({op: table[op] for op in decomposed})
    return program_from_torch(exported, names)


def _ops_kiln_lacks(exported: Any) -> list[Any]:
    """The OpOverloads of `exported` (its subgraphs included) that kiln's registry does not have."""
    import torch
    from kiln.ir.registry import REGISTRY
    lacking = {}
    for graph_module in exported.graph_module.modules():
        if not isinstance(graph_module, torch.fx.GraphModule):
            continue
        for node in graph_module.graph.nodes:
            target = node.target
            if node.op == "call_function" and isinstance(target, torch._ops.OpOverload):
                name = f"{target.namespace}.{target._schema.name.split('::')[-1]}.{target._overloadname}"
                if name not in REGISTRY and name.replace("_.", ".", 1) not in REGISTRY:
                    lacking[name] = target
    return list(lacking.values())
