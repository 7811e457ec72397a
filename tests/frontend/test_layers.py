"""kiln.nn layers against torch.nn: one table of layers, each checked for state-dict keys, repr, eval and
train outputs (with torch's weights loaded), running-stat updates, and export with a dynamic batch dim.

Every constructor in the table is a function of the `nn` namespace, so the same expression builds the
kiln module and its torch twin.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pytest

import kiln
from kiln.ir.interpreter import run_program
from kiln.ir.program import OutputKind

torch = pytest.importorskip("torch")
knn = kiln.nn


@dataclass
class Case:
    name: str
    build: Callable[[Any], Any]  # nn namespace -> module
    shapes: list[tuple[int, ...]]  # one per input, batch first
    integer_high: int | None = None  # integer inputs in [0, high) instead of floats
    random_in_training: bool = False  # train-mode output is random (dropout): compare eval only


CASES = [
    Case("Identity", lambda nn: nn.Identity(3, unused=True), [(3, 5)]),
    Case("Linear", lambda nn: nn.Linear(5, 4), [(3, 5)]),
    Case("Linear_no_bias_3d", lambda nn: nn.Linear(5, 4, bias=False), [(3, 2, 5)]),
    Case("Bilinear", lambda nn: nn.Bilinear(3, 4, 5), [(3, 3), (3, 4)]),
    Case("Conv1d", lambda nn: nn.Conv1d(2, 4, 3, stride=2, padding=1), [(3, 2, 9)]),
    Case("Conv1d_same_dilated", lambda nn: nn.Conv1d(2, 4, 4, padding="same", dilation=2), [(3, 2, 9)]),
    Case("Conv2d", lambda nn: nn.Conv2d(2, 4, 3), [(3, 2, 7, 6)]),
    Case("Conv2d_groups_tuple", lambda nn: nn.Conv2d(4, 6, (3, 2), stride=(2, 1), padding=(1, 0), groups=2,
                                                     bias=False), [(3, 4, 7, 6)]),
    Case("Conv2d_same", lambda nn: nn.Conv2d(2, 3, 4, padding="same"), [(3, 2, 6, 5)]),
    Case("Conv2d_valid_dilated", lambda nn: nn.Conv2d(2, 3, 3, padding="valid", dilation=2), [(3, 2, 7, 7)]),
    Case("Conv2d_reflect", lambda nn: nn.Conv2d(2, 3, 3, padding=1, padding_mode="reflect"), [(3, 2, 5, 6)]),
    Case("Conv2d_replicate", lambda nn: nn.Conv2d(2, 3, 3, padding=(2, 1), padding_mode="replicate"),
         [(3, 2, 5, 6)]),
    Case("Conv2d_circular", lambda nn: nn.Conv2d(2, 3, 3, padding=1, padding_mode="circular"), [(3, 2, 5, 6)]),
    Case("ConvTranspose1d", lambda nn: nn.ConvTranspose1d(2, 3, 3, stride=2, padding=1, output_padding=1),
         [(3, 2, 5)]),
    Case("ConvTranspose2d", lambda nn: nn.ConvTranspose2d(4, 2, 3, stride=2, groups=2), [(3, 4, 4, 3)]),
    Case("ConvTranspose2d_dilated", lambda nn: nn.ConvTranspose2d(2, 3, (2, 3), padding=1, dilation=2,
                                                                  bias=False), [(3, 2, 4, 5)]),
    Case("MaxPool1d", lambda nn: nn.MaxPool1d(3, stride=2, padding=1), [(3, 2, 9)]),
    Case("MaxPool2d", lambda nn: nn.MaxPool2d(2), [(3, 2, 6, 7)]),
    Case("MaxPool2d_ceil_dilated", lambda nn: nn.MaxPool2d(3, stride=2, padding=1, dilation=2, ceil_mode=True),
         [(3, 2, 9, 8)]),
    Case("MaxPool2d_indices", lambda nn: nn.MaxPool2d((2, 3), return_indices=True), [(3, 2, 6, 7)]),
    Case("AvgPool1d", lambda nn: nn.AvgPool1d(3, stride=2, padding=1, count_include_pad=False), [(3, 2, 9)]),
    Case("AvgPool2d", lambda nn: nn.AvgPool2d(2), [(3, 2, 6, 7)]),
    Case("AvgPool2d_ceil_divisor", lambda nn: nn.AvgPool2d(3, 2, 1, ceil_mode=True, divisor_override=4),
         [(3, 2, 8, 7)]),
    Case("AdaptiveAvgPool1d", lambda nn: nn.AdaptiveAvgPool1d(4), [(3, 2, 10)]),
    Case("AdaptiveAvgPool2d", lambda nn: nn.AdaptiveAvgPool2d((3, None)), [(3, 2, 7, 5)]),
    Case("AdaptiveAvgPool2d_global", lambda nn: nn.AdaptiveAvgPool2d(1), [(3, 2, 7, 5)]),
    Case("BatchNorm1d", lambda nn: nn.BatchNorm1d(4), [(3, 4)]),
    Case("BatchNorm1d_3d_no_bias", lambda nn: nn.BatchNorm1d(4, momentum=0.3, bias=False), [(3, 4, 5)]),
    Case("BatchNorm2d", lambda nn: nn.BatchNorm2d(3), [(3, 3, 4, 5)]),
    Case("BatchNorm2d_cumulative", lambda nn: nn.BatchNorm2d(3, momentum=None, eps=1e-3), [(3, 3, 4, 5)]),
    Case("BatchNorm2d_no_affine", lambda nn: nn.BatchNorm2d(3, affine=False), [(3, 3, 4, 5)]),
    Case("BatchNorm2d_no_running_stats", lambda nn: nn.BatchNorm2d(3, track_running_stats=False), [(3, 3, 4, 5)]),
    Case("LayerNorm", lambda nn: nn.LayerNorm(5), [(3, 5)]),
    Case("LayerNorm_2d_no_bias", lambda nn: nn.LayerNorm((4, 5), eps=1e-3, bias=False), [(3, 2, 4, 5)]),
    Case("LayerNorm_no_affine", lambda nn: nn.LayerNorm(5, elementwise_affine=False), [(3, 2, 5)]),
    Case("GroupNorm", lambda nn: nn.GroupNorm(2, 4), [(3, 4, 5)]),
    Case("GroupNorm_no_affine", lambda nn: nn.GroupNorm(3, 6, eps=1e-3, affine=False), [(3, 6, 3, 3)]),
    Case("RMSNorm", lambda nn: nn.RMSNorm(5), [(3, 5)]),
    Case("RMSNorm_2d_eps", lambda nn: nn.RMSNorm((4, 5), eps=1e-5), [(3, 2, 4, 5)]),
    Case("RMSNorm_no_affine", lambda nn: nn.RMSNorm(5, elementwise_affine=False), [(3, 5)]),
    Case("Embedding", lambda nn: nn.Embedding(10, 4), [(3, 6)], integer_high=10),
    Case("Embedding_padding_idx", lambda nn: nn.Embedding(10, 4, padding_idx=-2), [(3, 6)], integer_high=10),
    Case("Dropout", lambda nn: nn.Dropout(0.3), [(3, 8)], random_in_training=True),
    Case("ReLU", lambda nn: nn.ReLU(), [(3, 8)]),
    Case("ReLU_inplace", lambda nn: nn.ReLU(inplace=True), [(3, 8)]),
    Case("ReLU6", lambda nn: nn.ReLU6(), [(3, 8)]),
    Case("LeakyReLU", lambda nn: nn.LeakyReLU(0.2), [(3, 8)]),
    Case("LeakyReLU_inplace", lambda nn: nn.LeakyReLU(inplace=True), [(3, 8)]),
    Case("ELU", lambda nn: nn.ELU(alpha=0.5), [(3, 8)]),
    Case("GELU", lambda nn: nn.GELU(), [(3, 8)]),
    Case("GELU_tanh", lambda nn: nn.GELU("tanh"), [(3, 8)]),
    Case("SiLU", lambda nn: nn.SiLU(), [(3, 8)]),
    Case("Mish", lambda nn: nn.Mish(), [(3, 8)]),
    Case("Sigmoid", lambda nn: nn.Sigmoid(), [(3, 8)]),
    Case("Tanh", lambda nn: nn.Tanh(), [(3, 8)]),
    Case("Hardswish", lambda nn: nn.Hardswish(), [(3, 8)]),
    Case("Hardsigmoid", lambda nn: nn.Hardsigmoid(inplace=True), [(3, 8)]),
    Case("Hardtanh", lambda nn: nn.Hardtanh(-0.5, 0.75), [(3, 8)]),
    Case("Softplus", lambda nn: nn.Softplus(beta=2.0, threshold=1.0), [(3, 8)]),
    Case("LogSigmoid", lambda nn: nn.LogSigmoid(), [(3, 8)]),
    Case("Softmax", lambda nn: nn.Softmax(dim=1), [(3, 8)]),
    Case("LogSoftmax", lambda nn: nn.LogSoftmax(dim=-1), [(3, 2, 8)]),
    Case("Flatten", lambda nn: nn.Flatten(), [(3, 2, 3, 4)]),
    Case("Flatten_including_batch", lambda nn: nn.Flatten(0, 1), [(3, 2, 4)]),
    Case("Unflatten", lambda nn: nn.Unflatten(1, (2, 3)), [(3, 6)]),
    Case("Upsample_nearest", lambda nn: nn.Upsample(scale_factor=2), [(3, 2, 4, 5)]),
    Case("Upsample_nearest_size", lambda nn: nn.Upsample(size=(5, 7)), [(3, 2, 4, 3)]),
    Case("Upsample_nearest_1d", lambda nn: nn.Upsample(scale_factor=3), [(3, 2, 5)]),
    Case("Upsample_bilinear", lambda nn: nn.Upsample(size=(5, 7), mode="bilinear"), [(3, 2, 4, 3)]),
    Case("Upsample_bilinear_align_corners", lambda nn: nn.Upsample(scale_factor=1.5, mode="bilinear",
                                                                   align_corners=True), [(3, 2, 4, 6)]),
    Case("UpsamplingNearest2d", lambda nn: nn.UpsamplingNearest2d(scale_factor=2), [(3, 2, 3, 3)]),
    Case("UpsamplingBilinear2d", lambda nn: nn.UpsamplingBilinear2d(size=(4, 6)), [(3, 2, 3, 3)]),
    Case("ZeroPad2d", lambda nn: nn.ZeroPad2d((1, 2, 0, 3)), [(3, 2, 4, 5)]),
    Case("ZeroPad1d", lambda nn: nn.ZeroPad1d(2), [(3, 2, 4)]),
    Case("ConstantPad1d", lambda nn: nn.ConstantPad1d((2, 1), 1.5), [(3, 2, 4)]),
    Case("ConstantPad2d", lambda nn: nn.ConstantPad2d(1, -1.0), [(3, 2, 4, 5)]),
    Case("Sequential", lambda nn: nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                                                nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 3 * 2, 5)),
         [(3, 2, 6, 4)]),
    Case("Sequential_ordered_dict", lambda nn: nn.Sequential(OrderedDict(
        [("embed", nn.Embedding(7, 6)), ("norm", nn.LayerNorm(6)), ("act", nn.GELU()), ("drop", nn.Dropout(0.0))])),
        [(3, 5)], integer_high=7),
]
CASE_IDS = [case.name for case in CASES]
EXPORT_BATCH_SIZES = (2, 6)  # besides the example batch of 3


def _inputs(case: Case, batch: int | None = None, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = []
    for shape in case.shapes:
        shape = (batch if batch is not None else shape[0], *shape[1:])
        if case.integer_high is not None:
            arrays.append(rng.integers(0, case.integer_high, size=shape).astype(np.int64))
        else:
            arrays.append(rng.standard_normal(shape).astype(np.float32))
    return arrays


def _twins(case: Case) -> tuple[Any, Any]:
    """The torch module and a kiln module holding the same weights and buffers."""
    torch.manual_seed(0)
    torch_module = case.build(torch.nn)
    kiln_module = case.build(knn)
    kiln_module.load_state_dict(torch_module.state_dict())
    return kiln_module, torch_module


def _flat(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def _assert_same_as_torch(actual: Any, expected: Any) -> None:
    actual, expected = _flat(actual), _flat(expected)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(torch.from_numpy(np.asarray(a.numpy())), e.detach())


def _run_kiln(module: Any, arrays: list[np.ndarray]) -> Any:
    return module(*[kiln.tensor(a) for a in arrays])


def _run_torch(module: Any, arrays: list[np.ndarray]) -> Any:
    return module(*[torch.from_numpy(a.copy()) for a in arrays])


# ---------------------------------------------------------------------------------------------
# Registry-driven checks


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_state_dict_matches_torch(case):
    torch_module = case.build(torch.nn)
    kiln_module = case.build(knn)
    torch_state, kiln_state = torch_module.state_dict(), kiln_module.state_dict()
    assert list(kiln_state) == list(torch_state)
    for key, value in torch_state.items():
        assert tuple(kiln_state[key].shape) == tuple(value.shape), key
        assert str(kiln_state[key].dtype) == str(value.dtype).removeprefix("torch."), key
    assert [name for name, _ in kiln_module.named_parameters()] == [name for name, _ in torch_module.named_parameters()]
    assert [name for name, _ in kiln_module.named_buffers()] == [name for name, _ in torch_module.named_buffers()]


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_repr_matches_torch(case):
    assert repr(case.build(knn)) == repr(case.build(torch.nn))


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_eval_output_matches_torch(case):
    kiln_module, torch_module = _twins(case)
    kiln_module.eval()
    torch_module.eval()
    arrays = _inputs(case)
    _assert_same_as_torch(_run_kiln(kiln_module, arrays), _run_torch(torch_module, arrays))


@pytest.mark.parametrize("case", [c for c in CASES if not c.random_in_training], ids=lambda c: c.name)
def test_train_output_and_running_stats_match_torch(case):
    """Two training steps: outputs, then every buffer (running stats, num_batches_tracked) after each."""
    kiln_module, torch_module = _twins(case)
    kiln_module.train()
    torch_module.train()
    for step in range(2):
        arrays = _inputs(case, seed=step)
        _assert_same_as_torch(_run_kiln(kiln_module, arrays), _run_torch(torch_module, arrays))
        kiln_buffers = dict(kiln_module.named_buffers())
        for name, expected in torch_module.named_buffers():
            actual = torch.from_numpy(np.asarray(kiln_buffers[name].numpy()))
            torch.testing.assert_close(actual, expected, msg=f"buffer {name} after step {step}")


def _export(module: Any, case: Case) -> Any:
    arrays = _inputs(case)
    batch = kiln.Dim("batch")
    dynamic_shapes = tuple({0: batch} for _ in arrays)
    return kiln.export(module, tuple(kiln.tensor(a) for a in arrays), dynamic_shapes=dynamic_shapes)


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_export_with_dynamic_batch_matches_eager(case, mode):
    """ep(x) equals kiln eager at the example batch and two others; training BatchNorm returns its updated
    buffers as BUFFER_MUTATION outputs, equal to what eager mode writes into the module."""
    module = case.build(knn)
    module.train(mode == "train")
    initial_state = module.state_dict()
    program = _export(module, case)
    mutated = program.graph_signature.buffers_to_mutate
    updates_stats = mode == "train" and any(getattr(m, "track_running_stats", False) for m in module.modules())
    expected_mutations = {name for name, _ in module.named_buffers()} if updates_stats else set()
    assert set(mutated.values()) == expected_mutations
    if updates_stats:
        assert all(spec.kind is OutputKind.BUFFER_MUTATION
                   for spec in program.graph_signature.output_specs[:len(expected_mutations)])
    for batch in (3, *EXPORT_BATCH_SIZES):
        arrays = _inputs(case, batch=batch, seed=batch)
        module.load_state_dict(initial_state)  # eager training mutates buffers; start each call fresh
        eager = _flat(_run_kiln(module, arrays))
        exported = _flat(program(*[kiln.tensor(a) for a in arrays]))
        assert len(exported) == len(eager)
        for actual, expected in zip(exported, eager):
            assert tuple(actual.shape) == tuple(expected.shape)
            if mode == "train" and case.random_in_training:
                continue  # dropout draws different masks; shapes are what must agree
            torch.testing.assert_close(torch.from_numpy(actual.numpy()), torch.from_numpy(expected.numpy()))
        if updates_stats:
            outputs = run_program(program, [kiln.tensor(a).numpy() for a in arrays])
            buffers = dict(module.named_buffers())
            for value, spec in zip(outputs, program.graph_signature.output_specs):
                if spec.kind is OutputKind.BUFFER_MUTATION:
                    torch.testing.assert_close(torch.from_numpy(np.asarray(value)),
                                               torch.from_numpy(buffers[spec.target].numpy()))


def test_every_case_has_a_distinct_name():
    assert len(set(CASE_IDS)) == len(CASE_IDS)


def test_every_exported_layer_is_in_the_table():
    covered = set()
    for case in CASES:
        covered.update(type(m).__name__ for m in case.build(knn).modules())
    losses = {name for name in knn.layers.__all__ if name.endswith("Loss")}  # two inputs: tests/frontend/test_losses.py
    uncovered = {name for name in knn.layers.__all__ if name not in covered} - {"ModuleList", "ModuleDict"} - losses
    assert not uncovered


# ---------------------------------------------------------------------------------------------
# Initialization: torch's distributions, checked on large layers


N_SIGMA = 6.0


def _assert_uniform(values: np.ndarray, bound: float) -> None:
    values = values.astype(np.float64).ravel()
    assert np.abs(values).max() <= bound
    assert np.abs(values).max() > 0.98 * bound
    std = bound / math.sqrt(3)
    assert abs(values.mean()) <= N_SIGMA * std / math.sqrt(values.size)
    assert abs(values.var() - std ** 2) <= N_SIGMA * std ** 2 * math.sqrt(0.8 / values.size)


def test_linear_init_is_uniform_in_one_over_sqrt_fan_in():
    layer = knn.Linear(300, 400)
    _assert_uniform(layer.weight.numpy(), 1 / math.sqrt(300))
    _assert_uniform(layer.bias.numpy(), 1 / math.sqrt(300))


def test_conv2d_init_uses_receptive_field_fan_in():
    layer = knn.Conv2d(16, 64, 3)
    _assert_uniform(layer.weight.numpy(), 1 / math.sqrt(16 * 9))
    _assert_uniform(knn.Conv2d(16, 4096, 3).bias.numpy(), 1 / math.sqrt(16 * 9))


def test_conv_transpose2d_fan_in_is_weight_dim_1():
    layer = knn.ConvTranspose2d(64, 8, 3, groups=2)
    assert tuple(layer.weight.shape) == (64, 4, 3, 3)
    _assert_uniform(layer.weight.numpy(), 1 / math.sqrt(4 * 9))


def test_bilinear_init():
    layer = knn.Bilinear(20, 30, 40)
    _assert_uniform(layer.weight.numpy(), 1 / math.sqrt(20))


def test_embedding_init_is_standard_normal_with_zero_padding_row():
    layer = knn.Embedding(1000, 64, padding_idx=3)
    values = np.delete(layer.weight.numpy(), 3, axis=0).astype(np.float64).ravel()
    assert abs(values.mean()) <= N_SIGMA / math.sqrt(values.size)
    assert abs(values.var() - 1) <= N_SIGMA * math.sqrt(2 / values.size)
    assert np.all(layer.weight.numpy()[3] == 0)


@pytest.mark.parametrize("build", [lambda nn: nn.BatchNorm2d(5), lambda nn: nn.LayerNorm((2, 5)),
                                   lambda nn: nn.GroupNorm(5, 5), lambda nn: nn.RMSNorm(5)])
def test_norm_layers_init_exactly_like_torch(build):
    torch_state = build(torch.nn).state_dict()
    kiln_state = build(knn).state_dict()
    for key, value in torch_state.items():
        assert np.array_equal(kiln_state[key].numpy(), value.numpy()), key


def test_reset_parameters_redraws():
    layer = knn.Linear(8, 8)
    before = layer.weight.numpy().copy()
    layer.reset_parameters()
    assert not np.array_equal(before, layer.weight.numpy())


def test_dtype_argument():
    layer = knn.Linear(3, 2, dtype=kiln.float64)
    assert layer.weight.dtype is kiln.float64 and layer.bias.dtype is kiln.float64
    assert knn.BatchNorm1d(3, dtype=kiln.float64).num_batches_tracked.dtype is kiln.int64


# ---------------------------------------------------------------------------------------------
# Containers


def test_sequential_indexing_slicing_and_mutation():
    layers = [knn.Linear(2, 3), knn.ReLU(), knn.Linear(3, 4), knn.Tanh()]
    seq = knn.Sequential(*layers)
    assert len(seq) == 4 and list(seq) == layers
    assert seq[0] is layers[0] and seq[-1] is layers[3]
    head = seq[1:3]
    assert isinstance(head, knn.Sequential) and list(head) == layers[1:3]
    assert list(head._modules) == ["1", "2"]  # torch keeps the original keys in a slice
    with pytest.raises(IndexError):
        seq[4]
    seq.append(knn.Sigmoid())
    assert len(seq) == 5 and isinstance(seq[4], knn.Sigmoid)
    del seq[1]
    assert list(seq._modules) == ["0", "1", "2", "3"] and seq[1] is layers[2]
    seq[0] = knn.Identity()
    assert isinstance(seq[0], knn.Identity)
    seq.insert(1, knn.ReLU6())
    assert isinstance(seq[1], knn.ReLU6) and len(seq) == 5
    assert isinstance(seq.pop(1), knn.ReLU6) and len(seq) == 4
    combined = seq + knn.Sequential(knn.ReLU())
    assert len(combined) == 5
    assert len(knn.Sequential(knn.ReLU()) * 3) == 3
    seq.extend([knn.ReLU()])
    assert len(seq) == 5


def test_sequential_state_dict_and_forward_match_torch():
    torch.manual_seed(1)
    torch_seq = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    seq = knn.Sequential(knn.Linear(4, 3), knn.ReLU(), knn.Linear(3, 2))
    seq.load_state_dict(torch_seq.state_dict())
    assert list(seq.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    _assert_same_as_torch(seq(kiln.tensor(x)), torch_seq(torch.from_numpy(x)))


def test_module_list():
    modules = knn.ModuleList([knn.Linear(2, 2) for _ in range(3)])
    torch_modules = torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(3)])
    assert repr(modules) == repr(torch_modules)
    assert list(modules.state_dict()) == list(torch_modules.state_dict())
    assert len(modules) == 3 and modules[-1] is modules[2]
    assert isinstance(modules[1:], knn.ModuleList) and len(modules[1:]) == 2
    modules.append(knn.ReLU())
    modules.extend([knn.Tanh()])
    modules.insert(0, knn.Sigmoid())
    assert [type(m).__name__ for m in modules] == ["Sigmoid", "Linear", "Linear", "Linear", "ReLU", "Tanh"]
    del modules[0]
    assert list(modules._modules) == [str(i) for i in range(5)]
    modules += [knn.ELU()]
    assert len(modules) == 6 and len(modules + [knn.ReLU()]) == 7
    with pytest.raises(IndexError):
        modules[6]
    assert repr(knn.ModuleList()) == repr(torch.nn.ModuleList()) == "ModuleList()"


def test_module_dict():
    modules = knn.ModuleDict({"conv": knn.Conv2d(1, 2, 3), "act": knn.ReLU()})
    torch_modules = torch.nn.ModuleDict({"conv": torch.nn.Conv2d(1, 2, 3), "act": torch.nn.ReLU()})
    assert repr(modules) == repr(torch_modules)
    assert list(modules.state_dict()) == list(torch_modules.state_dict())
    assert list(modules) == ["conv", "act"] and "act" in modules and len(modules) == 2
    modules.update([("pool", knn.MaxPool2d(2))])
    assert list(modules.keys()) == ["conv", "act", "pool"]
    assert isinstance(modules.pop("act"), knn.ReLU) and "act" not in modules
    modules["x"] = knn.Identity()
    assert [type(v).__name__ for v in modules.values()] == ["Conv2d", "MaxPool2d", "Identity"]
    modules.clear()
    assert len(modules) == 0


def test_nested_container_repr_matches_torch():
    def build(nn):
        return nn.Sequential(nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)]),
                             nn.ModuleDict({"a": nn.Sequential(nn.ReLU(), nn.Dropout(0.1))}))
    assert repr(build(knn)) == repr(build(torch.nn))


# ---------------------------------------------------------------------------------------------
# Layer-specific behaviour


def test_embedding_from_pretrained():
    weights = np.arange(12, dtype=np.float32).reshape(4, 3)
    layer = knn.Embedding.from_pretrained(kiln.tensor(weights), padding_idx=1)
    torch_layer = torch.nn.Embedding.from_pretrained(torch.from_numpy(weights), padding_idx=1)
    assert repr(layer) == repr(torch_layer)
    assert np.array_equal(layer.weight.numpy(), weights)
    assert layer.weight.requires_grad is False
    assert knn.Embedding.from_pretrained(kiln.tensor(weights), freeze=False).weight.requires_grad is True
    indices = np.array([[0, 3], [1, 1]], dtype=np.int64)
    _assert_same_as_torch(layer(kiln.tensor(indices)), torch_layer(torch.from_numpy(indices)))


def test_embedding_max_norm_is_a_clear_error():
    layer = knn.Embedding(5, 2, max_norm=1.0)
    assert repr(layer) == repr(torch.nn.Embedding(5, 2, max_norm=1.0))
    with pytest.raises(kiln.KilnError, match="max_norm"):
        layer(kiln.tensor([1, 2]))


def test_dropout_training_statistics():
    layer = knn.Dropout(0.25)
    output = layer(kiln.ones(400, 500)).numpy()
    kept = output != 0
    assert np.allclose(output[kept], 1 / 0.75)
    n = output.size
    assert abs(kept.mean() - 0.75) <= N_SIGMA * math.sqrt(0.25 * 0.75 / n)
    assert np.array_equal(layer.eval()(kiln.ones(3, 3)).numpy(), np.ones((3, 3), np.float32))


def test_dropout_rejects_bad_probability():
    with pytest.raises(ValueError, match="between 0 and 1"):
        knn.Dropout(1.5)


def test_batch_norm_cumulative_average_over_three_batches():
    kiln_module, torch_module = _twins(CASES[CASE_IDS.index("BatchNorm2d_cumulative")])
    for step in range(3):
        x = np.random.default_rng(step).standard_normal((4, 3, 2, 2)).astype(np.float32)
        kiln_module(kiln.tensor(x))
        torch_module(torch.from_numpy(x))
    for name, expected in torch_module.named_buffers():
        torch.testing.assert_close(torch.from_numpy(dict(kiln_module.named_buffers())[name].numpy()), expected)


def test_batch_norm_checks_input_rank_and_batch():
    with pytest.raises(ValueError, match="expected 4D input"):
        knn.BatchNorm2d(3)(kiln.zeros(2, 3))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        knn.BatchNorm1d(3)(kiln.zeros(1, 3))


def test_conv_transpose_output_size():
    kiln_module, torch_module = _twins(Case("", lambda nn: nn.ConvTranspose2d(2, 3, 3, stride=2, padding=1), []))
    x = np.random.default_rng(0).standard_normal((2, 2, 4, 4)).astype(np.float32)
    _assert_same_as_torch(kiln_module(kiln.tensor(x), output_size=[8, 8]),
                          torch_module(torch.from_numpy(x), output_size=[8, 8]))
    with pytest.raises(ValueError, match="requested an output size"):
        kiln_module(kiln.tensor(x), output_size=[10, 10])


@pytest.mark.parametrize("kwargs, message", [
    ({"groups": 0}, "groups must be a positive integer"), ({"groups": 3}, "divisible by groups"),
    ({"padding": "full"}, "Invalid padding string"), ({"padding": "same", "stride": 2}, "strided convolutions"),
    ({"padding_mode": "mirror"}, "padding_mode must be one of"),
])
def test_conv_constructor_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        knn.Conv2d(4, 6, 3, **kwargs)


def test_group_norm_channels_must_divide():
    with pytest.raises(ValueError, match="must be divisible by num_groups"):
        knn.GroupNorm(3, 4)


def test_softmax_without_dim_warns_and_picks_torchs_dim():
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    with pytest.warns(UserWarning, match="Implicit dimension choice"):
        actual = knn.Softmax()(kiln.tensor(x))
    with pytest.warns(UserWarning):
        expected = torch.nn.Softmax()(torch.from_numpy(x))
    _assert_same_as_torch(actual, expected)


def test_inplace_activation_updates_its_input():
    x = kiln.tensor([-1.0, 2.0])
    result = knn.ReLU(inplace=True)(x)
    assert result is x and x.tolist() == [0.0, 2.0]


def test_unflatten_requires_int_tuple():
    with pytest.raises(TypeError):
        knn.Unflatten(1, 6)
    with pytest.raises(TypeError):
        knn.Unflatten(1, (2, 3.0))
