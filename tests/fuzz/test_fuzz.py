"""Differential fuzzing: random programs (tests/fuzz/programs.py) agree across the interpreter, ONNX, C at every
capability, Triton (its interpreter), the .pt2 round trip and torch eager. A failure is shrunk by hypothesis and
shown as a pytest test to add to tests/regressions/. `make fuzz` runs the 10,000-program budget
(tests/fuzz/__main__.py).

Each test's draws depend on its seed alone (conftest.py).
"""

from __future__ import annotations


import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings

from tests.fuzz.differential import Report, run_cases
from tests.fuzz.programs import Case, batches, cases, dags
from tests.fuzz.reproduce import case_source

SUPPRESSED = list(HealthCheck)


def check(batch: list[Case]) -> Report:
    report = Report()
    failures = run_cases(batch, report)
    assert not failures, "\n\n".join(f"{failure}\n{case_source(failure.case, backends=(failure.backend,))}"
                                      for failure in failures[:3])
    return report


@seed(20261202)
@settings(max_examples=3, database=None, deadline=None, suppress_health_check=SUPPRESSED)
@given(batches(max_cases=30, max_steps=25))
def test_random_programs_agree_across_backends(batch):
    check(batch)


@pytest.mark.slow
@seed(7)
@settings(max_examples=14, database=None, deadline=None, suppress_health_check=SUPPRESSED,
          phases=[Phase.explicit, Phase.generate, Phase.shrink])
@given(batches(max_cases=40))
def test_random_programs_agree_across_backends_long(batch):
    check(batch)


@seed(1)
@settings(max_examples=100, database=None, deadline=None, suppress_health_check=SUPPRESSED)
@given(dags())
def test_generated_dags_build_and_verify(dag):
    """Every drawn DAG replays into a program that verifies, with ops and an output."""
    from tests.fuzz.programs import build_program
    program = build_program([dag])
    program.verify()
    assert dag.steps and dag.outputs


@seed(2)
@settings(max_examples=30, database=None, deadline=None, suppress_health_check=SUPPRESSED)
@given(cases(max_steps=10))
def test_case_source_reproduces_the_program(case):
    """The printed reproduction builds the same program as the recipe."""
    import numpy as np

    from kiln.ir import dtypes
    from tests.fuzz.programs import build_program
    from tests.fuzz.reproduce import HEADER
    namespace: dict = {}
    source = HEADER + case_source(case).replace("    check_program(program, inputs)", "    return program, inputs")
    exec(compile(source, "<case>", "exec"), namespace)  # noqa: S102  (the printer's own output)
    program, inputs = namespace["test_case"]()
    assert program.to_mlir() == build_program([case.dag]).to_mlir()
    assert all(np.array_equal(a, b, equal_nan=dtypes.dtype(a.dtype).is_floating_point)  # (bfloat16's kind is "V")
               for a, b in zip(inputs, case.inputs))


def test_a_float32_sum_the_interpreter_keeps_in_float64_may_reorder_by_a_float32_ulp():
    """The interpreter hands a float32 convolution's sum on in float64. "Another order of the sum" must move it by an
    ulp of float32 of the terms' summed magnitudes, the dtype a backend sums in, not of float64: with float64's, the
    fuzzer filed a float32 FMA chain over terms of +-1e4 summing to 14.25 (a convolution of clamped infinities, seed
    20000) as a mismatch of 7.6e-4 in every C capability and Triton. A result further off still is one."""
    import numpy as np

    import kiln
    from kiln.ir.program import GraphBuilder
    from kiln.ir.registry import ops
    from kiln.ir.types import TensorType
    from tests.fuzz.differential import compare, ill_conditioned
    aten = ops.aten
    builder = GraphBuilder()
    x = builder.add_input('x', TensorType.of([1, 1, 1, 4], kiln.float32))
    w = builder.add_input('w', TensorType.of([1, 1, 1, 4], kiln.float32))
    with builder:
        y = aten.conv2d.default(aten.clamp.default(x, -100.0, 100.0), aten.clamp.default(w, -100.0, 100.0))
    program = builder.build([y])
    inputs = [np.array([[[[np.inf, 1.2345678, -np.inf, 3.0]]]], np.float32),  # 1e4 + 1.23 rounds in float32
              np.array([[[[np.inf, 1.0, np.inf, 0.33333334]]]], np.float32)]
    expected = program(*inputs)
    terms = np.clip(inputs[0], -100, 100).ravel().astype(np.float64) * np.clip(inputs[1], -100, 100).ravel()
    chain = np.float32(0)
    for term in terms:  # a float32 backend's FMA chain
        chain = np.float32(np.float64(chain) + term)
    got = np.full_like(expected, chain)
    assert compare(got, expected) is not None  # the cancellation leaves float32's rounding beyond its tolerance
    assert ill_conditioned(program, inputs, [expected], [got], [0])
    assert not ill_conditioned(program, inputs, [expected], [expected + np.float32(0.01)], [0])


