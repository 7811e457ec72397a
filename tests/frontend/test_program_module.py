"""ProgramModule: an exported program as a trainable module, against the eager model it was exported from."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn as nn
import kiln.nn.functional as F
from kiln.frontend.program_module import ProgramModule


def _bn_cnn() -> nn.Module:
    kiln.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(64, 10))


def _data(seed: int):
    rng = np.random.default_rng(seed)
    return kiln.tensor(rng.standard_normal((8, 1, 8, 8)).astype(np.float32)), kiln.tensor(rng.integers(0, 10, 8))


def _close(actual, expected):
    np.testing.assert_allclose(actual.numpy(), expected.numpy(), rtol=1.3e-6, atol=1e-5)


def test_training_a_program_module_matches_training_the_model():
    model, twin = _bn_cnn(), _bn_cnn()
    images, _ = _data(0)
    module = ProgramModule(kiln.export(twin, (images,)))
    assert [n for n, _ in module.named_parameters()] == [n for n, _ in model.named_parameters()]
    assert list(module.state_dict()) == list(model.state_dict())
    optimizers = [kiln.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (model, module)]
    for step in range(4):
        images, labels = _data(step)
        for m, optimizer in zip((model, module), optimizers):
            optimizer.zero_grad()
            F.cross_entropy(m(images), labels).backward()
            optimizer.step()
    for (name, mine), (_, theirs) in zip(module.state_dict().items(), model.state_dict().items()):
        _close(mine, theirs)
    model.eval()
    module.eval()
    images, _ = _data(9)
    _close(module(images), model(images))
    before = module.state_dict()["1.running_mean"].numpy().copy()
    module(images)
    np.testing.assert_array_equal(module.state_dict()["1.running_mean"].numpy(), before)  # eval: no updates
    module.train()
    module(images)
    assert not np.array_equal(module.state_dict()["1.running_mean"].numpy(), before)


def test_value_transforms_apply_to_every_use_and_edge_transforms_to_one():
    class Double(nn.Module):
        calls = 0

        def forward(self, x):
            Double.calls += 1
            return x * 2

    class Model(nn.Module):
        def forward(self, x):
            y = x.exp()
            return y + 1, y * 3

    x = kiln.randn(3)
    program = kiln.export(Model(), (x,))
    exp = next(op for op in program.nodes() if op.opdef.name == "aten.exp.default")
    add = next(op for op in program.nodes() if op.opdef.name == "aten.add.Tensor" or op.opdef.name == "aten.add.Scalar")
    module = ProgramModule(program)
    module.transform_edge(exp.results[0], add, "double", Double())
    plus, times = module(x)
    _close(plus, x.exp() * 2 + 1)
    _close(times, x.exp() * 3)
    module = ProgramModule(program)
    module.transform_value(exp.results[0], "double", Double())
    plus, times = module(x)
    _close(plus, x.exp() * 2 + 1)
    _close(times, x.exp() * 6)


def test_control_flow_is_refused_clearly():
    class Branchy(nn.Module):
        def forward(self, x):
            return kiln.cond(x.sum() > 0, lambda v: v + 1, lambda v: v - 1, (x,))

    module = ProgramModule(kiln.export(Branchy(), (kiln.randn(3),)))
    with pytest.raises(kiln.KilnError, match="control flow"):
        module(kiln.randn(3))


def test_eval_keeps_the_running_statistics_but_not_other_state():
    """In eval mode (torch's move_exported_model_to_eval) batch norm's running statistics stay, while a buffer the
    program updates for another reason, a step counter as a KV cache's position would be, keeps counting."""
    class Counted(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.BatchNorm1d(3)
            self.register_buffer("calls", kiln.zeros(()))

        def forward(self, x):
            self.calls.add_(1)
            return self.norm(x) * self.calls

    x = kiln.tensor(np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32))
    module = ProgramModule(kiln.export(Counted(), (x,)))
    statistics = {name: value.numpy().copy() for name, value in module.named_buffers() if "running" in name}
    module.eval()
    for _ in range(3):
        module(x)
    buffers = dict(module.named_buffers())
    assert float(buffers["calls"].numpy()) == 3.0
    for name, value in statistics.items():
        np.testing.assert_array_equal(buffers[name].numpy(), value)
