"""Per-op ONNX tests, parametrized over the op registry: every op's one-op program (from tests/ir/samples) passes
the ONNX checker and strict shape inference, and onnxruntime computes what kiln's interpreter computes."""

from __future__ import annotations

import pytest

import kiln.ir.ops  # noqa: F401
from kiln.codegen import LOWERINGS
from kiln.codegen.onnx import DEFAULT_OPSET, LOWERING_TABLE, MAX_OPSET, MIN_OPSET, UNSUPPORTED, MissingLoweringError
from kiln.ir.registry import REGISTRY
from kiln.passes.complex import complex_boundary

from tests.codegen.support import assert_matches_interpreter, check_model, export_one_op
from tests.ir.test_ops import _samples, _trace_sample

ALL_OPS = sorted(REGISTRY)
SAMPLES_PER_OP = 3


def test_every_op_lowers_decomposes_or_is_listed_unsupported():
    orphans = [name for name in ALL_OPS if name not in LOWERING_TABLE and REGISTRY[name].decomposition is None
               and name not in UNSUPPORTED]
    assert not orphans, f"ops with no ONNX lowering, no decomposition and no UNSUPPORTED entry: {orphans}"
    assert LOWERINGS["onnx"] == set(LOWERING_TABLE)
    assert set(UNSUPPORTED) <= set(REGISTRY), "UNSUPPORTED lists ops that are not registered"


@pytest.mark.parametrize("name", ALL_OPS)
def test_op_exports_and_matches_interpreter(name):
    opdef = REGISTRY[name]
    for sample in _samples(name)[:SAMPLES_PER_OP]:
        program, inputs = _trace_sample(opdef, sample, decompose=False)
        if name in UNSUPPORTED:
            with pytest.raises(MissingLoweringError, match=name.replace(".", r"\.")):
                export_one_op(program)
            return
        if complex_boundary(program):
            _assert_complex_boundary_refused(program)
            continue
        onnx_program = export_one_op(program)
        check_model(onnx_program)
        check_values = sample.check_values and "random" not in opdef.tags
        assert_matches_interpreter(program, onnx_program, inputs, check_values)


# Edge-case samples onnxruntime does not reproduce yet, by (op, sample note), with the reason. A fixed gap fails
# the test below, so this list cannot go stale.
KNOWN_GAPS: dict[tuple[str, str], str] = {}


def _assert_complex_boundary_refused(program, opset: int = DEFAULT_OPSET) -> None:
    """onnxruntime has no complex tensors, and lower-complex runs complex values only between real program inputs
    and outputs: a program that takes or returns one is refused, naming the complex op left."""
    with pytest.raises(MissingLoweringError, match="complex values: onnxruntime has no complex tensors"):
        export_one_op(program, opset_version=opset)


def _run_sample(name, sample, opset: int = DEFAULT_OPSET) -> str | None:
    """None when the sample exports and matches, else the failure."""
    opdef = REGISTRY[name]
    program, inputs = _trace_sample(opdef, sample, decompose=False)
    if complex_boundary(program):
        _assert_complex_boundary_refused(program, opset)
        return None
    try:
        onnx_program = export_one_op(program, opset_version=opset)
        check_model(onnx_program)
        assert_matches_interpreter(program, onnx_program, inputs, sample.check_values and "random" not in opdef.tags)
    except Exception as error:  # noqa: BLE001  (collect every failure of the op)
        return f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    return None


@pytest.mark.parametrize("name", [n for n in ALL_OPS if n not in UNSUPPORTED])
def test_op_edge_case_samples(name):
    """The rest of the op's samples (NaN/inf, wrap-around, empty and 0-d tensors, every dtype)."""
    failures, fixed = [], []
    for sample in _samples(name)[SAMPLES_PER_OP:]:
        failure = _run_sample(name, sample)
        gap = KNOWN_GAPS.get((name, sample.note))
        if failure and not gap:
            failures.append(f"{sample}: {failure}")
        elif gap and not failure:
            fixed.append(sample.note)
    assert not failures, "\n".join(failures)
    assert not fixed, f"known gaps now pass, remove them from KNOWN_GAPS: {fixed}"


@pytest.mark.parametrize("opset", sorted({MIN_OPSET, MAX_OPSET} - {DEFAULT_OPSET}))
@pytest.mark.parametrize("name", [n for n in ALL_OPS if n not in UNSUPPORTED])
def test_op_matches_interpreter_at_other_opsets(name, opset):
    """Lowerings pick ONNX ops by opset (Gelu from 20; Attention, RMSNormalization from 23; onnxruntime's kernels
    per opset): every sample also matches at the oldest and newest opset the exporter targets."""
    if "random" in REGISTRY[name].tags and opset >= 22:
        # onnxruntime 1.32 has no kernels for opset 22's RandomUniform/RandomNormal(Like) and Bernoulli: the files
        # are checked, not run
        for sample in _samples(name):
            check_model(export_one_op(_trace_sample(REGISTRY[name], sample, decompose=False)[0], opset_version=opset))
        return
    failures = [f"{sample}: {failure}" for sample in _samples(name)
                if (failure := _run_sample(name, sample, opset)) and not KNOWN_GAPS.get((name, sample.note))]
    assert not failures, "\n".join(failures)
