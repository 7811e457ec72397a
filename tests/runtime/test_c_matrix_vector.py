"""GEMMs with one output column in C (render._gemv_f32: dot products of A's rows with the column, kiln_gemv4) against
torch: linear layers to one output, bmm of one vector per batch entry, and the batched mixture-of-experts layer of
Hugging Face, whose gathered expert weights the bmm reads where they are (schedule._batch_gather) at every
capability. A panel micro-kernel would compute one of its KILN_NR columns."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

import kiln
from kiln.codegen.c import supported_capabilities
from kiln.compiler import compile as compile_c
from kiln.ir.errors import KilnError
from tests.runtime.support import use_capability

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
GEMV = "kiln_gemv4(rows, K, "  # model.c's marker of a matrix-vector kernel (not of the pasted library)


def _compile(module, args, tmp_path, dynamic_shapes=None):
    program = kiln.from_torch(module.eval(), args, dynamic_shapes=dynamic_shapes)
    compiled = compile_c(program, output=tmp_path / "model")
    return compiled, (tmp_path / "model" / "model.c").read_text()


def _close(got, module, *args):
    with torch.no_grad():
        expected = module(*(torch.from_numpy(a) for a in args))
    torch.testing.assert_close(torch.from_numpy(np.asarray(got)), expected)


class _Head(torch.nn.Module):
    """A linear layer to one output, its bias and ReLU fused into the kernel's epilogue."""

    def __init__(self, k: int):
        super().__init__()
        self.linear = torch.nn.Linear(k, 1)

    def forward(self, x):
        return torch.relu(self.linear(x) - 0.1)


@pytest.mark.parametrize("capability", ["DEFAULT", "AVX2", "AVX512"])
@pytest.mark.parametrize("k", [1, 7, 16, 33, 300])
def test_linear_to_one_output(capability, k, monkeypatch, tmp_path):
    use_capability(capability, monkeypatch)
    torch.manual_seed(k)
    module = _Head(k)
    compiled, source = _compile(module, (torch.randn(5, k),), tmp_path,
                                dynamic_shapes=({0: torch.export.Dim("rows", max=64)},))
    assert GEMV in source
    for rows in (1, 3, 4, 5, 37):  # whole blocks of 4 rows, and the rows left over
        x = np.random.default_rng(rows).standard_normal((rows, k)).astype(np.float32)
        _close(compiled(x), module, x)


class _Bmm(torch.nn.Module):
    def forward(self, a, x):
        return torch.bmm(a, x[..., :1])  # a column of a wider tensor: its K stride is 2


def test_bmm_of_one_column_per_batch_entry(tmp_path):
    module = _Bmm()
    args = (torch.randn(3, 6, 20), torch.randn(3, 20, 2))
    compiled, source = _compile(module, args, tmp_path, dynamic_shapes=({0: torch.export.Dim("batch", max=16)},
                                                                         {0: torch.export.Dim("batch", max=16)}))
    assert GEMV in source
    for batch in (1, 3, 9):
        rng = np.random.default_rng(batch)
        a, x = (rng.standard_normal(shape).astype(np.float32) for shape in ((batch, 6, 20), (batch, 20, 2)))
        _close(compiled(a, x), module, a, x)


class _TransposedRows(torch.nn.Module):
    def forward(self, a, x):
        return a.transpose(-1, -2) @ x  # A's rows are strided along K: the panel GEMM takes it


def test_a_with_strided_rows_keeps_the_panel_gemm(tmp_path):
    module = _TransposedRows()
    a, x = np.random.default_rng(0).standard_normal((2, 20, 6)).astype(np.float32), \
        np.random.default_rng(1).standard_normal((2, 20, 1)).astype(np.float32)
    compiled, source = _compile(module, (torch.from_numpy(a), torch.from_numpy(x)), tmp_path)
    assert GEMV not in source
    _close(compiled(a, x), module, a, x)


