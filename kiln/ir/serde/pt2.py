"""`kiln.save` / `kiln.load`: ExportedProgram <-> a PT2 archive exactly as torch 2.13's torch.export.save writes it."""

from __future__ import annotations

import json
import math
import warnings
from typing import Any

from kiln.ir.errors import KilnError
from kiln.ir.program import ExportedProgram, InputKind
from kiln.ir.serde import archive
from kiln.ir.serde.archive import ArchiveWriter, FileLike, Limits
from kiln.ir.serde.errors import SerdeError
from kiln.ir.serde import formats
from kiln.ir.serde.sparse_graph import construct_sparse_weights
from kiln.ir.serde.writer import array_meta, program_to_json, sparse_input_layouts, tensor_bytes

MODEL_NAME = "model"


def save(ep: ExportedProgram, f: FileLike, *, extra_files: dict[str, Any] | None = None,
         example_inputs: tuple[tuple, dict] | None = None) -> None:
    """Write `ep` as a .pt2 that `torch.export.load` reads; the write is atomic for paths.

    The example inputs, `(args, kwargs)`, default to `ep.example_inputs` (set by kiln.export and kiln.from_torch);
    torch reads them as `ExportedProgram.example_inputs`, which AOTInductor needs. None writes none.
    """
    if not isinstance(ep, ExportedProgram):
        raise SerdeError(f"kiln.save needs a kiln ExportedProgram, got {type(ep).__name__}",
                         fix="export first: ep = kiln.export(model, args), or kiln.from_torch(...)")
    document = program_to_json(ep)
    writer = ArchiveWriter(archive.archive_root_for(f))
    writer.add_header()
    weights: dict[str, Any] = {}
    constants: dict[str, Any] = {}
    for spec in ep.graph_signature.input_specs:
        if spec.kind not in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR) or spec.target is None:
            continue
        # torch keeps non-persistent buffers and lifted constants in `constants`, the rest in the state dict
        in_state_dict = spec.target in ep.state_dict and spec.kind is not InputKind.CONSTANT_TENSOR
        value = ep.stored(spec.target, None)
        if value is None:
            raise SerdeError(f"{spec.kind.value.lower()} {spec.target!r} is missing from the program's weights")
        (weights if in_state_dict else constants)[spec.target] = (value, spec.kind is InputKind.PARAMETER)
    sparse: dict[str, Any] = {"inputs": sparse_input_layouts(ep), "weights": {}}
    sparse_weights = {}
    for table in (weights, constants):
        for fqn, (value, is_param) in list(table.items()):
            components = getattr(value, "components", None)
            if components is None:
                continue
            del table[fqn]  # torch stores no sparse tensors in a .pt2: each component is a dense buffer
            for component, array in components.items():
                table[f"{fqn}.{component}"] = (array, False)
            sparse["weights"][fqn] = {"layout": value.layout.text(), "shape": list(value.shape),
                                      "components": list(components)}
            sparse_weights[fqn] = value
    built = construct_sparse_weights(document, sparse_weights)  # torch builds them from their components
    for fqn, record in built.items():
        sparse["weights"][fqn]["graph"] = record
    if set(sparse["inputs"]) - {record["input"]["as_tensor"]["name"] for record in built.values()}:
        warnings.warn("kiln.save: the program takes sparse user inputs, which torch 2.13 cannot load from a .pt2 "
                      "(its serializer has no sparse encoding); kiln.load reads this file", stacklevel=2)
    if sparse["inputs"] or sparse["weights"]:
        writer.add(archive.EXTRA_DIR + formats.KILN_SPARSE_MEMBER, json.dumps(sparse))
    writer.add(archive.MODELS_FILENAME_FORMAT.format(MODEL_NAME), json.dumps(_finite_json(document), allow_nan=False))
    # torch.export.load requires this member; empty means "no example inputs"
    writer.add(archive.SAMPLE_INPUTS_FILENAME_FORMAT.format(MODEL_NAME), _sample_inputs(ep, example_inputs))
    for table, directory, prefix, config_format in (
            (weights, archive.WEIGHTS_DIR, archive.WEIGHT_FILENAME_PREFIX, archive.WEIGHTS_CONFIG_FILENAME_FORMAT),
            (constants, archive.CONSTANTS_DIR, archive.TENSOR_CONSTANT_FILENAME_PREFIX,
             archive.CONSTANTS_CONFIG_FILENAME_FORMAT)):
        config = {}
        for index, (fqn, (value, is_param)) in enumerate(table.items()):
            import numpy as np
            array = np.asarray(value)
            path_name = f"{prefix}{index}"
            writer.add(directory + path_name, tensor_bytes(array))
            config[fqn] = {"path_name": path_name, "is_param": is_param, "use_pickle": False,
                           "tensor_meta": array_meta(array, is_param)}
        writer.add(config_format.format(MODEL_NAME), json.dumps({"config": config}))  # required, even empty
    for name, content in (extra_files or {}).items():
        writer.add(archive.EXTRA_DIR + name, content if isinstance(content, (bytes, str)) else str(content))
    writer.write(f)


def _sample_inputs(ep: ExportedProgram, explicit: tuple[tuple, dict] | None) -> bytes:
    """torch.save's bytes of (args, kwargs), written without torch. The caller's inputs must encode; the program's
    own are left out with a warning when they cannot (a custom class, say), as a file without them still works."""
    from kiln.ir.serde.torch_save import check_example_inputs, torch_save_bytes
    if explicit is not None:
        return torch_save_bytes(check_example_inputs(explicit, ep.in_spec))
    if ep.example_inputs is None:
        return b""
    try:
        return torch_save_bytes(check_example_inputs(ep.example_inputs, ep.in_spec))
    except KilnError as error:
        warnings.warn(f"kiln.save writes no example inputs: {error}", stacklevel=3)
        return b""


def _finite_json(value: Any) -> Any:
    """torch's JSON spells non-finite floats as strings (its writer sets allow_nan=False)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {key: _finite_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite_json(item) for item in value]
    return value


def load(f: FileLike, *, extra_files: dict[str, Any] | None = None, limits: Limits | None = None) -> ExportedProgram:
    """Read a .pt2 written by kiln.save or torch.export.save, without torch and without unpickling anything.

    `extra_files`: a dict whose keys name `extra/` members to read; their text is stored into it.
    """
    from kiln.ir.serde.reader import read_archive
    return read_archive(f, extra_files=extra_files, limits=limits or archive.DEFAULT_LIMITS)


def _save_method(self: ExportedProgram, f: FileLike, *, extra_files: dict[str, Any] | None = None,
                 example_inputs: tuple[tuple, dict] | None = None) -> None:
    """Write this program as a .pt2 (`kiln.save(self, f)`)."""
    save(self, f, extra_files=extra_files, example_inputs=example_inputs)


ExportedProgram.save = _save_method  # type: ignore[attr-defined]
