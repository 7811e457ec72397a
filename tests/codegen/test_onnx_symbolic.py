"""Shape arithmetic on symbolic dims is computed inside the ONNX graph (Shape/Gather/arithmetic), so one model
is valid for every size in range: reshape to (s0*4, -1), slices to s0 + 1, expand, arange(s0), causal masks."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.onnx
from kiln import nn

from tests.codegen.support import check_model


class ShapeArithmetic(nn.Module):
    def forward(self, x, y):
        rows = x.shape[0]
        folded = x.reshape(rows * 4, -1)                      # (s0*4, -1)
        grown = kiln.cat([y, y[:1]], dim=0)[: rows + 1]       # a slice to s0 + 1
        positions = kiln.arange(rows).to(kiln.float32)        # arange(s0)
        mask = positions[:, None] >= positions[None, :]       # a causal mask of size s0
        scores = (x.sum(-1, keepdim=True) * positions).masked_fill(~mask, 0.0)
        spread = x[:, :1].expand(rows, 8)                     # expand to a symbolic size
        halves = x[: rows // 2]                               # floor division of a size
        return folded.sum(-1), grown * 2, scores, spread, halves.mean(0)


@pytest.fixture(scope="module")
def program():
    kiln.manual_seed(0)
    rows = kiln.Dim("rows", min=2, max=64)
    x, y = kiln.randn(6, 8), kiln.randn(7, 3)
    return kiln.onnx.export(ShapeArithmetic(), (x, y), dynamic_shapes={"x": {0: rows}, "y": {0: rows + 1}},
                            verify=True)


def test_model_checks_and_keeps_sizes_symbolic(program):
    check_model(program)
    dims = [d.dim_param or d.dim_value for d in program.model_proto.graph.input[1].type.tensor_type.shape.dim]
    assert dims == ["rows+1", 3]
    assert {"Shape"} <= {n.op_type for n in program.model_proto.graph.node}


@pytest.mark.parametrize("rows", [2, 3, 6, 17, 64])
def test_matches_interpreter_at_every_size(program, rows):
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, 8)).astype(np.float32)
    y = rng.standard_normal((rows + 1, 3)).astype(np.float32)
    report = program.verify(kiln.Tensor(x), kiln.Tensor(y))
    assert report.ok, str(report)
