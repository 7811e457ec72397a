"""Differential fuzzing of quantized programs (tests/fuzz/quantized.py): chains of quantized layers with power-of-two
scales, where every backend's integer math and requantization is exact, agree exactly with the interpreter on the
reference Q/DQ program. `python -m tests.fuzz.quantized --programs N` runs a longer budget."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from kiln.passes import run
from tests.fuzz.quantized import Conv, Linear, build, chains, check

SUPPRESSED = list(HealthCheck)


def _assert_agree(batch) -> None:
    mismatches, _ = check(batch)
    assert not mismatches, "\n".join(str(m) for m in mismatches[:5])


@seed(20261205)
@settings(max_examples=2, database=None, deadline=None, suppress_health_check=SUPPRESSED)
@given(st.lists(chains(), min_size=12, max_size=12))
def test_quantized_chains_agree_exactly_across_backends(batch):
    _assert_agree(batch)


@pytest.mark.slow
@seed(5)
@settings(max_examples=12, database=None, deadline=None, suppress_health_check=SUPPRESSED)
@given(st.lists(chains(), min_size=16, max_size=16))
def test_quantized_chains_agree_exactly_across_backends_long(batch):
    _assert_agree(batch)


@seed(3)
@settings(max_examples=25, database=None, deadline=None, suppress_health_check=SUPPRESSED)
@given(st.lists(chains(), min_size=1, max_size=6))
def test_every_drawn_layer_becomes_an_integer_kernel(batch):
    """The generator draws what the integer lowering takes: each linear and conv2d becomes a fused integer op (a
    chain that fell back to float would test the float path instead)."""
    program, inputs = build(batch)
    lowered = run(program, "lower-quantized").op_histogram()
    layers = sum(isinstance(layer, (Linear, Conv)) for chain in batch for layer in chain.layers)
    fused = sum(count for name, count in lowered.items()
                if name.startswith(("quant.qlinear_pointwise", "quant.qconv2d_pointwise")))
    assert fused == layers
    assert not {"aten.linear.default", "aten.conv2d.default"} & set(lowered)
    assert len(inputs) == len(program.graph_signature.user_inputs)
