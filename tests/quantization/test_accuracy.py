"""Accuracy after quantization on a real data set: scikit-learn's bundled handwritten digits (8x8 images, no
download), an MLP and a small CNN trained in torch on half of it, quantized by kiln, evaluated on the other half."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import quantization as kq
from tests.datasets import digits as load_digits
from tests.torch_oracle import requires_torch, torch

pytestmark = requires_torch


@pytest.fixture(scope="module")
def digits():
    return load_digits()


def _mlp():
    nn = torch.nn
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def _cnn():
    nn = torch.nn
    return nn.Sequential(nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(256, 10))


@pytest.fixture(scope="module", params=["mlp", "cnn"])
def trained(request, digits):
    """(name, float program, test images, test labels): trained full-batch with Adam, deterministically."""
    train_x, train_y, test_x, test_y = digits
    torch.manual_seed(0)
    module = {"mlp": _mlp, "cnn": _cnn}[request.param]()
    optimizer = torch.optim.Adam(module.parameters(), lr=1e-2)
    inputs, targets = torch.from_numpy(train_x), torch.from_numpy(train_y)
    for _ in range(150):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(module(inputs), targets).backward()
        optimizer.step()
    module.eval()
    batch = torch.from_numpy(test_x)
    program = kiln.from_torch(module, (batch,), dynamic_shapes=({0: torch.export.Dim("batch")},))
    return request.param, program, train_x, test_x, test_y


def _accuracy(program, images, labels) -> float:
    return float((np.argmax(program(images), axis=1) == labels).mean() * 100)


def _calibrated(program, quantizer, train_x):
    prepared = kq.prepare_pt2e(program, quantizer)
    for batch in np.array_split(train_x[:512], 4):
        prepared(batch)
    return kq.convert_pt2e(prepared)


@pytest.mark.parametrize("scheme,allowed_drop", [("static", 1.0), ("dynamic", 0.5), ("xnnpack-static", 1.0)])
def test_int8_accuracy_drop(trained, scheme, allowed_drop):
    name, program, train_x, test_x, test_y = trained
    baseline = _accuracy(program, test_x, test_y)
    assert baseline > 90, f"{name} trained to only {baseline:.1f}%: the fixture is broken"
    if scheme.startswith("xnnpack"):
        quantizer = kq.XNNPACKQuantizer().set_global(kq.get_symmetric_quantization_config())
    else:
        config = kq.get_default_x86_inductor_quantization_config(is_dynamic=scheme == "dynamic")
        quantizer = kq.X86InductorQuantizer().set_global(config)
    quantized = _calibrated(program, quantizer, train_x)
    assert any(n.startswith("quantized_decomposed") for n in quantized.op_histogram())
    accuracy = _accuracy(quantized, test_x, test_y)
    print(f"digits {name} {scheme} int8: {baseline:.2f}% -> {accuracy:.2f}%")
    assert baseline - accuracy <= allowed_drop, f"{name} {scheme}: {baseline:.2f}% -> {accuracy:.2f}%"


@pytest.mark.parametrize("scheme", ["int8", "int4", "fp16"])
def test_weight_only_accuracy(trained, scheme):
    """Weight-only int8 and fp16 keep the accuracy; int4 in groups of 32 is reported (and must stay a working
    model)."""
    name, program, _, test_x, test_y = trained
    baseline = _accuracy(program, test_x, test_y)
    quantized = kq.convert_pt2e(kq.prepare_pt2e(program, kq.WeightOnlyQuantizer(scheme, group_size=32)))
    accuracy = _accuracy(quantized, test_x, test_y)
    print(f"digits {name} weight-only {scheme}: {baseline:.2f}% -> {accuracy:.2f}%")
    assert baseline - accuracy <= (10.0 if scheme == "int4" else 1.0), f"{baseline:.2f}% -> {accuracy:.2f}%"
