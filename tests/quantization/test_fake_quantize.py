"""kiln's fake-quantize modules (quantization-aware training) against torch.ao.quantization's with the same settings:
over a stream of batches with the observer on, then off, and fake quantization off and on again, the outputs, the
scale and zero point, the observer's statistics and the gradients kiln's autograd gives (x, and the learnable
module's scale and zero point) equal torch's bit for bit (assert_close with rtol=0, atol=0: kiln repeats torch's
float32 arithmetic, its FMA contractions and its summation order, so the results are identical, not just close).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import numpy as np
import pytest

import kiln
from kiln import quantization as kq
from kiln.ir import dtypes
from tests.torch_oracle import requires_torch, torch

pytestmark = requires_torch

if torch is not None:
    import torch.ao.quantization as tq
    from torch.ao.quantization._learnable_fake_quantize import _LearnableFakeQuantize as TorchLearnableFakeQuantize

F32 = np.float32


def _exact(actual: Any, expected: Any, what: str) -> None:
    actual = torch.from_numpy(np.array(actual.detach().numpy() if isinstance(actual, kiln.Tensor) else actual))
    expected = expected.detach()
    if actual.dtype != expected.dtype:  # e.g. an observer's int64 zero point against torch's int32 buffer
        actual = actual.to(expected.dtype)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, msg=lambda m: f"{what}: {m}")


def _on_grid(inverse: np.float32, target: float) -> np.float32:
    """A float32 x whose product with `inverse` is exactly `target` in float32 (a tie or a range end), if one of
    the neighbours of target / inverse has it."""
    x = F32(target / float(inverse))
    candidates = [x]
    for direction in (np.inf, -np.inf):
        step = x
        for _ in range(6):
            step = np.nextafter(step, F32(direction))
            candidates.append(step)
    for candidate in candidates:
        if F32(candidate * inverse) == F32(target):
            return candidate
    return x


def _edge_values(scale: np.float32, zero_point: int, quant_min: int, quant_max: int) -> np.ndarray:
    """Values on the range's ends, half a step past them (ties: in range or out, as round-half-to-even says), one
    step past them, and half-steps inside."""
    inverse = F32(1) / F32(scale)
    low, high = quant_min - zero_point, quant_max - zero_point
    targets = [low, high, low - 0.5, high + 0.5, low - 1, high + 1] + [k + 0.5 for k in range(-4, 4)]
    return np.array([_on_grid(inverse, t) for t in targets], F32)


def _with_edges(batch: np.ndarray, scales: np.ndarray, zero_points: np.ndarray, quant_min: int, quant_max: int,
                per_channel: bool) -> np.ndarray:
    """`batch` with its first values (of each channel, along axis 0) replaced by the current qparams' edge values."""
    batch = batch.copy()
    rows = batch.reshape(batch.shape[0], -1) if per_channel else batch.reshape(1, -1)
    for row, scale, zero_point in zip(rows, np.atleast_1d(scales), np.atleast_1d(zero_points)):
        edges = _edge_values(scale, int(zero_point), quant_min, quant_max)
        row[:min(row.size, edges.size)] = edges[:row.size]
    return batch


def _batch(rng: np.random.Generator, shape: tuple[int, ...], spread: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * spread + rng.uniform(-0.5, 0.5)).astype(F32)


def _quiet(make: Callable[[], Any]) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns that reduce_range will be deprecated
        return make()


def _step(kiln_module, torch_module, batch: np.ndarray, rng: np.random.Generator, where: str) -> None:
    """One forward and backward through both modules; the outputs and x's gradients must be identical."""
    x, tx = kiln.tensor(batch, requires_grad=True), torch.tensor(batch, requires_grad=True)
    y, ty = kiln_module(x), torch_module(tx)
    _exact(y, ty, f"{where}: output")
    cotangent = rng.standard_normal(batch.shape).astype(F32)
    y.backward(kiln.tensor(cotangent))
    ty.backward(torch.from_numpy(cotangent))
    _exact(x.grad, tx.grad, f"{where}: x.grad")


