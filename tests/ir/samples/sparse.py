"""Samples for kiln/ir/ops/sparse.py: conversions and torch.sparse's ops, on every layout torch computes them for."""

from __future__ import annotations

import numpy as np

from kiln.ir import dtypes
from kiln.ir import sparse as layouts
from tests.ir.samples import Sample, rand, samples


def sparse_rand(rng: np.random.Generator, *shape: int, density: float = 0.4, block: tuple[int, int] = (1, 1),
                dtype: str = "float32") -> np.ndarray:
    """A dense array whose (block-)elements are zero with probability 1 - density."""
    values = rand(rng, *shape, dtype=dtype)
    rows, cols = shape[0] // block[0], shape[1] // block[1]
    keep = rng.random((rows, cols)) < density
    mask = np.repeat(np.repeat(keep, block[0], axis=0), block[1], axis=1)
    return values * mask.reshape(mask.shape + (1,) * (len(shape) - 2)).astype(values.dtype)


def each_layout(rng: np.random.Generator, dense: np.ndarray, kinds=layouts.SPARSE_KINDS[:-1]):
    """`dense` in each torch layout (blocked ones with 2x2 blocks where the shape allows)."""
    for kind in kinds:
        if kind in ("sparse_bsr", "sparse_bsc"):
            if dense.ndim != 2 or dense.shape[0] % 2 or dense.shape[1] % 2:
                continue
            yield kind, layouts.from_dense(dense, kind, blocksize=(2, 2))
        else:
            yield kind, layouts.from_dense(dense, kind)


@samples("aten._to_sparse_csr.default", "aten._to_sparse_csc.default")
def _to_compressed(rng):
    yield Sample((sparse_rand(rng, 5, 7),), note="2-D")
    yield Sample((sparse_rand(rng, 4, 6, 3), 1), note="hybrid: one dense dim")
    yield Sample((np.zeros((3, 4), np.float32),), note="all zero")
    yield Sample((layouts.from_dense(sparse_rand(rng, 4, 6), "sparse_coo"),), note="from COO")


@samples("aten._to_sparse_bsr.default", "aten._to_sparse_bsc.default")
def _to_blocked(rng):
    yield Sample((sparse_rand(rng, 8, 12, block=(2, 3)), [2, 3]), note="2x3 blocks")
    yield Sample((sparse_rand(rng, 8, 8, block=(4, 4)), [4, 4]), note="4x4 blocks")
    yield Sample((layouts.from_dense(sparse_rand(rng, 4, 6), "sparse_csr"), [2, 2]), note="from CSR")


@samples("aten._to_sparse.default")
def _to_sparse(rng):
    dense = sparse_rand(rng, 6, 8, block=(2, 2))
    yield Sample((dense,), note="COO by default")
    yield Sample((dense,), {"layout": "sparse_csr"})
    yield Sample((dense,), {"layout": "sparse_csc"})
    yield Sample((dense,), {"layout": "sparse_bsr", "blocksize": [2, 2]})
    yield Sample((dense,), {"layout": "sparse_bsc", "blocksize": [2, 4]})


@samples("aten._to_sparse.sparse_dim")
def _to_sparse_dim(rng):
    yield Sample((sparse_rand(rng, 4, 5), 2))
    yield Sample((sparse_rand(rng, 4, 5, 3), 2), note="hybrid")
    yield Sample((sparse_rand(rng, 4, 5, 3), 1), note="one sparse dim")


@samples("aten._to_dense.default")
def _to_dense(rng):
    dense = sparse_rand(rng, 6, 8)
    for kind, value in each_layout(rng, dense):
        yield Sample((value,), note=kind)
    yield Sample((layouts.coo(np.array([[0, 1, 0], [2, 0, 2]]), np.array([1.0, 2.0, 3.0], np.float32), (2, 3)),),
                 note="uncoalesced COO sums duplicates")


@samples("aten._sparse_mm.default")
def _sparse_mm(rng):
    dense = sparse_rand(rng, 6, 4)
    for kind, value in each_layout(rng, dense, ("sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr")):
        yield Sample((value, rand(rng, 4, 5)), note=kind)


@samples("aten.sparse_sampled_addmm.default")
def _sampled_addmm(rng):
    pattern = layouts.from_dense(sparse_rand(rng, 4, 5), "sparse_csr")
    yield Sample((pattern, rand(rng, 4, 3), rand(rng, 3, 5)))
    yield Sample((pattern, rand(rng, 4, 3), rand(rng, 3, 5)), {"beta": 0.5, "alpha": 2.0})


@samples("aten._sparse_sum.default")
def _sparse_sum(rng):
    yield Sample((layouts.from_dense(sparse_rand(rng, 4, 6), "sparse_coo"),))


@samples("aten._sparse_sum.dim")
def _sparse_sum_dim(rng):
    value = layouts.from_dense(sparse_rand(rng, 4, 6), "sparse_coo")
    yield Sample((value, [1]), note="one of two sparse dims: COO result")
    yield Sample((value, [0, 1]), note="every sparse dim: dense result")
    yield Sample((layouts.from_dense(sparse_rand(rng, 4, 6, 3), "sparse_coo", sparse_dim=2), [0]), note="hybrid")


@samples("aten._sparse_softmax.int", "aten._sparse_log_softmax.int")
def _sparse_softmax(rng):
    dense = sparse_rand(rng, 5, 6)
    dense[2] = 0  # a row that stores nothing
    value = layouts.from_dense(dense, "sparse_coo")
    yield Sample((value, 1))
    yield Sample((value, 0))
    yield Sample((value, -1, dtypes.float64), note="with a dtype")
