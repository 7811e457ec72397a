"""Quantization-aware training: kiln's prepare_qat_pt2e against torchao's on the same modules and data (fake-quantized
outputs, gradients, training steps, converted programs), the converted program through kiln's int8 C kernels and
ONNX QDQ, and QAT recovering what post-training quantization loses on scikit-learn's digits."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn.functional as F
from kiln import quantization as kq
from kiln.ir import dtypes
from tests.datasets import digits
from tests.quantization.support import TORCHAO, requires_torchao
from tests.quantization.test_pt2e import (
    MODELS, _assert_same_quantize_args, _kiln_quantize_args, _quantize_args, assert_quantized_close,
)
from tests.torch_oracle import torch


def _close(actual, expected):
    torch.testing.assert_close(torch.from_numpy(np.asarray(actual)), torch.from_numpy(np.asarray(expected)))


def _fake_quantized_outputs_agree(actual, expected) -> bool:
    """Whether the fake-quantized outputs agree at float32 tolerance (then the rest of the step must agree as
    strictly). kiln's and torch's float kernels differ in the last ulp, so a value on a fake quantizer's rounding
    boundary can land one step apart (measured on the conv-BN model: 2 of 12 steps over four data seeds, 1 and 5
    samples of 16). A flip may move only some samples' outputs, by at most the few percent of the output range
    that `assert_quantized_close` allows; a wrong quantizer placement, qparam or gradient moves every sample."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    differs = (np.abs(actual - expected) > 1e-5 + 1.3e-6 * np.abs(expected)).reshape(len(actual), -1).any(axis=1)
    if not differs.any():
        return True
    assert differs.mean() <= 0.5, f"{differs.sum()} of {len(differs)} samples differ: more than rounding flips"
    assert_quantized_close(actual, expected)
    return False


def _batches(shape, count, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(*shape, generator=generator) * (1 + i % 3), torch.randint(0, 4, (shape[0],),
                                                                                   generator=generator))
            for i in range(count)]


def _conv_bn():
    nn = torch.nn

    class ConvBatchNorm(nn.Module):
        """torch's QAT patterns with batch norm: conv → bn → relu, conv (no bias) → bn → add → relu, conv → bn."""

        def __init__(self):
            super().__init__()
            self.conv1, self.bn1, self.relu1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()
            self.conv2, self.bn2, self.relu2 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU()
            self.conv3, self.bn3 = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)
            self.fc = nn.Linear(8, 4)

        def forward(self, x):
            x = self.relu1(self.bn1(self.conv1(x)))
            x = self.relu2(self.bn2(self.conv2(x)) + x)
            return self.fc(self.bn3(self.conv3(x)).mean((2, 3)))
    return ConvBatchNorm()


QAT_MODELS = {**MODELS, "conv_bn": (_conv_bn, (16, 3, 8, 8))}


def _prepared_pair(model: str, batch):
    """The same torch module prepared for QAT by torchao and by kiln (X86 QAT config)."""
    _, flow, x86 = TORCHAO
    factory, _ = QAT_MODELS[model]
    torch.manual_seed(0)
    module = factory()
    reference = flow.prepare_qat_pt2e(torch.export.export(module, (batch,)).module(), x86.X86InductorQuantizer()
                                      .set_global(x86.get_default_x86_inductor_quantization_config(is_qat=True)))
    prepared = kq.prepare_qat_pt2e(kiln.from_torch(module, (batch,)), kq.X86InductorQuantizer().set_global(
        kq.get_default_x86_inductor_quantization_config(is_qat=True)))
    return reference, prepared


