"""The Triton backend's sparse kernels (kiln/codegen/triton/sparse.py) against the reference interpreter, on the C
backend's sparse test programs (tests/sparse/test_c_sparse.py) and the zoo's pruned MLP and CNN: linear layers on
CSR, BSR (square, odd and non-square blocks) and 2:4 weights with fused epilogues, 3-D inputs and a symbolic batch,
and sparse convolutions (folded batch norm and ReLU, strided, 1x1 with a residual, dilated 1-D)."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")  # tests/conftest.py sets it before triton's first import
pytest.importorskip("torch")
pytest.importorskip("triton")

import kiln  # noqa: E402
from kiln.compiler import compile as compile_program  # noqa: E402
from kiln.testing import assert_close  # noqa: E402
from tests.sparse.test_c_sparse import (  # noqa: E402
    CONV_PIPELINES, FFN, PIPELINES, _sparse_conv_program, _sparse_program,
)
from tests.sparse.test_cli import CASES, _zoo_mlp  # noqa: E402

LINEAR_PIPELINES = {  # the C tests' layouts, and more block shapes: small, tensor-core sized, non-square
    **PIPELINES,
    "bsr-4x4": "prune{pattern=block block=4,4 sparsity=0.7},sparsify{block=4,4}",
    "bsr-16x16": "prune{pattern=block block=16,16 sparsity=0.6},sparsify{block=16,16}",
    "bsr-16x8": "prune{pattern=block block=16,8 sparsity=0.6},sparsify{block=16,8}",
    "bsr-1x8": "prune{pattern=block block=1,8 sparsity=0.6},sparsify{block=1,8}",
}


def _compile(program, path):
    return compile_program(program, target="triton", output=path)


def _kernels(path, kind: str) -> list[str]:
    """model.py's `# kind: ops` comment lines of the kernels of `kind`."""
    return [line for line in (path / "model.py").read_text().splitlines() if line.startswith(f"# {kind}:")]


@pytest.mark.parametrize("layout", sorted(LINEAR_PIPELINES))
@pytest.mark.parametrize("rows", [1, 5, 70])  # one row, a partial tile, several tiles of activation rows
def test_sparse_linear_matches_the_interpreter(layout, rows, tmp_path):
    program = _sparse_program(LINEAR_PIPELINES[layout], rows)
    assert "f32, " + ("semi_structured" if layout == "2:4" else f"sparse_{layout[:3]}") in program.to_mlir()
    compiled = _compile(program, tmp_path / "pkg")
    kernels = _kernels(tmp_path / "pkg", "sparse_linear")
    # bias and GELU fuse into the first kernel, the residual add into the second: nothing else runs
    assert len(kernels) == 2 and "aten.gelu.default" in kernels[0] and "aten.add.Tensor" in kernels[1], kernels
    assert not _kernels(tmp_path / "pkg", "matmul") and not _kernels(tmp_path / "pkg", "pointwise")
    x = np.random.default_rng(rows).standard_normal((rows, 48)).astype(np.float32)
    assert_close(compiled(x), program(x))


@pytest.mark.parametrize("layout", ["csr", "bsr", "2:4"])
def test_symbolic_batch_and_3d_inputs(layout, tmp_path):
    program = _sparse_program(LINEAR_PIPELINES[layout], 4, dynamic=True)
    compiled = _compile(program, tmp_path / "pkg")
    for rows in (1, 37):
        x = np.random.default_rng(rows).standard_normal((rows, 48)).astype(np.float32)
        assert_close(compiled(x), program(x))
    kiln.manual_seed(0)
    sequence = kiln.passes.run(kiln.export(FFN().eval(), (kiln.randn(3, 7, 48),)), LINEAR_PIPELINES[layout])
    compiled = _compile(sequence, tmp_path / "pkg3d")
    x = np.random.default_rng(0).standard_normal((3, 7, 48)).astype(np.float32)
    assert_close(compiled(x), sequence(x))


