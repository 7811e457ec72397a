"""Fused attention in the C backend (kiln/codegen/c/attention.py): which chains fuse, and that the fused kernel
gives the reference interpreter's values (plain and safe softmax, masks, dynamic and ragged sizes, NaN rows)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import kiln
from kiln.compiler import compile as compile_c
from tests.runtime.test_c_backend import _check
from tests.torch_oracle import requires_torch, torch

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")


def _fused_kernels(package) -> int:
    return sum(line.startswith("static void kernel_") and "_attention_" in line.split("(")[0]
               for line in (package / "model.c").read_text().splitlines())


class _Plain(kiln.nn.Module):
    """softmax(q kᵀ · scale) v: a scale in the scores GEMM's epilogue, a residual in the output GEMM's."""

    def forward(self, q, k, v, residual):
        return kiln.softmax(q @ k.transpose(-1, -2) * 0.125, dim=-1) @ v + residual


@pytest.mark.parametrize("dims", [(3, 5, 7, 16, 24), (2, 40, 33, 64, 64), (1, 77, 130, 40, 72)],
                         ids=["tiny", "one-panel-of-keys", "ragged"])
def test_plain_attention_fuses_and_matches(dims, tmp_path):
    """Batch, queries, keys, head dim, value dim: query blocks, key panels and value panels with remainders."""
    batch, queries, keys, dim, value_dim = dims
    args = (kiln.randn(batch, queries, dim), kiln.randn(batch, keys, dim), kiln.randn(batch, keys, value_dim),
            kiln.randn(batch, queries, value_dim))
    program = kiln.export(_Plain(), args)
    compiled = compile_c(program, output=tmp_path / "attention")
    assert _fused_kernels(tmp_path / "attention") == 1
    rng = np.random.default_rng(sum(dims))
    inputs = [rng.standard_normal(a.shape).astype(np.float32) * 2 for a in args]
    inputs[0][0, 0, 0] = np.nan  # one NaN query: its row of scores, hence of the output, is NaN
    _check(compiled(*inputs), program(*inputs))


def test_dynamic_sequence_attention(tmp_path):
    seq = kiln.Dim("seq", max=300)
    args = tuple(kiln.randn(2, 9, 16) for _ in range(3))

    class Attention(kiln.nn.Module):
        def forward(self, q, k, v):
            return kiln.softmax(q @ k.transpose(-1, -2), dim=-1) @ v

    program = kiln.export(Attention(), args, dynamic_shapes=({1: seq}, {1: seq}, {1: seq}))
    compiled = compile_c(program, output=tmp_path / "attention")
    assert _fused_kernels(tmp_path / "attention") == 1
    for length in (1, 12, 13, 100, 300):
        q, k, v = (np.random.default_rng(length + i).standard_normal((2, length, 16)).astype(np.float32)
                   for i in range(3))
        _check(compiled(q, k, v), program(q, k, v))


class _ScoresToo(kiln.nn.Module):
    def forward(self, q, k, v):
        scores = q @ k.transpose(-1, -2)
        return kiln.softmax(scores, dim=-1) @ v, scores


def test_scores_read_elsewhere_do_not_fuse(tmp_path):
    """The scores are an output too: they must reach memory, so the chain stays three kernels."""
    args = tuple(kiln.randn(2, 6, 8) for _ in range(3))
    program = kiln.export(_ScoresToo(), args)
    compiled = compile_c(program, output=tmp_path / "attention")
    assert _fused_kernels(tmp_path / "attention") == 0
    inputs = [np.random.default_rng(i).standard_normal((2, 6, 8)).astype(np.float32) for i in range(3)]
    _check(compiled(*inputs), program(*inputs))


@requires_torch
@pytest.mark.parametrize("mask", ["none", "causal", "boolean with a fully masked row"])
def test_torch_sdpa_safe_softmax_fuses_and_matches(mask, tmp_path):
    """torch's scaled_dot_product_attention decomposes to the safe softmax (amax, eq -inf, where around _softmax);
    a query row whose keys are all masked gives zeros there, and in the fused kernel."""
    functional = torch.nn.functional

    class Attention(torch.nn.Module):
        def forward(self, q, k, v, allowed):
            if mask == "causal":
                return functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            if mask == "none":
                return functional.scaled_dot_product_attention(q, k, v)
            return functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed)

    rng = np.random.default_rng(0)
    q, k, v = (torch.from_numpy(rng.standard_normal((1, 4, 29, 32)).astype(np.float32)) for _ in range(3))
    allowed = torch.from_numpy(rng.random((29, 29)) < 0.7)
    allowed[3] = False  # query 3 sees no key
    program = kiln.from_torch(Attention().eval(), (q, k, v, allowed))
    compiled = compile_c(program, output=tmp_path / "attention")
    assert _fused_kernels(tmp_path / "attention") == 1
    arrays = [t.numpy() for t in (q, k, v, allowed)]
    got = compiled(*arrays)
    _check(got, program(*arrays))
    if mask == "boolean with a fully masked row":
        assert np.all(got[0, :, 3] == 0)
