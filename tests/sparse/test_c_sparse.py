"""The C backend's sparse linear kernels (CSR, BSR, 2:4) against the reference interpreter, at every CPU capability
this machine runs, over every tile path (one row, partial tiles, whole KILN_SMB tiles), fused epilogues, 3-D inputs
and a symbolic batch."""

from __future__ import annotations

import json

import numpy as np
import pytest

import kiln
from kiln.codegen.c.build import CAPABILITIES
from kiln.testing import assert_close
from tests.runtime.support import use_capability

PIPELINES = {
    "csr": "prune{sparsity=0.9},sparsify",
    "bsr": "prune{pattern=block block=8,8 sparsity=0.75},sparsify{block=8,8}",
    "bsr-odd-blocks": "prune{pattern=block block=2,3 sparsity=0.6},sparsify{block=2,3}",
    "2:4": "prune{pattern=semi_structured},sparsify{layout=semi_structured}",
}


class FFN(kiln.nn.Module):
    """A transformer-style feed-forward block with a residual: linear, GELU, linear, + input."""

    def __init__(self, width: int = 48, hidden: int = 96):
        super().__init__()
        self.up, self.down = kiln.nn.Linear(width, hidden), kiln.nn.Linear(hidden, width)

    def forward(self, x):
        return self.down(kiln.nn.functional.gelu(self.up(x))) + x


def _sparse_program(pipeline: str, rows: int, dynamic: bool = False):
    kiln.manual_seed(0)
    model = FFN().eval()
    example = kiln.randn(rows, 48)
    shapes = ({"x": {0: kiln.Dim("batch", min=1, max=256)}},) if dynamic else None
    program = kiln.export(model, (example,), dynamic_shapes=shapes[0] if shapes else None)
    return kiln.passes.run(program, pipeline)


@pytest.mark.parametrize("capability", list(CAPABILITIES))
@pytest.mark.parametrize("layout", sorted(PIPELINES))
@pytest.mark.parametrize("rows", [1, 3, 5, 32, 36, 70])  # 3, and 36's last 4: 2:4 expands its weights
def test_sparse_linear_matches_the_interpreter(capability, layout, rows, monkeypatch, tmp_path):
    use_capability(capability, monkeypatch)
    program = _sparse_program(PIPELINES[layout], rows)
    assert "f32, " + ("semi_structured" if layout == "2:4" else f"sparse_{layout[:3]}") in program.to_mlir()
    compiled = kiln.compile(program, output=tmp_path / "pkg")
    assert compiled.manifest["cpu_capability"] == capability
    source = (tmp_path / "pkg" / "model.c").read_text()
    assert "sparse_linear" in source and "kiln_sparse.h" in source
    x = np.random.default_rng(rows).standard_normal((rows, 48)).astype(np.float32)
    assert_close(compiled(x), program(x))


def _24_program(features: int, columns: int):
    kiln.manual_seed(0)
    batch = kiln.Dim("batch", min=1, max=256)
    program = kiln.export(kiln.nn.Linear(columns, features).eval(), (kiln.randn(5, columns),),
                          dynamic_shapes={"input": {0: batch}})
    program = kiln.passes.run(program, PIPELINES["2:4"])
    assert "semi_structured" in program.to_mlir()
    return program


@pytest.mark.parametrize("capability", list(CAPABILITIES))
def test_24_pair_units_padded_at_every_row_count(capability, monkeypatch, tmp_path):
    """51 output features and 48 columns: the pair stream's one unit of 64 rows has 13 rows of zeros, and its second
    block of 8 groups 4 of zeros. Rows: one (dot products), 2 (expanded weights), then pair units over 8 rows (5),
    16 (12) and 24 (20), a chunk of 32 and one of 8 (40), and two whole chunks (64)."""
    use_capability(capability, monkeypatch)
    program = _24_program(51, 48)
    compiled = kiln.compile(program, output=tmp_path / "pkg")
    assert "kiln_24p_unit(" in (tmp_path / "pkg" / "model.c").read_text()
    for rows in (1, 2, 5, 12, 20, 40, 64):
        x = np.random.default_rng(rows).standard_normal((rows, 48)).astype(np.float32)
        assert_close(compiled(x), program(x))


@pytest.mark.parametrize("capability", list(CAPABILITIES))
def test_24_pair_planes_of_a_partial_column_strip(capability, monkeypatch, tmp_path):
    """40 columns are 10 groups: the planes are laid out four groups (16 columns) at a time, so the last strip holds
    8 columns of the rows and 8 of zeros."""
    use_capability(capability, monkeypatch)
    program = _24_program(70, 40)
    compiled = kiln.compile(program, output=tmp_path / "pkg")
    for rows in (7, 29, 45):
        x = np.random.default_rng(rows).standard_normal((rows, 40)).astype(np.float32)
        assert_close(compiled(x), program(x))