def test_rounding_through_an_ill_conditioned_computation_is_told_apart():
    """exp of a float32 dot product near 21: onnxruntime's float32 dot rounds differently from the interpreter's, and
    exp turns that into a relative difference of 1.9e-6 (over float32's rtol); 1-ulp input changes move the oracle
    as far, so the fuzzer files it as ill-conditioned. A result off by more than that stays a mismatch."""
    import numpy as np

    import kiln
    from kiln.codegen.onnx import export_program
    from kiln.ir.program import GraphBuilder
    from kiln.ir.registry import ops
    from kiln.ir.types import TensorType
    from tests.fuzz.differential import compare, ill_conditioned
    aten = ops.aten
    builder = GraphBuilder()
    a = builder.add_input('a', TensorType.of([5], kiln.float32))
    b = builder.add_input('b', TensorType.of([5], kiln.float32))
    with builder:
        y = aten.exp.default(aten.matmul.default(a, b))
    program = builder.build([y])
    inputs = [np.array([0.12396046, 0.39251572, 1.3828124, 4.431549, 12.182431], np.float32),
              np.array([0.07457414, -1.0886683, -0.14138953, 2.783895, 0.77073717], np.float32)]
    expected = program(*inputs)
    onnx_result = export_program(program).run(inputs)[0]
    assert compare(onnx_result, expected) is not None  # beyond float32's default tolerance
    assert ill_conditioned(program, inputs, [expected], [onnx_result], [0])
    assert not ill_conditioned(program, inputs, [expected], [expected * np.float32(1.001)], [0])
    assert not ill_conditioned(program, inputs, [expected], [np.full_like(expected, np.nan)], [0])
    overflowing = [x * np.float32(4) for x in inputs]  # exp(16 x 21) is inf whichever way it rounds
    assert not ill_conditioned(program, overflowing, [program(*overflowing)], [np.float32(3e38)], [0])


def test_a_sum_added_in_another_order_is_told_apart():
    """A float32 sum whose terms cancel (1e8 + 1 - 1e8 + 0.5): its value depends on the order of the additions by
    far more than one ulp of the result (onnxruntime's ReduceSum and MatMul order differs from numpy's; the fuzzer
    met 0.02124 against 0.02141 behind exp∘cosh). The detector moves an accumulating op's result by one ulp of its
    terms' summed magnitudes (2e8 x 2^-23 = 24 here), so a left-to-right float32 sum counts as ill-conditioned; a
    value off by more than SPREAD_FACTOR such steps stays a mismatch."""
    import math

    import numpy as np

    import kiln
    from kiln.ir.program import GraphBuilder
    from kiln.ir.registry import ops
    from kiln.ir.types import TensorType
    from tests.fuzz.differential import _rounding_noise, compare, ill_conditioned
    builder = GraphBuilder()
    x = builder.add_input('x', TensorType.of([4], kiln.float32))
    with builder:
        y = ops.aten.mul.Scalar(ops.aten.sum.default(x), 2.0)
    program = builder.build([y])
    inputs = [np.array([1e8, 1.0, -1e8, 0.5], np.float32)]
    expected = program(*inputs)
    assert expected == 2 * math.fsum(inputs[0].tolist())  # 3: the oracle keeps every term
    in_order = np.float32(0)
    for term in inputs[0]:  # a float32 sum left to right loses the 1: 2 x 0.5
        in_order = np.float32(in_order + term)
    assert compare(2 * in_order, expected) is not None
    assert ill_conditioned(program, inputs, [expected], [2 * in_order], [0])
    assert not ill_conditioned(program, inputs, [expected], [np.float32(400)], [0])
    with _rounding_noise("away", np.random.default_rng(0)):  # the sum moves 2e8 x 2^-23, doubled by the mul
        assert abs(float(program(*inputs)) - 3.0) >= 2 * 2e8 * 2.0 ** -23 * 0.99


@pytest.mark.parametrize("name", ["conv_transpose1d.default", "conv_transpose2d.input", "conv_transpose3d.input",
                                  "conv1d.padding", "conv2d.padding", "conv3d.padding"])
def test_every_convolution_may_add_its_terms_in_another_order(name):
    """Transposed convolutions and those with string padding sum products as conv2d does: a backend's order of the
    sum moves them by an ulp of the terms' magnitudes (torch and onnxruntime agreed on a transposed convolution
    7e-4 from the interpreter's float64 sum at 18.3, fuzz seed 15000). Three input channels of 1e8, 1 and -1e8
    into one output: the oracle moves it 2e8 x 2^-23, not an ulp of 1."""
    import numpy as np

    import kiln
    from kiln.ir.program import GraphBuilder
    from kiln.ir.registry import ops
    from kiln.ir.types import TensorType
    from tests.fuzz.differential import _rounding_noise
    rank = int(name.split(".")[0][-2])
    transposed = "transpose" in name
    builder = GraphBuilder()
    x = builder.add_input('x', TensorType.of([1, 3] + [1] * rank, kiln.float32))
    w = builder.add_input('w', TensorType.of(([3, 1] if transposed else [1, 3]) + [1] * rank, kiln.float32))
    op = getattr(getattr(ops.aten, name.split(".")[0]), name.split(".")[1])
    with builder:
        y = op(x, w) if transposed else op(x, w, None, 1, "same")
    program = builder.build([y])
    inputs = [np.array([1e8, 1.0, -1e8], np.float32).reshape([1, 3] + [1] * rank),
              np.ones(([3, 1] if transposed else [1, 3]) + [1] * rank, np.float32)]
    assert float(program(*inputs).ravel()[0]) == 1.0
    with _rounding_noise("away", np.random.default_rng(0)):
        assert abs(float(program(*inputs).ravel()[0]) - 1.0) >= 2e8 * 2.0 ** -23 * 0.99


