"""The ONNX emitter: `export_program(ep)` lowers an ExportedProgram to an `ONNXProgram` (onnxruntime-verified).

The lowering table lives in `lowerings.py` (one entry per op); ops without one are decomposed first.
"""

from __future__ import annotations

import warnings

from typing import Any, Mapping

from kiln.codegen import LOWERINGS
from kiln.codegen.onnx.context import Lowering, LoweringContext
from kiln.codegen.onnx.export import (
    DEFAULT_OPSET, MAX_OPSET, MIN_OPSET, MissingLoweringError, lower_to_model, prepare_program,
)
from kiln.codegen.onnx.graph import OnnxGraph, Value
from kiln.codegen.onnx.lowerings import LOWERING_TABLE, UNSUPPORTED, lowers
from kiln.codegen.onnx.program import ONNXProgram, VerificationReport, require_match
from kiln.ir.program import ExportedProgram

LOWERINGS["onnx"] = set(LOWERING_TABLE)


def normalize_translation_table(table: Mapping[Any, Lowering] | None) -> dict[str, Lowering]:
    """Keys may be op handles (`kiln.ops.aten.gelu.default`) or names (`aten.gelu.default`, `gelu`)."""
    from kiln.ir.registry import lookup
    result: dict[str, Lowering] = {}
    for key, fn in (table or {}).items():
        result[key.name if hasattr(key, "name") else lookup(str(key)).name] = fn
    return result


def export_program(program: ExportedProgram, *, opset_version: int | None = None,
                   input_names: list[str] | None = None, output_names: list[str] | None = None,
                   external_data: bool | None = None, optimize: bool = True,
                   custom_translation_table: Mapping[Any, Lowering] | None = None,
                   sparse_initializers: bool | None = None) -> ONNXProgram:
    """Lower `program` to ONNX (decomposing ops the table cannot lower, folding constants when `optimize`).

    Sparse-layout weights compute densely. `sparse_initializers` stores mostly-zero weights as ONNX sparse
    initializers (default: when the program has sparse weights)."""
    from kiln.passes import run
    from kiln.passes.sparsity import sparse_weights

    custom = normalize_translation_table(custom_translation_table)
    sparse = sparse_weights(program)
    if sparse:
        warnings.warn(f"kiln.onnx: {len(sparse)} sparse weight(s) ({', '.join(sparse[:3])}"
                      f"{', ...' if len(sparse) > 3 else ''}) are computed densely: ONNX has no sparse operators. "
                      "The file stores them as sparse initializers, which onnxruntime densifies when it loads them.",
                      stacklevel=3)
        program = run(program, "densify-weights")
    if sparse_initializers is None:
        sparse_initializers = bool(sparse)
    opset = opset_version or DEFAULT_OPSET
    prepared = prepare_program(program, custom, optimize=optimize, opset=opset)
    model = lower_to_model(prepared, opset=opset, input_names=input_names,
                           output_names=output_names, custom_translation_table=custom,
                           sparse_initializers=sparse_initializers)
    return ONNXProgram(model, program, external_data)


__all__ = ["export_program", "ONNXProgram", "VerificationReport", "require_match", "LOWERING_TABLE", "UNSUPPORTED",
           "lowers", "Lowering", "LoweringContext", "OnnxGraph", "Value", "DEFAULT_OPSET", "MIN_OPSET", "MAX_OPSET",
           "MissingLoweringError", "normalize_translation_table"]
