"""kiln.nn.functional against torch.nn.functional: one table of calls, each written once as a function of the
`F` namespace and run on both; every deterministic call is also exported with a dynamic batch dim and
checked against eager kiln at three batch sizes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pytest

import kiln
import kiln.nn.functional as KF
from tests.modules import FunctionModule
from kiln.ir.errors import KilnError

torch = pytest.importorskip("torch")
TF = torch.nn.functional


@dataclass(frozen=True)
class Int:
    """An integer input drawn from [low, high)."""
    shape: tuple[int, ...]
    high: int
    low: int = 0


@dataclass(frozen=True)
class Bool:
    shape: tuple[int, ...]


@dataclass
class Call:
    name: str
    fn: Callable[..., Any]  # (F, *inputs) -> output
    inputs: list[Any]  # float shapes, Int(...) or Bool(...)
    batched: tuple[int, ...] = (0,)  # inputs whose dim 0 is the batch (dynamic when exported)
    export: bool = True
    positive: bool = False  # float inputs drawn from (0.5, 1.5) instead of N(0, 1)


CALLS = [
    Call("linear", lambda F, x, w, b: F.linear(x, w, b), [(3, 5), (4, 5), (4,)]),
    Call("linear_3d_no_bias", lambda F, x, w: F.linear(x, w), [(3, 2, 5), (4, 5)]),
    Call("bilinear", lambda F, a, b, w, bias: F.bilinear(a, b, w, bias), [(3, 2), (3, 4), (5, 2, 4), (5,)],
         batched=(0, 1)),
    Call("conv1d", lambda F, x, w, b: F.conv1d(x, w, b, stride=2, padding=1, dilation=2),
         [(3, 4, 11), (6, 4, 3), (6,)]),
    Call("conv1d_groups", lambda F, x, w: F.conv1d(x, w, groups=2), [(3, 4, 8), (6, 2, 3)]),
    Call("conv1d_same", lambda F, x, w: F.conv1d(x, w, padding="same", dilation=3), [(3, 2, 9), (4, 2, 4)]),
    Call("conv1d_unbatched", lambda F, x, w: F.conv1d(x, w), [(2, 9), (4, 2, 3)], batched=()),
    Call("conv2d", lambda F, x, w, b: F.conv2d(x, w, b, stride=(2, 1), padding=(1, 2)),
         [(3, 2, 7, 6), (4, 2, 3, 3), (4,)]),
    Call("conv2d_same_even_kernel", lambda F, x, w: F.conv2d(x, w, padding="same"), [(3, 2, 6, 5), (3, 2, 4, 2)]),
    Call("conv2d_valid", lambda F, x, w, b: F.conv2d(x, w, b, padding="valid", groups=2),
         [(3, 4, 6, 5), (6, 2, 3, 3), (6,)]),
    Call("conv_transpose1d", lambda F, x, w, b: F.conv_transpose1d(x, w, b, stride=3, padding=1, output_padding=2),
         [(3, 2, 5), (2, 4, 3), (4,)]),
    Call("conv_transpose2d", lambda F, x, w: F.conv_transpose2d(x, w, stride=2, groups=2, dilation=(1, 2)),
         [(3, 4, 3, 4), (4, 1, 3, 2)]),
    Call("max_pool1d", lambda F, x: F.max_pool1d(x, 3, stride=2, padding=1, ceil_mode=True), [(3, 2, 10)]),
    Call("max_pool1d_indices", lambda F, x: F.max_pool1d(x, 2, return_indices=True), [(3, 2, 9)]),
    Call("max_pool2d", lambda F, x: F.max_pool2d(x, (3, 2), dilation=(1, 2)), [(3, 2, 7, 8)]),
    Call("max_pool2d_indices", lambda F, x: F.max_pool2d(x, 3, 2, 1, return_indices=True), [(3, 2, 7, 8)]),
    Call("avg_pool1d", lambda F, x: F.avg_pool1d(x, 4, 3, 2, ceil_mode=True), [(3, 2, 11)]),
    Call("avg_pool2d", lambda F, x: F.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=False),
         [(3, 2, 7, 8)]),
    Call("avg_pool2d_divisor", lambda F, x: F.avg_pool2d(x, 2, divisor_override=3), [(3, 2, 6, 6)]),
    Call("adaptive_avg_pool1d", lambda F, x: F.adaptive_avg_pool1d(x, 3), [(3, 2, 8)]),
    Call("adaptive_avg_pool2d", lambda F, x: F.adaptive_avg_pool2d(x, (None, 3)), [(3, 2, 5, 7)]),
    Call("batch_norm_eval", lambda F, x, m, v, w, b: F.batch_norm(x, m, v, w, b, eps=1e-3),
         [(3, 4, 5), (4,), (4,), (4,), (4,)], positive=True),
    Call("batch_norm_batch_stats", lambda F, x, w, b: F.batch_norm(x, None, None, w, b, training=True),
         [(3, 4, 2, 2), (4,), (4,)]),
    Call("layer_norm", lambda F, x, w, b: F.layer_norm(x, (4, 5), w, b, eps=1e-4), [(3, 2, 4, 5), (4, 5), (4, 5)]),
    Call("layer_norm_no_affine", lambda F, x: F.layer_norm(x, [5]), [(3, 5)]),
    Call("group_norm", lambda F, x, w, b: F.group_norm(x, 3, w, b), [(3, 6, 4), (6,), (6,)]),
    Call("rms_norm", lambda F, x, w: F.rms_norm(x, [5], w), [(3, 2, 5), (5,)]),
    Call("rms_norm_eps", lambda F, x: F.rms_norm(x, (2, 5), eps=1e-2), [(3, 2, 5)]),
    Call("embedding", lambda F, i, w: F.embedding(i, w), [Int((3, 4), 7), (7, 5)]),
    Call("embedding_padding_idx", lambda F, i, w: F.embedding(i, w, padding_idx=-1), [Int((3, 4), 7), (7, 5)]),
    Call("dropout_eval", lambda F, x: F.dropout(x, 0.4, training=False), [(3, 6)]),
    Call("dropout_p0", lambda F, x: F.dropout(x, 0.0), [(3, 6)]),
    Call("dropout_p1", lambda F, x: F.dropout(x, 1.0), [(3, 6)]),
    Call("relu", lambda F, x: F.relu(x), [(3, 6)]),
    Call("relu6", lambda F, x: F.relu6(x * 4), [(3, 6)]),
    Call("leaky_relu", lambda F, x: F.leaky_relu(x, 0.1), [(3, 6)]),
    Call("elu", lambda F, x: F.elu(x, alpha=2.0), [(3, 6)]),
    Call("gelu", lambda F, x: F.gelu(x), [(3, 6)]),
    Call("gelu_tanh", lambda F, x: F.gelu(x, approximate="tanh"), [(3, 6)]),
    Call("silu", lambda F, x: F.silu(x), [(3, 6)]),
    Call("mish", lambda F, x: F.mish(x), [(3, 6)]),
    Call("sigmoid", lambda F, x: F.sigmoid(x), [(3, 6)]),
    Call("tanh", lambda F, x: F.tanh(x), [(3, 6)]),
    Call("hardswish", lambda F, x: F.hardswish(x * 3), [(3, 6)]),
    Call("hardsigmoid", lambda F, x: F.hardsigmoid(x * 3), [(3, 6)]),
    Call("hardtanh", lambda F, x: F.hardtanh(x, -0.3, 0.6), [(3, 6)]),
    Call("softplus", lambda F, x: F.softplus(x * 10, beta=0.5, threshold=3.0), [(3, 6)]),
    Call("logsigmoid", lambda F, x: F.logsigmoid(x * 30), [(3, 6)]),
    Call("softmax", lambda F, x: F.softmax(x, dim=1), [(3, 6)]),
    Call("softmax_dtype", lambda F, x: F.softmax(x, -1, dtype=torch.float64 if F is TF else kiln.float64),
         [(3, 6)]),
    Call("log_softmax", lambda F, x: F.log_softmax(x, dim=0), [(3, 6)]),
    Call("log_softmax_dtype", lambda F, x: F.log_softmax(x, 1, dtype=torch.float64 if F is TF else kiln.float64),
         [(3, 6)]),
    Call("normalize", lambda F, x: F.normalize(x), [(3, 6)]),
    Call("normalize_p1_dim", lambda F, x: F.normalize(x, p=1.0, dim=-1, eps=1e-3), [(3, 2, 6)]),
    Call("cosine_similarity", lambda F, a, b: F.cosine_similarity(a, b), [(3, 6), (3, 6)], batched=(0, 1)),
    Call("cosine_similarity_broadcast", lambda F, a, b: F.cosine_similarity(a, b, dim=-1, eps=1e-6),
         [(3, 2, 6), (2, 6)]),
    Call("pad_constant", lambda F, x: F.pad(x, (1, 2, 0, 1), value=2.5), [(3, 2, 4)]),
    Call("pad_negative", lambda F, x: F.pad(x, (-1, 2)), [(3, 2, 4)]),
    Call("pad_reflect", lambda F, x: F.pad(x, (2, 1), mode="reflect"), [(3, 2, 5)]),
    Call("pad_reflect_2d", lambda F, x: F.pad(x, (1, 1, 2, 0), mode="reflect"), [(3, 2, 4, 5)]),
    Call("pad_replicate", lambda F, x: F.pad(x, (1, 2, 3, 1), mode="replicate"), [(3, 2, 4, 5)]),
    Call("pad_circular", lambda F, x: F.pad(x, (1, 2), mode="circular"), [(3, 2, 5)]),
    Call("interpolate_nearest_scale", lambda F, x: F.interpolate(x, scale_factor=2), [(3, 2, 3, 4)]),
    Call("interpolate_nearest_fractional", lambda F, x: F.interpolate(x, scale_factor=(1.5, 0.5)),
         [(3, 2, 4, 6)]),
    Call("interpolate_nearest_size", lambda F, x: F.interpolate(x, size=(5, 3)), [(3, 2, 3, 4)]),
    Call("interpolate_nearest_1d", lambda F, x: F.interpolate(x, size=7), [(3, 2, 4)]),
    Call("interpolate_bilinear", lambda F, x: F.interpolate(x, size=(5, 7), mode="bilinear"), [(3, 2, 3, 4)]),
    Call("interpolate_bilinear_align", lambda F, x: F.interpolate(x, scale_factor=2, mode="bilinear",
                                                                  align_corners=True), [(3, 2, 3, 4)]),
    Call("interpolate_bilinear_down", lambda F, x: F.interpolate(x, scale_factor=0.5, mode="bilinear"),
         [(3, 2, 6, 8)]),
    Call("interpolate_linear_1d", lambda F, x: F.interpolate(x, scale_factor=2.5, mode="linear"), [(3, 2, 4)]),
    Call("interpolate_linear_1d_align", lambda F, x: F.interpolate(x, size=7, mode="linear", align_corners=True),
         [(3, 2, 4)]),
    Call("interpolate_area_scale", lambda F, x: F.interpolate(x, scale_factor=0.5, mode="area"), [(3, 2, 6, 7)]),
    Call("interpolate_recompute", lambda F, x: F.interpolate(x, scale_factor=1.7, recompute_scale_factor=True),
         [(3, 2, 3, 5)]),
    Call("interpolate_area", lambda F, x: F.interpolate(x, size=(2, 3), mode="area"), [(3, 2, 6, 7)]),
    Call("sdpa", lambda F, q, k, v: F.scaled_dot_product_attention(q, k, v), [(3, 2, 4, 8), (3, 2, 5, 8),
                                                                             (3, 2, 5, 6)], batched=(0, 1, 2)),
    Call("sdpa_causal_scale", lambda F, q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3),
         [(3, 2, 4, 8), (3, 2, 4, 8), (3, 2, 4, 8)], batched=(0, 1, 2)),
    Call("sdpa_bool_mask", lambda F, q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
         [(3, 2, 4, 8), (3, 2, 5, 8), (3, 2, 5, 8), Bool((4, 5))], batched=(0, 1, 2)),
    Call("sdpa_float_mask", lambda F, q, k, v, m: F.scaled_dot_product_attention(q, k, v, m),
         [(3, 4, 8), (3, 5, 8), (3, 5, 8), (3, 4, 5)], batched=(0, 1, 2, 3)),
    Call("sdpa_gqa", lambda F, q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
         [(3, 4, 4, 8), (3, 2, 5, 8), (3, 2, 5, 8)], batched=(0, 1, 2)),
    Call("one_hot", lambda F, i: F.one_hot(i, 6), [Int((3, 4), 6)]),
    Call("one_hot_inferred_classes", lambda F, i: F.one_hot(i), [Int((3, 4), 6)], export=False),
    Call("mse_loss", lambda F, a, b: F.mse_loss(a, b), [(3, 5), (3, 5)], batched=(0, 1)),
    Call("mse_loss_sum", lambda F, a, b: F.mse_loss(a, b, reduction="sum"), [(3, 5), (3, 5)],
         batched=(0, 1)),
    Call("mse_loss_none", lambda F, a, b: F.mse_loss(a, b, reduction="none"), [(3, 5), (3, 5)], batched=(0, 1)),
    Call("cross_entropy", lambda F, x, t: F.cross_entropy(x, t), [(3, 5), Int((3,), 5)], batched=(0, 1)),
    Call("cross_entropy_weighted_ignore", lambda F, x, t, w: F.cross_entropy(x, t, w, ignore_index=1),
         [(3, 5), Int((3,), 5), (5,)], batched=(0, 1), positive=False),
    Call("cross_entropy_smoothing_sum", lambda F, x, t: F.cross_entropy(x, t, reduction="sum",
                                                                        label_smoothing=0.2),
         [(3, 5, 2), Int((3, 2), 5)], batched=(0, 1)),
    Call("cross_entropy_probabilities", lambda F, x, t: F.cross_entropy(x, F.softmax(t, 1)), [(3, 5), (3, 5)],
         batched=(0, 1)),
]
CALL_IDS = [call.name for call in CALLS]


def _arrays(call: Call, batch: int | None = None, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = []
    for index, spec in enumerate(call.inputs):
        shape = spec.shape if isinstance(spec, (Int, Bool)) else spec
        if batch is not None and index in call.batched:
            shape = (batch, *shape[1:])
        if isinstance(spec, Int):
            arrays.append(rng.integers(spec.low, spec.high, size=shape).astype(np.int64))
        elif isinstance(spec, Bool):
            mask = rng.random(shape) < 0.7
            mask[..., 0] = True  # every query attends somewhere, so no row is all -inf
            arrays.append(mask)
        elif call.positive:
            arrays.append(rng.uniform(0.5, 1.5, size=shape).astype(np.float32))
        else:
            arrays.append(rng.standard_normal(shape).astype(np.float32))
    return arrays


def _flat(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def _assert_matches_torch(actual: Any, expected: Any) -> None:
    actual, expected = _flat(actual), _flat(expected)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(torch.from_numpy(np.asarray(a.numpy())), e)


@pytest.mark.parametrize("call", CALLS, ids=CALL_IDS)
def test_matches_torch(call):
    arrays = _arrays(call)
    actual = call.fn(KF, *[kiln.tensor(a) for a in arrays])
    expected = call.fn(TF, *[torch.from_numpy(a.copy()) for a in arrays])
    _assert_matches_torch(actual, expected)


# Calls that compose their op from core ops while the registry lacks it (conv padding strings, 1-D
# nearest/linear resampling, 1-D max-pool indices, one_hot and the losses).
COMPOSED_WHEN_MISSING = [c for c in CALLS if c.name.startswith((
    "conv1d_same", "conv2d_same", "conv2d_valid", "max_pool1d_indices", "interpolate_nearest_1d",
    "interpolate_linear_1d", "one_hot", "mse_loss", "cross_entropy"))]


@pytest.mark.parametrize("call", COMPOSED_WHEN_MISSING, ids=lambda c: c.name)
def test_compositions_for_missing_ops_match_torch(call, monkeypatch):
    monkeypatch.setattr(KF, "_registered", lambda *names: None)
    arrays = _arrays(call)
    actual = call.fn(KF, *[kiln.tensor(a) for a in arrays])
    expected = call.fn(TF, *[torch.from_numpy(a.copy()) for a in arrays])
    _assert_matches_torch(actual, expected)


@pytest.mark.parametrize("call", [c for c in CALLS if c.export], ids=lambda c: c.name)
def test_export_with_dynamic_batch_matches_eager(call):
    module = FunctionModule(call.fn)
    batch = kiln.Dim("batch")
    arrays = _arrays(call)
    dynamic_shapes = tuple({0: batch} if i in call.batched else None for i in range(len(arrays)))
    program = kiln.export(module, tuple(kiln.tensor(a) for a in arrays), dynamic_shapes=dynamic_shapes)
    for size in (3, 2, 5):
        arrays = _arrays(call, batch=size, seed=size)
        eager = _flat(module(*[kiln.tensor(a) for a in arrays]))
        exported = _flat(program(*[kiln.tensor(a) for a in arrays]))
        assert len(exported) == len(eager)
        for actual, expected in zip(exported, eager):
            assert actual.dtype == expected.dtype
            torch.testing.assert_close(torch.from_numpy(actual.numpy()), torch.from_numpy(expected.numpy()))


def _recorded_ops(fn: Callable[..., Any], *arrays: np.ndarray) -> list[str]:
    program = kiln.export(FunctionModule(fn), tuple(kiln.tensor(a) for a in arrays))
    return [op.name for op in program.body.ops if op.name.startswith("aten.")]


@pytest.mark.parametrize("fn, arrays, expected", [
    (lambda F, x, w: F.linear(x, w), [(2, 3), (4, 3)], ["aten.linear.default"]),
    (lambda F, x, w: F.conv2d(x, w), [(1, 2, 5, 5), (3, 2, 3, 3)], ["aten.conv2d.default"]),
    (lambda F, x: F.layer_norm(x, [4]), [(2, 4)], ["aten.layer_norm.default"]),
    (lambda F, x: F.relu6(x), [(2, 4)], ["aten.hardtanh.default"]),
    (lambda F, q: F.scaled_dot_product_attention(q, q, q), [(1, 2, 3, 4)],
     ["aten.scaled_dot_product_attention.default"]),
    (lambda F, x: F.max_pool2d(x, 2), [(1, 1, 4, 4)], ["aten.max_pool2d.default"]),
    (lambda F, x: F.normalize(x), [(2, 4)], ["aten.linalg_vector_norm.default", "aten.clamp_min.default",
                                            "aten.expand_as.default", "aten.div.Tensor"]),
])
def test_records_the_composite_op_torch_export_keeps(fn, arrays, expected):
    inputs = [np.zeros(shape, np.float32) for shape in arrays]
    assert _recorded_ops(fn, *inputs) == expected


# ---------------------------------------------------------------------------------------------
# Behaviour beyond one call


@pytest.mark.parametrize("momentum", [0.1, 0.5])
def test_batch_norm_training_updates_running_stats_in_place(momentum):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3, 5)).astype(np.float32)
    mean, var = rng.standard_normal(3).astype(np.float32), rng.uniform(0.5, 2, 3).astype(np.float32)
    kiln_mean, kiln_var = kiln.tensor(mean), kiln.tensor(var)
    torch_mean, torch_var = torch.from_numpy(mean.copy()), torch.from_numpy(var.copy())
    mean_storage = kiln_mean.numpy()
    actual = KF.batch_norm(kiln.tensor(x), kiln_mean, kiln_var, training=True, momentum=momentum)
    expected = TF.batch_norm(torch.from_numpy(x), torch_mean, torch_var, training=True, momentum=momentum)
    _assert_matches_torch(actual, expected)
    torch.testing.assert_close(torch.from_numpy(kiln_mean.numpy()), torch_mean)
    torch.testing.assert_close(torch.from_numpy(kiln_var.numpy()), torch_var)
    assert kiln_mean.numpy() is mean_storage  # updated in place, not rebound


def test_batch_norm_errors():
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        KF.batch_norm(kiln.zeros(1, 3), None, None, training=True)
    with pytest.raises(ValueError, match="eps must be positive"):
        KF.batch_norm(kiln.zeros(2, 3), None, None, training=True, eps=0.0)


def test_dropout_training_zeroes_and_rescales():
    kiln.manual_seed(0)
    output = KF.dropout(kiln.ones(300, 400), p=0.2).numpy()
    kept = output != 0
    np.testing.assert_allclose(output[kept], 1 / 0.8, rtol=1e-6)
    assert abs(kept.mean() - 0.8) <= 6 * math.sqrt(0.2 * 0.8 / output.size)


def test_dropout_probability_must_be_in_unit_interval():
    for p in (-0.1, 1.1):
        with pytest.raises(ValueError, match="between 0 and 1"):
            KF.dropout(kiln.ones(2), p)


def test_dropout_exports_native_dropout_in_training_only():
    ops = _recorded_ops(lambda F, x: F.dropout(x, 0.5), np.ones((2, 3), np.float32))
    assert ops == ["aten.native_dropout.default"]
    eval_ops = _recorded_ops(lambda F, x: F.dropout(x, 0.5, training=False) + 1, np.ones((2, 3), np.float32))
    assert len(eval_ops) == 1 and eval_ops[0].startswith("aten.add.")


@pytest.mark.parametrize("name", ["relu", "leaky_relu", "elu", "hardtanh", "relu6", "silu", "mish", "hardswish",
                                  "hardsigmoid"])
def test_inplace_activations_write_into_their_input(name):
    values = np.array([-2.0, -0.5, 0.5, 3.0], np.float32)
    x = kiln.tensor(values)
    result = getattr(KF, name)(x, inplace=True)
    assert result is x
    expected = getattr(TF, name)(torch.from_numpy(values.copy()), inplace=True)
    _assert_matches_torch(x, expected)


def test_embedding_max_norm_is_unsupported():
    with pytest.raises(KilnError, match="max_norm"):
        KF.embedding(kiln.tensor([0, 1]), kiln.ones(3, 2), max_norm=1.0)


def test_embedding_padding_idx_range():
    with pytest.raises(ValueError, match="Padding_idx must be within num_embeddings"):
        KF.embedding(kiln.tensor([0]), kiln.ones(3, 2), padding_idx=3)


def test_softmax_implicit_dim_warns():
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    with pytest.warns(UserWarning, match="Implicit dimension choice for softmax"):
        actual = KF.softmax(kiln.tensor(x))
    with pytest.warns(UserWarning):
        expected = TF.softmax(torch.from_numpy(x))
    _assert_matches_torch(actual, expected)


@pytest.mark.parametrize("call, error", [
    (lambda: KF.interpolate(kiln.zeros(1, 1, 2, 2), size=3, scale_factor=2), "only one of size or scale_factor"),
    (lambda: KF.interpolate(kiln.zeros(1, 1, 2, 2)), "either size or scale_factor"),
    (lambda: KF.interpolate(kiln.zeros(1, 1, 2, 2), size=3, align_corners=True), "align_corners option"),
    (lambda: KF.interpolate(kiln.zeros(1, 1, 2, 2), size=(3, 3, 3)), "same number of spatial dimensions"),
    (lambda: KF.pad(kiln.zeros(2, 2), (1,)), "divisible by 2"),
    (lambda: KF.pad(kiln.zeros(2, 2), (1, 1), mode="mirror"), "Unrecognised padding mode"),
    (lambda: KF.conv2d(kiln.zeros(1, 1, 4, 4), kiln.zeros(1, 1, 3, 3), stride=2, padding="same"),
     "not supported for strided convolutions"),
    (lambda: KF.gelu(kiln.zeros(2), approximate="erf"), "approximate argument"),
    (lambda: KF.mse_loss(kiln.zeros(2), kiln.zeros(2), reduction="avg"), "not a valid value for reduction"),
])
def test_argument_errors(call, error):
    with pytest.raises(ValueError, match=error):
        call()


def test_sdpa_causal_with_mask_is_an_error():
    q = kiln.zeros(1, 2, 3)
    with pytest.raises(ValueError, match="attn_mask should not be set"):
        KF.scaled_dot_product_attention(q, q, q, attn_mask=kiln.zeros(2, 2), is_causal=True)


def test_max_pool_indices_are_exact():
    x = np.random.default_rng(0).standard_normal((2, 3, 6, 7)).astype(np.float32)
    _, indices = KF.max_pool2d(kiln.tensor(x), 3, 2, 1, return_indices=True)
    _, expected = TF.max_pool2d(torch.from_numpy(x), 3, 2, 1, return_indices=True)
    assert indices.dtype is kiln.int64 and np.array_equal(indices.numpy(), expected.numpy())


def test_legacy_reduction_arguments():
    a, b = np.ones((2, 3), np.float32), np.zeros((2, 3), np.float32)
    assert KF.mse_loss(kiln.tensor(a), kiln.tensor(b), size_average=False).item() == 6.0
    assert tuple(KF.mse_loss(kiln.tensor(a), kiln.tensor(b), reduce=False).shape) == (2, 3)


def test_functional_all_names_exist():
    assert all(callable(getattr(KF, name)) for name in KF.__all__)