def _same_qparams(kiln_module, torch_module, where: str) -> None:
    _exact(kiln_module.scale, torch_module.scale, f"{where}: scale")
    _exact(kiln_module.zero_point, torch_module.zero_point, f"{where}: zero_point")
    observer, torch_observer = kiln_module.activation_post_process, torch_module.activation_post_process
    if torch_observer.min_val.numel():
        _exact(np.asarray(observer.min_val), torch_observer.min_val, f"{where}: running min")
        _exact(np.asarray(observer.max_val), torch_observer.max_val, f"{where}: running max")


# name -> (kiln constructor, torch constructor, batch shape); per-channel ones quantize along axis 0
FAKE_QUANTIZE: dict[str, tuple[Callable[[], Any], Callable[[], Any], tuple[int, ...]]] = {
    "per_tensor_affine_uint8": (
        lambda: kq.FakeQuantize(observer=kq.MovingAverageMinMaxObserver, quant_min=0, quant_max=255,
                                dtype=kiln.uint8, qscheme=kq.per_tensor_affine),
        lambda: tq.FakeQuantize(observer=tq.MovingAverageMinMaxObserver, quant_min=0, quant_max=255,
                                dtype=torch.quint8, qscheme=torch.per_tensor_affine), (4, 3, 5, 5)),
    "per_channel_symmetric_int8": (
        lambda: kq.FakeQuantize(observer=kq.MovingAveragePerChannelMinMaxObserver, quant_min=-128, quant_max=127,
                                dtype=kiln.int8, qscheme=kq.per_channel_symmetric, ch_axis=0),
        lambda: tq.FakeQuantize(observer=tq.MovingAveragePerChannelMinMaxObserver, quant_min=-128, quant_max=127,
                                dtype=torch.qint8, qscheme=torch.per_channel_symmetric, ch_axis=0), (8, 3, 3, 3)),
    "quint8_reduce_range": (kq.default_fake_quant, lambda: tq.default_fake_quant(), (4, 3, 5, 5)),
    "per_channel_weight_default": (kq.default_per_channel_weight_fake_quant,
                                   lambda: tq.default_per_channel_weight_fake_quant(), (6, 4, 3)),
    "fused_per_tensor_affine_uint8": (kq.default_fused_act_fake_quant, lambda: tq.default_fused_act_fake_quant(),
                                      (4, 3, 5, 5)),
    "fused_per_tensor_symmetric_int8": (kq.default_fused_wt_fake_quant, lambda: tq.default_fused_wt_fake_quant(),
                                        (8, 3, 3, 3)),
    "fused_per_channel_symmetric_int8": (kq.default_fused_per_channel_wt_fake_quant,
                                         lambda: tq.default_fused_per_channel_wt_fake_quant(), (8, 3, 3, 3)),
    "fused_quint8_reduce_range": (
        lambda: kq.FusedMovingAvgObsFakeQuantize(quant_min=0, quant_max=255, dtype=kiln.uint8, reduce_range=True),
        lambda: tq.FusedMovingAvgObsFakeQuantize(quant_min=0, quant_max=255, dtype=torch.quint8,
                                                 reduce_range=True), (4, 3, 5, 5)),
}


@pytest.mark.parametrize("name", list(FAKE_QUANTIZE))
def test_fake_quantize_matches_torch(name):
    make_kiln, make_torch, shape = FAKE_QUANTIZE[name]
    module, reference = _quiet(make_kiln), _quiet(make_torch)
    rng = np.random.default_rng(0)
    low, high = module.activation_post_process.quant_min, module.activation_post_process.quant_max
    assert (low, high) == (reference.activation_post_process.quant_min, reference.activation_post_process.quant_max)
    for index in range(3):  # observing: the running range and the qparams follow each batch
        _step(module, reference, _batch(rng, shape, spread=1.0 + index), rng, f"{name} observing {index}")
        _same_qparams(module, reference, f"{name} observing {index}")
    kq.disable_observer(module)
    reference.apply(tq.disable_observer)
    for index in range(3):  # fixed qparams: the range's ends, half a step past them and ties exactly
        batch = _with_edges(_batch(rng, shape, spread=2.0), module.scale.numpy(), module.zero_point.numpy(), low,
                            high, module.is_per_channel)
        _step(module, reference, batch, rng, f"{name} fixed {index}")
        _same_qparams(module, reference, f"{name} fixed {index}")
    kq.disable_fake_quant(module)
    reference.apply(tq.disable_fake_quant)
    _step(module, reference, _batch(rng, shape), rng, f"{name} fake quantization off")
    kq.enable_fake_quant(module)
    kq.enable_observer(module)
    reference.apply(tq.enable_fake_quant)
    reference.apply(tq.enable_observer)
    _step(module, reference, _batch(rng, shape, spread=0.5), rng, f"{name} observing again")
    _same_qparams(module, reference, f"{name} observing again")
    _exact(module.calculate_qparams()[0], reference.calculate_qparams()[0], f"{name}: calculate_qparams scale")
    _exact(module.calculate_qparams()[1], reference.calculate_qparams()[1], f"{name}: calculate_qparams zero point")


