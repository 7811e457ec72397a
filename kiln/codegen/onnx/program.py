"""ONNXProgram: the emitted model with `.model_proto`, `.save(path)`, `__call__` (onnxruntime) and `.verify()`
(onnxruntime against kiln's reference interpreter with torch.testing's default tolerances)."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import onnx

from kiln.ir import dtypes
from kiln.ir.closeness import closeness, default_tolerances
from kiln.ir.files import atomic_write
from kiln.ir.errors import InputError, KilnError, VerificationError
from kiln.ir.program import ExportedProgram, InputKind, OutputKind

PROTOBUF_LIMIT = 2**31 - 1  # bytes: larger models must keep their weights in an external data file
EXTERNAL_DATA_THRESHOLD = PROTOBUF_LIMIT - (64 << 20)  # weight bytes; the rest of the model needs some room
def weights_size(model: onnx.ModelProto) -> int:
    return sum(len(t.raw_data) for t in model.graph.initializer)


@dataclass
class OutputDifference:
    name: str
    max_abs: float
    max_rel: float
    rtol: float
    atol: float
    ok: bool

    def __str__(self) -> str:
        verdict = "ok" if self.ok else "MISMATCH"
        return (f"{self.name}: max abs diff {self.max_abs:.3g}, max rel diff {self.max_rel:.3g} "
                f"(rtol {self.rtol:g}, atol {self.atol:g}) {verdict}")


@dataclass
class VerificationReport:
    outputs: list[OutputDifference]

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)

    def __str__(self) -> str:
        return "\n".join(str(o) for o in self.outputs)


def compare(name: str, actual: np.ndarray, expected: np.ndarray) -> OutputDifference:
    """torch.testing.assert_close's rule at the expected dtype's default tolerances, NaNs equal."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    rtol, atol = default_tolerances(dtypes.dtype(expected.dtype))
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return OutputDifference(f"{name} (got {actual.dtype}{list(actual.shape)}, expected "
                                f"{expected.dtype}{list(expected.shape)})", float("inf"), float("inf"),
                                rtol, atol, False)
    result = closeness(actual, expected, rtol, atol, equal_nan=True)
    (max_abs, _), (max_rel, _) = result.greatest()
    return OutputDifference(name, float(max_abs), float(max_rel), rtol, atol, result.ok)


