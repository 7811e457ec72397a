"""A cat's parts written in place: the kernel computing a part writes its slice of the cat's result, and the cat
copies only the parts it cannot place (schedule._Scheduler.place_cat_part). Each program runs compiled against the
reference interpreter, and the C source says which parts were placed."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

import kiln
import kiln.nn as nn
from kiln.compiler import compile as compile_c
from tests.runtime.test_c_backend import _check

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")


def _compile(module, args, tmp_path, dynamic_shapes=None):
    program = kiln.export(module.eval(), args, dynamic_shapes=dynamic_shapes)
    compiled = compile_c(program, output=tmp_path / "model")
    source = (tmp_path / "model" / "model.c").read_text()
    placed = re.findall(r"ctx->buf\[\d+\] = \(unsigned char\*\)ctx->buf\[\d+\] \+ .*/\* (\w+) in (\w+) \*/", source)
    copies = len(re.findall(r"static void kernel_\d+_cat", source))
    return program, compiled, placed, copies


def test_stacked_results_are_computed_in_place(tmp_path):
    """A stack (cat along a new dim 0) of computed tensors: each is written into its slice, no cat kernel runs;
    one of them is also read after the stack, through its slice."""
    class Stack(nn.Module):
        def forward(self, x, y):
            parts = [x.sin(), (x * y).cos(), x + y]
            stacked = kiln.stack(parts)
            return stacked * 2, parts[1].exp()

    x, y = kiln.randn(3, 5, 16), kiln.randn(3, 5, 16)
    program, compiled, placed, copies = _compile(Stack(), (x, y), tmp_path)
    assert len(placed) == 3 and copies == 0
    _check(compiled(x.numpy(), y.numpy()), program(x.numpy(), y.numpy()))


def test_channels_of_one_image_are_computed_in_place(tmp_path):
    """torch.cat on channels at batch 1 (a YOLO or DenseNet block): every dim before the cat's is 1, so each
    convolution writes its channels of the result."""
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Conv2d(8, 16, 3, padding=1), nn.Conv2d(8, 16, 1)

        def forward(self, x):
            return kiln.cat([self.a(x).relu(), self.b(x), x], 1).sigmoid()

    x = kiln.randn(1, 8, 12, 12)
    program, compiled, placed, copies = _compile(Block(), (x,), tmp_path)
    assert len(placed) == 2 and copies == 1  # x is the program's input: copied
    _check(compiled(x.numpy()), program(x.numpy()))


def test_parts_that_cannot_be_placed_are_copied(tmp_path):
    """Copied by the cat: a part's second use (its first is placed), a slice that is not contiguous (batch 2 before
    the cat's dim), a part starting off a cache line, a part of another dtype and a program input. A placed part
    that is also returned gets a copy of its own as that output."""
    class Mixed(nn.Module):
        def forward(self, x, y, n):
            twice = x.tanh()
            returned = y.exp()
            odd = x[:, :, :3].sin()  # 3 columns of float32: the next part starts 12 bytes in
            return (kiln.cat([twice, twice], 0), returned, kiln.cat([returned, x], 0),
                    kiln.cat([odd, x.cos()], 2), kiln.cat([n + 1, x], 0))

    x, y, n = kiln.randn(2, 4, 16), kiln.randn(2, 4, 16), kiln.randint(0, 5, (2, 4, 16))
    program, compiled, placed, copies = _compile(Mixed(), (x, y, n), tmp_path)
    assert [name for name, _ in placed] == ["tanh", "exp"] and copies == 4
    assert "copy_exp" in (tmp_path / "model" / "model.c").read_text()
    _check(compiled(x.numpy(), y.numpy(), n.numpy()), program(x.numpy(), y.numpy(), n.numpy()))


def test_nested_cats_and_a_cat_returned_as_output(tmp_path):
    """cat(cat(a, b), c), returned: a and b live in the inner cat's result, which lives in the caller's output."""
    class Nested(nn.Module):
        def forward(self, x):
            inner = kiln.cat([x.sin(), x.cos()], 0)
            return kiln.cat([inner, x.exp()], 0)

    x = kiln.randn(2, 3, 16)
    program, compiled, placed, copies = _compile(Nested(), (x,), tmp_path)
    assert len(placed) == 4 and copies == 0
    _check(compiled(x.numpy()), program(x.numpy()))


def test_symbolic_sizes(tmp_path):
    """Stacking along a dynamic batch: the slices' offsets are formulas of the batch, checked to start on a cache
    line (16 floats per row here)."""
    class Stack(nn.Module):
        def forward(self, x):
            return kiln.cat([x.sin(), x.cos() * 2], 0) + 1

    x = kiln.randn(3, 16)
    program, compiled, placed, copies = _compile(Stack(), (x,), tmp_path,
                                                  dynamic_shapes=({0: kiln.Dim("batch", max=16)},))
    assert len(placed) == 2 and copies == 0
    for batch in (1, 5, 16):
        value = np.random.default_rng(batch).standard_normal((batch, 16)).astype(np.float32)
        _check(compiled(value), program(value))


class _C2f(nn.Module):
    """YOLOv8's C2f block: a convolution's channels in two chunks, a bottleneck on the second, all three cat."""

    def __init__(self):
        super().__init__()
        self.first, self.bottleneck = nn.Conv2d(8, 32, 1), nn.Conv2d(16, 16, 3, padding=1)
        self.last = nn.Conv2d(48, 8, 1)

    def forward(self, x):
        a, b = self.first(x).relu().chunk(2, 1)
        return self.last(kiln.cat([a, b, self.bottleneck(b).relu() + b], 1))


def test_chunks_of_one_convolution_are_placed_whole(tmp_path):
    """At batch 1 the first convolution's output, both chunks of it, is placed in the cat's first 32 channels; the
    bottleneck reads its chunk there. At batch 2 the chunks are not contiguous in the result, and the cat copies."""
    x = kiln.randn(1, 8, 10, 10)
    program, compiled, placed, copies = _compile(_C2f(), (x,), tmp_path)
    assert len(placed) == 2 and copies == 0
    _check(compiled(x.numpy()), program(x.numpy()))
    x = kiln.randn(2, 8, 10, 10)
    program, compiled, placed, copies = _compile(_C2f(), (x,), tmp_path / "batch2")
    assert not placed and copies == 1
    _check(compiled(x.numpy()), program(x.numpy()))


def test_chunks_out_of_order_or_partial_are_copied(tmp_path):
    """Chunks in another order than their buffer's, or only some of a buffer's chunks, are copied."""
    class Chunks(nn.Module):
        def forward(self, x):
            a, b, c = x.exp().chunk(3, 1)
            d, e = x.sin().chunk(2, 1)
            return kiln.cat([b, a, c], 1).tanh(), kiln.cat([d, d], 1).cos()

    x = kiln.randn(1, 48, 8)
    program, compiled, placed, copies = _compile(Chunks(), (x,), tmp_path)
    assert not placed and copies == 2
    _check(compiled(x.numpy()), program(x.numpy()))