# Each interpolation and average pool as a weighted sum of terms that cancel: (op name, input shape, the call's
# other arguments).
WEIGHTED_SUMS = [
    ("avg_pool1d.default", [1, 1, 3], ([3],)),
    ("avg_pool2d.default", [1, 1, 1, 3], ([1, 3],)),
    ("avg_pool3d.default", [1, 1, 1, 1, 3], ([1, 1, 3],)),
    ("adaptive_avg_pool1d.default", [1, 1, 3], ([1],)),
    ("adaptive_avg_pool2d.default", [1, 1, 1, 3], ([1, 1],)),
    ("_adaptive_avg_pool2d.default", [1, 1, 1, 3], ([1, 1],)),
    ("adaptive_avg_pool3d.default", [1, 1, 1, 1, 3], ([1, 1, 1],)),
    ("_adaptive_avg_pool3d.default", [1, 1, 1, 1, 3], ([1, 1, 1],)),
    ("upsample_linear1d.default", [1, 1, 2], ([3], True)),
    ("upsample_linear1d.vec", [1, 1, 2], ([3], True, None)),
    ("upsample_bilinear2d.default", [1, 1, 1, 2], ([1, 3], True)),
    ("upsample_bilinear2d.vec", [1, 1, 1, 2], ([1, 3], True, None)),
    ("upsample_bicubic2d.vec", [1, 1, 1, 2], ([1, 3], True, None)),
]


@pytest.mark.parametrize("name, shape, arguments", WEIGHTED_SUMS, ids=[case[0] for case in WEIGHTED_SUMS])
def test_every_interpolation_and_average_may_add_its_terms_in_another_order(name, shape, arguments):
    """An interpolation or an average pool sums weighted elements, which a backend may order otherwise: onnxruntime's
    Resize computes a lerp, ATen a weighted sum (fuzz seed 9191 met it as a logit of a bilinear upsample near 0.002
    off by 5e-5). Terms near 1e8 that cancel: the oracle moves the result by an ulp of their weighted magnitudes
    (about 12), hundreds of ulps of the result."""
    import numpy as np

    import kiln
    from kiln.ir.program import GraphBuilder
    from kiln.ir.registry import ops
    from kiln.ir.types import TensorType
    from tests.fuzz.differential import ACCUMULATING, _rounding_noise
    assert f"aten.{name}" in ACCUMULATING
    builder = GraphBuilder()
    x = builder.add_input('x', TensorType.of(shape, kiln.float32))
    op = getattr(getattr(ops.aten, name.split(".")[0]), name.split(".")[1])
    with builder:
        y = op(x, *arguments)
    program = builder.build([y])
    terms = np.array([1e8, 1.0, -1e8] if shape[-1] == 3 else [1e8, -0.99e8], np.float32).reshape(shape)
    exact = program(terms)  # 1/3 for a pool, 5e5 between the two for an interpolation
    with _rounding_noise("away", np.random.default_rng(0)):
        moved = program(terms)
    assert np.max(np.abs(moved - exact) / np.spacing(exact)) >= 100  # ulps of the result


def test_an_interpolation_through_an_ill_conditioned_logit_is_told_apart():
    """Fuzz seed 9191: logit of a bilinear upsample whose terms (near 2.5) cancel to 0.002. onnxruntime's Resize
    rounds its lerp differently from the interpreter's weighted sum, by less than an ulp of the terms, and the logit
    turns that into a difference of 6.6e-5 at -6.2 (torch's own float32 is 1.1e-5 off float64's there). That counts
    as ill-conditioned; a value further off stays a mismatch."""
    import numpy as np

    import kiln
    from kiln.codegen.onnx import export_program
    from kiln.ir.program import GraphBuilder
    from kiln.ir.registry import ops
    from kiln.ir.types import TensorType
    from tests.fuzz.differential import compare, ill_conditioned
    aten = ops.aten
    builder = GraphBuilder()
    x = builder.add_input('x', TensorType.of([1, 1, 3, 4], kiln.float32))
    with builder:
        y = aten.logit.default(aten.upsample_bilinear2d.default(x, [5, 10], False, 1.7, 2.5))
    program = builder.build([y])
    inputs = [np.array([[[[1.5838764905929565, -1.0998753309249878, -2.322425365447998, -2.126088857650757],
                          [-0.7449493408203125, 0.6170491576194763, -2.6504976749420166, -1.6447112560272217],
                          [-2.5549237728118896, -0.13388800621032715, 0.3641399145126343, -0.356083482503891]]]],
                       np.float32)]
    expected = program(*inputs)
    onnx_result = export_program(program).run(inputs)[0]
    assert compare(onnx_result, expected) is not None  # beyond float32's default tolerance
    assert ill_conditioned(program, inputs, [expected], [onnx_result], [0])
    off = expected.copy()
    off[0, 0, 3, 3] += np.float32(1e-3)
    assert not ill_conditioned(program, inputs, [expected], [off], [0])


