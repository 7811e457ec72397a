"""Shared helpers for the ONNX emitter tests: one-op programs from the op samples, and ORT vs interpreter checks."""

from __future__ import annotations

import numpy as np
import onnx

from kiln.codegen.onnx import ONNXProgram, export_program
from kiln.codegen.onnx.program import compare
from kiln.ir.program import ExportedProgram


def check_model(program: ONNXProgram) -> None:
    """The acceptance checks every emitted model passes: full checker, strict type-checked shape inference, and a
    clean graph (`assert_clean`)."""
    onnx.checker.check_model(program.model_proto, full_check=True)
    onnx.shape_inference.infer_shapes(program.model_proto, check_type=True, strict_mode=True)
    assert_clean(program.model_proto)


def assert_clean(model: onnx.ModelProto) -> None:
    """Nothing onnxruntime would drop or warn about: every initializer and every node output is read (by a node,
    a subgraph or as a graph output), no Identity except where it names a graph output, no MaxPool indices output
    nobody reads."""
    graph = model.graph
    read = {name for node in graph.node for name in _reads(node)} | {o.name for o in graph.output}
    unused = [t.name for t in graph.initializer if t.name not in read]
    assert not unused, f"unused initializers: {unused}"
    dead = [f"{n.op_type} {n.name}" for n in graph.node if not any(o in read for o in n.output if o)]
    assert not dead, f"nodes nothing reads: {dead}"
    outputs = {o.name for o in graph.output}
    identities = [n.name for n in graph.node if n.op_type == "Identity" and n.output[0] not in outputs]
    assert not identities, f"Identity nodes: {identities}"
    for node in graph.node:
        if node.op_type == "MaxPool" and len(node.output) > 1:
            assert node.output[1] in read, f"MaxPool {node.name} computes indices nothing reads"


def _reads(node: onnx.NodeProto) -> list[str]:
    names = list(node.input)
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.GRAPH:
            for inner in attribute.g.node:
                names += _reads(inner)
            names += [o.name for o in attribute.g.output]
    return names


def assert_matches_interpreter(program: ExportedProgram, onnx_program: ONNXProgram, inputs: list[np.ndarray],
                               check_values: bool = True) -> None:
    from kiln.ir.interpreter import run_program
    expected = run_program(program, inputs)
    actual = onnx_program.run(inputs)
    assert len(actual) == len(expected)
    quantizes = any(op.name.startswith("quantized_decomposed.quantize") for op in program.nodes())
    for index, (got, want) in enumerate(zip(actual, expected)):
        # a Python scalar result (`_local_scalar_dense`) takes the IR's declared dtype
        want = np.asarray(want) if isinstance(want, np.ndarray) else np.asarray(want, dtype=got.dtype)
        assert got.shape == want.shape and got.dtype == want.dtype, (
            f"output {index}: got {got.dtype}{list(got.shape)}, expected {want.dtype}{list(want.shape)}")
        if check_values and got.dtype.kind in "iu" and quantizes:
            # QuantizeLinear divides by the scale where torch multiplies by its reciprocal: a value within an ulp
            # of a rounding tie lands one quantization step apart (kiln/codegen/onnx/quantized.py)
            steps = np.abs(got.astype(np.int64) - want.astype(np.int64))
            assert steps.max(initial=0) <= 1, f"output {index}: {steps.max()} quantization steps apart"
        elif check_values:
            difference = compare(f"output {index}", got, want)
            assert difference.ok, str(difference)


def export_one_op(program: ExportedProgram, **options) -> ONNXProgram:
    return export_program(program, optimize=False, **options)
