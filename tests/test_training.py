"""Training in kiln: exported train steps (forward, loss, backward, optimizer update in one program) against eager
kiln autograd + kiln.optim, compiled to C against the interpreter, through .pt2 into torch, and a small CNN
trained from scratch on scikit-learn's bundled digits (no download) to >= 97% held-out accuracy."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn as nn
import kiln.nn.functional as F
from kiln.ir.program import InputKind, OutputKind
from kiln.training import TrainStep, compile_train_step, export_train_step
from tests.datasets import digits as load_digits
from tests.torch_oracle import requires_torch, torch


def _cnn() -> nn.Module:
    kiln.manual_seed(0)
    return nn.Sequential(nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(256, 10))


def _bn_mlp() -> nn.Module:
    kiln.manual_seed(1)
    # no bias before the batch norm: its gradient is rounding noise, which Adam would amplify to full steps
    return nn.Sequential(nn.Linear(64, 32, bias=False), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 10))


def _batches(count: int, size: int = 16, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((size, 64)).astype(np.float32), rng.integers(0, 10, size)) for _ in range(count)]


OPTIMIZERS = {
    "sgd": lambda params: kiln.optim.SGD(params, lr=0.05),
    "sgd-momentum-nesterov-wd": lambda params: kiln.optim.SGD(params, lr=0.05, momentum=0.9, nesterov=True,
                                                               weight_decay=1e-3),
    "adam": lambda params: kiln.optim.Adam(params, lr=1e-2),
    "adamw-amsgrad": lambda params: kiln.optim.AdamW(params, lr=1e-2, amsgrad=True),
    "rmsprop-centered-momentum": lambda params: kiln.optim.RMSprop(params, lr=1e-3, momentum=0.5, centered=True),
}


def _eager_steps(model, optimizer, batches) -> list[float]:
    losses = []
    for images, labels in batches:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(kiln.tensor(images)), kiln.tensor(labels))
        loss.backward()
        optimizer.step()
        losses.append(float(loss.item()))
    return losses


def _close(actual, expected):
    np.testing.assert_allclose(np.asarray(actual, np.float64), np.asarray(expected, np.float64), rtol=1.3e-6,
                               atol=1e-5)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("make_model", [_cnn, _bn_mlp], ids=["cnn", "bn-mlp"])
def test_train_step_program_matches_eager_training(name, make_model):
    """Five steps of the exported program (interpreter) == five eager steps of the same model and optimizer."""
    batches = _batches(5)
    model, twin = make_model(), make_model()
    step = TrainStep(export_train_step(model, F.cross_entropy, OPTIMIZERS[name](model.parameters()),
                                       batches[0]), backend="interpreter")
    eager_losses = _eager_steps(twin, OPTIMIZERS[name](twin.parameters()), batches)
    for (images, labels), expected in zip(batches, eager_losses):
        _close(step(images, labels), expected)
    trained = dict(twin.named_parameters())
    trained.update(dict(twin.named_buffers()))
    for key, value in trained.items():
        _close(step.state[f"model.{key}"], value.numpy())


def test_train_step_signature_marks_state_and_loss():
    model = _bn_mlp()
    optimizer = kiln.optim.Adam(model.parameters(), lr=1e-2)
    program = export_train_step(model, F.cross_entropy, optimizer, _batches(1)[0])
    buffers = [s.target for s in program.graph_signature.input_specs if s.kind is InputKind.BUFFER]
    mutated = [s.target for s in program.graph_signature.output_specs if s.kind is OutputKind.BUFFER_MUTATION]
    assert "model.0.weight" in buffers and "model.1.running_mean" in buffers
    assert "optimizer.0.weight.exp_avg_sq" in buffers and "optimizer.0.weight.step" in buffers
    assert sorted(mutated) == sorted(buffers)
    assert program.graph_signature.output_specs[-1].kind is OutputKind.LOSS_OUTPUT
    assert not optimizer.state[model[0].weight]["step"].item()  # exporting does not take a step


@pytest.mark.parametrize("name", ["sgd-momentum-nesterov-wd", "adam"])
def test_compiled_train_step_matches_the_interpreter(name):
    batches = _batches(4)
    model = _cnn()
    program = export_train_step(model, F.cross_entropy, OPTIMIZERS[name](model.parameters()), batches[0])
    reference, compiled = TrainStep(program, backend="interpreter"), TrainStep(program, backend="c")
    for images, labels in batches:
        _close(compiled(images, labels), reference(images, labels))
        for key in reference.state:
            _close(compiled.state[key], reference.state[key])


@requires_torch
def test_torch_runs_the_saved_train_step(tmp_path):
    """torch.export.load reads the step, and its module() performs the same optimizer steps (state in buffers)."""
    batches = _batches(3)
    model = _bn_mlp()
    program = export_train_step(model, F.cross_entropy, kiln.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                 batches[0])
    kiln.save(program, tmp_path / "step.pt2")
    module = torch.export.load(str(tmp_path / "step.pt2")).module()
    step = TrainStep(program, backend="interpreter")
    for images, labels in batches:
        (torch_loss,) = module(torch.from_numpy(images), torch.from_numpy(labels))
        _close(torch_loss.detach().numpy(), step(images, labels))
    state = {**dict(module.named_buffers()), **dict(module.named_parameters())}
    for key, value in step.state.items():
        _close(state[key].detach().numpy(), value)


@pytest.fixture(scope="module")
def digits():
    return load_digits()


def _epochs(train_x, train_y, epochs: int, batch: int = 128):
    rng = np.random.default_rng(0)
    for _ in range(epochs):
        order = rng.permutation(len(train_x))
        for start in range(0, len(order) - batch + 1, batch):  # whole batches: one compiled shape
            chosen = order[start:start + batch]
            yield train_x[chosen], train_y[chosen]


def _accuracy(model, images, labels) -> float:
    model.eval()
    with kiln.no_grad():
        predicted = model(kiln.tensor(images)).numpy().argmax(axis=1)
    return float((predicted == labels).mean() * 100)


EPOCHS = 20


def test_digits_cnn_trains_eagerly_to_97_percent(digits):
    train_x, train_y, test_x, test_y = digits
    model = _cnn()
    optimizer = kiln.optim.Adam(model.parameters(), lr=1e-2)
    _eager_steps(model, optimizer, _epochs(train_x, train_y, EPOCHS))
    assert _accuracy(model, test_x, test_y) >= 97.0


def test_digits_cnn_trains_as_a_compiled_c_step_to_97_percent(digits):
    train_x, train_y, test_x, test_y = digits
    model = _cnn()
    optimizer = kiln.optim.Adam(model.parameters(), lr=1e-2)
    batches = list(_epochs(train_x, train_y, EPOCHS))
    step = compile_train_step(model, F.cross_entropy, optimizer, batches[0])
    first = float(step(*batches[0]))
    for images, labels in batches[1:]:
        last = float(step(images, labels))
    assert last < first
    step.copy_to(model, optimizer)
    assert _accuracy(model, test_x, test_y) >= 97.0