@requires_torchao
@pytest.mark.parametrize("model", ["mlp", "cnn", "conv_bn"])
def test_qat_training_matches_torchao(model):
    """Three SGD steps: the fake-quantized outputs, the loss, every parameter's gradient, the updated parameters and
    batch norms' running statistics agree with torchao's prepared module (which simulates folding batch norm into
    the convolution's weight); then both convert to the same quantize placement and qparams. Agreement is at float32
    tolerance, unless a fake-quantize rounding flip (see `_fake_quantized_outputs_agree`) made the models diverge:
    from then on, within the bound `assert_quantized_close` allows."""
    _, shape = QAT_MODELS[model]
    batches = _batches(shape, 3)
    reference, prepared = _prepared_pair(model, batches[0][0])
    torch_optimizer = torch.optim.SGD(reference.parameters(), lr=0.05)
    kiln_optimizer = kiln.optim.SGD(prepared.parameters(), lr=0.05)
    torch_parameters = dict(reference.named_parameters())
    close = _close
    for images, labels in batches:
        torch_optimizer.zero_grad()
        expected = reference(images)
        expected_loss = torch.nn.functional.cross_entropy(expected[:, :4] if expected.shape[1] > 4 else expected,
                                                          labels)
        expected_loss.backward()
        kiln_optimizer.zero_grad()
        produced = prepared(kiln.tensor(images.numpy()))
        loss = F.cross_entropy(produced[:, :4] if produced.shape[1] > 4 else produced, kiln.tensor(labels.numpy()))
        loss.backward()
        if not _fake_quantized_outputs_agree(produced.detach().numpy(), expected.detach().numpy()):
            close = assert_quantized_close
        close(loss.detach().numpy(), expected_loss.detach().numpy())
        for name, parameter in prepared.named_parameters():
            theirs = torch_parameters[name.replace(".", "_") if name not in torch_parameters else name]
            close(parameter.grad.numpy(), theirs.grad.numpy())
        torch_optimizer.step()
        kiln_optimizer.step()
    for name, parameter in prepared.named_parameters():
        close(parameter.detach().numpy(), torch_parameters[name].detach().numpy())
    torch_buffers = dict(reference.named_buffers())
    for name, buffer in prepared.named_buffers():
        if "running_" in name:
            close(buffer.numpy(), torch_buffers[name].numpy())
    kq.move_exported_model_to_eval(prepared)
    from torchao.quantization.pt2e import move_exported_model_to_eval
    move_exported_model_to_eval(reference)
    converted = kq.convert_pt2e(prepared)
    expected_module = TORCHAO[1].convert_pt2e(reference)
    _assert_same_quantize_args(_kiln_quantize_args(converted), _quantize_args(expected_module))


@requires_torchao
@pytest.mark.parametrize("model", ["cnn", "conv_bn"])
def test_fake_quantizers_are_placed_where_torchao_places_them(model):
    _, shape = QAT_MODELS[model]
    batch = _batches(shape, 1)[0][0]
    reference, prepared = _prepared_pair(model, batch)
    theirs = [m for m in reference.modules() if type(m).__name__.endswith("FakeQuantize")]  # torchao's own classes
    mine = [m for m in prepared.modules() if isinstance(m, kq.FakeQuantizeBase)]
    assert len(mine) == len(theirs) > 0
    assert sorted(type(m).__name__ for m in mine) == sorted(type(m).__name__ for m in theirs)


def test_observers_and_fake_quant_can_be_switched_off():
    _, shape = MODELS["mlp"]
    module = MODELS["mlp"][0]().eval()
    batch = torch.randn(*shape)
    prepared = kq.prepare_qat_pt2e(kiln.from_torch(module, (batch,)), kq.X86InductorQuantizer().set_global(
        kq.get_default_x86_inductor_quantization_config(is_qat=True)))
    x = kiln.tensor(batch.numpy())
    with kiln.no_grad():
        prepared(x)
        prepared.apply(kq.disable_observer)
        scales = [m.scale.numpy().copy() for m in prepared.modules() if isinstance(m, kq.FakeQuantizeBase)]
        prepared(x * 10)  # observers off: the qparams stay
        assert all(np.array_equal(a, m.scale.numpy()) for a, m in zip(
            scales, [m for m in prepared.modules() if isinstance(m, kq.FakeQuantizeBase)]))
        prepared.apply(kq.disable_fake_quant)
        _close(prepared(x).numpy(), module(batch).detach().numpy())  # no fake quant: the float model


def test_prepare_qat_needs_a_qat_config():
    program = kiln.export(kiln.nn.Linear(4, 2), (kiln.randn(3, 4),))
    with pytest.raises(kiln.KilnError, match="QAT config"):
        kq.prepare_qat_pt2e(program, kq.X86InductorQuantizer().set_global(
            kq.get_default_x86_inductor_quantization_config()))


def _epochs(images, labels, count, seed):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        order = rng.permutation(len(images))
        for start in range(0, len(order) - 127, 128):
            chosen = order[start:start + 128]
            yield kiln.tensor(images[chosen]), kiln.tensor(labels[chosen])


def _two_bit_weights(qat: bool) -> kq.QuantizationConfig:
    """uint8 activations, weights in 2 bits ([-2, 1]) per tensor: a setting where post-training quantization loses
    accuracy (kiln's int8 C kernels take these weights too: int8 storage, any range)."""
    eps = 2.0 ** -12
    if qat:
        activation_observer = kq.FusedMovingAvgObsFakeQuantize.with_args(eps=eps)
        weight_observer = kq.FusedMovingAvgObsFakeQuantize.with_args(eps=eps, observer=kq.MovingAverageMinMaxObserver)
    else:
        activation_observer = kq.HistogramObserver.with_args(eps=eps)
        weight_observer = kq.MinMaxObserver.with_args(eps=eps)
    activation = kq.QuantizationSpec(dtypes.uint8, activation_observer, quant_min=0, quant_max=255,
                                     qscheme=kq.per_tensor_affine)
    weight = kq.QuantizationSpec(dtypes.int8, weight_observer, quant_min=-2, quant_max=1,
                                 qscheme=kq.per_tensor_symmetric)
    return kq.QuantizationConfig(activation, activation, weight, None, qat)


