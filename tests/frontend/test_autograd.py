"""Eager autograd on kiln.Tensor against torch: the same program run in both, gradients and semantics compared."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn.functional as F
from kiln.frontend.autograd import AutogradError
from tests.torch_oracle import requires_torch, torch

pytestmark = requires_torch


def _pair(*shape, seed=0):
    array = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return kiln.tensor(array, requires_grad=True), torch.tensor(array, requires_grad=True)


def _close(kiln_value, torch_value):
    torch.testing.assert_close(torch.from_numpy(np.array(kiln_value.numpy())), torch_value.detach())


def test_mlp_gradients_match_torch():
    x, tx = _pair(4, 5)
    w1, tw1 = _pair(6, 5, seed=1)
    b1, tb1 = _pair(6, seed=2)
    w2, tw2 = _pair(3, 6, seed=3)

    def run(module, x, w1, b1, w2):
        hidden = module.relu(module.nn.functional.linear(x, w1, b1))
        logits = hidden @ w2.t() if module is torch else hidden @ w2.t()
        return module.nn.functional.log_softmax(logits, dim=1).mean() + (hidden * hidden).sum() * 0.01

    run(kiln, x, w1, b1, w2).backward()
    run(torch, tx, tw1, tb1, tw2).backward()
    for mine, theirs in [(x, tx), (w1, tw1), (b1, tb1), (w2, tw2)]:
        _close(mine.grad, theirs.grad)


def test_gradients_accumulate_and_a_freed_graph_refuses_a_second_backward():
    x, tx = _pair(3)
    y, ty = (x * x).sum(), (tx * tx).sum()
    y.backward(retain_graph=True)
    y.backward()
    ty.backward(retain_graph=True)
    ty.backward()
    _close(x.grad, tx.grad)
    with pytest.raises(AutogradError, match="backward through the graph a second time"):
        y.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        ty.backward()


def test_a_tensor_used_twice_sums_both_paths():
    x, tx = _pair(2, 3)
    (x.exp() * x + x).sum().backward()
    (tx.exp() * tx + tx).sum().backward()
    _close(x.grad, tx.grad)


def test_grad_modes():
    x, _ = _pair(3)
    with kiln.no_grad():
        assert not (x * 2).requires_grad
        assert not kiln.is_grad_enabled()
        with kiln.enable_grad():
            assert (x * 2).requires_grad
    assert (x * 2).requires_grad
    with kiln.inference_mode():
        assert not (x * 2).requires_grad and kiln.is_inference_mode_enabled()
    with kiln.set_grad_enabled(False):
        assert not (x * 2).requires_grad
    assert kiln.is_grad_enabled()

    @kiln.no_grad()
    def doubled(value):
        return value * 2
    assert not doubled(x).requires_grad and kiln.is_grad_enabled()

    kiln.set_grad_enabled(False)  # the plain call switches the mode, as torch's does
    try:
        assert not kiln.is_grad_enabled()
    finally:
        kiln.set_grad_enabled(True)
    assert not (kiln.ones(2) * 3).requires_grad  # nothing requires grad: nothing is recorded


def test_detach_stops_the_gradient_and_shares_values():
    x, tx = _pair(3)
    (x * x.detach()).sum().backward()
    (tx * tx.detach()).sum().backward()
    _close(x.grad, tx.grad)
    detached = x.detach()
    assert not detached.requires_grad and detached.is_leaf
    np.testing.assert_array_equal(detached.numpy(), x.detach().numpy())


def test_autograd_grad_leaves_dot_grad_alone():
    x, tx = _pair(2, 2)
    z, tz = _pair(2, 2, seed=5)
    out, tout = (x * z).exp().sum(), (tx * tz).exp().sum()
    gx, = kiln.autograd.grad(out, [x], retain_graph=True)
    tgx, = torch.autograd.grad(tout, [tx], retain_graph=True)
    _close(gx, tgx)
    assert x.grad is None
    unused, _ = _pair(2)
    with pytest.raises(AutogradError, match="not have been used"):
        kiln.autograd.grad(out, [unused], retain_graph=True)
    assert kiln.autograd.grad(out, [unused], allow_unused=True, retain_graph=True) == (None,)
    # grad_outputs for a non-scalar output
    weights = np.arange(4, dtype=np.float32).reshape(2, 2)
    y, ty = x * z, tx * tz
    gz, = kiln.autograd.grad(y, z, grad_outputs=kiln.tensor(weights))
    tgz, = torch.autograd.grad(ty, tz, grad_outputs=torch.from_numpy(weights))
    _close(gz, tgz)


def test_non_scalar_backward_needs_a_gradient_and_integer_tensors_cannot_require_grad():
    x, _ = _pair(3)
    with pytest.raises(AutogradError, match="only for scalar outputs"):
        (x * 2).backward()
    with pytest.raises(kiln.KilnError, match="floating point and complex"):
        kiln.tensor([1, 2]).requires_grad_()
    with pytest.raises(AutogradError, match="does not require grad"):
        kiln.ones(2).sum().backward()


def test_hooks_and_retain_grad():
    x, tx = _pair(3)
    seen = []
    handle = x.register_hook(lambda g: seen.append(g.numpy().copy()))
    tx.register_hook(lambda g: None)
    y, ty = x * 3, tx * 3
    y.register_hook(lambda g: g * 2)  # a hook may replace the gradient of a non-leaf
    ty.register_hook(lambda g: g * 2)
    y.retain_grad()
    ty.retain_grad()
    (y * y).sum().backward()
    (ty * ty).sum().backward()
    _close(x.grad, tx.grad)
    _close(y.grad, ty.grad)
    assert len(seen) == 1 and y.retains_grad
    handle.remove()
    x.grad = None
    (x * 1).sum().backward()
    assert len(seen) == 1


def test_second_order_gradients_with_create_graph():
    x, tx = _pair(4)
    first, = kiln.autograd.grad((x * x * x).sum(), x, create_graph=True)
    tfirst, = torch.autograd.grad((tx * tx * tx).sum(), tx, create_graph=True)
    _close(first, tfirst)
    assert first.requires_grad
    second, = kiln.autograd.grad(first.sum(), x)
    tsecond, = torch.autograd.grad(tfirst.sum(), tx)
    _close(second, tsecond)


def test_in_place_ops():
    x, tx = _pair(3)
    with pytest.raises(AutogradError, match="leaf Variable that requires grad"):
        x.mul_(2)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        tx.mul_(2)
    y, ty = x * 1, tx * 1
    y.mul_(3)
    ty.mul_(3)
    y.add_(x)
    ty.add_(tx)
    y = y.exp()
    ty = ty.exp()
    y.sum().backward()
    ty.sum().backward()
    _close(x.grad, tx.grad)
    with kiln.no_grad():  # what an optimizer does
        x.sub_(x.grad * 0.1)
    with torch.no_grad():
        tx.sub_(tx.grad * 0.1)
    _close(x, tx)
    assert x.is_leaf and x.requires_grad


def test_in_place_update_of_a_value_a_rule_needs_keeps_the_gradient_right():
    """exp_'s rule needs its result, which add_ then overwrites: torch refuses (a version-counter error), kiln keeps
    the old array for the rule, so the gradient equals the out-of-place program's."""
    x, tx = _pair(3)
    y = x * 1
    y.exp_()
    y.add_(x)
    y.sum().backward()
    ((tx * 1).exp() + tx).sum().backward()
    _close(x.grad, tx.grad)