@pytest.mark.parametrize("batch", ["zeros", "tiny", "positive", "negative", "one_value"])
@pytest.mark.parametrize("name", ["fused_per_tensor_affine_uint8", "fused_per_tensor_symmetric_int8",
                                  "fused_per_channel_symmetric_int8"])
def test_fused_qparams_on_degenerate_ranges(name, batch):
    """fbgemm's qparams where they take special branches: an empty range (scale 0.1), a tiny one (the 6.1e-5 floor),
    one-sided ranges (no symmetric zero point), a single repeated value."""
    make_kiln, make_torch, shape = FAKE_QUANTIZE[name]
    module, reference = make_kiln(), make_torch()
    rng = np.random.default_rng(1)
    values = {"zeros": np.zeros(shape, F32), "tiny": (rng.standard_normal(shape) * 1e-6).astype(F32),
              "positive": rng.uniform(0.5, 2.0, shape).astype(F32),
              "negative": -rng.uniform(0.5, 2.0, shape).astype(F32), "one_value": np.full(shape, F32(-0.3))}[batch]
    _step(module, reference, values, rng, f"{name} {batch}")
    _same_qparams(module, reference, f"{name} {batch}")


LEARNABLE: dict[str, tuple[Callable[[], Any], Callable[[], Any], tuple[int, ...]]] = {
    "per_tensor_affine_uint8": (
        lambda: kq._LearnableFakeQuantize(kq.MovingAverageMinMaxObserver, quant_min=0, quant_max=255,
                                          dtype=kiln.uint8),
        lambda: TorchLearnableFakeQuantize(tq.MovingAverageMinMaxObserver, quant_min=0, quant_max=255,
                                           dtype=torch.quint8), (4, 3, 5, 5)),
    "per_tensor_grad_scaling": (
        lambda: kq._LearnableFakeQuantize(kq.MovingAverageMinMaxObserver, quant_min=0, quant_max=127,
                                          dtype=kiln.uint8, use_grad_scaling=True),
        lambda: TorchLearnableFakeQuantize(tq.MovingAverageMinMaxObserver, quant_min=0, quant_max=127,
                                           dtype=torch.quint8, use_grad_scaling=True), (4, 3, 5, 5)),
    "per_channel_symmetric_int8": (
        lambda: kq._LearnableFakeQuantize(kq.MovingAveragePerChannelMinMaxObserver, quant_min=-128, quant_max=127,
                                          channel_len=8, dtype=kiln.int8, qscheme=kq.per_channel_symmetric,
                                          ch_axis=0),
        lambda: TorchLearnableFakeQuantize(tq.MovingAveragePerChannelMinMaxObserver, quant_min=-128, quant_max=127,
                                           channel_len=8, dtype=torch.qint8, qscheme=torch.per_channel_symmetric,
                                           ch_axis=0), (8, 3, 3, 3)),
    "per_channel_affine_int8": (
        lambda: kq._LearnableFakeQuantize(kq.MovingAveragePerChannelMinMaxObserver, quant_min=-128, quant_max=127,
                                          channel_len=8, dtype=kiln.int8, qscheme=kq.per_channel_affine, ch_axis=0,
                                          use_grad_scaling=True),
        lambda: TorchLearnableFakeQuantize(tq.MovingAveragePerChannelMinMaxObserver, quant_min=-128, quant_max=127,
                                           channel_len=8, dtype=torch.qint8, qscheme=torch.per_channel_affine,
                                           ch_axis=0, use_grad_scaling=True), (8, 6, 5, 5)),
}