@pytest.mark.parametrize("capability", list(CAPABILITIES))
@pytest.mark.parametrize("features", [130, 1100])
def test_24_pairs_over_several_spans(capability, features, monkeypatch, tmp_path):
    """1280 columns are 40 blocks of groups, so each thread lays out the pair planes in two spans (KILN_24P_SPAN) and
    its units' sums wait between them; 36 rows are two chunks. 130 features are three units: teams of 1 to 4 threads
    split the six (chunk, unit) items evenly (3 and 4 threads: shares that cross from one chunk into the next, and
    shares of one and two items). 1100 features are 18 units: one or two threads keep the sums of 16
    (KILN_24P_KEPT), then lay out the planes again for the rest. The result is the same at any team size."""
    use_capability(capability, monkeypatch)
    program = _24_program(features, 1280)
    kiln.compile(program, output=tmp_path / "pkg")
    x = np.random.default_rng(0).standard_normal((36, 1280)).astype(np.float32)
    alone = kiln.runtime.load(tmp_path / "pkg", num_threads=1)
    expected = alone(x)
    assert_close(expected, program(x))
    for threads in (2, 3, 4):
        team = kiln.runtime.load(tmp_path / "pkg", num_threads=threads)
        np.testing.assert_array_equal(team(x), expected)
        assert team.last_run_threads == threads


@pytest.mark.parametrize("layout", sorted(PIPELINES))
def test_symbolic_batch_and_3d_inputs(layout, tmp_path):
    program = _sparse_program(PIPELINES[layout], 4, dynamic=True)
    compiled = kiln.compile(program, output=tmp_path / "pkg")
    for rows in (1, 33, 100):
        x = np.random.default_rng(rows).standard_normal((rows, 48)).astype(np.float32)
        assert_close(compiled(x), program(x))
    kiln.manual_seed(0)
    sequence = kiln.passes.run(kiln.export(FFN().eval(), (kiln.randn(3, 7, 48),)), PIPELINES[layout])
    compiled = kiln.compile(sequence, output=tmp_path / "pkg3d")
    x = np.random.default_rng(0).standard_normal((3, 7, 48)).astype(np.float32)
    assert_close(compiled(x), sequence(x))


def test_epilogue_fuses_into_the_sparse_kernel(tmp_path):
    """bias and GELU run in the sparse kernel's epilogue: no separate pointwise kernel reads the product."""
    program = _sparse_program(PIPELINES["csr"], 8)
    compiled = kiln.compile(program, output=tmp_path / "pkg")
    source = (tmp_path / "pkg" / "model.c").read_text()
    sparse_kernels = [line for line in source.splitlines() if line.startswith("/* sparse_linear")]
    assert len(sparse_kernels) == 2 and any("gelu" in line for line in sparse_kernels), sparse_kernels
    x = np.random.default_rng(0).standard_normal((8, 48)).astype(np.float32)
    assert_close(compiled(x), program(x))


@pytest.mark.parametrize("capability", list(CAPABILITIES))
def test_sparse_kernels_build_at_every_capability(capability, tmp_path, monkeypatch):
    """Every sparse path compiles for every capability, including those this CPU cannot run (a package is built for
    one capability: its weights are packed for that capability's register tiles)."""
    import importlib

    from kiln.codegen.driver import build_package
    for module in ("package", "render"):  # (kiln.codegen.c.render is also a function's name)
        monkeypatch.setattr(importlib.import_module(f"kiln.codegen.c.{module}"), "get_cpu_capability",
                            lambda: capability)
    programs = [_sparse_program(pipeline, 32) for pipeline in PIPELINES.values()]
    programs += [_sparse_conv_program(CONV_PIPELINES["bsr-8x4"], 1, size) for size in (9, 30)]
    for index, program in enumerate(programs):
        out = build_package(program, output=tmp_path / f"pkg{index}")
        assert json.loads((out / "manifest.json").read_text())["cpu_capability"] == capability
        assert (out / "model.so").stat().st_size > 0


def test_unsupported_sparse_ops_are_named():
    value = kiln.randn(6, 8).to_sparse_csr()

    class Densify(kiln.nn.Module):
        def forward(self, x):
            return x.to_dense() * 2

    program = kiln.export(Densify(), (value,))
    with pytest.raises(kiln.KilnError, match="no C kernel for sparse_csr operands"):
        kiln.compile(program)