def test_float64_csr_weight(tmp_path):
    """A user's float64 CSR weight: the kernel accumulates in float64."""
    rng = np.random.default_rng(0)
    dense = rng.standard_normal((24, 16)) * (rng.random((24, 16)) < 0.3)

    class Net(kiln.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("weight", kiln.tensor(dense).to_sparse_csr())

        def forward(self, x):
            return kiln.relu(kiln.nn.functional.linear(x, self.weight))

    x = rng.standard_normal((5, 16))
    program = kiln.export(Net(), (kiln.tensor(x),))
    compiled = _compile(program, tmp_path / "pkg")
    assert len(_kernels(tmp_path / "pkg", "sparse_linear")) == 1
    assert_close(compiled(x), program(x))


@pytest.mark.parametrize("blocks", sorted(CONV_PIPELINES))
@pytest.mark.parametrize("batch,size", [(1, 9), (2, 20)])
def test_sparse_conv_matches_the_interpreter(blocks, batch, size, tmp_path):
    program = _sparse_conv_program(CONV_PIPELINES[blocks], batch, size)
    assert len(kiln.passes.sparsity.sparse_weights(program)) == 4, program.to_mlir()
    compiled = _compile(program, tmp_path / "pkg")
    kernels = _kernels(tmp_path / "pkg", "sparse_conv")
    assert len(kernels) == 4, kernels
    # batch norm folds into the sparse weight (its zeros kept); ReLU and the residual add fuse into the epilogue
    assert "aten.relu.default" in kernels[0] and "aten.add.Tensor" in kernels[2], kernels
    x = np.random.default_rng(size).standard_normal((batch, 8, size, size)).astype(np.float32)
    assert_close(compiled(x), program(x))


def test_sparse_conv_with_a_symbolic_batch(tmp_path):
    program = _sparse_conv_program(CONV_PIPELINES["bsr-8x4"], 2, 12, dynamic=True)
    compiled = _compile(program, tmp_path / "pkg")
    for batch in (1, 5):
        x = np.random.default_rng(batch).standard_normal((batch, 8, 12, 12)).astype(np.float32)
        assert_close(compiled(x), program(x))


def test_user_convolution_on_a_hybrid_csr_weight(tmp_path):
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
    compiled = _compile(program, tmp_path / "pkg")
    assert len(_kernels(tmp_path / "pkg", "sparse_conv")) == 1
    expected = kiln.nn.functional.conv2d(kiln.tensor(x), kiln.tensor(dense), stride=2, padding=1).numpy()
    assert_close(compiled(x), expected)


@pytest.mark.parametrize("case", sorted(CASES))
def test_pruned_zoo_mlp(case, tmp_path):
    """`kiln sparsify`'s passes on the zoo's MLP, compiled for Triton: every sparse weight runs as a sparse kernel."""
    _, pipeline, layouts, _ = CASES[case]
    program = kiln.passes.run(_zoo_mlp(), pipeline)
    compiled = _compile(program, tmp_path / "pkg")
    assert len(_kernels(tmp_path / "pkg", "sparse_linear")) == sum(layout != "dense" for layout in layouts.values())
    for rows in (1, 5):
        x = np.random.default_rng(rows).standard_normal((rows, 32)).astype(np.float32)
        assert_close(compiled(x), program(x))


def test_pruned_zoo_cnn(tmp_path):
    """The zoo's ResNet block-pruned as `kiln sparsify --pattern block --block 8,8` does: five sparse_conv kernels."""
    entry = kiln.models.get("cnn")
    program = kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes)
    program = kiln.passes.run(program, "prune{pattern=block block=8,8 sparsity=0.75},sparsify{block=8,8}")
    compiled = _compile(program, tmp_path / "pkg")
    assert len(_kernels(tmp_path / "pkg", "sparse_conv")) == 5
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 16, 16)).astype(np.float32)
        assert_close(compiled(x), program(x))


def test_unsupported_sparse_ops_are_named():
    value = kiln.randn(6, 8).to_sparse_csr()

    class Densify(kiln.nn.Module):
        def forward(self, x):
            return x.to_dense() * 2

    program = kiln.export(Densify(), (value,))
    with pytest.raises(kiln.KilnError, match=r"no Triton kernel for sparse_csr operands \(the Triton backend"):
        compile_program(program, target="triton")
