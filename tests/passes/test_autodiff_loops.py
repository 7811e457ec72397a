"""Reverse-mode autodiff through kiln.scan: the joint program of a recurrent model with a dynamic sequence length
(one program for every length: a scan recomputing each step's carry, then a scan backwards over the steps running
the body's VJP) gives torch autograd's gradients at lengths 1, 7 and 300, and compiles to C."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import kiln
import kiln.nn as nn
from kiln.passes import joint_program
from kiln.passes.autodiff import JointProgramError
from tests.torch_oracle import module_pair

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.filterwarnings("ignore:LSTM with projections is not supported:UserWarning")

LENGTHS = (1, 7, 300)


class Squared(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        out, _ = self.inner(x)
        return (out * out).mean()


def _close(got, expected) -> None:
    torch.testing.assert_close(torch.from_numpy(np.asarray(got)), expected.detach())


@pytest.mark.parametrize("name,kwargs", [
    ("LSTM", {"num_layers": 2, "bidirectional": True, "proj_size": 3}),
    ("GRU", {"batch_first": True, "bias": False}),
    ("RNN", {"nonlinearity": "relu", "bidirectional": True}),
], ids=["LSTM", "GRU", "RNN"])
def test_recurrent_joint_program_matches_torch_autograd(name, kwargs):
    reference, module = module_pair(name, 4, 6, **kwargs)
    seq_dim = 1 if kwargs.get("batch_first") else 0
    example = kiln.randn(*([2, 5, 4] if seq_dim else [5, 2, 4]))
    joint = joint_program(kiln.export(Squared(module), (example,), dynamic_shapes=({seq_dim: kiln.Dim("seq")},)),
                          input_gradients=True)
    assert sum(op.name == "kiln.scan" for op in joint.body.walk()) >= 3 * (4 if name == "LSTM" else 2 if
                                                                           kwargs.get("bidirectional") else 1)
    for length in LENGTHS:
        shape = [2, length, 4] if seq_dim else [length, 2, 4]
        x = torch.randn(*shape, requires_grad=True)
        reference.zero_grad()
        loss = (reference(x)[0] ** 2).mean()
        loss.backward()
        loss_value, *gradients = joint(x.detach().numpy())
        _close(loss_value, loss)
        expected = [p.grad for p in reference.parameters()] + [x.grad]
        assert len(gradients) == len(expected)
        for got, want in zip(gradients, expected):
            _close(got, want)


class TwoCarries(nn.Module):
    """A reversed scan over dim 1 with two carries, two xs and a parameter; the input's gradient flows back."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(kiln.randn(3, 3) * 0.5)

    def forward(self, xs, h):
        def step(carry, x):
            h, total = carry
            h = kiln.tanh(x[0] @ self.weight + h * x[1])
            return (h, total + h.sum(-1, keepdim=True)), h * 2
        (h, total), ys = kiln.scan(step, (h, kiln.zeros(h.shape[0], 1)), (xs, xs.sin()), dim=1, reverse=True)
        return (ys * ys).mean() + total.sum() + h.pow(2).sum()


def test_user_scan_gradients_match_torch():
    from torch._higher_order_ops.scan import scan
    module = TwoCarries()
    weight = torch.from_numpy(np.asarray(module.weight.numpy()).copy()).requires_grad_()

    def reference(xs, h):
        def step(carry, x):
            h, total = carry
            h = torch.tanh(x[0] @ weight + h * x[1])
            return (h, total + h.sum(-1, keepdim=True)), h * 2
        (h, total), ys = scan(step, (h, torch.zeros(h.shape[0], 1)), (xs, xs.sin()), dim=1, reverse=True)
        return (ys * ys).mean() + total.sum() + h.pow(2).sum()

    joint = joint_program(kiln.export(module, (kiln.randn(2, 5, 3), kiln.randn(2, 3)),
                                      dynamic_shapes={"xs": {1: kiln.Dim("seq")}, "h": None}), input_gradients=True)
    for length in LENGTHS:
        torch._dynamo.reset()  # torch compiles its scan; its caches do not survive new shapes well in 2.13
        xs, h = torch.randn(2, length, 3, requires_grad=True), torch.randn(2, 3, requires_grad=True)
        weight.grad = None
        loss = reference(xs, h)
        loss.backward()
        loss_value, weight_grad, xs_grad, h_grad = joint(xs.detach().numpy(), h.detach().numpy())
        _close(loss_value, loss)
        for got, want in ((weight_grad, weight.grad), (xs_grad, xs.grad), (h_grad, h.grad)):
            _close(got, want)


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_joint_program_of_a_scan_compiles_to_c(tmp_path):
    reference, module = module_pair("GRU", 4, 6, num_layers=2)
    joint = joint_program(kiln.export(Squared(module), (kiln.randn(5, 2, 4),),
                                      dynamic_shapes=({0: kiln.Dim("seq")},)))
    compiled = kiln.compile(joint, output=tmp_path / "pkg")
    for length in LENGTHS:
        x = kiln.randn(length, 2, 4).numpy()
        for got, want in zip(compiled(x), joint(x)):
            torch.testing.assert_close(torch.from_numpy(got), torch.from_numpy(np.asarray(want)))


def test_integer_carries_are_refused_clearly():
    class Counting(nn.Module):
        def forward(self, xs):
            def step(carry, x):
                count, total = carry
                return (count + 1, total + x), x * 2
            (count, total), ys = kiln.scan(step, (kiln.zeros((), dtype=kiln.int64), kiln.zeros(3)), xs)
            return (ys.sum() + total.sum()) * count

    program = kiln.export(Counting(), (kiln.randn(4, 3),))
    with pytest.raises(JointProgramError, match="integer carries"):
        joint_program(program)
