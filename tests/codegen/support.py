"""Shared helpers for the ONNX emitter tests: one-op programs from the op samples, and ORT vs interpreter checks."""

from __future__ import annotations

import numpy as np
import onnx

from kiln.codegen.onnx import ONNXProgram, export_program
from kiln.codegen.onnx.program import compare
from kiln.ir.program import ExportedProgram


def check_model(program: ONNXProgram) -> None:
    """The acceptance checks every emitted model passes: full checker and strict, type-checked shape inference."""
    onnx.checker.check_model(program.model_proto, full_check=True)
    onnx.shape_inference.infer_shapes(program.model_proto, check_type=True, strict_mode=True)


def assert_matches_interpreter(program: ExportedProgram, onnx_program: ONNXProgram, inputs: list[np.ndarray],
                               check_values: bool = True) -> None:
    from kiln.ir.interpreter import run_program
    expected = run_program(program, inputs)
    actual = onnx_program.run(inputs)
    assert len(actual) == len(expected)
    for index, (got, want) in enumerate(zip(actual, expected)):
        # a Python scalar result (`_local_scalar_dense`) takes the IR's declared dtype
        want = np.asarray(want) if isinstance(want, np.ndarray) else np.asarray(want, dtype=got.dtype)
        assert got.shape == want.shape and got.dtype == want.dtype, (
            f"output {index}: got {got.dtype}{list(got.shape)}, expected {want.dtype}{list(want.shape)}")
        if check_values:
            difference = compare(f"output {index}", got, want)
            assert difference.ok, str(difference)


def export_one_op(program: ExportedProgram, **options) -> ONNXProgram:
    return export_program(program, optimize=False, **options)