def test_a_normalization_computed_folded_is_told_apart():
    """instance_norm over channels of one element: (x - mean) * rstd * w + b is exactly b, but ATen's CPU kernel and
    onnxruntime compute x * alpha + (b - mean * alpha), alpha = w / sqrt(var + eps), whose two terms (near 9000 here)
    cancel: torch eager returns 1.8613281 where b is 1.8617492. The detector moves a normalization's result by one
    ulp of those terms' magnitudes, so torch's value counts as ill-conditioned; one further off stays a mismatch."""
    import numpy as np
    import torch

    import kiln
    from kiln.ir.program import GraphBuilder
    from kiln.ir.registry import ops
    from kiln.ir.types import TensorType
    from tests.fuzz.differential import compare, ill_conditioned
    builder = GraphBuilder()
    w = builder.add_input('w', TensorType.of([5], kiln.float32))
    x = builder.add_input('x', TensorType.of([1, 5], kiln.float32))
    with builder:
        y = ops.aten.instance_norm.default(x, w, w, None, None, True, 0.1, 1e-05, True)
    program = builder.build([y])
    inputs = [np.array([0.93989718, -4.3948474, 1.8617492, 0.31387538, 0.75236738], np.float32),
              np.array([[4.4974642, -10.218948, 15.229967, 15.030747, 10.836812]], np.float32)]
    expected = program(*inputs)
    np.testing.assert_array_equal(expected, inputs[0][None])  # the oracle: exactly the bias
    folded = torch.ops.aten.instance_norm.default(*(torch.from_numpy(a) for a in (inputs[1], inputs[0], inputs[0])),
                                                  None, None, True, 0.1, 1e-05, True).numpy()
    assert compare(folded, expected) is not None
    assert ill_conditioned(program, inputs, [expected], [folded], [0])
    assert not ill_conditioned(program, inputs, [expected], [expected + np.float32(0.05)], [0])


def test_a_normalization_without_weight_computed_folded_is_told_apart():
    """instance_norm with running statistics and no weight or bias, a channel of variance 0: (x - mean) / sqrt(eps)
    is -39.402786, onnxruntime's folded x * alpha - mean * alpha (terms near 1150) -39.40271. The detector's folded
    step took a weight of ones of shape (1, -1) and failed, so this stayed a mismatch (fuzz seed 9900)."""
    import numpy as np

    import kiln
    from kiln.codegen.onnx import export_program
    from kiln.ir.program import GraphBuilder
    from kiln.ir.registry import ops
    from kiln.ir.types import TensorType
    from tests.fuzz.differential import compare, ill_conditioned
    builder = GraphBuilder()
    x = builder.add_input('x', TensorType.of([1, 2, 2], kiln.float32))
    mean = builder.add_input('mean', TensorType.of([2], kiln.float32))
    var = builder.add_input('var', TensorType.of([2], kiln.float32))
    with builder:
        y = ops.aten.instance_norm.default(x, None, None, mean, var, False, 0.1, 1e-05, True)
    program = builder.build([y])
    inputs = [np.array([[[-1.0, 0.5], [3.6231608390808105, 1.0]]], np.float32),
              np.array([1.2973250150680542, 3.7477633953094482], np.float32), np.array([1.72, 0.0], np.float32)]
    expected = program(*inputs)
    onnx_result = export_program(program).run(inputs)[0]
    assert compare(onnx_result, expected) is not None
    assert ill_conditioned(program, inputs, [expected], [onnx_result], [0])
    assert not ill_conditioned(program, inputs, [expected], [expected + np.float32(0.05)], [0])


def test_a_normalization_computed_folded_before_a_cat_of_unequal_tensors_is_told_apart():
    """cosh of an instance norm with weights near -600, concatenated with a tensor of another size (fuzz seed 11000):
    onnxruntime's folded norm is off by an ulp of its terms (1e-5 at outputs near 14 there), which cosh carries past
    float32's tolerance, within the oracle's spread. The checker's moved runs had failed on the cat (reading its list
    of unequal tensors as an array, where only a norm's input is read), so every program with such a cat stayed a
    mismatch."""
    import numpy as np

    import kiln
    from kiln.codegen.onnx import export_program
    from kiln.ir.program import GraphBuilder
    from kiln.ir.registry import ops
    from kiln.ir.types import TensorType
    from tests.fuzz.differential import compare, ill_conditioned
    aten = ops.aten
    builder = GraphBuilder()
    x = builder.add_input('x', TensorType.of([2, 3, 5], kiln.float32))
    weight = builder.add_input('weight', TensorType.of([3], kiln.float32))
    other = builder.add_input('other', TensorType.of([2, 5, 5], kiln.float32))
    with builder:
        normalized = aten.instance_norm.default(x, weight, weight, None, None, True, 0.1, 1e-05, True)
        y = aten.cosh.default(aten.cat.default([normalized, other], 1))
    program = builder.build([y])
    rng = np.random.default_rng(11000)
    inputs = [(rng.standard_normal((2, 3, 5)) * 2).astype(np.float32), np.array([-617.8668, -436.37527, -93.15175],
              np.float32), rng.standard_normal((2, 5, 5)).astype(np.float32)]
    expected = program(*inputs)
    onnx_result = export_program(program).run(inputs)[0]
    assert compare(onnx_result, expected) is not None
    assert ill_conditioned(program, inputs, [expected], [onnx_result], [0])
    assert not ill_conditioned(program, inputs, [expected], [expected * np.float32(1.01)], [0])


