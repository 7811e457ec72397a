"""Train and eval mode under autograd: Dropout's mask and scale in values and gradients, and BatchNorm's batch
statistics, gradients and running-statistic updates against torch, with the buffers kept out of the graph.

RNGs differ between kiln and torch, so dropout is compared by its semantics (the gradient is the mask read from
the output times 1 / (1 - p)) and its statistics (the fraction of zeros), not element by element.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import kiln
import kiln.nn.functional as KF
from kiln.frontend.autograd import AutogradError
from kiln.ir.interpreter import run_program
from kiln.ir.program import OutputKind
from tests.torch_oracle import requires_torch, torch

pytestmark = requires_torch


def _close(actual: Any, expected: Any, what: str = "") -> None:
    torch.testing.assert_close(torch.from_numpy(np.array(actual.numpy())), expected.detach(),
                               msg=lambda m: f"{what}: {m}")


def _normal(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# Dropout


@pytest.mark.parametrize("p", [0.2, 0.5, 0.8])
def test_dropout_training_zeroes_scales_and_routes_the_gradient_through_the_kept_elements(p):
    x_array = _normal(200, 300)  # no exact zeros, so a zero in the output means a dropped element
    upstream = np.random.default_rng(1).uniform(0.5, 1.5, x_array.shape).astype(np.float32)
    kiln.manual_seed(0)
    x = kiln.tensor(x_array, requires_grad=True)
    dropout = kiln.nn.Dropout(p)
    assert dropout.training
    y = dropout(x)
    assert y.requires_grad and y.grad_fn is not None
    y.backward(kiln.tensor(upstream))
    output = y.numpy()
    kept = output != 0
    scale = np.float32(1 / (1 - p))
    np.testing.assert_allclose(output[kept], x_array[kept] * scale, rtol=1e-6)
    np.testing.assert_array_equal(x.grad.numpy(), (upstream * kept) * scale)
    # The fraction dropped is p, as in torch (60,000 draws: 5 standard deviations is under 0.01).
    torch_output = torch.nn.functional.dropout(torch.from_numpy(x_array), p, training=True).numpy()
    for dropped in (1 - kept.mean(), (torch_output == 0).mean()):
        assert abs(dropped - p) < 0.01


def test_dropout_gradient_of_a_sum_is_the_scaled_mask():
    kiln.manual_seed(3)
    x = kiln.tensor(_normal(50, 40), requires_grad=True)
    y = KF.dropout(x, 0.25)
    y.sum().backward()
    mask = (y.numpy() != 0).astype(np.float32)
    np.testing.assert_array_equal(x.grad.numpy(), mask * np.float32(1 / 0.75))


def test_dropout_mask_is_deterministic_under_manual_seed():
    x = kiln.tensor(_normal(64, 64), requires_grad=True)
    masks = []
    for seed in (7, 7, 8):
        kiln.manual_seed(seed)
        masks.append(KF.dropout(x, 0.5).numpy() != 0)
    np.testing.assert_array_equal(masks[0], masks[1])
    assert (masks[0] != masks[2]).any()


def test_dropout_eval_is_the_identity_with_the_identity_gradient():
    x_array = _normal(6, 7)
    upstream = _normal(6, 7, seed=2)
    x = kiln.tensor(x_array, requires_grad=True)
    tx = torch.tensor(x_array, requires_grad=True)
    dropout, torch_dropout = kiln.nn.Dropout(0.5).eval(), torch.nn.Dropout(0.5).eval()
    y, ty = dropout(x), torch_dropout(tx)
    np.testing.assert_array_equal(y.numpy(), x_array)
    y.backward(kiln.tensor(upstream))
    ty.backward(torch.from_numpy(upstream))
    np.testing.assert_array_equal(x.grad.numpy(), upstream)
    _close(x.grad, tx.grad, "gradient")
    np.testing.assert_array_equal(KF.dropout(x, 0.5, training=False).numpy(), x_array)


@pytest.mark.parametrize("p", [0.0, 1.0])
def test_dropout_extreme_probabilities_match_torch(p):
    x_array = _normal(5, 4)
    x, tx = kiln.tensor(x_array, requires_grad=True), torch.tensor(x_array, requires_grad=True)
    y, ty = KF.dropout(x, p), torch.nn.functional.dropout(tx, p)
    _close(y, ty, "output")
    y.sum().backward()
    ty.sum().backward()
    _close(x.grad, tx.grad, "gradient")


def test_inplace_dropout_of_a_leaf_that_requires_grad_is_refused_like_torch():
    x = kiln.tensor(_normal(3, 4), requires_grad=True)
    with pytest.raises(AutogradError, match="leaf Variable that requires grad"):
        KF.dropout(x, 0.5, inplace=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        torch.nn.functional.dropout(torch.zeros(3, 4, requires_grad=True), 0.5, inplace=True)


def test_inplace_dropout_of_an_intermediate_keeps_the_gradient():
    kiln.manual_seed(0)
    x = kiln.tensor(_normal(30, 20), requires_grad=True)
    hidden = x * 2.0
    KF.dropout(hidden, 0.4, inplace=True)
    hidden.sum().backward()
    kept = (hidden.numpy() != 0).astype(np.float32)
    np.testing.assert_allclose(x.grad.numpy(), kept * np.float32(2.0) * np.float32(1 / 0.6), rtol=1e-6)


def test_train_and_eval_switch_dropout_in_a_model():
    """eval(): the model's outputs and parameter gradients equal torch's; train(): only kept units get gradient."""
    torch.manual_seed(0)
    torch_model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Dropout(0.5),
                                      torch.nn.Linear(8, 3))
    model = kiln.nn.Sequential(kiln.nn.Linear(6, 8), kiln.nn.ReLU(), kiln.nn.Dropout(0.5), kiln.nn.Linear(8, 3))
    model.load_state_dict(torch_model.state_dict())
    x = _normal(5, 6)
    model.eval()
    torch_model.eval()
    model(kiln.tensor(x)).pow(2).sum().backward()
    torch_model(torch.from_numpy(x)).pow(2).sum().backward()
    for (name, param), (_, expected) in zip(model.named_parameters(), torch_model.named_parameters()):
        _close(param.grad, expected.grad, f"eval gradient of {name}")
    model.zero_grad()
    model.train()
    kiln.manual_seed(0)
    hidden = model[1](model[0](kiln.tensor(x)))
    dropped = model[2](hidden)
    model[3](dropped).sum().backward()
    kept = dropped.numpy() != 0
    last_weight_grad = model[3].weight.grad.numpy()  # sum over the batch of the dropped activations
    np.testing.assert_allclose(last_weight_grad, np.tile(dropped.numpy().sum(0), (3, 1)), rtol=1e-5, atol=1e-6)
    assert not kept.all()


# ---------------------------------------------------------------------------------------------
# BatchNorm


BATCH_NORMS = [
    ("BatchNorm1d", lambda nn: nn.BatchNorm1d(4), (6, 4)),
    ("BatchNorm1d_3d_momentum", lambda nn: nn.BatchNorm1d(4, momentum=0.3), (5, 4, 3)),
    ("BatchNorm2d", lambda nn: nn.BatchNorm2d(3), (4, 3, 5, 4)),
    ("BatchNorm2d_cumulative", lambda nn: nn.BatchNorm2d(3, momentum=None, eps=1e-3), (4, 3, 3, 3)),
    ("BatchNorm2d_no_affine", lambda nn: nn.BatchNorm2d(3, affine=False), (4, 3, 3, 2)),
    ("BatchNorm2d_no_running_stats", lambda nn: nn.BatchNorm2d(3, track_running_stats=False), (4, 3, 2, 3)),
]


def _batch_norm_twins(build: Any) -> tuple[Any, Any]:
    torch_module = build(torch.nn)
    with torch.no_grad():  # non-trivial affine parameters, so their gradients matter
        for param in torch_module.parameters():
            param.copy_(torch.randn(param.shape, generator=torch.Generator().manual_seed(5)))
    module = build(kiln.nn)
    module.load_state_dict(torch_module.state_dict())
    return module, torch_module


def _assert_buffers_outside_the_graph(module: Any) -> None:
    for name, buffer in module.named_buffers():
        assert not buffer.requires_grad, f"buffer {name} requires grad"
        assert buffer.grad_fn is None, f"buffer {name} has a grad_fn"
        assert buffer.grad is None


@pytest.mark.parametrize("name, build, shape", BATCH_NORMS, ids=[b[0] for b in BATCH_NORMS])
def test_batch_norm_training_steps_match_torch(name, build, shape):
    """Three training steps: output, input/weight/bias gradients, then every buffer after each step."""
    module, torch_module = _batch_norm_twins(build)
    module.train()
    torch_module.train()
    storages = {key: buffer.numpy() for key, buffer in module.named_buffers()}
    for step in range(3):
        x_array = _normal(*shape, seed=10 + step) * 2 + 0.5
        upstream = _normal(*shape, seed=20 + step)
        x, tx = kiln.tensor(x_array, requires_grad=True), torch.tensor(x_array, requires_grad=True)
        y, ty = module(x), torch_module(tx)
        _close(y, ty, f"output at step {step}")
        y.backward(kiln.tensor(upstream))
        ty.backward(torch.from_numpy(upstream))
        _close(x.grad, tx.grad, f"input gradient at step {step}")
        for (key, param), (_, expected) in zip(module.named_parameters(), torch_module.named_parameters()):
            _close(param.grad, expected.grad, f"{key} gradient (accumulated) after step {step}")
        buffers = dict(module.named_buffers())
        for key, expected in torch_module.named_buffers():
            _close(buffers[key], expected, f"buffer {key} after step {step}")
        _assert_buffers_outside_the_graph(module)
    for key, buffer in module.named_buffers():
        assert buffer.numpy() is storages[key], f"buffer {key} was rebound instead of updated in place"


@pytest.mark.parametrize("name, build, shape", BATCH_NORMS, ids=[b[0] for b in BATCH_NORMS])
def test_batch_norm_eval_uses_the_running_statistics(name, build, shape):
    module, torch_module = _batch_norm_twins(build)
    for step in range(2):  # move the running statistics away from their initial values
        x_array = _normal(*shape, seed=30 + step) * 3 - 1
        module(kiln.tensor(x_array, requires_grad=True)).sum().backward()
        torch_module(torch.tensor(x_array, requires_grad=True)).sum().backward()
    module.zero_grad()
    torch_module.zero_grad()
    module.eval()
    torch_module.eval()
    before = {key: buffer.numpy().copy() for key, buffer in module.named_buffers()}
    x_array = _normal(*shape, seed=40)
    upstream = _normal(*shape, seed=41)
    x, tx = kiln.tensor(x_array, requires_grad=True), torch.tensor(x_array, requires_grad=True)
    y, ty = module(x), torch_module(tx)
    _close(y, ty, "eval output")
    y.backward(kiln.tensor(upstream))
    ty.backward(torch.from_numpy(upstream))
    _close(x.grad, tx.grad, "eval input gradient")
    for (key, param), (_, expected) in zip(module.named_parameters(), torch_module.named_parameters()):
        _close(param.grad, expected.grad, f"eval {key} gradient")
    for key, buffer in module.named_buffers():
        np.testing.assert_array_equal(buffer.numpy(), before[key], err_msg=f"eval changed buffer {key}")
    _assert_buffers_outside_the_graph(module)


def test_functional_batch_norm_keeps_the_running_statistics_out_of_the_graph():
    x_array = _normal(6, 3, 4)
    mean, var = kiln.zeros(3), kiln.ones(3)
    torch_mean, torch_var = torch.zeros(3), torch.ones(3)
    weight = kiln.tensor(_normal(3, seed=1), requires_grad=True)
    torch_weight = torch.tensor(_normal(3, seed=1), requires_grad=True)
    x, tx = kiln.tensor(x_array, requires_grad=True), torch.tensor(x_array, requires_grad=True)
    y = KF.batch_norm(x, mean, var, weight, training=True, momentum=0.2)
    ty = torch.nn.functional.batch_norm(tx, torch_mean, torch_var, torch_weight, training=True, momentum=0.2)
    for buffer in (mean, var):
        assert not buffer.requires_grad and buffer.grad_fn is None
    _close(mean, torch_mean, "running_mean")
    _close(var, torch_var, "running_var")
    y.pow(2).sum().backward()
    ty.pow(2).sum().backward()
    _close(x.grad, tx.grad, "input gradient")
    _close(weight.grad, torch_weight.grad, "weight gradient")


def test_batch_norm_updates_running_statistics_under_no_grad():
    module, torch_module = _batch_norm_twins(lambda nn: nn.BatchNorm1d(4))
    x_array = _normal(5, 4)
    with kiln.no_grad():
        y = module(kiln.tensor(x_array))
    with torch.no_grad():
        torch_module(torch.from_numpy(x_array))
    assert not y.requires_grad
    buffers = dict(module.named_buffers())
    for key, expected in torch_module.named_buffers():
        _close(buffers[key], expected, f"buffer {key}")


def test_export_of_training_batch_norm_still_records_the_buffer_mutations():
    """After eager autograd steps the module still exports with BUFFER_MUTATION outputs equal to the eager update."""
    module = kiln.nn.BatchNorm2d(3)
    module.train()
    x_array = _normal(4, 3, 3, 3)
    module(kiln.tensor(x_array, requires_grad=True)).sum().backward()
    state = module.state_dict()
    program = kiln.export(module, (kiln.tensor(x_array),))
    mutations = [spec for spec in program.graph_signature.output_specs if spec.kind is OutputKind.BUFFER_MUTATION]
    assert {spec.target for spec in mutations} == {"running_mean", "running_var", "num_batches_tracked"}
    module.load_state_dict(state)
    outputs = run_program(program, [x_array])
    module(kiln.tensor(x_array, requires_grad=True))
    buffers = dict(module.named_buffers())
    for value, spec in zip(outputs, program.graph_signature.output_specs):
        if spec.kind is OutputKind.BUFFER_MUTATION:
            torch.testing.assert_close(torch.from_numpy(np.asarray(value)),
                                       torch.from_numpy(buffers[spec.target].numpy()))
    _assert_buffers_outside_the_graph(module)
