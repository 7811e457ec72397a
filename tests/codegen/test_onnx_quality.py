"""The structure of kiln's ONNX files, which decides their speed in onnxruntime: each ATen pattern becomes the
ONNX op that computes it (Gemm, Conv with batch norm folded, MaxPool without indices, LayerNormalization, Softmax,
Gelu, RMSNormalization, Attention), with no scaffolding, unused initializers or loader warnings, and no more nodes
than torch.onnx writes. Values are checked against torch eager or kiln's interpreter; nothing here is timed
(benchmarks/onnx_quality.py times the files). Every exported file in the suite is also checked clean
(tests/codegen/support.py `check_model`)."""

from __future__ import annotations

import collections
import contextlib
import io
import logging
import warnings

import numpy as np
import onnxruntime as ort
import pytest

import kiln
import kiln.nn as nn

from tests.codegen.support import check_model

torch = pytest.importorskip("torch")


def _ops(program) -> collections.Counter:
    return collections.Counter(node.op_type for node in program.model_proto.graph.node)


def _torch_cnn():
    torch.manual_seed(0)
    layers, channels = [], 3
    for width in (8, 16):
        layers += [torch.nn.Conv2d(channels, width, 3, padding=1), torch.nn.BatchNorm2d(width), torch.nn.ReLU(),
                   torch.nn.MaxPool2d(2)]
        channels = width
    model = torch.nn.Sequential(*layers, torch.nn.Flatten(), torch.nn.Linear(16 * 4 * 4, 10)).eval()
    for module in model.modules():  # statistics that make folding visible
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
    return model, (torch.randn(4, 3, 16, 16),)


def _torch_onnx_node_count(model, args) -> int:
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            exported = torch.onnx.export(model, args, dynamo=True, verbose=False)
    finally:
        logging.disable(logging.NOTSET)
    return len(exported.model_proto.graph.node)


def _run(program, args) -> list[np.ndarray]:
    return program.run([a.numpy() if hasattr(a, "numpy") else a for a in args])


def test_cnn_folds_batch_norm_pools_without_indices_and_is_no_larger_than_torch_onnx():
    model, args = _torch_cnn()
    program = kiln.onnx.export(kiln.from_torch(model, args))
    check_model(program)
    ops = _ops(program)
    assert ops == {"Conv": 2, "Relu": 2, "MaxPool": 2, "Flatten": 1, "Gemm": 1}, ops  # BN folded into the convs
    assert all(len(n.output) == 1 for n in program.model_proto.graph.node if n.op_type == "MaxPool")
    assert sum(ops.values()) <= _torch_onnx_node_count(model, args)
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(_run(program, args)[0]), model(*args))