def test_a_layer_norm_computed_folded_is_told_apart():
    """A float16 layer norm over one element is 0 exactly (x - mean), but ATen's CPU kernel (torch eager) computes it
    folded, x * rstd - mean * rstd in float32 with rstd = 1 / sqrt(eps) = 316: -2.7e-5 at one element (fuzz seed
    14000), past float16's atol; as a fused multiply-add (below), the folded form leaves the product's rounding. The
    moved runs move a layer norm by an ulp of those terms, as a batch norm's (the weight and bias over the normalized
    dims); a result 0.01 off stays a mismatch."""
    import numpy as np

    import kiln
    from kiln.ir.program import GraphBuilder
    from kiln.ir.registry import ops
    from kiln.ir.types import TensorType
    from tests.fuzz.differential import compare, ill_conditioned
    aten = ops.aten
    builder = GraphBuilder()
    x = builder.add_input('x', TensorType.of([5, 3, 1], kiln.float16))
    with builder:
        y = aten.layer_norm.default(x, [1])
    program = builder.build([y])
    inputs = [(np.random.default_rng(14000).standard_normal((5, 3, 1)) * 8).astype(np.float16)]
    expected = program(*inputs)
    assert not expected.any()
    x32 = inputs[0].astype(np.float32)
    rstd = np.float32(1) / np.sqrt(np.float32(1e-5))
    shift = -(x32 * rstd)  # -mean * rstd, rounded to float32; then x * rstd + shift in one fused multiply-add:
    folded = (x32.astype(np.float64) * np.float64(rstd) + shift).astype(np.float16)  # the product's rounding error
    assert compare(folded, expected) is not None
    assert ill_conditioned(program, inputs, [expected], [folded], [0])
    assert not ill_conditioned(program, inputs, [expected], [expected + np.float16(0.01)], [0])


def test_a_float_a_ulp_off_before_a_conversion_to_int_is_told_apart():
    """tanh(9) in float32 is 0.99999994 in the interpreter and 1.0 in onnxruntime (a ulp apart), so converted to int32
    they are 0 and 1: one of the oracle's 1-ulp moved runs gives 1 too, so the fuzzer files it as ill-conditioned. An
    integer no moved run gives stays a mismatch."""
    import numpy as np

    import kiln
    from kiln.codegen.onnx import export_program
    from kiln.ir.program import GraphBuilder
    from kiln.ir.registry import ops
    from kiln.ir.types import TensorType
    from tests.fuzz.differential import compare, ill_conditioned
    aten = ops.aten
    builder = GraphBuilder()
    x = builder.add_input('x', TensorType.of([3], kiln.float32))
    with builder:
        y = aten._to_copy.default(aten.tanh.default(x), dtype=kiln.int32)
    program = builder.build([y])
    inputs = [np.array([9.0, 0.5, -9.0], np.float32)]
    expected = program(*inputs)
    onnx_result = export_program(program).run(inputs)[0]
    assert compare(onnx_result, expected) is not None
    assert ill_conditioned(program, inputs, [expected], [onnx_result], [0])
    assert not ill_conditioned(program, inputs, [expected], [np.array([5, 0, 0], np.int32)], [0])


def test_onnxruntime_sigmoid_exact_to_an_ulp_of_one_is_told_apart():
    """ceil(-silu(x)) at x = -23.15: ATen's silu is -2.04e-9 there, onnxruntime's x * Sigmoid(x) is 0 (its Sigmoid is
    exact to about an ulp of 1, not of the result), so the ceil is 1 against 0 (fuzz seed 10000). Moving silu by an
    ulp of 1 times |x| (ABSOLUTE_ULP) reaches 0 too, so the fuzzer files it as ill-conditioned; at x = 1, where both
    are exact, a ceil off by one stays a mismatch."""
    import numpy as np

    import kiln
    from kiln.codegen.onnx import export_program
    from kiln.ir.program import GraphBuilder
    from kiln.ir.registry import ops
    from kiln.ir.types import TensorType
    from tests.fuzz.differential import compare, ill_conditioned
    aten = ops.aten
    builder = GraphBuilder()
    x = builder.add_input('x', TensorType.of([2], kiln.float32))
    with builder:
        y = aten.ceil.default(aten.neg.default(aten.silu.default(x)))
    program = builder.build([y])
    inputs = [np.array([-23.15, 1.0], np.float32)]
    expected = program(*inputs)
    onnx_result = export_program(program).run(inputs)[0]
    assert expected[0] == 1 and onnx_result[0] == 0
    assert compare(onnx_result, expected) is not None
    assert ill_conditioned(program, inputs, [expected], [onnx_result], [0])
    assert not ill_conditioned(program, inputs, [expected], [expected - np.array([0, 1], np.float32)], [0])