def test_qat_recovers_what_post_training_quantization_loses_on_digits():
    train_x, train_y, test_x, test_y = digits()
    kiln.manual_seed(0)
    nn = kiln.nn
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = kiln.optim.Adam(model.parameters(), lr=1e-2)
    for images, labels in _epochs(train_x, train_y, 20, seed=0):
        optimizer.zero_grad()
        F.cross_entropy(model(images), labels).backward()
        optimizer.step()
    model.eval()

    def accuracy(run) -> float:
        return float((np.asarray(run(test_x)).argmax(axis=1) == test_y).mean() * 100)

    with kiln.no_grad():
        float_accuracy = accuracy(lambda a: model(kiln.tensor(a)).numpy())
    program = kiln.export(model, (kiln.tensor(train_x[:128]),), dynamic_shapes=({0: kiln.Dim("batch")},))
    calibrating = kq.prepare_pt2e(program, kq.X86InductorQuantizer().set_global(_two_bit_weights(qat=False)))
    for images, _ in _epochs(train_x, train_y, 1, seed=1):
        calibrating(images.numpy())
    ptq_accuracy = accuracy(kq.convert_pt2e(calibrating))

    prepared = kq.prepare_qat_pt2e(program, kq.X86InductorQuantizer().set_global(_two_bit_weights(qat=True)))
    optimizer = kiln.optim.Adam(prepared.parameters(), lr=3e-3)
    for images, labels in _epochs(train_x, train_y, 10, seed=1):
        optimizer.zero_grad()
        F.cross_entropy(prepared(images), labels).backward()
        optimizer.step()
    kq.move_exported_model_to_eval(prepared)
    prepared.apply(kq.disable_observer)  # evaluation must not move the qparams
    with kiln.no_grad():
        fake_quantized_accuracy = accuracy(lambda a: prepared(kiln.tensor(a)).numpy())
    quantized = kq.convert_pt2e(prepared)
    qat_accuracy = accuracy(quantized)
    assert float_accuracy >= 96.0
    assert float_accuracy - ptq_accuracy >= 3.0, "the setting must cost post-training quantization accuracy"
    assert qat_accuracy == fake_quantized_accuracy  # convert quantizes with the qparams training used
    assert qat_accuracy - ptq_accuracy >= (float_accuracy - ptq_accuracy) / 2, (
        f"float {float_accuracy:.2f}, PTQ {ptq_accuracy:.2f}, QAT {qat_accuracy:.2f}")
    compiled = kiln.compile(quantized)  # the int8 C kernels of post-training quantization
    np.testing.assert_array_equal(np.asarray(compiled(test_x)).argmax(axis=1) == test_y,
                                  np.asarray(quantized(test_x)).argmax(axis=1) == test_y)
    ort = pytest.importorskip("onnxruntime")
    model_proto = kiln.onnx.export(quantized, (test_x,)).model_proto  # ONNX QDQ, as for post-training quantization
    assert {"QuantizeLinear", "DequantizeLinear"} <= {node.op_type for node in model_proto.graph.node}
    session = ort.InferenceSession(model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {session.get_inputs()[0].name: test_x})
    assert_quantized_close(logits, quantized(test_x))


