"""ONNX export of programs with sparse weights: densified computation, sparse initializers, onnxruntime vs kiln."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import kiln
from tests.codegen.support import assert_matches_interpreter, check_model

PIPELINES = {
    "csr": "prune{sparsity=0.9},sparsify",
    "bsr": "prune{pattern=block block=8,8 sparsity=0.8},sparsify{block=8,8}",
    "2:4": "prune{pattern=semi_structured},sparsify{layout=semi_structured}",
}


def _programs(pipeline: str):
    kiln.manual_seed(0)
    model = kiln.nn.Sequential(kiln.nn.Linear(64, 128), kiln.nn.GELU(), kiln.nn.Linear(128, 64)).eval()
    program = kiln.export(model, (kiln.randn(3, 64),))
    pruned = kiln.passes.run(program, pipeline.split(",sparsify")[0])
    return pruned, kiln.passes.run(pruned, pipeline)


@pytest.mark.parametrize("layout", sorted(PIPELINES))
def test_sparse_weights_export_and_match_the_interpreter(layout):
    pruned, sparse = _programs(PIPELINES[layout])
    with pytest.warns(UserWarning, match="sparse weight\\(s\\) .* computed densely"):
        exported = kiln.onnx.export(sparse)
    size, dense_size = exported.model_proto.ByteSize(), kiln.onnx.export(pruned).model_proto.ByteSize()
    check_model(exported)
    x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    assert_matches_interpreter(sparse, exported, [x], True)
    stored = _sparse_constants(exported)
    if layout == "2:4":  # half zeros: stored dense, which is smaller than values plus int64 indices
        assert not stored
        return
    assert len(stored) == 2
    for tensor in stored:  # the stored values are the pruned weights' nonzeros
        values = onnx.numpy_helper.to_array(tensor.values)
        assert np.all(values != 0) and values.size <= 0.25 * np.prod(tensor.dims)
    assert size < 0.7 * dense_size  # 12 bytes per nonzero: 10% (CSR) and 20% (BSR) of the weights


def _sparse_constants(exported):
    return [attribute.sparse_tensor for node in exported.model_proto.graph.node if node.op_type == "Constant"
            for attribute in node.attribute if attribute.name == "sparse_value"]


def test_pruned_dense_weights_as_sparse_initializers_on_request():
    pruned, _ = _programs(PIPELINES["csr"])
    exported = kiln.onnx.export(pruned, sparse_initializers=True)
    check_model(exported)
    assert len(_sparse_constants(exported)) == 2
    x = np.random.default_rng(1).standard_normal((3, 64)).astype(np.float32)
    assert_matches_interpreter(pruned, exported, [x], True)
    assert not _sparse_constants(kiln.onnx.export(pruned))


def test_sparse_convolutions_export_densified_and_match_the_interpreter():
    kiln.manual_seed(0)
    nn = kiln.nn
    model = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 1, stride=2)).eval()
    program = kiln.export(model, (kiln.randn(2, 8, 10, 10),))
    sparse = kiln.passes.run(program, "prune{pattern=block block=4,4 sparsity=0.75},sparsify{block=4,4}")
    assert len(kiln.passes.sparsity.sparse_weights(sparse)) == 2
    with pytest.warns(UserWarning, match="sparse weight\\(s\\) .* computed densely"):
        exported = kiln.onnx.export(sparse)
    check_model(exported)
    x = np.random.default_rng(0).standard_normal((2, 8, 10, 10)).astype(np.float32)
    assert_matches_interpreter(sparse, exported, [x], True)
