"""trim-convolution-taps: a convolution keeps the weight taps some output reads inside the image, with its padding
shortened to match, and computes what torch's convolution computes; where every tap reads the image, or a dropped
tap holds inf or NaN (which ATen multiplies by the padding's zeros), it stays as it is. The compile pipeline runs
it, so the C package of a CNN on a small image gets the trimmed weights."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.compiler import compile as compile_c
from kiln.passes import run
from kiln.passes.trim_taps import used_taps
from kiln.testing import assert_close

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("size, kernel, stride, padding, dilation, expected", [
    (1, 3, 1, 1, 1, (1, 1)),  # a 3-tap kernel over one pixel: the centre
    (2, 5, 1, 2, 1, (1, 3)),  # output 0 reads pixels through taps 2 and 3, output 1 through taps 1 and 2
    (4, 3, 1, 1, 1, (0, 2)),  # every tap reads the image somewhere
    (1, 3, 2, 1, 1, (1, 1)),
    (3, 3, 2, 1, 2, (1, 1)),  # dilated and strided: one output, reading -1, 1 and 3
    (5, 3, 2, 1, 2, (0, 2)),  # two outputs, reading -1, 1, 3 and 1, 3, 5
    (1, 3, 1, 2, 2, (1, 1)),
    (5, 1, 1, 0, 1, (0, 0)),
])
def test_used_taps_by_hand(size, kernel, stride, padding, dilation, expected):
    assert used_taps(size, kernel, stride, padding, dilation) == expected
    reads = {tap for tap in range(kernel) for o in range((size + 2 * padding - dilation * (kernel - 1) - 1) // stride
                                                         + 1) if 0 <= o * stride - padding + tap * dilation < size}
    assert (min(reads), max(reads)) == expected  # the same taps, counted output by output


# (module, input shape, the weight's spatial shape after trimming)
CASES = {
    "3x3 over 1x1": (lambda: torch.nn.Conv2d(16, 24, 3, padding=1), (2, 16, 1, 1), (1, 1)),
    "3x1 and 1x3 over 1x1": (lambda: torch.nn.Conv2d(8, 8, (3, 1), padding=(1, 0)), (2, 8, 1, 1), (1, 1)),
    "5x5 over 2x2": (lambda: torch.nn.Conv2d(4, 6, 5, padding=2), (1, 4, 2, 2), (3, 3)),
    "3x3 over 1x5": (lambda: torch.nn.Conv2d(4, 6, 3, padding=1), (1, 4, 1, 5), (1, 3)),
    "strided 3x3 over 1x1": (lambda: torch.nn.Conv2d(4, 6, 3, stride=2, padding=1, bias=False), (3, 4, 1, 1), (1, 1)),
    "dilated 3x3 over 1x1": (lambda: torch.nn.Conv2d(4, 6, 3, padding=2, dilation=2), (1, 4, 1, 1), (1, 1)),
    "grouped 3x3 over 1x1": (lambda: torch.nn.Conv2d(8, 8, 3, padding=1, groups=4), (2, 8, 1, 1), (1, 1)),
    "conv1d over 1": (lambda: torch.nn.Conv1d(4, 6, 5, padding=2), (2, 4, 1), (1,)),
    "conv3d over 1x1x1": (lambda: torch.nn.Conv3d(2, 3, 3, padding=1), (1, 2, 1, 1, 1), (1, 1, 1)),
    "3x3 over 4x4": (lambda: torch.nn.Conv2d(4, 6, 3, padding=1), (1, 4, 4, 4), (3, 3)),
}


def _conv_weights(program) -> list[tuple[int, ...]]:
    return [tuple(op.operands[1].type.shape[2:]) for op in program.body.walk()
            if getattr(getattr(op, "opdef", None), "name", "").startswith(("aten.conv", "aten.convolution"))]


@pytest.mark.parametrize("name", list(CASES))
def test_trimmed_convolution_matches_torch(name):
    make, shape, trimmed = CASES[name]
    torch.manual_seed(0)
    module = torch.nn.Sequential(make(), torch.nn.ReLU()).eval()
    x = torch.randn(*shape)
    program = kiln.from_torch(module, (x,))
    rewritten = run(program, "trim-convolution-taps,dce")
    assert _conv_weights(rewritten) == [trimmed]
    expected = module(x).detach().numpy()
    assert_close(rewritten(x.numpy()), expected)
    compiled = compile_c(program)
    assert_close(compiled(x.numpy()), expected)


def test_a_cnn_on_a_small_image_compiles_with_trimmed_weights(tmp_path):
    """Batch norm folded into each convolution, then trimmed: the second one's single output (stride 2 over 2x2)
    reads through its last two taps a side, the third (over 1x1) through its centre."""
    torch.manual_seed(0)
    module = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU()).eval()
    for layer in module:
        if isinstance(layer, torch.nn.BatchNorm2d):
            layer.running_mean.uniform_(-1, 1)
            layer.running_var.uniform_(0.5, 2)
    x = torch.randn(2, 3, 4, 4)  # 2x2 after the first convolution, 1x1 after the second
    program = kiln.from_torch(module, (x,), dynamic_shapes={"input": {0: torch.export.Dim("batch")}})
    assert _conv_weights(run(program, "fold-batchnorm,trim-convolution-taps,dce")) == [(3, 3), (2, 2), (1, 1)]
    compiled = compile_c(program, output=tmp_path / "pkg")
    for batch in (2, 5):
        x = torch.randn(batch, 3, 4, 4)
        assert_close(compiled(x.numpy()), module(x).detach().numpy())


def test_every_tap_reading_the_image_or_a_non_finite_dropped_tap_keeps_the_weight():
    torch.manual_seed(0)
    whole = torch.nn.Conv2d(4, 6, 3, padding=1).eval()
    program = kiln.from_torch(whole, (torch.randn(1, 4, 3, 3),))
    assert _conv_weights(run(program, "trim-convolution-taps")) == [(3, 3)]

    poisoned = torch.nn.Conv2d(4, 6, 3, padding=1).eval()
    with torch.no_grad():
        poisoned.weight[0, 0, 0, 0] = float("inf")  # a corner tap: over a 1x1 image it only meets padding
    x = torch.randn(1, 4, 1, 1)
    program = kiln.from_torch(poisoned, (x,))
    rewritten = run(program, "trim-convolution-taps")
    assert _conv_weights(rewritten) == [(3, 3)]
    expected = poisoned(x).detach().numpy()
    assert np.isnan(expected[0, 0]).all()  # ATen: inf times the padding's zero
    assert_close(rewritten(x.numpy()), expected, equal_nan=True)
