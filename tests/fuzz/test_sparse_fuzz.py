"""Differential fuzzing of sparse programs (tests/fuzz/sparse.py): random networks, pruned and sparsified by a
random pipeline (CSR, BSR, 2:4, global, the cost model's choice), agree with the interpreter on every backend.
`python -m tests.fuzz.sparse --programs N` runs a longer budget."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, seed, settings

from tests.fuzz.sparse import build, check, sparse_batches, sparse_layers

SUPPRESSED = list(HealthCheck)


def _assert_agree(batch) -> None:
    mismatches, _ = check(batch)
    assert not mismatches, "\n".join(str(m) for m in mismatches[:5])


@seed(20261205)
@settings(max_examples=3, database=None, deadline=None, suppress_health_check=SUPPRESSED)
@given(sparse_batches(max_nets=6))
def test_sparse_networks_agree_across_backends(batch):
    _assert_agree(batch)


@pytest.mark.slow
@seed(11)
@settings(max_examples=12, database=None, deadline=None, suppress_health_check=SUPPRESSED)
@given(sparse_batches(max_nets=8))
def test_sparse_networks_agree_across_backends_long(batch):
    _assert_agree(batch)


@pytest.mark.parametrize("kind, layout", [("csr", "sparse_csr"), ("bsr", "sparse_bsr"), ("2:4", "semi_structured")])
def test_the_generator_reaches_every_sparse_layout(kind, layout):
    """Each kind of pipeline stores weights in its layout (linear and convolution weights for BSR) in most draws:
    the fuzzer would otherwise test dense kernels only."""
    found = []

    @seed(4)
    @settings(max_examples=10, database=None, deadline=None, suppress_health_check=SUPPRESSED)
    @given(sparse_batches(max_nets=4, kinds=[kind]))
    def collect(batch):
        program, _ = build(batch)
        found.append(sparse_layers(program) > 0 and layout in program.to_mlir())
    collect()
    assert sum(found) >= len(found) // 2, found