def test_onnxruntime_sigmoid_flushed_to_zero_under_a_reciprocal_is_told_apart():
    """1 / sigmoid(x) at x = -30: ATen's sigmoid is 9.4e-14 (1.1e13), onnxruntime's 0 (inf; as rsqrt of it, fuzz seed
    14000). The oracle's run moved toward zero reaches inf too, an unbounded spread, which the check had turned into
    the largest float (numpy's nan_to_num) and then refused the infinite difference; at x = 1 an inf stays a
    mismatch."""
    import numpy as np

    import kiln
    from kiln.codegen.onnx import export_program
    from kiln.ir.program import GraphBuilder
    from kiln.ir.registry import ops
    from kiln.ir.types import TensorType
    from tests.fuzz.differential import compare, ill_conditioned
    aten = ops.aten
    builder = GraphBuilder()
    x = builder.add_input('x', TensorType.of([2], kiln.float32))
    with builder:
        y = aten.reciprocal.default(aten.sigmoid.default(x))
    program = builder.build([y])
    inputs = [np.array([-30.0, 1.0], np.float32)]
    expected = program(*inputs)
    onnx_result = export_program(program).run(inputs)[0]
    assert np.isfinite(expected).all() and np.isinf(onnx_result[0])
    assert compare(onnx_result, expected) is not None
    assert ill_conditioned(program, inputs, [expected], [onnx_result], [0])
    assert not ill_conditioned(program, inputs, [expected], [np.array([expected[0], np.inf], np.float32)], [0])


def test_onnxruntime_sigmoid_flushed_to_zero_before_a_truth_test_is_told_apart():
    """logical_and(neg(silu(x)), y) at x = -54.6: ATen's silu is -1.1e-22, onnxruntime's 0, so the truth is True
    against False (fuzz seed 12000). The oracle's run moved toward zero takes silu to 0 (ABSOLUTE_ULP), and neg's
    zero stays zero in that run (a zero moved toward zero had become a subnormal, True again); at x = -1, where both
    are exact, False stays a mismatch."""
    import numpy as np

    import kiln
    from kiln.codegen.onnx import export_program
    from kiln.ir.program import GraphBuilder
    from kiln.ir.registry import ops
    from kiln.ir.types import TensorType
    from tests.fuzz.differential import compare, ill_conditioned
    aten = ops.aten
    builder = GraphBuilder()
    x = builder.add_input('x', TensorType.of([2], kiln.float32))
    y = builder.add_input('y', TensorType.of([2], kiln.float32))
    with builder:
        z = aten.logical_and.default(aten.neg.default(aten.silu.default(x)), y)
    program = builder.build([z])
    inputs = [np.array([-54.59815, -1.0], np.float32), np.array([0.5, 0.5], np.float32)]
    expected = program(*inputs)
    onnx_result = export_program(program).run(inputs)[0]
    assert expected.tolist() == [True, True] and onnx_result.tolist() == [False, True]
    assert compare(onnx_result, expected) is not None
    assert ill_conditioned(program, inputs, [expected], [onnx_result], [0])
    assert not ill_conditioned(program, inputs, [expected], [np.array([True, False])], [0])


def test_onnxruntime_recurrent_cell_gates_exact_to_an_ulp_of_one_are_told_apart():
    """rsqrt of a GRU cell whose update gate is near 1 (h' nearly h = 1e-3): onnxruntime's gates are exact to about
    an ulp of 1, so its h' is 1e-8 off, which rsqrt carries past float32's tolerance (fuzz seed 13000). The oracle's
    moved runs move gru_cell by an ulp of 1 times 2 + |h| (ABSOLUTE_ULP, in float32 though the interpreter hands the
    cell on in float64); a result 0.1% off stays a mismatch."""
    import numpy as np

    import kiln
    from kiln.codegen.onnx import export_program
    from kiln.ir.program import GraphBuilder
    from kiln.ir.registry import ops
    from kiln.ir.types import TensorType
    from tests.fuzz.differential import compare, ill_conditioned
    aten = ops.aten
    builder = GraphBuilder()
    x = builder.add_input('x', TensorType.of([1, 4], kiln.float32))
    h = builder.add_input('h', TensorType.of([1, 5], kiln.float32))
    weights = [builder.add_input(name, TensorType.of(shape, kiln.float32))
               for name, shape in (('w_ih', [15, 4]), ('w_hh', [15, 5]), ('b_ih', [15]), ('b_hh', [15]))]
    with builder:
        y = aten.rsqrt.default(aten.gru_cell.default(x, h, *weights))
    program = builder.build([y])
    rng = np.random.default_rng(12000)
    bias = np.zeros(15, np.float32)
    bias[5:10] = [9, 10, 11, 12, 13]  # the update gate (r, z, n) near 1
    inputs = [rng.standard_normal((1, 4)).astype(np.float32), np.full((1, 5), 1e-3, np.float32),
              rng.standard_normal((15, 4)).astype(np.float32), rng.standard_normal((15, 5)).astype(np.float32), bias,
              np.zeros(15, np.float32)]
    expected = program(*inputs)
    onnx_result = export_program(program).run(inputs)[0]
    assert compare(onnx_result, expected) is not None
    assert ill_conditioned(program, inputs, [expected], [onnx_result], [0])
    assert not ill_conditioned(program, inputs, [expected], [expected * np.float32(1.001)], [0])


