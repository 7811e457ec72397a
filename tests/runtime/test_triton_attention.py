"""Fused attention in the Triton backend (kiln/codegen/triton/attention.py, a flash-attention kernel) on CPU through
Triton's interpreter: which chains fuse, and that the kernel gives torch's and the reference interpreter's values
(masks, causal attention, head dims, sequence lengths across block boundaries, all-masked and NaN rows, the zoo)."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")  # tests/conftest.py sets it before triton's first import
torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import kiln  # noqa: E402
from kiln.compiler import compile as compile_program  # noqa: E402
from tests.runtime.support import zoo_inputs  # noqa: E402
from tests.runtime.test_c_attention import _Plain, _ScoresToo  # noqa: E402
from tests.runtime.test_c_backend import _check  # noqa: E402


def _compile(program, path):
    return compile_program(program, target="triton", output=path)


def _fused_kernels(package) -> int:
    """How many attention kernels model.py holds (module.py heads each kernel's source with '# kind: ops')."""
    return sum(line.startswith("# attention: ") for line in (package / "model.py").read_text().splitlines())


class _Attention(torch.nn.Module):
    """torch's scaled_dot_product_attention: it decomposes to the safe softmax (amax, eq -inf, where around
    _softmax), which the fused kernel keeps."""

    def __init__(self, mask: str):
        super().__init__()
        self.mask = mask

    def forward(self, q, k, v, mask):
        functional = torch.nn.functional
        if self.mask == "causal":
            return functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        if self.mask == "none":
            return functional.scaled_dot_product_attention(q, k, v)
        return functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _mask(kind: str, length: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "boolean":
        allowed = rng.random((length, length)) < 0.7
        allowed[min(3, length - 1)] = False  # that query sees no key: its output row is zeros
        return allowed
    return rng.standard_normal((length, length)).astype(np.float32)


@pytest.mark.parametrize("head_dim", [16, 64])
@pytest.mark.parametrize("mask", ["none", "additive", "boolean", "causal"])
def test_sdpa_fuses_and_matches(mask, head_dim, tmp_path):
    """A symbolic sequence length, run at lengths inside one block, across a block boundary and across several
    (blocks of 16 queries and 32 keys under the interpreter)."""
    rng = np.random.default_rng(head_dim)
    q, k, v = (torch.from_numpy(rng.standard_normal((2, 3, 29, head_dim)).astype(np.float32)) for _ in range(3))
    seq = torch.export.Dim("seq", min=1, max=256)
    example_mask = torch.from_numpy(_mask(mask, 29, rng))
    program = kiln.from_torch(_Attention(mask).eval(), (q, k, v, example_mask),
                              dynamic_shapes=({2: seq}, {2: seq}, {2: seq}, {0: seq, 1: seq}))
    compiled = _compile(program, tmp_path / "attention")
    assert _fused_kernels(tmp_path / "attention") == 1
    for length in (1, 37, 130):
        arrays = [rng.standard_normal((2, 3, length, head_dim)).astype(np.float32) for _ in range(3)]
        arrays.append(_mask(mask, length, rng))
        got = compiled(*arrays)
        _check(got, program(*arrays))
        torch.testing.assert_close(torch.from_numpy(got), _Attention(mask)(*map(torch.from_numpy, arrays)))
        if mask == "boolean":
            assert np.all(got[:, :, min(3, length - 1)] == 0)


@pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")  # the NaN query, in the interpreter
@pytest.mark.parametrize("dims", [(3, 5, 7, 16, 24), (1, 77, 130, 40, 72)], ids=["tiny", "ragged"])
def test_plain_attention_fuses_and_matches(dims, tmp_path):
    """Batch, queries, keys, head dim, value dim: a scale in the scores' epilogue, a residual in the output's, head
    and value dims that are not powers of two; one NaN query makes its row NaN."""
    batch, queries, keys, dim, value_dim = dims
    args = (kiln.randn(batch, queries, dim), kiln.randn(batch, keys, dim), kiln.randn(batch, keys, value_dim),
            kiln.randn(batch, queries, value_dim))
    program = kiln.export(_Plain(), args)
    compiled = _compile(program, tmp_path / "attention")
    assert _fused_kernels(tmp_path / "attention") == 1
    rng = np.random.default_rng(sum(dims))
    inputs = [rng.standard_normal(a.shape).astype(np.float32) * 2 for a in args]
    inputs[0][0, 0, 0] = np.nan
    got = compiled(*inputs)
    _check(got, program(*inputs))
    assert np.isnan(got[0, 0]).all() and not np.isnan(got[0, 1:]).any()


class _MaskedSoftmax(kiln.nn.Module):
    """A plain softmax (no safe-softmax `where`) over masked scores."""

    def forward(self, q, k, v, mask):
        return kiln.softmax(q @ k.transpose(-1, -2) + mask, dim=-1) @ v


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # 0 / 0, in the interpreter
def test_all_masked_row_under_a_plain_softmax_is_nan(tmp_path):
    """Without torch's safe softmax a row of all -inf scores is NaN (exp(-inf - -inf)), as the reference gives and
    the C kernel does; a row masked in one block of keys only is finite."""
    args = (kiln.randn(2, 40, 16), kiln.randn(2, 45, 16), kiln.randn(2, 45, 16), kiln.randn(40, 45))
    program = kiln.export(_MaskedSoftmax(), args)
    compiled = _compile(program, tmp_path / "attention")
    assert _fused_kernels(tmp_path / "attention") == 1
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal(a.shape).astype(np.float32) for a in args]
    inputs[3][5] = -np.inf
    inputs[3][6, :32] = -np.inf
    got = compiled(*inputs)
    _check(got, program(*inputs))
    assert np.isnan(got[:, 5]).all() and not np.isnan(np.delete(got, 5, axis=1)).any()


def test_scores_read_elsewhere_do_not_fuse(tmp_path):
    """The scores are an output too: they must reach memory, so the chain stays three kernels."""
    args = tuple(kiln.randn(2, 6, 8) for _ in range(3))
    program = kiln.export(_ScoresToo(), args)
    compiled = _compile(program, tmp_path / "attention")
    assert _fused_kernels(tmp_path / "attention") == 0
    inputs = [np.random.default_rng(i).standard_normal((2, 6, 8)).astype(np.float32) for i in range(3)]
    _check(compiled(*inputs), program(*inputs))


@pytest.mark.parametrize("name", ["gpt", "transformer"])
def test_zoo_attention_fuses_and_matches(name, tmp_path):
    """The zoo's GPT (causal) and Transformer encoder: every layer's attention fused, at each example size."""
    entry = kiln.models.get(name)
    program = kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes)
    model = _compile(program, tmp_path / name)
    assert _fused_kernels(tmp_path / name) >= 1
    for x in zoo_inputs(entry):
        _check(model(x), program(x))