class ONNXProgram:
    """An exported ONNX model (torch.onnx.ONNXProgram's API): `model_proto`, `save`, `__call__`."""

    def __init__(self, model_proto: onnx.ModelProto, exported_program: ExportedProgram | None = None,
                 external_data: bool | None = None):
        self.model_proto = model_proto
        self.exported_program = exported_program
        self.external_data = external_data
        self._session: Any = None
        # (graph input, graph output updating it, buffer target) per buffer the program mutates (lower_to_model)
        state = next((entry.value for entry in model_proto.metadata_props if entry.key == "kiln.state"), None)
        self._state_io: list[tuple[str, str, str]] = [tuple(item) for item in json.loads(state)] if state else []
        self._initial_state = {}
        if exported_program is not None:
            self._initial_state = {name: np.array(exported_program.stored(target))
                                   for name, _, target in self._state_io}
        self.state: dict[str, np.ndarray] = dict(self._initial_state)

    def reset_state(self) -> None:
        """The state inputs back to the exported buffers' values (a KV cache emptied for the next sequence)."""
        self.state = dict(self._initial_state)

    def __repr__(self) -> str:
        graph = self.model_proto.graph
        return (f"ONNXProgram(opset={self.model_proto.opset_import[0].version}, nodes={len(graph.node)}, "
                f"initializers={len(graph.initializer)})")

    # -- writing
    def save(self, destination: str | os.PathLike[str], *, external_data: bool | None = None) -> None:
        """Write the model; weights go to `<name>.data` beside it when asked or above the 2 GB protobuf limit."""
        path = Path(destination)
        use_external = self.external_data if external_data is None else external_data
        if use_external is None:
            use_external = weights_size(self.model_proto) > EXTERNAL_DATA_THRESHOLD
        if not use_external:
            atomic_write(path, self.model_proto.SerializeToString())
            return
        model, data = self._split_external(path.name + ".data")
        atomic_write(path.with_name(path.name + ".data"), data)
        atomic_write(path, model.SerializeToString())

    def _split_external(self, location: str) -> tuple[onnx.ModelProto, bytes]:
        """The model with initializers pointing into one data file (relative location), and that file's bytes."""
        model = onnx.ModelProto()
        model.CopyFrom(self.model_proto)
        chunks: list[bytes] = []
        offset = 0
        for tensor in model.graph.initializer:
            if len(tensor.raw_data) < 1024:
                continue
            raw = tensor.raw_data
            padding = (-offset) % 4096  # page-aligned offsets let runtimes mmap each tensor
            chunks.append(b"\0" * padding)
            offset += padding
            del tensor.external_data[:]
            for key, value in (("location", location), ("offset", str(offset)), ("length", str(len(raw)))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
            tensor.data_location = onnx.TensorProto.EXTERNAL
            tensor.ClearField("raw_data")
            chunks.append(raw)
            offset += len(raw)
        return model, b"".join(chunks)

    # -- running
    def session(self) -> Any:
        """An onnxruntime session that computes what the program does; bfloat16 inputs/outputs travel as float32
        (exact), since onnxruntime's Python API has no numpy type for bfloat16."""
        if self._session is None:
            import onnxruntime
            options = onnxruntime.SessionOptions()
            options.log_severity_level = 3
            # onnxruntime fuses a weight-only layer's DequantizeLinear + MatMul into MatMulNBits, whose default
            # accuracy level quantizes the float activations to 8 bits: level 0 keeps them float32, as the program
            # computes (docs/quantization.md)
            options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
            model = _float32_boundary(self.model_proto)
            if model.ByteSize() < PROTOBUF_LIMIT:
                self._session = onnxruntime.InferenceSession(model.SerializeToString(), options,
                                                             providers=["CPUExecutionProvider"])
            else:
                with tempfile.TemporaryDirectory() as folder:
                    path = Path(folder) / "model.onnx"
                    ONNXProgram(model).save(path, external_data=True)
                    self._session = onnxruntime.InferenceSession(str(path), options,
                                                                 providers=["CPUExecutionProvider"])
        return self._session

    def run(self, inputs: Sequence[Any]) -> list[np.ndarray]:
        """Run onnxruntime on flat user inputs (numpy arrays or kiln Tensors); return the user outputs. State inputs
        (buffers the program mutates) are fed from `state`, which their updated values then replace, as torch's
        `ep.module()` keeps its buffers' updates."""
        outputs, self.state = self._step(inputs)
        return outputs

    def _step(self, inputs: Sequence[Any]) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
        """(the user outputs, the state after them) of one run from the current state."""
        if not self.model_proto.graph.output:  # nothing to compute (e.g. unbind of an empty dim); ORT refuses it
            return [], self.state
        if not self._state_io:
            return self._run(inputs), self.state
        missing = [name for name, _, _ in self._state_io if name not in self.state]
        if missing:
            raise InputError(f"the ONNX model's state inputs {', '.join(missing)} have no values",
                             fix="set ONNXProgram.state[name] (the buffers' values), or export with kiln.onnx.export, "
                                 "which starts them at the exported program's")
        outputs = self._run([*inputs, *(self.state[name] for name, _, _ in self._state_io)])
        count = len(outputs) - len(self._state_io)
        return outputs[:count], {name: value for (name, _, _), value in zip(self._state_io, outputs[count:])}

    def _run(self, inputs: Sequence[Any]) -> list[np.ndarray]:
        session = self.session()
        declared = session.get_inputs()
        if len(inputs) != len(declared):
            raise InputError(f"the ONNX model takes {len(declared)} input(s) "
                             f"({', '.join(i.name for i in declared)}) but got {len(inputs)}")
        feed = {}
        for spec, value in zip(declared, inputs):
            if hasattr(value, "__kiln_array__"):
                value = value.__kiln_array__()
            value = np.asarray(value)
            feed[spec.name] = value.astype(np.float32) if value.dtype == dtypes.bfloat16.numpy else value
        outputs = session.run(None, feed)
        return [o.astype(dtypes.bfloat16.numpy) if proto.type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16 else o
                for o, proto in zip(outputs, self.model_proto.graph.output)]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        flat = flat_user_inputs(self.exported_program, args, kwargs) if self.exported_program else list(args)
        outputs = self.run(flat)
        if self.exported_program is not None and self.exported_program.out_spec is not None:
            from kiln.ir.pytree import tree_unflatten
            return tree_unflatten(outputs, self.exported_program.out_spec)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def verify(self, *args: Any, **kwargs: Any) -> VerificationReport:
        """Run onnxruntime and the reference interpreter on the same inputs and compare every output."""
        if self.exported_program is None:
            raise KilnError("verify needs the ExportedProgram the model came from")
        from kiln.ir.interpreter import run_program
        flat = flat_user_inputs(self.exported_program, args, kwargs)
        state = {target: self.state[name] for name, _, target in self._state_io if name in self.state}
        expected = [value for value, spec in zip(run_program(self.exported_program, flat, state),
                                                 self.exported_program.graph_signature.output_specs)
                    if spec.kind is OutputKind.USER_OUTPUT]
        actual, _ = self._step(flat)  # a check, not a step: the state stays
        names = [o.name for o in self.model_proto.graph.output]
        return VerificationReport([compare(n, a, np.asarray(e)) for n, a, e in zip(names, actual, expected)])


def _float32_boundary(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with bfloat16 graph inputs and outputs retyped float32 and cast inside the graph."""
    bf16 = onnx.TensorProto.BFLOAT16
    if not any(v.type.tensor_type.elem_type == bf16 for v in [*model.graph.input, *model.graph.output]):
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    prologue = []
    for value in graph.input:
        if value.type.tensor_type.elem_type == bf16:
            inner = value.name + "__bf16"
            for node in graph.node:
                node.input[:] = [inner if i == value.name else i for i in node.input]
            for output in graph.output:
                if output.name == value.name:
                    output.name = inner
            prologue.append(onnx.helper.make_node("Cast", [value.name], [inner], to=bf16))
            value.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    for value in graph.output:
        if value.type.tensor_type.elem_type == bf16:
            inner = value.name + "__float32"
            graph.node.append(onnx.helper.make_node("Cast", [value.name], [inner], to=onnx.TensorProto.FLOAT))
            value.name = inner
            value.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    nodes = prologue + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    return copy


def flat_user_inputs(program: ExportedProgram, args: Sequence[Any], kwargs: dict[str, Any]) -> list[Any]:
    """The program's user inputs, flattened like `ExportedProgram.__call__` does (baked-in constants dropped)."""
    if program.in_spec is None:
        flat = list(args)
    else:
        from kiln.ir.pytree import check_structure
        flat = check_structure(program.in_spec, (tuple(args), dict(kwargs)))
        flat = [leaf for index, leaf in enumerate(flat) if index not in program.input_constants]
    arrays = []
    for value in flat:
        if hasattr(value, "__kiln_array__"):
            value = value.__kiln_array__()
        arrays.append(np.asarray(value) if not isinstance(value, np.ndarray) else value)
    user = [s for s in program.graph_signature.input_specs if s.kind is InputKind.USER_INPUT]
    if len(arrays) != len(user):
        raise InputError(f"the program takes {len(user)} user input(s) but got {len(arrays)}")
    return arrays


def require_match(report: VerificationReport) -> None:
    if not report.ok:
        raise VerificationError("onnxruntime and kiln's reference interpreter disagree beyond torch.testing "
                                "tolerances:\n" + str(report),
                                fix="report the op at fault; export with verify=False to get the model anyway")


__all__ = ["ONNXProgram", "VerificationReport", "OutputDifference", "compare", "flat_user_inputs", "require_match",
           "atomic_write"]