def test_onnxruntime_resize_leaving_out_an_infinite_tap_is_told_apart():
    """Bilinear upsampling with align_corners of [1, inf, 2]: ATen multiplies the infinity by the on-grid samples'
    weight 0 (NaN), onnxruntime's float32 Resize leaves that tap out (inf), a documented divergence the fuzzer files
    as resize-infinity. float64 (ATen's taps in ONNX too) agrees, and a wrong number stays a mismatch."""
    import numpy as np

    import kiln
    from kiln.codegen.onnx import export_program
    from kiln.ir.program import GraphBuilder
    from kiln.ir.registry import ops
    from kiln.ir.types import TensorType
    from tests.fuzz.differential import compare, resize_dropped_infinity
    aten = ops.aten

    def upsampling(dtype):
        builder = GraphBuilder()
        x = builder.add_input('x', TensorType.of([1, 1, 1, 3], dtype))
        with builder:
            y = aten.upsample_bilinear2d.vec(x, [1, 5], True, None)
        return builder.build([y])

    program = upsampling(kiln.float32)
    inputs = [np.array([[[[1, np.inf, 2]]]], np.float32)]
    with np.errstate(invalid="ignore"):
        expected = program(*inputs)
    onnx_result = export_program(program).run(inputs)[0]
    assert compare(onnx_result, expected) is not None
    assert resize_dropped_infinity(program, inputs, [expected], [onnx_result], [0])
    wrong = onnx_result.copy()
    wrong[..., -1] += 1  # a finite sample off as well
    assert not resize_dropped_infinity(program, inputs, [expected], [wrong], [0])
    finite = [np.array([[[[1, 3, 2]]]], np.float32)]
    assert not resize_dropped_infinity(program, finite, [program(*finite)], [program(*finite) + 1], [0])
    double = upsampling(kiln.float64)
    inputs64 = [inputs[0].astype(np.float64)]
    with np.errstate(invalid="ignore"):
        expected64 = double(*inputs64)
    assert compare(export_program(double).run(inputs64)[0], expected64) is None
    assert not resize_dropped_infinity(double, inputs64, [expected64], [np.nan_to_num(expected64)], [0])


def test_indices_chosen_among_equal_values_are_told_apart():
    """topk of a row holding a repeated value: torch eager returned index 9 where the interpreter returned 8 (both
    hold the k-th largest value), which the fuzzer now files as tie-dependent; indices that differ where the values
    are distinct, or a stable sort's, stay mismatches."""
    import numpy as np

    import kiln
    from kiln.ir.program import GraphBuilder
    from kiln.ir.registry import ops
    from kiln.ir.types import TensorType
    from tests.fuzz.differential import tie_dependent
    aten = ops.aten

    def program_of(op):
        builder = GraphBuilder()
        x = builder.add_input('x', TensorType.of([6], kiln.float32))
        with builder:
            values, indices = op(x)
            shifted = aten.add.Scalar(indices, 1)
        return builder.build([values, shifted])

    topk = program_of(lambda x: aten.topk.default(x, 3))
    tied = np.array([0.5, 2.0, -1.0, 2.0, 3.0, 0.0], np.float32)
    expected = topk(tied)
    swapped = [expected[0], expected[1][[0, 2, 1]]]  # the two positions of 2.0 in the other order
    assert np.array_equal(swapped[0], expected[0]) and not np.array_equal(swapped[1], expected[1])
    assert tie_dependent(topk, [tied], [1])
    assert not tie_dependent(topk, [tied], [0])  # the values do not depend on the choice
    distinct = np.array([0.5, 2.0, -1.0, 2.5, 3.0, 0.0], np.float32)
    assert not tie_dependent(topk, [distinct], [1])
    stable = program_of(lambda x: aten.sort.stable(x, stable=True))
    assert not tie_dependent(stable, [tied], [1])
    assert tie_dependent(program_of(lambda x: aten.sort.stable(x, stable=False)), [tied], [1])


def test_torch_kernels_refusing_empty_tensors_are_told_apart(tmp_path):
    """torch's learnable fake-quantize kernel takes min() of its zero points and refuses an empty tensor ("Expected
    reduction dim to be specified for input.numel() == 0") where its shape rules accept one (found by the fuzzer,
    seed 9100): that is torch's limit, a refusal, while the other backends still compute kiln's (empty) result."""
    import numpy as np

    import kiln
    from kiln.ir.program import GraphBuilder
    from kiln.ir.registry import ops
    from kiln.ir.types import TensorType
    from tests.fuzz.differential import TorchRefused, _torch, check_program
    aten = ops.aten
    builder = GraphBuilder()
    x = builder.add_input('x', TensorType.of([0], kiln.float32))
    with builder:
        y = aten._fake_quantize_learnable_per_channel_affine.default(x, aten.add.Scalar(x, 1.0), x, 0, -128, 127)
    program = builder.build([y])
    inputs = [np.zeros(0, np.float32)]
    with pytest.raises(TorchRefused, match="Expected reduction dim"):
        _torch(program, inputs, tmp_path)
    check_program(program, inputs, backends=("onnx", "pt2"))


