"""The C backend's reflection / replication pads and group norm match the interpreter at several batch sizes."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import kiln
from kiln.compiler import compile as compile_c
from tests.runtime.test_c_backend import _check

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")


class _Pad(kiln.nn.Module):
    def __init__(self, pad, mode):
        super().__init__()
        self.pad, self.mode = pad, mode

    def forward(self, x):
        return kiln.nn.functional.pad(x, self.pad, mode=self.mode) * 2.0


def _compare(module, shape, tmp_path, sizes=(1, 2, 5)):
    batch = kiln.Dim("batch", max=16)
    program = kiln.export(module, (kiln.randn(2, *shape[1:]),), dynamic_shapes=({0: batch},))
    compiled = compile_c(program, output=tmp_path / "model")
    for n in sizes:
        x = np.random.default_rng(n).standard_normal((n, *shape[1:])).astype(np.float32)
        _check(compiled(x), program(x))


@pytest.mark.parametrize("pad,mode,shape", [
    ([2, 3], "reflect", [2, 3, 7]),
    ([1, 2, 3, 0], "reflect", [2, 3, 5, 6]),
    ([4, 4, 3, 3], "reflect", [2, 2, 5, 6]),
    ([-1, 2, 3, -2], "reflect", [2, 2, 5, 6]),
    ([1, 2, 3, 0, 2, 1], "reflect", [2, 2, 4, 5, 6]),
    ([1, 2, 3, 0], "replicate", [2, 3, 5, 6]),
    ([7, 0, 0, 6], "replicate", [2, 2, 5, 4]),
    ([-1, 2, 3, -2], "replicate", [2, 2, 5, 6]),
    ([0, 4, 1, 0, 2, 1], "replicate", [2, 2, 4, 5, 6]),
])
def test_reflection_and_replication_pads(pad, mode, shape, tmp_path):
    _compare(_Pad(pad, mode).eval(), shape, tmp_path)


@pytest.mark.parametrize("groups,channels,spatial,affine", [
    (2, 6, [5, 4], True), (3, 6, [5, 4], False), (1, 4, [7], True), (4, 4, [3, 2, 2], True), (2, 4, [], True),
])
def test_group_norm(groups, channels, spatial, affine, tmp_path):
    module = kiln.nn.GroupNorm(groups, channels, affine=affine).eval()
    if affine:  # non-trivial affine parameters
        rng = np.random.default_rng(channels)
        with kiln.no_grad():
            module.weight.copy_(kiln.tensor(rng.standard_normal(channels).astype(np.float32)))
            module.bias.copy_(kiln.tensor(rng.standard_normal(channels).astype(np.float32)))
    _compare(module, [2, channels, *spatial], tmp_path)


def test_pads_and_group_norm_compile_to_their_kernels(tmp_path):
    """The composite pad / group_norm decompose to the core ops the C backend lowers (not rejected)."""
    for module, shape in ((_Pad([2, 1, 1, 2], "reflect"), [2, 3, 5, 6]),
                          (_Pad([1, 3, 2, 0], "replicate"), [2, 3, 5, 6]), (kiln.nn.GroupNorm(3, 6), [2, 6, 4])):
        program = kiln.export(module.eval(), (kiln.randn(*shape),))
        compile_c(program, output=tmp_path / "m")
        source = (tmp_path / "m" / "model.c").read_text()
        assert ("group_norm" in source) if isinstance(module, kiln.nn.GroupNorm) else ("_pad2d" in source)