def test_clamps_with_constant_bounds_are_clip_which_onnxruntime_fuses_into_the_conv(tmp_path):
    """ReLU6 (MobileNet), hardtanh and one-sided clamps are one Clip each, as torch.onnx writes them: onnxruntime
    fuses a Clip after a Conv into it. A NaN stays NaN and infinities clip as in ATen (a missing bound is an
    infinity, not Clip's default of the type's finite extreme)."""
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = torch.nn.Conv2d(3, 8, 3), torch.nn.Conv2d(8, 8, 1)

        def forward(self, x):
            y = torch.nn.functional.relu6(self.conv1(x))
            y = torch.nn.functional.hardtanh(self.conv2(y), -2.0, 3.0)
            return y, torch.clamp(x, max=0.5), torch.clamp(x, min=-0.25)

    torch.manual_seed(0)
    model, args = Model().eval(), (torch.randn(2, 3, 8, 8),)
    program = kiln.onnx.export(kiln.from_torch(model, args))
    check_model(program)
    ops = _ops(program)
    assert ops == {"Conv": 2, "Clip": 4}, ops
    assert sum(ops.values()) <= _torch_onnx_node_count(model, args)
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    session = ort.InferenceSession(program.model_proto.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    import onnx
    nodes = onnx.load(tmp_path / "optimized.onnx").graph.node
    # each Conv carries its Clip as its activation (FusedConv, or the NCHWc Conv on CPUs with wide vectors)
    activations = [a.s for node in nodes if "Conv" in node.op_type for a in node.attribute if a.name == "activation"]
    assert activations == [b"Clip", b"Clip"], [node.op_type for node in nodes]
    assert [node.op_type for node in nodes].count("Clip") == 2  # the clamps of x alone
    x = args[0].clone()
    x[0, 0, 0, :4] = torch.tensor([float("nan"), float("inf"), float("-inf"), 0.3])
    got = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        for g, e in zip(got, model(x)):
            torch.testing.assert_close(torch.from_numpy(g), e, equal_nan=True)


def test_batch_norm_without_a_conv_before_it_is_a_batch_normalization_node():
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.BatchNorm1d(6)
            self.fc = nn.Linear(6, 3)

        def forward(self, x):
            return self.fc(self.norm(x))

    model = Model().eval()
    model.norm.running_mean = kiln.randn(6)
    model.norm.running_var = kiln.rand(6) + 0.5
    x = kiln.randn(5, 6)
    program = kiln.onnx.export(model, (x,), verify=True)  # verify: onnxruntime against kiln's interpreter
    check_model(program)
    assert _ops(program) == {"BatchNormalization": 1, "Gemm": 1}


def test_transformer_layer_is_layer_normalization_softmax_and_prefolded_weights():
    torch.manual_seed(0)
    model = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).eval()
    args = (torch.randn(2, 10, 32),)
    program = kiln.onnx.export(kiln.from_torch(model, args))
    check_model(program)
    ops = _ops(program)
    assert ops["LayerNormalization"] == 2 and ops["Softmax"] == 1
    # no decomposed layer norm or softmax scaffolding (mean/variance reductions, max-subtraction, NaN guards)
    assert not {"ReduceMean", "ReduceMax", "Sqrt", "Reciprocal", "Exp", "IsNaN", "Where"} & set(ops), ops
    initializers = {t.name for t in program.model_proto.graph.initializer}
    transposed_weights = [n.name for n in program.model_proto.graph.node
                          if n.op_type == "Transpose" and n.input[0] in initializers]
    assert not transposed_weights, "weights are stored pre-transposed, not transposed at run time"
    assert sum(ops.values()) <= _torch_onnx_node_count(model, args)
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(_run(program, args)[0]), model(*args))


def test_onnxruntime_loads_the_files_without_warnings(capfd):
    model, args = _torch_cnn()
    program = kiln.onnx.export(kiln.from_torch(model, args))
    capfd.readouterr()
    options = ort.SessionOptions()
    options.log_severity_level = 1  # info and above: warnings included
    ort.InferenceSession(program.model_proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    logged = capfd.readouterr().err
    assert "[W:onnxruntime" not in logged, logged


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.RMSNorm(16)
        self.proj = nn.Linear(16, 48)

    def forward(self, x):
        q, k, v = self.proj(self.norm(x)).view(2, 5, 3, 4, 4).permute(2, 0, 3, 1, 4)
        attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return nn.functional.gelu(attended)


@pytest.mark.parametrize("opset, expected, absent", [
    (18, {"MatMul", "Softmax", "Erf"}, {"Gelu", "Attention", "RMSNormalization"}),
    (20, {"MatMul", "Softmax", "Gelu"}, {"Erf", "Attention", "RMSNormalization"}),
    (23, {"Attention", "RMSNormalization", "Gelu"}, {"Softmax", "Erf"}),
])
def test_ops_follow_the_opset(opset, expected, absent):
    x = kiln.randn(2, 5, 16)
    program = kiln.onnx.export(_Block().eval(), (x,), opset_version=opset, verify=True)
    check_model(program)
    ops = set(_ops(program))
    assert expected <= ops and not absent & ops, ops


class _GroupedBlock(nn.Module):
    """Four query heads over two key/value heads (grouped-query attention)."""

    def __init__(self):
        super().__init__()
        self.query = nn.Linear(16, 16)
        self.key_value = nn.Linear(16, 16)

    def forward(self, x):
        q = self.query(x).view(2, 5, 4, 4).transpose(1, 2)
        k, v = self.key_value(x).view(2, 5, 2, 2, 4).permute(2, 0, 3, 1, 4)
        return nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


@pytest.mark.parametrize("opset", [20, 23])
def test_grouped_attention_repeats_key_heads_only_below_opset_23(opset):
    """opset 23's Attention takes two key heads for four query heads itself; older opsets repeat them (Expand)."""
    x = kiln.randn(2, 5, 16)
    program = kiln.onnx.export(_GroupedBlock().eval(), (x,), opset_version=opset, verify=True)
    check_model(program)
    ops = _ops(program)
    assert ("Attention" in ops) == (opset >= 23) and ("Expand" in ops) == (opset < 23), ops
