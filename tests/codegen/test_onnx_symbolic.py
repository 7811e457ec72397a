"""Shape arithmetic on symbolic dims is computed inside the ONNX graph (Shape/Gather/arithmetic), so one model
is valid for every size in range: reshape to (s0*4, -1), slices to s0 + 1, expand, arange(s0), causal masks."""

from __future__ import annotations

import numpy as np
import pytest
import sympy

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


class Frames(nn.Module):
    """Inputs whose lengths are only ever multiples of the symbol, plus a constant (torch exports wav2vec2's waveform
    as 320 * frames): the graph computes `frames` from the first such length."""

    def forward(self, padded, waveform):
        frames = waveform.shape[1] // 5
        framed = waveform.reshape(waveform.shape[0], frames, 5)
        positions = kiln.arange(frames).to(kiln.float32)
        return framed.sum(-1) * positions, padded[:, 3:].reshape(-1, frames, 4).mean(-1)


@pytest.mark.parametrize("frames", [1, 4, 33])
def test_a_symbol_known_only_as_a_multiple_of_itself(frames):
    """The symbol's source is the input dim 4 * frames + 3: (length - 3) / 4."""
    count = kiln.Dim("frames", min=1, max=64)
    exported = kiln.onnx.export(Frames(), (kiln.randn(2, 19), kiln.randn(2, 20)),
                                dynamic_shapes={"padded": {1: 4 * count + 3}, "waveform": {1: 5 * count}})
    check_model(exported)
    rng = np.random.default_rng(frames)
    padded = rng.standard_normal((2, 4 * frames + 3)).astype(np.float32)
    waveform = rng.standard_normal((2, 5 * frames)).astype(np.float32)
    report = exported.verify(kiln.Tensor(padded), kiln.Tensor(waveform))
    assert report.ok, str(report)


def test_dims_that_are_not_a_multiple_of_a_symbol_are_not_its_source():
    """An input sized floor(s / 2) beside one sized s (the fuzzer's case): s comes from the latter, and the former,
    which has no inverse, is passed over (the export raised sympy's PolynomialError)."""
    from kiln.ir.program import GraphBuilder
    from kiln.ir.registry import ops
    from kiln.ir.types import TensorType

    builder = GraphBuilder()
    s = builder.shape_env.create_symbol(4, name="s", min=2)
    half = builder.add_input("half", TensorType.of([2, sympy.floor(s / 2)], kiln.float32))
    full = builder.add_input("full", TensorType.of([2, s], kiln.float32))
    with builder:
        total = ops.aten.sum.dim_IntList(full, [1], True)
        out = ops.aten.add.Tensor(half, total)
    program = builder.build([out])
    exported = kiln.onnx.export(program, (np.zeros((2, 2), np.float32), np.zeros((2, 4), np.float32)))
    check_model(exported)
    for size in (2, 5, 8):
        rng = np.random.default_rng(size)
        inputs = [rng.standard_normal((2, size // 2)).astype(np.float32),
                  rng.standard_normal((2, size)).astype(np.float32)]
        report = exported.verify(*map(kiln.Tensor, inputs))
        assert report.ok, str(report)
