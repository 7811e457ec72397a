"""kiln.nn.functional's losses and kiln.nn's loss modules against torch: one table of calls, each written once as
a function of the `F` namespace; the value and the gradients kiln's autograd gives (input, and target where torch
differentiates it) are compared in float32, and a sample of the calls is exported with a dynamic batch dim.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pytest

import kiln
import kiln.nn.functional as KF
from kiln.ir.errors import KilnError
from tests.modules import FunctionModule
from tests.torch_oracle import requires_torch, torch

pytestmark = requires_torch
TF = None if torch is None else torch.nn.functional


@dataclass(frozen=True)
class Normal:
    shape: tuple[int, ...]
    scale: float = 1.0


@dataclass(frozen=True)
class Uniform:
    shape: tuple[int, ...]
    low: float
    high: float


@dataclass(frozen=True)
class Classes:
    """int64 class indices in [0, high); every third position (from the second) holds `ignore` when given."""
    shape: tuple[int, ...]
    high: int
    ignore: int | None = None


@dataclass(frozen=True)
class Fixed:
    values: Any
    dtype: str = "float32"


@dataclass
class Case:
    name: str
    fn: Callable[..., Any]  # (F, *inputs) -> loss
    inputs: list[Any]
    grads: tuple[int, ...] = (0,)  # the inputs whose gradients are compared
    batched: tuple[int, ...] = ()  # inputs whose dim 0 is the batch, when exported with a dynamic batch
    extra: dict[str, Any] = field(default_factory=dict)


def _array(spec: Any, rng: np.random.Generator, batch: int | None = None, batched: bool = False) -> np.ndarray:
    if isinstance(spec, Fixed):
        return np.array(spec.values, dtype=spec.dtype)
    shape = spec.shape if batch is None or not batched else (batch, *spec.shape[1:])
    if isinstance(spec, Normal):
        return (rng.standard_normal(shape) * spec.scale).astype(np.float32)
    if isinstance(spec, Uniform):
        return rng.uniform(spec.low, spec.high, shape).astype(np.float32)
    values = rng.integers(0, spec.high, shape).astype(np.int64)
    if spec.ignore is not None:
        values.reshape(-1)[1::3] = spec.ignore
    return values


def _arrays(case: Case, batch: int | None = None, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [_array(spec, rng, batch, index in case.batched) for index, spec in enumerate(case.inputs)]


X = Normal((4, 5))
CLASSES = Classes((4,), 5)
IGNORING = Classes((4,), 5, ignore=-100)
IGNORING_2 = Classes((6,), 5, ignore=2)  # ignore_index may be a real class
WEIGHT = Uniform((5,), 0.5, 2.0)
PROBS = Uniform((4, 5), 0.02, 0.98)
# Errors exactly at 0 and at the kink (|x - t| == 1 == beta == delta) and on both sides of it.
KINK_INPUT = Fixed((0.0, 1.0, -1.0, 0.5, -0.25, 2.0, -3.0))
KINK_TARGET = Fixed((0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0))

CASES = [
    # cross_entropy: class indices
    Case("ce_mean", lambda F, x, t: F.cross_entropy(x, t), [X, CLASSES], batched=(0, 1)),
    Case("ce_sum", lambda F, x, t: F.cross_entropy(x, t, reduction="sum"), [X, CLASSES]),
    Case("ce_none", lambda F, x, t: F.cross_entropy(x, t, reduction="none"), [X, CLASSES]),
    Case("ce_legacy_size_average", lambda F, x, t: F.cross_entropy(x, t, size_average=False), [X, CLASSES]),
    Case("ce_ignore_mean", lambda F, x, t: F.cross_entropy(x, t), [X, IGNORING]),
    Case("ce_ignore_real_class", lambda F, x, t: F.cross_entropy(x, t, ignore_index=2), [Normal((6, 5)), IGNORING_2]),
    Case("ce_weight_ignore_mean", lambda F, x, t, w: F.cross_entropy(x, t, w), [X, IGNORING, WEIGHT],
         batched=(0, 1)),
    Case("ce_weight_ignore_sum", lambda F, x, t, w: F.cross_entropy(x, t, w, reduction="sum"),
         [X, IGNORING, WEIGHT]),
    Case("ce_weight_ignore_none", lambda F, x, t, w: F.cross_entropy(x, t, w, reduction="none"),
         [X, IGNORING, WEIGHT]),
    Case("ce_smoothing_mean", lambda F, x, t: F.cross_entropy(x, t, label_smoothing=0.2), [X, CLASSES]),
    Case("ce_smoothing_ignore_mean", lambda F, x, t: F.cross_entropy(x, t, label_smoothing=0.3), [X, IGNORING]),
    Case("ce_smoothing_weight_ignore_mean",
         lambda F, x, t, w: F.cross_entropy(x, t, w, label_smoothing=0.25), [X, IGNORING, WEIGHT],
         batched=(0, 1)),
    Case("ce_smoothing_weight_ignore_sum",
         lambda F, x, t, w: F.cross_entropy(x, t, w, reduction="sum", label_smoothing=0.1), [X, IGNORING, WEIGHT]),
    Case("ce_smoothing_weight_ignore_none",
         lambda F, x, t, w: F.cross_entropy(x, t, w, reduction="none", label_smoothing=0.1), [X, IGNORING, WEIGHT]),
    Case("ce_smoothing_full", lambda F, x, t: F.cross_entropy(x, t, label_smoothing=1.0), [X, CLASSES]),
    Case("ce_kdim_mean", lambda F, x, t: F.cross_entropy(x, t), [Normal((2, 4, 3, 2)), Classes((2, 3, 2), 4)],
         batched=(0, 1)),
    Case("ce_kdim_weight_ignore_smoothing_mean",
         lambda F, x, t, w: F.cross_entropy(x, t, w, label_smoothing=0.2),
         [Normal((2, 4, 3, 2)), Classes((2, 3, 2), 4, ignore=-100), Uniform((4,), 0.5, 2.0)]),
    Case("ce_kdim_none", lambda F, x, t: F.cross_entropy(x, t, reduction="none", label_smoothing=0.1),
         [Normal((2, 4, 3)), Classes((2, 3), 4, ignore=-100)]),
    Case("ce_unbatched", lambda F, x, t: F.cross_entropy(x, t), [Normal((5,)), Fixed(3, "int64")]),
    Case("ce_unbatched_weight_smoothing", lambda F, x, t, w: F.cross_entropy(x, t, w, label_smoothing=0.2),
         [Normal((5,)), Fixed(3, "int64"), WEIGHT]),
    Case("ce_large_logits", lambda F, x, t: F.cross_entropy(x, t), [Normal((4, 5), scale=40.0), CLASSES]),
    # cross_entropy: class probabilities
    Case("ce_probs_mean", lambda F, x, p: F.cross_entropy(x, p), [X, PROBS], grads=(0, 1), batched=(0, 1)),
    Case("ce_probs_sum", lambda F, x, p: F.cross_entropy(x, p, reduction="sum"), [X, PROBS], grads=(0, 1)),
    Case("ce_probs_none", lambda F, x, p: F.cross_entropy(x, p, reduction="none"), [X, PROBS], grads=(0, 1)),
    Case("ce_probs_weight_smoothing_mean", lambda F, x, p, w: F.cross_entropy(x, p, w, label_smoothing=0.3),
         [X, PROBS, WEIGHT], grads=(0, 1)),
    Case("ce_probs_kdim_weight_none", lambda F, x, p, w: F.cross_entropy(x, p, w, reduction="none"),
         [Normal((2, 5, 3)), Uniform((2, 5, 3), 0.0, 1.0), WEIGHT], grads=(0, 1)),
    Case("ce_probs_unbatched", lambda F, x, p: F.cross_entropy(x, p, label_smoothing=0.1),
         [Normal((5,)), Uniform((5,), 0.0, 1.0)], grads=(0, 1)),
    # nll_loss
    Case("nll_mean", lambda F, x, t: F.nll_loss(x, t), [X, CLASSES], batched=(0, 1)),
    Case("nll_sum", lambda F, x, t: F.nll_loss(x, t, reduction="sum"), [X, IGNORING]),
    Case("nll_none", lambda F, x, t: F.nll_loss(x, t, reduction="none"), [X, IGNORING]),
    Case("nll_weight_ignore_mean", lambda F, x, t, w: F.nll_loss(x, t, w), [X, IGNORING, WEIGHT], batched=(0, 1)),
    Case("nll_weight_ignore_real_class_sum", lambda F, x, t, w: F.nll_loss(x, t, w, ignore_index=2,
                                                                            reduction="sum"),
         [Normal((6, 5)), IGNORING_2, WEIGHT]),
    Case("nll_weight_none", lambda F, x, t, w: F.nll_loss(x, t, w, reduction="none"), [X, IGNORING, WEIGHT]),
    Case("nll_legacy_reduce_false", lambda F, x, t: F.nll_loss(x, t, reduce=False), [X, CLASSES]),
    Case("nll_kdim_weight_mean", lambda F, x, t, w: F.nll_loss(x, t, w),
         [Normal((2, 5, 2, 3)), Classes((2, 2, 3), 5, ignore=-100), WEIGHT], batched=(0, 1)),
    Case("nll_kdim_none", lambda F, x, t: F.nll_loss(x, t, reduction="none"),
         [Normal((2, 5, 4)), Classes((2, 4), 5)]),
    Case("nll_unbatched", lambda F, x, t: F.nll_loss(x, t), [Normal((5,)), Fixed(4, "int64")]),
    Case("nll_of_log_softmax", lambda F, x, t: F.nll_loss(F.log_softmax(x, 1), t), [X, IGNORING]),
    # mse / l1 / smooth_l1 / huber
    *[Case(f"{name}_{reduction}", (lambda name, reduction: lambda F, x, y: getattr(F, name)(
        x, y, reduction=reduction))(name, reduction), [X, X], grads=(0, 1), batched=(0, 1))
      for name in ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss") for reduction in ("mean", "sum", "none")],
    Case("mse_loss_broadcast_target", lambda F, x, y: F.mse_loss(x, y), [X, Normal((5,))], grads=(0, 1)),
    Case("mse_loss_weight_mean", lambda F, x, y, w: F.mse_loss(x, y, weight=w), [X, X, Uniform((4, 5), 0.1, 2.0)],
         grads=(0, 1)),
    Case("mse_loss_weight_none", lambda F, x, y, w: F.mse_loss(x, y, reduction="none", weight=w),
         [X, X, Uniform((4, 5), 0.1, 2.0)], grads=(0, 1)),
    Case("mse_loss_legacy_reduce_false", lambda F, x, y: F.mse_loss(x, y, reduce=False), [X, X], grads=(0, 1)),
    Case("l1_loss_broadcast_input", lambda F, x, y: F.l1_loss(x, y, reduction="sum"), [Normal((3, 1)), Normal((3, 4))],
         grads=(0, 1)),
    Case("l1_loss_weight_mean", lambda F, x, y, w: F.l1_loss(x, y, weight=w), [X, X, Uniform((4, 5), 0.1, 2.0)],
         grads=(0, 1)),
    Case("l1_loss_legacy_size_average", lambda F, x, y: F.l1_loss(x, y, size_average=False), [X, X], grads=(0, 1)),
    Case("l1_loss_at_zero", lambda F, x, y: F.l1_loss(x, y, reduction="sum"), [KINK_INPUT, KINK_TARGET],
         grads=(0, 1)),
    Case("smooth_l1_loss_beta", lambda F, x, y: F.smooth_l1_loss(x, y, beta=0.5), [X, X], grads=(0, 1)),
    Case("smooth_l1_loss_beta_zero", lambda F, x, y: F.smooth_l1_loss(x, y, beta=0.0), [X, X], grads=(0, 1)),
    Case("smooth_l1_loss_kinks", lambda F, x, y: F.smooth_l1_loss(x, y, reduction="sum"), [KINK_INPUT, KINK_TARGET],
         grads=(0, 1)),
    Case("smooth_l1_loss_broadcast", lambda F, x, y: F.smooth_l1_loss(x, y, beta=2.0), [X, Normal((5,))],
         grads=(0, 1)),
    Case("smooth_l1_loss_legacy", lambda F, x, y: F.smooth_l1_loss(x, y, size_average=True, reduce=False), [X, X],
         grads=(0, 1)),
    Case("huber_loss_delta", lambda F, x, y: F.huber_loss(x, y, delta=0.5), [X, X], grads=(0, 1)),
    Case("huber_loss_delta_large", lambda F, x, y: F.huber_loss(x, y, reduction="sum", delta=2.5), [X, X],
         grads=(0, 1)),
    Case("huber_loss_kinks", lambda F, x, y: F.huber_loss(x, y, reduction="sum"), [KINK_INPUT, KINK_TARGET],
         grads=(0, 1)),
    Case("huber_loss_weight_mean", lambda F, x, y, w: F.huber_loss(x, y, delta=0.7, weight=w),
         [X, X, Uniform((4, 5), 0.1, 2.0)], grads=(0, 1)),
    Case("huber_loss_weight_sum", lambda F, x, y, w: F.huber_loss(x, y, reduction="sum", weight=w),
         [X, X, Uniform((4, 5), 0.1, 2.0)], grads=(0, 1)),
    # binary_cross_entropy
    *[Case(f"bce_{reduction}", (lambda reduction: lambda F, p, t: F.binary_cross_entropy(
        p, t, reduction=reduction))(reduction), [PROBS, Uniform((4, 5), 0.0, 1.0)], grads=(0, 1), batched=(0, 1))
      for reduction in ("mean", "sum", "none")],
    Case("bce_weight_broadcast", lambda F, p, t, w: F.binary_cross_entropy(p, t, w), [PROBS, PROBS, WEIGHT],
         grads=(0, 1)),
    Case("bce_weight_full_none", lambda F, p, t, w: F.binary_cross_entropy(p, t, w, reduction="none"),
         [PROBS, PROBS, Uniform((4, 5), 0.1, 2.0)], grads=(0, 1)),
    Case("bce_legacy_sum", lambda F, p, t: F.binary_cross_entropy(p, t, size_average=False), [PROBS, PROBS],
         grads=(0, 1)),
    Case("bce_hard_targets", lambda F, p, t: F.binary_cross_entropy(p, t), [PROBS, Fixed(((0.0,) * 5, (1.0,) * 5,
                                                                                         (0.0,) * 5, (1.0,) * 5))],
         grads=(0,)),
    # the logs clamp at -100: probabilities of exactly 0 and 1 cost at most 100 (values only, see the report test)
    Case("bce_clamped_logs", lambda F, p, t: F.binary_cross_entropy(p, t, reduction="none"),
         [Fixed((0.0, 1.0, 0.0, 1.0, 1e-30)), Fixed((1.0, 0.0, 0.5, 0.5, 1.0))], grads=()),
    # binary_cross_entropy_with_logits
    *[Case(f"bce_logits_{reduction}", (lambda reduction: lambda F, x, t: F.binary_cross_entropy_with_logits(
        x, t, reduction=reduction))(reduction), [X, Uniform((4, 5), 0.0, 1.0)], grads=(0, 1), batched=(0, 1))
      for reduction in ("mean", "sum", "none")],
    Case("bce_logits_weight_pos_weight", lambda F, x, t, w, pw: F.binary_cross_entropy_with_logits(
        x, t, w, pos_weight=pw), [X, Uniform((4, 5), 0.0, 1.0), Uniform((4, 1), 0.5, 2.0), WEIGHT], grads=(0, 1),
        batched=(0, 1, 2)),
    Case("bce_logits_pos_weight_none", lambda F, x, t, pw: F.binary_cross_entropy_with_logits(
        x, t, reduction="none", pos_weight=pw), [X, Uniform((4, 5), 0.0, 1.0), WEIGHT], grads=(0, 1)),
    Case("bce_logits_legacy_reduce_false", lambda F, x, t: F.binary_cross_entropy_with_logits(x, t, reduce=False),
         [X, Uniform((4, 5), 0.0, 1.0)], grads=(0, 1)),
    # large logits stay finite, and x = 0 takes torch's gradient (sigmoid(0) - t)
    Case("bce_logits_extremes", lambda F, x, t, pw: F.binary_cross_entropy_with_logits(
        x, t, reduction="sum", pos_weight=pw),
        [Fixed((-200.0, -100.0, -30.0, 0.0, 0.0, 30.0, 100.0, 200.0)), Fixed((1.0, 0.0, 0.3, 1.0, 0.2, 0.0, 1.0, 0.6)),
         Fixed((1.5,))], grads=(0, 1)),
    # kl_div
    *[Case(f"kl_div_{reduction}", (lambda reduction: lambda F, x, t: F.kl_div(x, t, reduction=reduction))(
        reduction), [X, Uniform((4, 5), 0.05, 1.0)], grads=(0, 1), batched=(0, 1))
      for reduction in ("mean", "sum", "none", "batchmean")],
    *[Case(f"kl_div_log_target_{reduction}", (lambda reduction: lambda F, x, t: F.kl_div(
        x, t, reduction=reduction, log_target=True))(reduction), [X, X], grads=(0, 1))
      for reduction in ("mean", "sum", "none", "batchmean")],
    Case("kl_div_of_log_softmax_batchmean", lambda F, x, t: F.kl_div(F.log_softmax(x, 1), F.softmax(t, 1),
                                                                    reduction="batchmean"), [X, X], grads=(0, 1)),
    # zero targets contribute 0 (xlogy), and their input gradient is 0
    Case("kl_div_zero_targets", lambda F, x, t: F.kl_div(x, t, reduction="sum"),
         [Normal((2, 3)), Fixed(((0.0, 0.5, 0.5), (1.0, 0.0, 0.0)))], grads=(0,)),
    Case("kl_div_batchmean_0d", lambda F, x, t: F.kl_div(x, t, reduction="batchmean"),
         [Normal(()), Uniform((), 0.1, 1.0)], grads=(0, 1)),
    Case("kl_div_legacy_size_average_false", lambda F, x, t: F.kl_div(x, t, size_average=False),
         [X, Uniform((4, 5), 0.05, 1.0)], grads=(0, 1)),
]
CASE_IDS = [case.name for case in CASES]


def _run(lib: Any, case: Case, arrays: list[np.ndarray]) -> tuple[Any, list[Any]]:
    """The loss and the tensors made from `arrays` (those in case.grads require grad)."""
    if lib is kiln:
        tensors = [kiln.tensor(a, requires_grad=i in case.grads) for i, a in enumerate(arrays)]
        namespace = KF
    else:
        tensors = [torch.tensor(a, requires_grad=i in case.grads) for i, a in enumerate(arrays)]
        namespace = TF
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's and kiln's broadcasting and kl_div 'mean' warnings
        return case.fn(namespace, *tensors), tensors


def _close(actual: Any, expected: Any, what: str) -> None:
    torch.testing.assert_close(torch.from_numpy(np.array(actual.numpy())), expected.detach(),
                               msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_value_matches_torch(case):
    arrays = _arrays(case)
    with kiln.no_grad():
        actual, _ = _run(kiln, case, arrays)
    expected, _ = _run(torch, case, arrays)
    _close(actual, expected, "loss")


@pytest.mark.parametrize("case", [c for c in CASES if c.grads], ids=lambda c: c.name)
def test_gradients_match_torch_autograd(case):
    """loss.backward() (with a fixed upstream gradient for unreduced losses) fills the same .grad as torch."""
    arrays = _arrays(case)
    loss, tensors = _run(kiln, case, arrays)
    expected_loss, torch_tensors = _run(torch, case, arrays)
    _close(loss, expected_loss, "loss")
    upstream = np.random.default_rng(1).uniform(0.5, 1.5, tuple(expected_loss.shape)).astype(np.float32)
    if expected_loss.dim() == 0:
        loss.backward()
        expected_loss.backward()
    else:
        loss.backward(kiln.tensor(upstream))
        expected_loss.backward(torch.from_numpy(upstream))
    for index in case.grads:
        assert tensors[index].grad is not None, f"input {index} got no gradient"
        _close(tensors[index].grad, torch_tensors[index].grad, f"gradient of input {index}")


def test_gradient_of_a_reduced_loss_is_scaled_like_torch():
    """autograd.grad with an explicit upstream gradient, and a second backward accumulating into .grad."""
    arrays = _arrays(CASES[CASE_IDS.index("ce_smoothing_weight_ignore_mean")])
    x = kiln.tensor(arrays[0], requires_grad=True)
    tx = torch.tensor(arrays[0], requires_grad=True)
    args = [kiln.tensor(a) for a in arrays[1:]]
    torch_args = [torch.from_numpy(a) for a in arrays[1:]]
    (grad,) = kiln.autograd.grad(KF.cross_entropy(x, *args, label_smoothing=0.25), x, kiln.tensor(np.float32(3.0)))
    (expected,) = torch.autograd.grad(TF.cross_entropy(tx, *torch_args, label_smoothing=0.25), tx,
                                      torch.tensor(3.0))
    _close(grad, expected, "autograd.grad")
    for _ in range(2):
        KF.cross_entropy(x, *args, label_smoothing=0.25).backward()
        TF.cross_entropy(tx, *torch_args, label_smoothing=0.25).backward()
    _close(x.grad, tx.grad, "accumulated .grad")


def test_all_targets_ignored_gives_nan_like_torch():
    """'mean' over no counted target is 0 / 0, as in torch."""
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    t = np.full(3, -100, np.int64)
    assert np.isnan(KF.cross_entropy(kiln.tensor(x), kiln.tensor(t)).item())
    assert np.isnan(TF.cross_entropy(torch.from_numpy(x), torch.from_numpy(t)).item())
    assert np.isnan(KF.nll_loss(kiln.tensor(x), kiln.tensor(t)).item())
    assert KF.nll_loss(kiln.tensor(x), kiln.tensor(t), reduction="sum").item() == 0.0


def test_binary_cross_entropy_gradient_is_finite_at_certain_predictions():
    """At probabilities of exactly 0 and 1 the clamped logs have no derivative; kiln's gradient there is finite
    (the derivative of the unclamped term), as torch's is. Their values differ: torch divides by
    max(x (1 - x), 1e-12) instead."""
    p = kiln.tensor(np.array([0.0, 1.0, 0.0, 1.0], np.float32), requires_grad=True)
    t = kiln.tensor(np.array([0.0, 1.0, 0.25, 0.75], np.float32))
    loss = KF.binary_cross_entropy(p, t, reduction="sum")
    expected = TF.binary_cross_entropy(torch.from_numpy(p.numpy()), torch.from_numpy(t.numpy()), reduction="sum")
    _close(loss, expected, "loss")  # 0.25 * 100 + 0.25 * 100
    loss.backward()
    np.testing.assert_allclose(p.grad.numpy(), [1.0, -1.0, 0.75, -0.75])


def test_byte_targets_are_class_indices():
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    t = np.array([0, 3, 1], np.uint8)
    _close(KF.cross_entropy(kiln.tensor(x), kiln.tensor(t)), TF.cross_entropy(torch.from_numpy(x),
                                                                             torch.from_numpy(t)), "loss")


# ---------------------------------------------------------------------------------------------
# Export: the losses are compositions of core ops, so they trace like any other code


@pytest.mark.parametrize("case", [c for c in CASES if c.batched], ids=lambda c: c.name)
def test_export_with_dynamic_batch_matches_eager(case):
    module = FunctionModule(case.fn)
    batch = kiln.Dim("batch")
    arrays = _arrays(case, batch=3)
    dynamic_shapes = tuple({0: batch} if i in case.batched else None for i in range(len(arrays)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = kiln.export(module, tuple(kiln.tensor(a) for a in arrays), dynamic_shapes=dynamic_shapes)
        for size in (3, 2, 5):
            arrays = _arrays(case, batch=size, seed=size)
            eager = module(*[kiln.tensor(a) for a in arrays])
            exported = program(*[kiln.tensor(a) for a in arrays])
            assert exported.dtype == eager.dtype
            torch.testing.assert_close(torch.from_numpy(np.array(exported.numpy())),
                                       torch.from_numpy(np.array(eager.numpy())))


def test_exported_losses_contain_only_core_ops():
    case = CASES[CASE_IDS.index("ce_smoothing_weight_ignore_mean")]
    program = kiln.export(FunctionModule(case.fn), tuple(kiln.tensor(a) for a in _arrays(case)))
    names = {op.name for op in program.body.ops if op.name.startswith("aten.")}
    assert "aten._log_softmax.default" in names or "aten.log_softmax.int" in names
    assert "aten.gather.default" in names


# ---------------------------------------------------------------------------------------------
# Modules


@dataclass
class ModuleCase:
    name: str
    build: Callable[[Any, Callable[[np.ndarray], Any]], Any]  # (nn, as_tensor) -> module
    inputs: list[Any]
    grads: tuple[int, ...] = (0,)


_W = np.array([0.5, 1.0, 2.0, 1.5, 0.75], np.float32)

MODULE_CASES = [
    ModuleCase("CrossEntropyLoss", lambda nn, T: nn.CrossEntropyLoss(), [X, CLASSES]),
    ModuleCase("CrossEntropyLoss_options", lambda nn, T: nn.CrossEntropyLoss(
        weight=T(_W), ignore_index=1, reduction="sum", label_smoothing=0.1), [X, CLASSES]),
    ModuleCase("CrossEntropyLoss_probabilities", lambda nn, T: nn.CrossEntropyLoss(label_smoothing=0.2),
               [X, PROBS], grads=(0, 1)),
    ModuleCase("CrossEntropyLoss_legacy", lambda nn, T: nn.CrossEntropyLoss(size_average=False), [X, IGNORING]),
    ModuleCase("NLLLoss", lambda nn, T: nn.NLLLoss(), [X, CLASSES]),
    ModuleCase("NLLLoss_options", lambda nn, T: nn.NLLLoss(T(_W), ignore_index=0, reduction="none"),
               [Normal((2, 5, 3)), Classes((2, 3), 5)]),
    ModuleCase("MSELoss", lambda nn, T: nn.MSELoss(), [X, X], grads=(0, 1)),
    ModuleCase("MSELoss_legacy", lambda nn, T: nn.MSELoss(reduce=False), [X, X], grads=(0, 1)),
    ModuleCase("L1Loss", lambda nn, T: nn.L1Loss(reduction="sum"), [X, X], grads=(0, 1)),
    ModuleCase("SmoothL1Loss", lambda nn, T: nn.SmoothL1Loss(beta=0.5), [X, X], grads=(0, 1)),
    ModuleCase("HuberLoss", lambda nn, T: nn.HuberLoss(reduction="none", delta=0.5), [X, X], grads=(0, 1)),
    ModuleCase("BCELoss", lambda nn, T: nn.BCELoss(), [PROBS, PROBS], grads=(0, 1)),
    ModuleCase("BCELoss_weight", lambda nn, T: nn.BCELoss(weight=T(_W), reduction="sum"), [PROBS, PROBS]),
    ModuleCase("BCEWithLogitsLoss", lambda nn, T: nn.BCEWithLogitsLoss(), [X, PROBS], grads=(0, 1)),
    ModuleCase("BCEWithLogitsLoss_weights", lambda nn, T: nn.BCEWithLogitsLoss(
        weight=T(_W), pos_weight=T(_W[::-1].copy())), [X, PROBS], grads=(0, 1)),
    ModuleCase("KLDivLoss", lambda nn, T: nn.KLDivLoss(reduction="batchmean"), [X, PROBS], grads=(0, 1)),
    ModuleCase("KLDivLoss_log_target", lambda nn, T: nn.KLDivLoss(reduction="sum", log_target=True), [X, X],
               grads=(0, 1)),
]
MODULE_IDS = [case.name for case in MODULE_CASES]


def _module_pair(case: ModuleCase) -> tuple[Any, Any]:
    return (case.build(kiln.nn, lambda a: kiln.tensor(a)),
            case.build(torch.nn, lambda a: torch.from_numpy(np.array(a))))


@pytest.mark.parametrize("case", MODULE_CASES, ids=MODULE_IDS)
def test_module_matches_torch(case):
    module, torch_module = _module_pair(case)
    assert repr(module) == repr(torch_module)
    assert module.reduction == torch_module.reduction
    assert list(module.state_dict()) == list(torch_module.state_dict())
    arrays = _arrays(Case(case.name, lambda F, *a: None, case.inputs))
    tensors = [kiln.tensor(a, requires_grad=i in case.grads) for i, a in enumerate(arrays)]
    torch_tensors = [torch.tensor(a, requires_grad=i in case.grads) for i, a in enumerate(arrays)]
    loss, expected = module(*tensors), torch_module(*torch_tensors)
    _close(loss, expected, "loss")
    if expected.dim() == 0:
        loss.backward()
        expected.backward()
    else:
        loss.sum().backward()
        expected.sum().backward()
    for index in case.grads:
        _close(tensors[index].grad, torch_tensors[index].grad, f"gradient of input {index}")


def test_loss_module_weight_is_a_buffer_and_loads_from_torch():
    torch_module = torch.nn.BCEWithLogitsLoss(weight=torch.ones(5), pos_weight=torch.full((5,), 2.0))
    module = kiln.nn.BCEWithLogitsLoss(weight=kiln.ones(5), pos_weight=kiln.ones(5))
    module.load_state_dict(torch_module.state_dict())
    assert [name for name, _ in module.named_buffers()] == ["weight", "pos_weight"]
    assert list(module.parameters()) == []
    np.testing.assert_array_equal(module.pos_weight.numpy(), np.full(5, 2.0, np.float32))


def test_loss_modules_in_a_training_step():
    """A Linear layer trained one step on CrossEntropyLoss: the same parameter gradients as torch."""
    torch.manual_seed(0)
    torch_layer = torch.nn.Linear(5, 3)
    layer = kiln.nn.Linear(5, 3)
    layer.load_state_dict(torch_layer.state_dict())
    rng = np.random.default_rng(0)
    x, t = rng.standard_normal((6, 5)).astype(np.float32), rng.integers(0, 3, 6)
    kiln.nn.CrossEntropyLoss(label_smoothing=0.1)(layer(kiln.tensor(x)), kiln.tensor(t)).backward()
    torch.nn.CrossEntropyLoss(label_smoothing=0.1)(torch_layer(torch.from_numpy(x)), torch.from_numpy(t)).backward()
    for (name, param), (_, expected) in zip(layer.named_parameters(), torch_layer.named_parameters()):
        _close(param.grad, expected.grad, f"gradient of {name}")


# ---------------------------------------------------------------------------------------------
# Errors


def _t(*values: Any, dtype: Any = None) -> Any:
    return kiln.tensor(np.array(values), dtype=dtype)


@pytest.mark.parametrize("call, error, match", [
    (lambda: KF.cross_entropy(kiln.zeros(3, 5), _t(0, 1, 7)), IndexError, "Target 7 is out of bounds"),
    (lambda: KF.cross_entropy(kiln.zeros(3, 5), _t(0, -1, 2)), IndexError, "Target -1 is out of bounds"),
    (lambda: KF.nll_loss(kiln.zeros(3, 5), _t(0, 1)), ValueError, r"Expected input batch_size \(3\) to match "
                                                                  r"target batch_size \(2\)"),
    (lambda: KF.nll_loss(kiln.zeros(3, 5, 2), kiln.zeros(3, 5, dtype=kiln.int64)), ValueError,
     r"Expected target size \[3, 2\], got \[3, 5\]"),
    (lambda: KF.nll_loss(kiln.zeros(3, 5), _t(0, 1, 2), weight=kiln.ones(4)), ValueError,
     "weight tensor should be defined either for all 5 classes"),
    (lambda: KF.nll_loss(kiln.zeros(3, 5), _t(0, 1, 2, dtype=kiln.int32)), TypeError,
     "expected target dtype to be Long or Byte, but got int32"),
    (lambda: KF.nll_loss(kiln.tensor(1.0), _t(0)), ValueError, "Expected 1 or more dimensions"),
    (lambda: KF.cross_entropy(kiln.zeros(3, 5), kiln.zeros(3, 5, dtype=kiln.int64)), TypeError,
     "Expected floating point type for target with class probabilities"),
    (lambda: KF.cross_entropy(kiln.zeros(3, 5), kiln.zeros(3, 5), ignore_index=1), ValueError,
     "ignore_index is not supported for floating point target"),
    (lambda: KF.cross_entropy(kiln.zeros(3, 5), _t(0, 1, 2), label_smoothing=1.5), ValueError,
     "label_smoothing must be between 0.0 and 1.0"),
    (lambda: KF.cross_entropy(kiln.zeros(3, 5), _t(0, 1, 2), reduction="avg"), ValueError,
     "avg is not a valid value for reduction"),
    (lambda: KF.kl_div(kiln.zeros(3), kiln.zeros(3), reduction="batch"), ValueError, "not a valid value"),
    (lambda: KF.smooth_l1_loss(kiln.zeros(3), kiln.zeros(3), beta=-1.0), ValueError,
     "does not support negative values for beta"),
    (lambda: KF.huber_loss(kiln.zeros(3), kiln.zeros(3), delta=0.0), ValueError,
     "does not support non-positive values for delta"),
    (lambda: KF.mse_loss(kiln.zeros(3), kiln.zeros(3), weight=kiln.ones(2)), ValueError,
     "Weights and input must have the same size"),
    (lambda: KF.binary_cross_entropy(kiln.full((3,), 0.5), kiln.zeros(2)), ValueError,
     "different to the input size"),
    (lambda: KF.binary_cross_entropy(_t(0.5, 1.5), kiln.zeros(2)), ValueError,
     "all elements of input should be between 0 and 1"),
    (lambda: KF.binary_cross_entropy(_t(0.5, float("nan")), kiln.zeros(2)), ValueError,
     "all elements of input should be between 0 and 1"),
    (lambda: KF.binary_cross_entropy(_t(0.5, 0.5), _t(0.0, 2.0)), ValueError,
     "all elements of target should be between 0 and 1"),
    (lambda: KF.binary_cross_entropy_with_logits(kiln.zeros(3), kiln.zeros(2)), ValueError,
     "must be the same as input size"),
])
def test_errors(call, error, match):
    with pytest.raises(error, match=match) as info:
        call()
    assert isinstance(info.value, KilnError)


def test_broadcast_target_warns_like_torch():
    with pytest.warns(UserWarning, match="different to the input size"):
        KF.mse_loss(kiln.zeros(3, 2), kiln.zeros(2))
    with pytest.warns(UserWarning, match="'batchmean' divides only by the batch size"):
        KF.kl_div(kiln.zeros(3), kiln.zeros(3))


def test_every_loss_module_is_in_the_table():
    covered = {type(case.build(kiln.nn, kiln.tensor)).__name__ for case in MODULE_CASES}
    assert covered == {name for name in kiln.nn.layers.__all__ if name.endswith("Loss")}
