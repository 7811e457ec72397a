"""Every pass, and the default pipeline, preserves what every zoo model computes (interpreter before == after).

Parametrized over kiln.models.MODELS x the pass registry, so a new model or pass is covered automatically.
"""

from __future__ import annotations

import pytest

import kiln.passes
from kiln.models import MODELS
from kiln.passes.base import check_signature

from tests.passes.support import assert_same_outputs, outputs, zoo

# joint-backward adds the backward of a scalar loss rather than preserving outputs: tests/passes/test_autodiff.py runs
# it over the zoo. prune changes weights by design: tests/sparse/test_pruning.py checks what it computes.
PIPELINES = sorted(set(kiln.passes.PASSES) - {"joint-backward", "prune"}) + [
    "fold-constants{freeze=true}",
    "decompose,prepack,fuse-activations",
    kiln.passes.DEFAULT_PIPELINE,
]


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("model", sorted(MODELS))
def test_pass_preserves_model_outputs(model, pipeline):
    entry, program, input_sets = zoo(model)
    before = program.to_mlir()
    references = [outputs(program, args) for args in input_sets]
    optimized = kiln.passes.run(program, pipeline, verify_each=True)
    check_signature(optimized)
    assert optimized.graph_signature.user_inputs == program.graph_signature.user_inputs
    for args, reference in zip(input_sets, references):
        assert_same_outputs(optimized, reference, args)
    assert program.to_mlir() == before  # the input program is never edited


@pytest.mark.parametrize("model", sorted(MODELS))
def test_default_pipeline_leaves_core_aten_and_fewer_weights_unused(model):
    _, program, _ = zoo(model)
    optimized = kiln.passes.run(program)
    assert all(op.opdef.is_core for op in optimized.nodes() if hasattr(op, "opdef"))
    used = {spec.target for spec in optimized.graph_signature.input_specs if spec.target}
    assert set(optimized.state_dict) <= used and set(optimized.constants) <= used
    for arg in optimized.body.args:  # every weight that stayed is read by some op
        spec = optimized.graph_signature.input_specs[arg.index]
        assert spec.kind is kiln.InputKind.USER_INPUT or arg.uses
