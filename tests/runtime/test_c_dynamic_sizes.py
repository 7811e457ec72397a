"""C kernels over dynamic and transposed layouts against the reference interpreter: activations read through a
transpose (render._staged_pointwise copies the strided operand a tile at a time, then runs the math vectorized),
rows across the layout (a layer norm over channels: render._transposed_rows), convolutions whose input plane is
sized at run time (int32 offsets and row copies, under a limit kiln_run checks where the symbol ranges leave it
open), values computed from weights alone (computed by the compiler), and kernels whose code differs only in a
division of the symbols (render.hoist_symbol_divisions: such bodies must not share one C function)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import kiln
from kiln.compiler import compile as compile_c
from tests.runtime.support import use_capability
from tests.runtime.test_c_backend import _check

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
F = kiln.nn.functional
STAGED = "s0[r][c]"  # model.c's marker of a staged pointwise kernel
LIMIT = ">= INT64_C(1073741824)"  # kiln_run's test of a plane's offsets against int32's room (2**30)


def _model_c(tmp_path) -> str:
    return (tmp_path / "model" / "model.c").read_text()


class _TransposedActivations(kiln.nn.Module):
    """wav2vec2's feature encoder: channels-last values back to channels-first, then an activation; and a gather
    (index_select along the row) feeding a sigmoid, and a strided slice feeding tanh."""

    def forward(self, x, index):
        channels_first = x.transpose(1, 2)
        return (F.gelu(channels_first), kiln.exp(channels_first) * 0.5 + channels_first,
                kiln.sigmoid(x.index_select(2, index)), kiln.tanh(x[:, :, ::2]))


@pytest.mark.parametrize("capability", ["DEFAULT", "AVX2", "AVX512"])
def test_activations_through_a_transpose(capability, monkeypatch, tmp_path):
    """Rows shorter than a vector, rows ending in a partial vector and rows of several 64-element chunks."""
    use_capability(capability, monkeypatch)
    length = kiln.Dim("length", max=300)
    args = (kiln.randn(2, 31, 12), kiln.tensor(np.array([3, 0, 11, 5], dtype=np.int64)))
    program = kiln.export(_TransposedActivations(), args, dynamic_shapes=({1: length}, None))
    compiled = compile_c(program, output=tmp_path / "model")
    assert STAGED in _model_c(tmp_path)
    index = np.array([3, 0, 11, 5], dtype=np.int64)
    for n in (1, 7, 31, 64, 65, 200):
        x = np.random.default_rng(n).standard_normal((2, n, 12)).astype(np.float32) * 3
        x[0, 0, :2] = [np.nan, np.inf]
        _check(compiled(x, index), program(x, index))


def test_a_staged_gather_still_checks_its_indices(tmp_path):
    """An out-of-range index copied into the stage fails the run, naming the op, as unstaged gathers do."""
    args = (kiln.randn(2, 5, 12), kiln.tensor(np.array([3, 0], dtype=np.int64)))
    program = kiln.export(_TransposedActivations(), args)
    compiled = compile_c(program, output=tmp_path / "model")
    assert STAGED in _model_c(tmp_path)
    x = np.random.default_rng(0).standard_normal((2, 5, 12)).astype(np.float32)
    _check(compiled(x, np.array([11, 0])), program(x, np.array([11, 0])))
    for wrong in ([0, 12], [-1, 0]):
        with pytest.raises(kiln.KilnError, match="index_select"):
            compiled(x, np.array(wrong))


class _Encoder(kiln.nn.Module):
    """wav2vec2's convolutional feature encoder in small: strided convolutions over a waveform of any length."""

    def __init__(self):
        super().__init__()
        self.first = kiln.nn.Conv1d(1, 16, 10, stride=5)
        self.second = kiln.nn.Conv1d(16, 16, 3, stride=2)
        self.positional = kiln.nn.Conv1d(16, 16, 5, padding=2, groups=4)

    def forward(self, waveform):
        hidden = F.gelu(self.first(waveform.unsqueeze(1)))
        hidden = F.gelu(self.second(hidden))
        return hidden + F.gelu(self.positional(hidden))


@pytest.mark.parametrize("capability", ["DEFAULT", "AVX2", "AVX512"])
@pytest.mark.parametrize("bounded", [True, False], ids=["bounded", "unbounded"])
def test_convolutions_over_a_dynamic_length(capability, bounded, monkeypatch, tmp_path):
    """The planes' offsets are int32 with row copies; kiln_run checks the limit only where the range leaves it open."""
    use_capability(capability, monkeypatch)
    samples = kiln.Dim("samples", min=20, max=4000 if bounded else None)
    program = kiln.export(_Encoder().eval(), (kiln.randn(2, 400),), dynamic_shapes=({1: samples},))
    compiled = compile_c(program, output=tmp_path / "model")
    source = _model_c(tmp_path)
    assert "int64_t source[" not in source and "kiln_masked_row(plane" in source
    assert (LIMIT in source) is not bounded
    for n in (20, 37, 400, 1999):
        x = np.random.default_rng(n).standard_normal((2, n)).astype(np.float32)
        _check(compiled(x), program(x))


