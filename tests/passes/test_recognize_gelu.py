"""recognize-gelu: the tanh GELU written out in elementary ops becomes one aten.gelu(approximate="tanh"), checked
against torch's gelu; near misses stay as they are; in a quantized FFN the recognized GELU fuses into the integer
layer before it."""

from __future__ import annotations

import math

import numpy as np
import pytest

import kiln
import kiln.nn as nn
from kiln import quantization as kq
from kiln.ir.dialect import bound_arguments
from kiln.passes import run
from kiln.testing import assert_close

torch = pytest.importorskip("torch")


class _WrittenOut(nn.Module):
    """GELU's tanh formula in elementary ops, in the given operand orders."""

    def __init__(self, cube: float = 3.0, coefficient: float = 0.044715, half_first: bool = True):
        super().__init__()
        self.linear = nn.Linear(8, 16)
        self.cube, self.coefficient, self.half_first = cube, coefficient, half_first

    def forward(self, x):
        y = self.linear(x)
        inner = math.sqrt(2.0 / math.pi) * (y + self.coefficient * y ** self.cube)
        tail = 1.0 + kiln.tanh(inner)
        return (0.5 * y) * tail if self.half_first else tail * (y * 0.5)


def _histogram(program):
    return run(program, "recognize-gelu,dce").op_histogram()


@pytest.mark.parametrize("half_first", [True, False])
def test_written_out_gelu_becomes_one_op(half_first):
    model = _WrittenOut(half_first=half_first).eval()
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32) * 3
    program = kiln.export(model, (kiln.tensor(x),))
    rewritten = run(program, "recognize-gelu,dce")
    assert rewritten.op_histogram() == {"aten.linear.default": 1, "aten.gelu.default": 1}
    linear = torch.nn.functional.linear(torch.from_numpy(x), torch.from_numpy(model.linear.weight.numpy()),
                                        torch.from_numpy(model.linear.bias.numpy()))
    assert_close(rewritten(x), torch.nn.functional.gelu(linear, approximate="tanh").numpy())


def test_transformers_new_gelu_is_recognized():
    activations = pytest.importorskip("transformers.activations")
    module = torch.nn.Sequential(torch.nn.Linear(8, 16), activations.NewGELUActivation())
    x = torch.randn(3, 8)
    program = kiln.from_torch(module, (x,))
    assert _histogram(program) == {"aten.linear.default": 1, "aten.gelu.default": 1}
    assert_close(run(program, "recognize-gelu")(x.numpy()), module(x).detach().numpy())


@pytest.mark.parametrize("change", [{"cube": 2.0}, {"coefficient": 0.04}])
def test_other_formulas_stay(change):
    program = kiln.export(_WrittenOut(**change).eval(), (kiln.randn(2, 8),))
    assert "aten.gelu.default" not in _histogram(program)


def test_quantized_ffn_fuses_the_recognized_gelu(tmp_path):
    """Linear → written-out GELU → Linear under the X86 static recipe: the compile pipeline recognizes the GELU and
    lowers the first layer to one integer op with the gelu_tanh post-op; the package matches the reference within
    one hidden quantization step."""
    model = nn.Sequential(_WrittenOut(), nn.Linear(16, 4)).eval()
    rng = np.random.default_rng(1)
    batches = [rng.standard_normal((8, 8)).astype(np.float32) for _ in range(3)]
    prepared = kq.prepare_pt2e(kiln.export(model, (kiln.tensor(batches[0]),)), kq.X86InductorQuantizer().set_global(
        kq.get_default_x86_inductor_quantization_config()))
    for batch in batches:
        prepared(batch)
    quantized = kq.convert_pt2e(prepared)
    lowered = run(quantized, "recognize-gelu,lower-quantized")
    post_ops = [bound_arguments(op)[-1] for op in lowered.nodes() if op.name.startswith("quant.qlinear_pointwise")]
    assert post_ops == ["gelu_tanh", "none"]
    x = rng.standard_normal((8, 8)).astype(np.float32)
    got, expected = kiln.compile(quantized, output=tmp_path / "pkg")(x), quantized(x)
    assert "KILN_QPOST_GELU_TANH, KILN_QOUT_U8" in (tmp_path / "pkg" / "model.c").read_text()  # kiln.compile's pipeline
    hidden = next(op for op in quantized.nodes() if op.name == "quantized_decomposed.quantize_per_tensor.default"
                  and op.results[0].type.shape[-1] == 16)
    step = bound_arguments(hidden)[1]
    weight = model[1].weight.numpy()
    bound = step * np.abs(np.asarray(weight)).sum(axis=1).max() * 1.05  # int8 weights round each by half a step
    assert np.abs(got - expected).max() <= bound + 1e-5
