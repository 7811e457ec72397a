"""Every zoo model exports to a valid ONNX model that onnxruntime runs like kiln's interpreter, at the example
shape and at other values of every dynamic dim (the symbolic dims are computed inside the graph)."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest

import kiln
import kiln.models
import kiln.onnx
from kiln.models import MODELS

from tests.codegen.support import check_model
from tests.passes.support import _inputs_at


@functools.cache
def _exported(name: str):
    entry = kiln.models.get(name)
    program = kiln.onnx.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes, verify=True)
    return entry, program


def _input_sets(entry) -> list[tuple]:
    sets = [entry.args]
    for dim, values in entry.dim_examples.items():
        sets += [_inputs_at(entry, {dim: value}) for value in values]
    if len(entry.dim_examples) > 1:  # every dynamic dim changed at once
        sets.append(_inputs_at(entry, {dim: values[-1] for dim, values in entry.dim_examples.items()}))
    return sets


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_passes_checker_and_strict_shape_inference(name):
    _, program = _exported(name)
    check_model(program)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_matches_interpreter_at_every_dynamic_size(name):
    entry, program = _exported(name)
    for args in _input_sets(entry):
        report = program.verify(*args)
        assert report.ok, f"{[tuple(a.shape) for a in args]}:\n{report}"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_dynamic_dims_are_named_dim_params_and_ranges_recorded(name):
    entry, program = _exported(name)
    model = program.model_proto
    dim_names = {d.name for spec in entry.dynamic_shapes.values() for d in (spec or {}).values()}
    params = {d.dim_param for value in model.graph.input for d in value.type.tensor_type.shape.dim if d.dim_param}
    assert params == dim_names
    ranges = {p.key: p.value for p in model.metadata_props}
    for dim in dim_names:
        assert f"kiln.range.{dim}" in ranges
    assert not any(i.name in {t.name for t in model.graph.initializer} for i in model.graph.input), \
        "weights must be initializers, not inputs"


def test_gpt_runs_with_dynamic_batch_and_sequence_length():
    entry, program = _exported("gpt")
    inputs = program.model_proto.graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_param for d in inputs] == ["batch", "seq"]
    for batch, seq in [(1, 1), (3, 5), (2, 16), (4, 64)]:
        tokens = kiln.randint(0, 50, (batch, seq))
        report = program.verify(tokens)
        assert report.ok, f"batch={batch} seq={seq}\n{report}"
        assert program(tokens).shape[:2] == (batch, seq)


def test_lstm_is_unrolled_into_cell_ops():
    _, program = _exported("lstm")
    op_types = {node.op_type for node in program.model_proto.graph.node}
    assert "LSTM" not in op_types and {"Sigmoid", "Tanh", "MatMul"} <= op_types


def test_export_is_byte_identical(tmp_path):
    entry = kiln.models.get("mlp")
    first, second = tmp_path / "a.onnx", tmp_path / "b.onnx"
    kiln.onnx.export(entry.model, entry.args, first, dynamic_shapes=entry.dynamic_shapes)
    entry = kiln.models.get("mlp")
    kiln.onnx.export(entry.model, entry.args, second, dynamic_shapes=entry.dynamic_shapes)
    assert first.read_bytes() == second.read_bytes()
    onnx.checker.check_model(str(first), full_check=True)


@pytest.mark.parametrize("opset", [18, 21, 23])
def test_supported_opsets(opset):
    entry = kiln.models.get("transformer")
    program = kiln.onnx.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes, opset_version=opset)
    assert program.model_proto.opset_import[0].version == opset
    check_model(program)
    np.testing.assert_allclose(program(*entry.args).numpy() if hasattr(program(*entry.args), "numpy")
                               else program(*entry.args), entry.model(*entry.args).numpy(), rtol=1.3e-6, atol=1e-5)