class _Experts(torch.nn.Module):
    """Hugging Face's batched mixture of experts (experts_implementation="batched_mm"): each (token, chosen expert)
    pair multiplies its token by that expert's gathered weight matrices, one bmm of one column each."""

    def __init__(self, experts: int = 4, hidden: int = 24, inner: int = 40, keep_gathered: bool = False):
        super().__init__()
        self.gate_up = torch.nn.Parameter(torch.randn(experts, 2 * inner, hidden) / hidden ** 0.5)
        self.down = torch.nn.Parameter(torch.randn(experts, hidden, inner) / inner ** 0.5)
        self.keep_gathered = keep_gathered

    def forward(self, tokens, chosen):
        selected = self.gate_up[chosen]
        gate, up = torch.bmm(selected, tokens.unsqueeze(-1)).squeeze(-1).chunk(2, dim=-1)
        out = torch.bmm(self.down[chosen], (torch.nn.functional.silu(gate) * up).unsqueeze(-1)).squeeze(-1)
        return (out, selected.sum()) if self.keep_gathered else out


@pytest.mark.parametrize("capability", supported_capabilities())
def test_mixture_of_experts_reads_the_expert_weights_where_they_are(capability, monkeypatch, tmp_path):
    use_capability(capability, monkeypatch)
    torch.manual_seed(0)
    module = _Experts()
    pairs = torch.export.Dim("pairs", max=512)
    compiled, source = _compile(module, (torch.randn(6, 24), torch.tensor([0, 3, 1, 1, 2, 0])), tmp_path,
                                dynamic_shapes=({0: pairs}, {0: pairs}))
    assert "pointwise_index" not in source  # no gathered copy of the weights
    # the pairs grouped by expert, each group a linear layer on its expert's panels
    assert source.count("kiln_group_entries(BATCH") == 2 and source.count("(g * panels + j) * K * KILN_NR") == 2
    # groups of one pair (decoding), of several, of more than one row chunk (8 register tiles: 96 pairs on
    # AVX-512, 48 on AVX2); all 40 pairs on one expert: the other groups are empty
    for count, experts in ((1, 4), (6, 4), (23, 4), (250, 4), (40, 1)):
        rng = np.random.default_rng(count)
        tokens = rng.standard_normal((count, 24)).astype(np.float32)
        # negative ids count from the end, as in ATen
        chosen = rng.integers(-4, 4, count).astype(np.int64) if experts > 1 else np.full(count, -2, np.int64)
        _close(compiled(tokens, chosen), module, tokens, chosen)
    with pytest.raises(KilnError, match="aten.index.Tensor: index 4 is out of bounds for dimension 0 with size 4"):
        compiled(tokens, np.full(count, 4, np.int64))
    _close(compiled(tokens, chosen), module, tokens, chosen)  # the failed run leaves no state behind


class _ExpertsGiven(torch.nn.Module):
    """The experts' weights as an input: not packed by the compiler, so each pair takes dot products with its
    expert's matrix where it lies."""

    def forward(self, weights, tokens, chosen):
        return torch.bmm(weights[chosen], tokens.unsqueeze(-1)).squeeze(-1)


def test_gathered_matrices_of_an_input_take_dot_products(tmp_path):
    module = _ExpertsGiven()
    pairs = torch.export.Dim("pairs", max=64)
    compiled, source = _compile(module, (torch.randn(3, 10, 24), torch.randn(5, 24), torch.tensor([0, 2, 1, 1, 0])),
                                tmp_path, dynamic_shapes=(None, {0: pairs}, {0: pairs}))
    assert "pointwise_index" not in source and GEMV in source and "kiln_group_entries(BATCH" not in source
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((3, 10, 24)).astype(np.float32)
    for count in (1, 7, 40):
        tokens = rng.standard_normal((count, 24)).astype(np.float32)
        chosen = rng.integers(-3, 3, count).astype(np.int64)
        _close(compiled(weights, tokens, chosen), module, weights, tokens, chosen)


def test_gathered_experts_read_elsewhere_are_made(tmp_path):
    """A gather that something else reads too is written out, and the bmm reads that copy."""
    torch.manual_seed(1)
    module = _Experts(keep_gathered=True)
    tokens = np.random.default_rng(0).standard_normal((5, 24)).astype(np.float32)
    chosen = np.array([2, 0, 3, 3, 1], np.int64)
    compiled, source = _compile(module, (torch.from_numpy(tokens), torch.from_numpy(chosen)), tmp_path)
    assert "pointwise_index" in source
    got = compiled(tokens, chosen)
    with torch.no_grad():
        expected = module(torch.from_numpy(tokens), torch.from_numpy(chosen))
    for g, e in zip(got, expected):
        torch.testing.assert_close(torch.from_numpy(np.asarray(g)), e)