def test_learnable_fake_quantizers_train_their_qparams():
    """LSQ-style QAT: a config of _LearnableFakeQuantize makes scale and zero point parameters of the prepared
    module; training moves them, and convert quantizes with the learned values."""
    learnable = kq._LearnableFakeQuantize.with_args(observer=kq.MovingAverageMinMaxObserver, use_grad_scaling=True)
    activation = kq.QuantizationSpec(dtypes.uint8, learnable, quant_min=0, quant_max=255,
                                     qscheme=kq.per_tensor_affine)
    weight = kq.QuantizationSpec(dtypes.int8, learnable, quant_min=-8, quant_max=7, qscheme=kq.per_tensor_symmetric)
    config = kq.QuantizationConfig(activation, activation, weight, None, True)
    kiln.manual_seed(0)
    model = kiln.nn.Sequential(kiln.nn.Linear(8, 16), kiln.nn.ReLU(), kiln.nn.Linear(16, 3))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 8)).astype(np.float32)
    y = x[:, :3].argmax(axis=1)
    prepared = kq.prepare_qat_pt2e(kiln.export(model, (kiln.tensor(x),)), kq.X86InductorQuantizer().set_global(config))
    quantizers = [m for m in prepared.modules() if isinstance(m, kq._LearnableFakeQuantize)]
    assert quantizers and all(isinstance(m.scale, kiln.nn.Parameter) for m in quantizers)
    with kiln.no_grad():
        prepared(kiln.tensor(x))  # the first call observes: initial qparams
    prepared.apply(kq.disable_observer)
    before = [m.scale.numpy().copy() for m in quantizers]
    optimizer = kiln.optim.Adam(prepared.parameters(), lr=1e-2)
    for _ in range(20):
        optimizer.zero_grad()
        F.cross_entropy(prepared(kiln.tensor(x)), kiln.tensor(y)).backward()
        optimizer.step()
    assert any(not np.array_equal(b, m.scale.numpy()) for b, m in zip(before, quantizers))
    kq.move_exported_model_to_eval(prepared)
    with kiln.no_grad():
        expected = prepared(kiln.tensor(x)).numpy()
    np.testing.assert_allclose(kq.convert_pt2e(prepared)(x), expected, rtol=1.3e-6, atol=1e-5)


def test_convert_gives_the_inference_program_of_a_model_exported_in_training_mode():
    """Batch norm exported in training mode (batch statistics, running-stat updates) and dropout: after QAT, convert
    reads the running statistics and drops the updates and the dropout, so the quantized program computes what the
    prepared module computes in eval mode."""
    nn = kiln.nn
    kiln.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(), nn.Dropout(0.2),
                          nn.Flatten(), nn.Linear(64, 3))
    x = kiln.randn(8, 1, 4, 4)
    labels = kiln.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    prepared = kq.prepare_qat_pt2e(kiln.export(model, (x,)), kq.X86InductorQuantizer().set_global(
        kq.get_default_x86_inductor_quantization_config(is_qat=True)))
    optimizer = kiln.optim.SGD(prepared.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        F.cross_entropy(prepared(x), labels).backward()
        optimizer.step()
    kq.move_exported_model_to_eval(prepared)
    prepared.apply(kq.disable_observer)
    with kiln.no_grad():
        expected = prepared(x).numpy()
    quantized = kq.convert_pt2e(prepared)
    assert [spec.kind for spec in quantized.graph_signature.output_specs] == [kiln.OutputKind.USER_OUTPUT]
    names = set(quantized.op_histogram())
    assert "aten.var_mean.correction" not in names and not any("dropout" in name for name in names)
    _close(quantized(x.numpy()), expected)
    _close(kiln.compile(quantized)(x.numpy()), expected)


@requires_torchao
def test_convert_folds_batch_norm_into_the_quantized_convolution():
    """After conv-BN QAT, convert folds each batch norm into its convolution (weight w·γ/σ quantized with the
    scales training learned, bias (b − mean)·γ/σ + β): the converted program computes what the prepared module
    computes in eval mode, every convolution becomes an int8 kernel in C, and torchao's converted model agrees."""
    from torchao.quantization.pt2e import move_exported_model_to_eval

    from kiln.passes import run
    _, shape = QAT_MODELS["conv_bn"]
    batches = _batches(shape, 4)
    reference, prepared = _prepared_pair("conv_bn", batches[0][0])
    torch_optimizer = torch.optim.SGD(reference.parameters(), lr=0.05)
    kiln_optimizer = kiln.optim.SGD(prepared.parameters(), lr=0.05)
    for images, labels in batches:
        torch_optimizer.zero_grad()
        torch.nn.functional.cross_entropy(reference(images), labels).backward()
        torch_optimizer.step()
        kiln_optimizer.zero_grad()
        F.cross_entropy(prepared(kiln.tensor(images.numpy())), kiln.tensor(labels.numpy())).backward()
        kiln_optimizer.step()
    kq.move_exported_model_to_eval(prepared)
    move_exported_model_to_eval(reference)
    prepared.apply(kq.disable_observer)
    x = batches[0][0].numpy()
    with kiln.no_grad():
        expected = prepared(kiln.tensor(x)).numpy()
    converted = kq.convert_pt2e(prepared)
    names = converted.op_histogram()
    assert not any("batch_norm" in name for name in names) and names["aten.conv2d.default"] == 3
    _close(converted(x), expected)
    assert_quantized_close(converted(x), TORCHAO[1].convert_pt2e(reference)(batches[0][0]).detach().numpy())
    assert run(converted, "lower-quantized").op_histogram()["quant.qconv2d_pointwise.default"] == 3
    _close(kiln.compile(converted)(x), converted(x))
