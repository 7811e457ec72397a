"""The joint forward+backward program (kiln.passes.joint_program) against eager autograd and torch.autograd, in the
interpreter, compiled to C, with symbolic batch sizes and through .pt2."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn as nn
import kiln.nn.functional as F
from kiln.training import WithLoss
import kiln.models
from kiln.ir.program import OutputKind
from kiln.passes import joint_program
from kiln.passes.autodiff import JointProgramError
from tests.torch_oracle import requires_torch, torch



def _cnn() -> nn.Module:
    kiln.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(64, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 10))


def _batch(n: int = 6, seed: int = 0):
    rng = np.random.default_rng(seed)
    return (kiln.tensor(rng.standard_normal((n, 1, 8, 8)).astype(np.float32)),
            kiln.tensor(rng.integers(0, 10, n)))


def _eager_gradients(model: nn.Module, images, labels) -> list[np.ndarray]:
    model.zero_grad()
    WithLoss(model, F.cross_entropy)(images, labels).backward()
    return [p.grad.numpy() for p in model.parameters()]


def _array(value) -> np.ndarray:
    return value.numpy() if isinstance(value, kiln.Tensor) else np.asarray(value)


def _close(actual, expected):
    torch.testing.assert_close(torch.from_numpy(_array(actual)), torch.from_numpy(_array(expected)))


@requires_torch
def test_joint_program_matches_eager_autograd_and_torch():
    model = _cnn()
    images, labels = _batch()
    joint = joint_program(kiln.export(WithLoss(model, F.cross_entropy), (images, labels)))
    kinds = [spec.kind for spec in joint.graph_signature.output_specs]
    names = [name for name, _ in model.named_parameters()]
    assert kinds == [OutputKind.LOSS_OUTPUT] + [OutputKind.GRADIENT_TO_PARAMETER] * len(names)
    assert [spec.target for spec in joint.graph_signature.output_specs[1:]] == [f"model.{n}" for n in names]

    loss, *gradients = joint(images, labels)
    eager = _eager_gradients(model, images, labels)
    reference = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                    torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.GELU(),
                                    torch.nn.LayerNorm(32), torch.nn.Linear(32, 10))
    reference.load_state_dict({k: torch.from_numpy(v.numpy()) for k, v in model.state_dict().items()})
    torch_loss = torch.nn.functional.cross_entropy(reference(torch.from_numpy(images.numpy())),
                                                   torch.from_numpy(labels.numpy()))
    torch_loss.backward()
    _close(loss, torch_loss.detach().numpy())
    for mine, from_eager, theirs in zip(gradients, eager, reference.parameters()):
        _close(mine, from_eager)
        _close(mine, theirs.grad.numpy())


@requires_torch
def test_joint_program_with_a_symbolic_batch_compiles_to_c():
    model = _cnn()
    images, labels = _batch()
    batch = kiln.Dim("batch", min=2, max=64)
    program = kiln.export(WithLoss(model, F.cross_entropy), (images, labels), dynamic_shapes=({0: batch}, {0: batch}))
    joint = joint_program(program)
    compiled = kiln.compile(joint)
    for n in (3, 11):
        images, labels = _batch(n, seed=n)
        expected = joint(images, labels)
        produced = compiled(images.numpy(), labels.numpy())
        for mine, reference in zip(produced, expected):
            _close(mine, reference)
        for mine, reference in zip(expected[1:], _eager_gradients(model, images, labels)):
            _close(mine, reference)


def test_joint_program_round_trips_through_pt2(tmp_path):
    model = _cnn()
    images, labels = _batch()
    joint = joint_program(kiln.export(WithLoss(model, F.cross_entropy), (images, labels)))
    kiln.save(joint, tmp_path / "joint.pt2")
    loaded = kiln.load(tmp_path / "joint.pt2")
    assert [s.kind for s in loaded.graph_signature.output_specs] == [s.kind for s in joint.graph_signature.output_specs]
    for mine, reference in zip(loaded(images, labels), joint(images, labels)):
        np.testing.assert_array_equal(_array(mine), _array(reference))


def test_input_gradients_and_unused_parameters():
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.used = nn.Linear(4, 1)
            self.unused = nn.Linear(4, 1)

        def forward(self, x):
            return (self.used(x) ** 2).mean()

    model = Model()
    x = kiln.randn(5, 4)
    joint = joint_program(kiln.export(model, (x,)), input_gradients=True)
    loss, used_weight, used_bias, unused_weight, unused_bias, input_gradient = joint(x.numpy())
    assert not unused_weight.any() and not unused_bias.any()
    assert joint.graph_signature.output_specs[-1].kind is OutputKind.GRADIENT_TO_USER_INPUT
    leaf = kiln.tensor(x.numpy(), requires_grad=True)
    model(leaf).backward()
    np.testing.assert_allclose(input_gradient, leaf.grad.numpy(), rtol=1.3e-6, atol=1e-5)
    np.testing.assert_allclose(used_weight, model.used.weight.grad.numpy(), rtol=1.3e-6, atol=1e-5)


def test_joint_program_errors():
    model = nn.Linear(3, 2)
    x = kiln.randn(4, 3)
    program = kiln.export(model, (x,))
    with pytest.raises(JointProgramError, match="one element"):
        joint_program(program)
    with pytest.raises(JointProgramError, match="out of range"):
        joint_program(program, joint_loss_index=3)


@requires_torch
def test_torch_loads_the_joint_program_and_returns_loss_and_gradients(tmp_path):
    model = _cnn()
    images, labels = _batch()
    joint = joint_program(kiln.export(WithLoss(model, F.cross_entropy), (images, labels)))
    kiln.save(joint, tmp_path / "joint.pt2")
    loaded = torch.export.load(str(tmp_path / "joint.pt2"))
    kinds = [type(spec.kind).__name__ + "." + spec.kind.name for spec in loaded.graph_signature.output_specs]
    assert kinds[0] == "OutputKind.LOSS_OUTPUT" and set(kinds[1:]) == {"OutputKind.GRADIENT_TO_PARAMETER"}
    produced = loaded.module()(torch.from_numpy(images.numpy()), torch.from_numpy(labels.numpy()))
    for mine, theirs in zip(joint(images.numpy(), labels.numpy()), produced):
        _close(mine, theirs.detach().numpy())


@pytest.mark.parametrize("name", sorted(kiln.models.MODELS))
def test_joint_program_of_every_zoo_model_matches_eager_autograd(name):
    """The mean square of each zoo model's outputs as the loss: the joint program's gradients == eager autograd's."""
    import inspect

    class SquaredOutputs(nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, *args):
            outputs = self.model(*args)
            outputs = outputs if isinstance(outputs, (list, tuple)) else (outputs,)
            total = None
            for output in outputs:
                term = (output * output).mean()
                total = term if total is None else total + term
            return total

    entry = kiln.models.get(name)
    names = list(inspect.signature(entry.model.forward).parameters)
    dynamic = tuple((entry.dynamic_shapes or {}).get(n) for n in names[:len(entry.args)])
    wrapped = SquaredOutputs(entry.model)
    joint = joint_program(kiln.export(wrapped, entry.args, dynamic_shapes=dynamic))
    loss, *gradients = joint(*[a.numpy() for a in entry.args])
    entry.model.zero_grad()
    wrapped(*entry.args).backward()
    for (parameter_name, parameter), gradient in zip(entry.model.named_parameters(), gradients):
        expected = np.zeros_like(parameter.numpy()) if parameter.grad is None else parameter.grad.numpy()
        np.testing.assert_allclose(gradient, expected, rtol=1.3e-6, atol=1e-5, err_msg=f"{name}: {parameter_name}")