def test_the_torch_backend_runs_torchs_native_kernels(tmp_path):
    """torch's oneDNN bfloat16 convolution (AVX-512 BF16 / AMX Xeons) makes outputs NaN whose window holds no NaN:
    with one in input column 3, output column 0 too (fuzz seed 12000). The fuzzer's torch backend turns oneDNN off,
    so torch's native kernels compute ATen's result, NaN exactly where the interpreter has it."""
    import numpy as np

    import kiln
    from kiln.ir.program import GraphBuilder
    from kiln.ir.registry import ops
    from kiln.ir.types import TensorType
    from tests.fuzz.differential import _torch
    aten = ops.aten
    builder = GraphBuilder()
    x = builder.add_input('x', TensorType.of([1, 3, 6, 6], kiln.bfloat16))
    w = builder.add_input('w', TensorType.of([2, 3, 3, 3], kiln.bfloat16))
    with builder:
        y = aten.conv2d.default(x, w)
    program = builder.build([y])
    rng = np.random.default_rng(12000)
    image = rng.standard_normal((1, 3, 6, 6)).astype(kiln.bfloat16.numpy)
    image[0, 0, 3, 3] = np.nan
    inputs = [image, rng.standard_normal((2, 3, 3, 3)).astype(kiln.bfloat16.numpy)]
    expected = program(*inputs)
    assert np.isnan(expected.astype(np.float32)).sum() == 2 * 9  # the outputs whose 3 x 3 window holds (3, 3)
    kiln.testing.assert_close(_torch(program, inputs, tmp_path)[0], expected, equal_nan=True)


def test_the_summary_names_the_ops_in_scope_that_no_program_ran():
    """`make fuzz`'s figures count the ops its programs ran against the generator's scope, and name the ones missed,
    so a template the generator never completes shows up."""
    import collections

    from tests.fuzz.differential import Report
    from tests.fuzz.programs import ops_in_scope
    scope = ops_in_scope()
    assert "aten.add.Tensor" in scope and "aten.reshape.default" in scope  # a template, a shape op built by hand
    report = Report(ops=collections.Counter({"aten.add.Tensor": 3}))
    summary = report.summary(scope=["aten.add.Tensor", "aten.mul.Tensor", "aten.exp.default"])
    assert "ops covered: 1 of 3 in scope, 3 op applications" in summary
    assert "ops in scope that no program ran: aten.exp.default, aten.mul.Tensor" in summary
    assert "no program ran" not in Report(ops=collections.Counter({"aten.add.Tensor": 1})).summary(["aten.add.Tensor"])


def test_rounding_of_a_computed_operand_against_an_input_is_told_apart():
    """remainder(exp(6), b) with b an input: C's float32 exp(6) is the correctly rounded 403.4288, numpy's one ulp
    below, and the remainder (403.43 - 129 b = 0.218) keeps that ulp of 403 as 1.4e-4 of its result. Moving every
    input and op result one ulp the same way moves exp(6) and 129 b alike, and the difference cancels: the oracle also
    moves its inputs one way and its op results the other (fuzz seed 15151, where C was called wrong)."""
    import numpy as np

    import kiln
    from kiln.ir.program import GraphBuilder
    from kiln.ir.registry import ops
    from kiln.ir.types import TensorType
    from tests.fuzz.differential import compare, ill_conditioned
    aten = ops.aten
    builder = GraphBuilder()
    x = builder.add_input('x', TensorType.of([1], kiln.int64))
    b = builder.add_input('b', TensorType.of([1], kiln.float32))
    with builder:
        y = aten.remainder.Tensor(aten.exp.default(x), b)
    program = builder.build([y])
    inputs = [np.array([6], np.int64), np.array([3.1256651878356934], np.float32)]
    expected = program(*inputs)
    correctly_rounded = np.float32(np.exp(np.float64(6)))
    got = np.array([np.float64(correctly_rounded) - 129 * np.float64(inputs[1][0])], np.float32)
    assert compare(got, expected) is not None
    assert ill_conditioned(program, inputs, [expected], [got], [0])
    assert not ill_conditioned(program, inputs, [expected], [expected + np.float32(3e-4)], [0])


def test_a_gelu_tail_times_a_large_factor_is_told_apart():
    """tanh(gelu_tanh(x) * 70000) in float16 (fuzz seed 16161): gelu's tail is 0.5 x (1 + tanh(...)) with tanh one
    float32 ulp from -1, so another libm's tanh changes gelu(-5) (1e-7 in float16's subnormals) by half of itself, and
    the factor carries that to 0.008. A gelu result moves by its tail's cancellation in the oracle too; a value
    further off is still a mismatch."""
    import numpy as np

    import kiln
    from kiln.ir.program import GraphBuilder
    from kiln.ir.registry import ops
    from kiln.ir.types import TensorType
    from tests.fuzz.differential import compare, ill_conditioned
    aten = ops.aten
    builder = GraphBuilder()
    factor = builder.add_input('factor', TensorType.of([], kiln.int64))
    x = builder.add_input('x', TensorType.of([2], kiln.float16))
    with builder:
        y = aten.tanh.default(aten.mul.Tensor(aten.gelu.default(x, approximate='tanh'), factor))
    program = builder.build([y])
    inputs = [np.array(70000, np.int64), np.array([-5.0078125, 0.93994140625], np.float16)]
    expected = program(*inputs)
    in_float64 = np.float64(inputs[1][0])  # the C backend's value: gelu from an exactly computed tail
    gelu = 0.5 * in_float64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (in_float64 + 0.044715 * in_float64 ** 3)))
    got = expected.copy()
    got[0] = np.tanh(np.float64(np.float16(gelu)) * 70000)
    assert compare(got, expected) is not None
    assert ill_conditioned(program, inputs, [expected], [got], [0])
    far = expected.copy()
    far[0] = np.float16(-0.5)
    assert not ill_conditioned(program, inputs, [expected], [far], [0])