def test_multi_output_op_and_backward_inputs():
    x, tx = _pair(3, 4)
    w, tw = _pair(3, 4, seed=7)
    values, indices = (x * w).max(dim=1)
    tvalues, tindices = (tx * tw).max(dim=1)
    values.sum().backward(inputs=[x])
    tvalues.sum().backward(inputs=[tx])
    _close(x.grad, tx.grad)
    assert w.grad is None and tw.grad is None
    assert not indices.requires_grad


def test_composite_ops_differentiate_through_their_decompositions():
    x, tx = _pair(2, 3, 8)
    weight, tweight = _pair(8, seed=1)
    bias, tbias = _pair(8, seed=2)
    out = F.layer_norm(x, [8], weight, bias).softmax(-1).mul(F.gelu(x)).sum()
    tout = torch.nn.functional.layer_norm(tx, [8], tweight, tbias).softmax(-1).mul(torch.nn.functional.gelu(tx)).sum()
    out.backward()
    tout.backward()
    for mine, theirs in [(x, tx), (weight, tweight), (bias, tbias)]:
        _close(mine.grad, theirs.grad)


def test_module_parameters_get_gradients():
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                    torch.nn.Flatten(), torch.nn.Linear(64, 10))
    model = kiln.nn.Sequential(kiln.nn.Conv2d(1, 4, 3, padding=1), kiln.nn.ReLU(), kiln.nn.MaxPool2d(2),
                               kiln.nn.Flatten(), kiln.nn.Linear(64, 10))
    model.load_state_dict(reference.state_dict())
    images = np.random.default_rng(0).standard_normal((5, 1, 8, 8)).astype(np.float32)
    labels = np.array([0, 3, 9, 1, 3])
    F.cross_entropy(model(kiln.tensor(images)), kiln.tensor(labels)).backward()
    torch.nn.functional.cross_entropy(reference(torch.from_numpy(images)), torch.from_numpy(labels)).backward()
    for (name, mine), (_, theirs) in zip(model.named_parameters(), reference.named_parameters()):
        _close(mine.grad, theirs.grad)