class _ChannelRows(kiln.nn.Module):
    """Rows across a channels-first layout: a layer norm over the channels (wav2vec2's feature encoder), a softmax,
    a log-softmax and a sum over dim 1."""

    def __init__(self):
        super().__init__()
        self.norm = kiln.nn.LayerNorm(12)

    def forward(self, x):
        return (self.norm(x.transpose(1, 2)).transpose(1, 2), kiln.softmax(x, dim=1),
                kiln.log_softmax(x * 2, dim=1), x.sum(1))


@pytest.mark.parametrize("capability", ["DEFAULT", "AVX2", "AVX512"])
def test_rows_across_the_layout(capability, monkeypatch, tmp_path):
    """Tiles of 16 rows copied together (render._transposed_rows), with a last partial tile; a batch of one shares
    its rows across the team too (all the rows kernels' loops are collapsed)."""
    use_capability(capability, monkeypatch)
    length = kiln.Dim("length", max=300)
    program = kiln.export(_ChannelRows().eval(), (kiln.randn(1, 12, 40),), dynamic_shapes=({2: length},))
    compiled = compile_c(program, output=tmp_path / "model", num_threads=2)
    source = _model_c(tmp_path)
    assert source.count("stage[tile_row * L + k] =") >= 3 and "collapse(1)" not in source
    for n in (1, 15, 16, 17, 100, 300):
        x = np.random.default_rng(n).standard_normal((1, 12, n)).astype(np.float32)
        x[0, 3, 0] = np.nan
        _check(compiled(x), program(x))


class _TiedAndNormalized(kiln.nn.Module):
    """A weight read as it is (an embedding) and transposed (a tied output layer), and a weight-normalized matrix."""

    def __init__(self):
        super().__init__()
        self.table = kiln.nn.Parameter(kiln.randn(1000, 64))
        self.direction = kiln.nn.Parameter(kiln.randn(64, 64))
        self.gain = kiln.nn.Parameter(kiln.randn(64, 1))

    def forward(self, tokens):
        weight = self.gain * self.direction / (self.direction * self.direction).sum(1, keepdim=True).sqrt()
        return F.embedding(tokens, self.table) @ weight @ self.table.t()


def test_compile_computes_weight_only_values_once(tmp_path):
    """The weight norm is computed by the compiler, not by every run: no kernel computes it, and neither its
    parameters nor a transposed table are stored."""
    program = kiln.export(_TiedAndNormalized(), (kiln.tensor(np.array([[1, 7, 3]])),),
                          dynamic_shapes=({1: kiln.Dim("seq", max=64)},))
    compiled = compile_c(program, output=tmp_path / "model")
    assert not any("sum" in name or "sqrt" in name or "div" in name for name, _ in compiled.profile(
        np.array([[5, 6]]), runs=1))
    # stored as they are: the table (the embedding reads it) and nothing else (unfolded, the direction and the gain
    # would be too); the GEMMs read the folded weight and the transposed table from panels the compiler packed
    assert [e["shape"] for e in compiled.manifest["weights"] if "packed_from" not in e] == [[1000, 64]]
    for tokens in ([[0]], [[999, 4, 17, 3]]):
        tokens = np.array(tokens)
        _check(compiled(tokens), program(tokens))


class _TwoStrides(kiln.nn.Module):
    """Two convolutions whose outputs' lengths are floor(s/5) and floor(s/10) - ...: after hoisting the divisions,
    the activations' kernel bodies read alike, and only their divisions tell them apart."""

    def __init__(self):
        super().__init__()
        self.five = kiln.nn.Conv1d(1, 4, 5, stride=5)
        self.ten = kiln.nn.Conv1d(1, 4, 10, stride=10)

    def forward(self, waveform):
        x = waveform.unsqueeze(1)
        return kiln.exp(self.five(x).transpose(1, 2)), kiln.exp(self.ten(x).transpose(1, 2))


def test_bodies_differing_in_a_division_stay_apart(tmp_path):
    program = kiln.export(_TwoStrides().eval(), (kiln.randn(1, 100),),
                          dynamic_shapes=({1: kiln.Dim("samples", min=20, max=1000)},))
    compiled = compile_c(program, output=tmp_path / "model")
    source = _model_c(tmp_path)
    assert "symdiv0 = kiln_floordiv(sym_" in source
    for n in (20, 57, 1000):
        x = np.random.default_rng(n).standard_normal((1, n)).astype(np.float32)
        _check(compiled(x), program(x))
