"""kiln.onnx.export's API: torch.onnx keywords, cond → If, errors that list every unsupported op, weights as
deduplicated initializers, external data, verification reports and custom translations."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import kiln
import kiln.onnx
from kiln import nn
from kiln.codegen.onnx import UNSUPPORTED, MissingLoweringError
from kiln.ir.errors import KilnError, VerificationError

from tests.codegen.support import check_model


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x):
        return kiln.cond(x.sum() > 0, lambda v: self.linear(v).relu(), lambda v: v.cos() * 2, (x,))


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4, bias=False)
        self.b = nn.Linear(4, 4, bias=False)
        self.b.weight = self.a.weight

    def forward(self, x):
        return self.b(self.a(x))


def test_cond_becomes_if_and_runs_both_branches():
    kiln.manual_seed(0)
    model = Branchy().eval()
    x = kiln.randn(3, 8)
    program = kiln.onnx.export(model, (x,), dynamic_shapes={"x": {0: kiln.Dim("rows", max=32)}}, verify=True)
    assert "If" in [n.op_type for n in program.model_proto.graph.node]
    check_model(program)
    for sign in (1, -1):
        value = kiln.Tensor(np.abs(np.random.default_rng(0).standard_normal((5, 8))).astype(np.float32) * sign)
        assert program.verify(value).ok
        np.testing.assert_allclose(program(value).numpy() if hasattr(program(value), "numpy") else program(value),
                                   model(value).numpy(), rtol=1.3e-6, atol=1e-5)


def test_weights_are_deduplicated_initializers():
    kiln.manual_seed(0)
    program = kiln.onnx.export(Tied().eval(), (kiln.randn(2, 4),))
    graph = program.model_proto.graph
    assert len(graph.initializer) == 1 and [i.name for i in graph.input] == ["x"]


def test_input_and_output_names():
    kiln.manual_seed(0)
    program = kiln.onnx.export(Tied().eval(), (kiln.randn(2, 4),), input_names=["features"], output_names=["y"])
    assert [i.name for i in program.model_proto.graph.input] == ["features"]
    assert [o.name for o in program.model_proto.graph.output] == ["y"]
    check_model(program)


def test_unsupported_ops_fail_in_one_error_with_sources_and_workarounds():
    from kiln.ir import dtypes
    from kiln.ir.program import GraphBuilder
    from kiln.ir.types import TensorType

    builder = GraphBuilder()
    x = builder.add_input("x", TensorType.of([8], dtypes.float32))
    spectrum = builder.add_input("spectrum", TensorType.of([5], dtypes.complex64))
    with builder:
        builder.source = "spectral.py:3"
        first = kiln.ops.aten._fft_r2c.default(x, [0], 0, True)
        builder.source = "spectral.py:4"
        second = kiln.ops.aten._fft_r2c.default(x, [0], 0, False)
        builder.source = "spectral.py:5"
        inverse = kiln.ops.aten._fft_c2r.default(spectrum, [0], 0, 8)
    program = builder.build([first, second, inverse])
    with pytest.raises(MissingLoweringError) as caught:
        kiln.onnx.export(program)
    message = str(caught.value)
    assert message.startswith("2 op(s) cannot be exported to ONNX")
    assert "aten._fft_r2c.default" in message and UNSUPPORTED["aten._fft_r2c.default"] in message
    assert "spectral.py:3; spectral.py:4" in message and "aten._fft_c2r.default" in message
    assert "custom_translation_table" in message and "decomposition" in message


def test_custom_translation_table_overrides_a_lowering():
    def relu_as_clip(ctx, x):
        return ctx.node("Clip", [x.name, ctx.const(np.float32(0))])

    class Relu(nn.Module):
        def forward(self, x):
            return x.relu()

    program = kiln.onnx.export(Relu(), (kiln.randn(4),), custom_translation_table={kiln.ops.aten.relu.default:
                                                                                     relu_as_clip}, verify=True)
    assert [n.op_type for n in program.model_proto.graph.node] == ["Clip"]


def test_opset_out_of_range_is_refused():
    with pytest.raises(KilnError, match="opset 12"):
        kiln.onnx.export(Tied(), (kiln.randn(2, 4),), opset_version=12)


def test_verify_reports_per_output_differences_and_fails_beyond_tolerance():
    kiln.manual_seed(0)
    model = Tied().eval()
    x = kiln.randn(2, 4)
    program = kiln.onnx.export(model, (x,))
    report = program.verify(x)
    assert report.ok and "max abs diff" in str(report)
    tensor = program.model_proto.graph.initializer[0]
    weights = onnx.numpy_helper.to_array(tensor) + 1e-3
    tensor.CopyFrom(onnx.numpy_helper.from_array(weights, tensor.name))
    program._session = None
    with pytest.raises(VerificationError, match="MISMATCH"):
        from kiln.codegen.onnx import require_match
        require_match(program.verify(x))


def test_external_data_on_request_uses_a_relative_location(tmp_path):
    kiln.manual_seed(0)
    model = nn.Linear(64, 64).eval()
    x = kiln.randn(3, 64)
    path = tmp_path / "linear.onnx"
    kiln.onnx.export(model, (x,), path, external_data=True)
    data = tmp_path / "linear.onnx.data"
    assert data.is_file() and path.stat().st_size < data.stat().st_size
    loaded = onnx.load(str(path), load_external_data=False)
    locations = {e.value for t in loaded.graph.initializer for e in t.external_data if e.key == "location"}
    assert locations == {"linear.onnx.data"}
    import onnxruntime
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    np.testing.assert_allclose(got, model(x).numpy(), rtol=1.3e-6, atol=1e-5)
    onnx.checker.check_model(str(path), full_check=True)


def test_interrupted_save_leaves_no_partial_file(tmp_path, monkeypatch):
    kiln.manual_seed(0)
    program = kiln.onnx.export(Tied().eval(), (kiln.randn(2, 4),))
    path = tmp_path / "model.onnx"

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(onnx.ModelProto, "SerializeToString", interrupted)
    with pytest.raises(KeyboardInterrupt):
        program.save(path)
    assert list(tmp_path.iterdir()) == []


def test_optimize_folds_constant_subgraphs():
    class Constant(nn.Module):
        def forward(self, x):
            return x + kiln.ones(4).exp().sum()

    optimized = kiln.onnx.export(Constant(), (kiln.randn(4),), verify=True)
    plain = kiln.onnx.export(Constant(), (kiln.randn(4),), optimize=False, verify=True)
    assert len(optimized.model_proto.graph.node) < len(plain.model_proto.graph.node)


def test_external_data_is_automatic_above_the_threshold(tmp_path, monkeypatch):
    import kiln.codegen.onnx.program as program_module
    monkeypatch.setattr(program_module, "EXTERNAL_DATA_THRESHOLD", 1000)
    kiln.manual_seed(0)
    model = nn.Linear(64, 64).eval()
    path = tmp_path / "big.onnx"
    kiln.onnx.export(model, (kiln.randn(2, 64),), path)
    assert (tmp_path / "big.onnx.data").is_file()
    onnx.checker.check_model(str(path), full_check=True)


def test_outputs_that_alias_inputs_or_each_other():
    class Aliases(nn.Module):
        def forward(self, x):
            doubled = x * 2
            return x, doubled, doubled

    x = kiln.randn(3)
    program = kiln.onnx.export(Aliases(), (x,), verify=True)
    check_model(program)
    names = [o.name for o in program.model_proto.graph.output]
    assert len(set(names)) == 3 and "x" not in names


def test_output_read_inside_a_branch_keeps_its_name_consistent():
    class SharedValue(nn.Module):
        def forward(self, x):
            shared = x.exp()
            picked = kiln.cond(x.sum() > 0, lambda v: v + shared, lambda v: v - shared, (x,))
            return shared, picked

    program = kiln.onnx.export(SharedValue(), (kiln.randn(4),), output_names=["shared", "picked"], verify=True)
    check_model(program)
    for sign in (1.0, -1.0):
        assert program.verify(kiln.Tensor(np.full(4, sign, dtype=np.float32))).ok


def test_kiln_ops_lists_the_onnx_lowerings(capsys):
    import json

    from kiln.cli.main import main
    assert main(["ops", "--json"]) == 0
    rows = {row["op"]: row["lowered_by"] for row in json.loads(capsys.readouterr().out)}
    assert "onnx" in rows["aten.add.Tensor"] and "onnx" in rows["aten.convolution.default"]
    assert "onnx" in rows["aten.linear.default"]  # composites with an exact ONNX op lower directly (Gemm)
    assert "onnx" not in rows["aten.silu.default"]  # the others reach ONNX through their decomposition


class _KeyedOutputs(kiln.nn.Module):
    def forward(self, x):
        return {"logits": x + 1, "hidden": (x * 2, x - 1)}


def test_outputs_are_named_after_their_pytree_keys_unless_output_names_are_given():
    program = kiln.export(_KeyedOutputs(), (kiln.randn(2, 3),), dynamic_shapes={"x": {0: kiln.Dim("batch")}})
    model = kiln.onnx.export(program).model_proto
    assert [o.name for o in model.graph.output] == ["logits", "hidden_0", "hidden_1"]
    assert [d.dim_param for d in model.graph.input[0].type.tensor_type.shape.dim][:1] == ["batch"]
    named = kiln.onnx.export(program, input_names=["pixels"], output_names=["a", "b", "c"]).model_proto
    assert [o.name for o in named.graph.output] == ["a", "b", "c"] and named.graph.input[0].name == "pixels"
    import onnxruntime
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    got = dict(zip([o.name for o in model.graph.output], session.run(None, {"x": x})))
    expected = program(x)
    kiln.testing.assert_close([got["logits"], got["hidden_0"], got["hidden_1"]],
                              [expected["logits"], *expected["hidden"]])