class ConvBlock(kiln.nn.Module):
    """Sparse convolution's paths: a 3x3 conv with batch norm (folded) and ReLU (fused), a strided one, a 1x1 with a
    residual, a dilated 1-D one, and a dense grouped one between them."""

    def __init__(self, channels: int = 32):
        super().__init__()
        nn = kiln.nn
        self.first, self.norm = nn.Conv2d(8, channels, 3, padding=1), nn.BatchNorm2d(channels)
        self.strided = nn.Conv2d(channels, channels, 3, stride=2, padding=1, bias=False)
        self.pointwise = nn.Conv2d(channels, channels, 1)
        self.grouped = nn.Conv2d(channels, channels, 3, padding=1, groups=4)
        self.line = nn.Conv1d(channels, 16, 3, padding=2, dilation=2)

    def forward(self, x):
        y = kiln.relu(self.strided(kiln.relu(self.norm(self.first(x)))))
        y = self.grouped(self.pointwise(y) + y)
        return self.line(y.flatten(2))


CONV_PIPELINES = {
    "bsr-8x4": "prune{pattern=block block=8,4 sparsity=0.7},sparsify{block=8,4}",
    "bsr-16x8": "prune{pattern=block block=16,8 sparsity=0.6},sparsify{block=16,8}",
    "bsr-1x1": "prune{pattern=block block=1,1 sparsity=0.8},sparsify{block=1,1 layout=bsr}",
}


def _sparse_conv_program(pipeline: str, batch: int, size: int, dynamic: bool = False):
    kiln.manual_seed(0)
    model = ConvBlock().eval()
    shapes = {"x": {0: kiln.Dim("batch", min=1, max=64)}} if dynamic else None
    program = kiln.export(model, (kiln.randn(batch, 8, size, size),), dynamic_shapes=shapes)
    return kiln.passes.run(program, pipeline)


@pytest.mark.parametrize("capability", list(CAPABILITIES))
@pytest.mark.parametrize("blocks", sorted(CONV_PIPELINES))
@pytest.mark.parametrize("batch,size", [(1, 9), (3, 30)])  # 25 output pixels (whole im2col) and 225 (panels)
def test_sparse_conv_matches_the_interpreter(capability, blocks, batch, size, monkeypatch, tmp_path):
    use_capability(capability, monkeypatch)
    program = _sparse_conv_program(CONV_PIPELINES[blocks], batch, size)
    assert len(kiln.passes.sparsity.sparse_weights(program)) == 4, program.to_mlir()
    compiled = kiln.compile(program, output=tmp_path / "pkg")
    source = (tmp_path / "pkg" / "model.c").read_text()
    sparse_kernels = [line for line in source.splitlines() if line.startswith("/* sparse_conv")]
    assert len(sparse_kernels) == 4, sparse_kernels
    # batch norm folds into the sparse weight (its zeros kept); ReLU and the residual add fuse into the epilogue
    assert "aten.relu.default" in sparse_kernels[0] and "aten.add.Tensor" in sparse_kernels[2], sparse_kernels
    x = np.random.default_rng(size).standard_normal((batch, 8, size, size)).astype(np.float32)
    assert_close(compiled(x), program(x))


def test_sparse_conv_with_a_symbolic_batch(tmp_path):
    program = _sparse_conv_program(CONV_PIPELINES["bsr-8x4"], 2, 12, dynamic=True)
    compiled = kiln.compile(program, output=tmp_path / "pkg")
    for batch in (1, 5):
        x = np.random.default_rng(batch).standard_normal((batch, 8, 12, 12)).astype(np.float32)
        assert_close(compiled(x), program(x))


def test_user_convolution_on_a_hybrid_csr_weight(tmp_path):
    """conv2d on a weight the user stores sparse (CSR over channel pairs, taps dense) decomposes to convolution
    with the weight untouched and runs sparse in C."""
    rng = np.random.default_rng(0)
    dense = rng.standard_normal((16, 8, 3, 3)).astype(np.float32) * (rng.random((16, 8, 1, 1)) < 0.3)

    class Net(kiln.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("weight", kiln.tensor(dense).to_sparse_csr(dense_dim=2))

        def forward(self, x):
            return kiln.nn.functional.conv2d(x, self.weight, stride=2, padding=1)

    x = rng.standard_normal((2, 8, 11, 11)).astype(np.float32)
    program = kiln.export(Net(), (kiln.tensor(x),))
    assert "sparse_csr<dense_dim=2>" in program.to_mlir()
    expected = kiln.nn.functional.conv2d(kiln.tensor(x), kiln.tensor(dense), stride=2, padding=1).numpy()
    assert_close(program(x), expected)
    compiled = kiln.compile(program, output=tmp_path / "pkg")
    assert "sparse_conv" in (tmp_path / "pkg" / "model.c").read_text()
    assert_close(compiled(x), expected)