def _same_learnable_state(module, reference, where: str) -> None:
    _exact(module.scale, reference.scale, f"{where}: scale")
    _exact(module.zero_point, reference.zero_point, f"{where}: zero_point")
    for name in ("scale", "zero_point"):
        mine, theirs = getattr(module, name).grad, getattr(reference, name).grad
        assert (mine is None) == (theirs is None), f"{where}: {name}.grad is {mine} in kiln, {theirs} in torch"
        if mine is not None:
            _exact(mine, theirs, f"{where}: {name}.grad")


def _sgd_step(module, reference, learning_rate: float) -> None:
    """The same update on both sides (torch's own SGD arithmetic, applied to kiln's values), then zeroed grads."""
    with torch.no_grad():
        for name in ("scale", "zero_point"):
            parameter = getattr(reference, name)
            parameter -= learning_rate * parameter.grad
            getattr(module, name).data = kiln.tensor(parameter.detach().numpy())
            parameter.grad = None
            getattr(module, name).grad = None


@pytest.mark.parametrize("name", list(LEARNABLE))
def test_learnable_fake_quantize_matches_torch(name):
    make_kiln, make_torch, shape = LEARNABLE[name]
    module, reference = make_kiln(), make_torch()
    rng = np.random.default_rng(2)
    low, high = module.quant_min, module.quant_max
    for index in range(2):  # static estimates (scale and zero point still require grad, as torch's do)
        _step(module, reference, _batch(rng, shape, spread=1.0 + index), rng, f"{name} static {index}")
        _same_learnable_state(module, reference, f"{name} static {index}")
        _sgd_step(module, reference, 0.0)
    module.enable_param_learning()
    reference.enable_param_learning()
    for index in range(4):  # learning: the qparams move by their gradients; the zero point becomes fractional
        scale, zero_point = module.calculate_qparams()
        batch = _with_edges(_batch(rng, shape, spread=2.0), scale, zero_point, low, high, module.qscheme.is_per_channel)
        _step(module, reference, batch, rng, f"{name} learning {index}")
        _same_learnable_state(module, reference, f"{name} learning {index}")
        _sgd_step(module, reference, 1e-3 if index < 3 else 0.3)
    module.toggle_fake_quant(False)
    reference.toggle_fake_quant(False)
    _step(module, reference, _batch(rng, shape), rng, f"{name} fake quantization off")
    for mine, theirs in zip(module.calculate_qparams(), reference.calculate_qparams()):
        _exact(mine, theirs, f"{name}: calculate_qparams")


def test_fixed_qparams_fake_quantize_matches_torch():
    rng = np.random.default_rng(3)
    for make_kiln, make_torch in [
            (lambda: kq.FixedQParamsFakeQuantize(kq.FixedQParamsObserver.with_args(
                scale=1.0 / 256.0, zero_point=0, dtype=kiln.uint8, quant_min=0, quant_max=255)),
             lambda: tq.default_fixed_qparams_range_0to1_fake_quant()),
            (lambda: kq.FixedQParamsFakeQuantize(kq.FixedQParamsObserver.with_args(
                scale=2.0 / 256.0, zero_point=128, dtype=kiln.uint8, quant_min=0, quant_max=255)),
             lambda: tq.default_fixed_qparams_range_neg1to1_fake_quant())]:
        module, reference = make_kiln(), make_torch()
        for index in range(2):
            batch = _with_edges(rng.uniform(-1.5, 1.5, (3, 40)).astype(F32), module.scale.numpy(),
                                module.zero_point.numpy(), 0, 255, per_channel=False)
            _step(module, reference, batch, rng, f"fixed qparams {index}")
            _exact(module.scale, reference.scale, "scale")
            _exact(module.zero_point, reference.zero_point, "zero_point")


