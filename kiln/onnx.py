"""kiln.onnx: `kiln.onnx.export(model, args, "model.onnx")`, with torch.onnx.export's (dynamo path) keywords."""

from __future__ import annotations

import os
from typing import Any, Mapping

from kiln.codegen.onnx import (
    DEFAULT_OPSET, LOWERING_TABLE, Lowering, LoweringContext, MissingLoweringError, ONNXProgram, VerificationReport,
    export_program, lowers, require_match,
)
from kiln.ir.program import ExportedProgram


def export(model: Any, args: tuple = (), f: str | os.PathLike[str] | None = None, *,
           kwargs: dict[str, Any] | None = None, input_names: list[str] | None = None,
           output_names: list[str] | None = None, opset_version: int | None = None, dynamic_shapes: Any = None,
           external_data: bool | None = None, optimize: bool = True, verify: bool = False,
           custom_translation_table: Mapping[Any, Lowering] | None = None,
           sparse_initializers: bool | None = None) -> ONNXProgram:
    """Export a `kiln.nn.Module` (traced with `kiln.export` first) or an `ExportedProgram` to ONNX.

    `f` saves the model; `external_data` forces (True) or forbids (False) a `<f>.data` weights file (default:
    only above the 2 GB protobuf limit); `verify` compares onnxruntime with kiln's interpreter on `args`.
    Sparse-layout weights compute densely (ONNX has no sparse operators); `sparse_initializers` stores weights that
    are at least 75% zeros as ONNX sparse initializers (default: when the program has sparse weights).
    """
    if isinstance(model, ExportedProgram):
        if dynamic_shapes is not None:
            from kiln.ir.errors import KilnError
            raise KilnError("dynamic_shapes applies when tracing a module; this ExportedProgram is already traced",
                            fix="pass dynamic_shapes to kiln.export, or export the module directly")
        program = model
    else:
        import kiln
        program = kiln.export(model, tuple(args), kwargs, dynamic_shapes=dynamic_shapes)
    onnx_program = export_program(program, opset_version=opset_version, input_names=input_names,
                                  output_names=output_names, external_data=external_data, optimize=optimize,
                                  custom_translation_table=custom_translation_table,
                                  sparse_initializers=sparse_initializers)
    if verify:
        if not args and not kwargs:
            from kiln.ir.errors import KilnError
            raise KilnError("verify=True needs example inputs", fix="pass args=(...) to kiln.onnx.export")
        require_match(onnx_program.verify(*args, **(kwargs or {})))
    if f is not None:
        onnx_program.save(f)
    return onnx_program


__all__ = ["export", "ONNXProgram", "VerificationReport", "DEFAULT_OPSET", "LOWERING_TABLE", "lowers",
           "LoweringContext", "MissingLoweringError"]
