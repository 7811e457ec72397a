"""The torch bridge: `kiln.from_torch(module, args)` runs torch.export and converts its program in memory.

torch is imported lazily, only here; the conversion reuses the .pt2 reader on torch's own serde JSON, and
weights move as numpy arrays (nothing is pickled). Ops kiln lacks are decomposed by torch first.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.ir.errors import KilnError, UnknownOpError
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


def program_from_torch(exported: Any) -> ExportedProgram:
    """Convert a `torch.export.ExportedProgram` to a kiln program without touching disk."""
    from torch._export.serde.serialize import serialize

    from kiln.ir.serde.reader import load_json_document, program_from_document
    artifact = serialize(exported, serialize_state_dict=False, serialize_constants=False,
                         serialize_example_inputs=False)
    document = load_json_document(artifact.exported_program)
    state_dict = {name: _to_numpy(value) for name, value in exported.state_dict.items()}
    constants = {name: _to_numpy(value) for name, value in exported.constants.items()
                 if hasattr(value, "detach")}
    return program_from_document(document, state_dict, constants)


def from_torch(module: Any, args: tuple, kwargs: dict[str, Any] | None = None, *, dynamic_shapes: Any = None,
               strict: bool = False) -> ExportedProgram:
    """torch.export.export(module, args, kwargs, dynamic_shapes=..., strict=...) as a kiln ExportedProgram.

    Ops outside kiln's registry (e.g. `aten.lstm.input`) are decomposed to core ATen by torch first.
    """
    torch = _require_torch()
    exported = torch.export.export(module, tuple(args), kwargs, dynamic_shapes=dynamic_shapes, strict=strict)
    try:
        return program_from_torch(exported)
    except UnknownOpError:
        return program_from_torch(exported.run_decompositions())