def test_moving_average_per_channel_observer_matches_torch():
    rng = np.random.default_rng(4)
    for kwargs, torch_kwargs in [({}, {}), ({"ch_axis": 1, "averaging_constant": 0.3, "dtype": kiln.int8,
                                             "qscheme": kq.per_channel_symmetric},
                                            {"ch_axis": 1, "averaging_constant": 0.3, "dtype": torch.qint8,
                                             "qscheme": torch.per_channel_symmetric})]:
        observer = kq.MovingAveragePerChannelMinMaxObserver(**kwargs)
        reference = tq.MovingAveragePerChannelMinMaxObserver(**torch_kwargs)
        for index in range(4):
            batch = _batch(rng, (5, 6, 7), spread=1.0 + index)
            observer(batch)
            reference(torch.from_numpy(batch))
            _exact(observer.min_val, reference.min_val, "min_val")
            _exact(observer.max_val, reference.max_val, "max_val")
            for mine, theirs in zip(observer.calculate_qparams(), reference.calculate_qparams()):
                _exact(mine, theirs, "qparams")


def test_fake_quantize_is_an_observer_for_quantization_specs():
    """`FakeQuantize.with_args(...)` in a QuantizationSpec: make_observer passes the spec's dtype, range and
    qscheme, and the module observes numpy arrays and names numpy qparams like an observer (what convert reads)."""
    spec = kq.QuantizationSpec(kiln.int8, kq.FakeQuantize.with_args(observer=kq.MovingAverageMinMaxObserver),
                               quant_min=-128, quant_max=127, qscheme=kq.per_tensor_symmetric)
    module = spec.make_observer()
    reference = tq.FakeQuantize(observer=tq.MovingAverageMinMaxObserver, quant_min=-128, quant_max=127,
                                dtype=torch.qint8, qscheme=torch.per_tensor_symmetric)
    assert isinstance(module, kq.FakeQuantize) and module.dtype is kiln.int8
    assert (module.quant_min, module.quant_max, module.qscheme) == (-128, 127, kq.per_tensor_symmetric)
    batch = np.random.default_rng(5).standard_normal((4, 7)).astype(F32)
    result = module(batch)
    assert isinstance(result, np.ndarray)
    _exact(result, reference(torch.from_numpy(batch)), "output")
    scale, zero_point = module.calculate_qparams()
    assert isinstance(scale, np.ndarray) and isinstance(zero_point, np.ndarray)
    _exact(scale, reference.calculate_qparams()[0], "scale")


def test_switches_reach_every_fake_quantize_in_a_model():
    model = kiln.nn.Sequential(kq.FakeQuantize(), kiln.nn.Linear(4, 4), kq.default_fused_act_fake_quant(),
                               kq._LearnableFakeQuantize(kq.MovingAverageMinMaxObserver))
    fake_quantizers = [model[0], model[2], model[3]]
    kq.disable_fake_quant(model)
    kq.disable_observer(model)
    assert all(int(m.fake_quant_enabled.numpy()[0]) == 0 for m in fake_quantizers)
    assert [int(m.observer_enabled.numpy()[0]) for m in fake_quantizers[:2]] == [0, 0]
    assert int(model[3].static_enabled.numpy()[0]) == 0  # the learnable module's observer switch
    model.apply(kq.enable_fake_quant)  # torch's idiom works too
    assert all(int(m.fake_quant_enabled.numpy()[0]) == 1 for m in fake_quantizers)
    assert model[2].fake_quant_enabled.dtype is kiln.int64 and model[0].fake_quant_enabled.dtype is kiln.uint8
    assert set(dict(model[0].named_buffers())) == {"fake_quant_enabled", "observer_enabled", "scale", "zero_point"}
    assert set(dict(model[3].named_parameters())) == {"scale", "zero_point"}


FAKE_QUANT_OPS = ["aten.fake_quantize_per_tensor_affine.default",
                  "aten.fake_quantize_per_tensor_affine.tensor_qparams",
                  "aten.fake_quantize_per_channel_affine.default",
                  "aten._fake_quantize_learnable_per_tensor_affine.default",
                  "aten._fake_quantize_learnable_per_channel_affine.default"]


@pytest.mark.parametrize("name", FAKE_QUANT_OPS)
def test_op_gradients_equal_torch_in_float32(name):
    """The ops' VJP rules through kiln's autograd on their float32 registry samples (which put values on the range's
    ends and on ties), against torch.autograd: identical gradients (torch's backward kernels take float32 only, so
    tests/ir/test_vjp.py's float64 comparison cannot run them)."""
    from kiln.frontend.tensor import dispatch
    from kiln.ir.registry import REGISTRY, OpOverload
    from tests.ir.samples import SAMPLES
    from tests.torch_oracle import to_torch

    opdef = REGISTRY[name]
    differentiable = {"self"} | ({"scale", "zero_point"} if "learnable" in name else set())
    names = [argument.name for argument in opdef.schema.arguments]
    compared = 0
    for sample in SAMPLES[name](np.random.default_rng(0)):
        arrays = [a for a in sample.args if isinstance(a, np.ndarray) and dtypes.dtype(a.dtype).is_floating_point]
        if any(a.dtype != np.float32 for a in arrays):
            continue
        wants = [argument in differentiable for argument in names[:len(sample.args)]]
        kiln_args = [kiln.tensor(a, requires_grad=w) if isinstance(a, np.ndarray) else a
                     for a, w in zip(sample.args, wants)]
        torch_args = [to_torch(a).requires_grad_(w) if isinstance(a, np.ndarray) else a
                      for a, w in zip(sample.args, wants)]
        result = dispatch(OpOverload(opdef), *kiln_args)
        expected = getattr(getattr(torch.ops.aten, name.split(".")[1]), name.split(".")[2])(*torch_args)
        _exact(result, expected, f"{name} {sample}: output")
        cotangent = np.random.default_rng(1).standard_normal(expected.shape).astype(F32)
        inputs = [a for a, w in zip(kiln_args, wants) if w]
        torch_inputs = [a for a, w in zip(torch_args, wants) if w]
        grads = kiln.autograd.grad([result], inputs, [kiln.tensor(cotangent)])
        torch_grads = torch.autograd.grad([expected], torch_inputs, [torch.from_numpy(cotangent)])
        for index, (mine, theirs) in enumerate(zip(grads, torch_grads)):
            _exact(mine, theirs, f"{name} {sample}: gradient of {[n for n, w in zip(names, wants) if w][index]}")
        compared += 1
    assert compared >= 2


def _fma_ties(inverse: np.float32, zero_point: np.float32, count: int) -> np.ndarray:
    """Inputs where rounding `x * inverse + zero_point` once (an FMA) and twice give different integers."""
    rng = np.random.default_rng(6)
    found = []
    while len(found) < count:
        x = rng.uniform(-4, 4, 2_000_000).astype(F32)
        twice = np.rint(x * inverse + zero_point)
        once = np.rint((x.astype(np.float64) * np.float64(inverse) + np.float64(zero_point)).astype(F32))
        found.extend(x[twice != once][:count - len(found)])
    return np.array(found, F32)


def test_fused_multiply_adds_round_like_torch():
    """ATen's kernels compute `zero_point + x * inv_scale` with one rounding where the compiler contracts it into an
    FMA (the float-zero-point per-channel forward, the learnable backward): kiln rounds there once too."""
    scale = F32(0.0371)
    inverse = F32(1) / scale
    x = _fma_ties(inverse, F32(17.3), 4)
    ours = kiln.ops.aten.fake_quantize_per_channel_affine.default(x[None], np.array([scale]), np.array([17.3], F32),
                                                                   0, 0, 255)
    theirs = torch.fake_quantize_per_channel_affine(torch.from_numpy(x[None]), torch.tensor([scale]),
                                                    torch.tensor([17.3]), 0, 0, 255)
    _exact(ours, theirs, "per-channel forward, float zero point")
    x = _fma_ties(inverse, F32(130), 4)
    grad = np.ones_like(x)
    ours = kiln.ops.aten._fake_quantize_learnable_per_tensor_affine_backward.default(
        grad, x, np.array([scale]), np.array([130.0], F32), 0, 255)
    theirs = torch.ops.aten._fake_quantize_learnable_per_tensor_affine_backward(
        torch.from_numpy(grad), torch.from_numpy(x), torch.tensor([scale]), torch.tensor([130.0]), 0, 255)
    for mine, reference in zip(ours, theirs):
        _exact(mine, reference, "learnable per-tensor backward")
