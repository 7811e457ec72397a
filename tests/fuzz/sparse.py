"""Differential fuzzing of sparse programs: random networks pruned and sparsified by a random pipeline, through every
backend, compared with the interpreter at assert_close's default tolerances.

    python -m tests.fuzz.sparse --programs 500 --seed 0 [--batch 8]

The general fuzzer (programs.py) leaves sparse layouts out. Here hypothesis draws a batch: one pruning pipeline
(unstructured CSR at 50-97%, BSR with blocks from 1x1 to 16x16, 2:4, global magnitude scope, or the cost model's
automatic choice) and several networks it applies to (`SparseNet`): chains of linear layers over [rows..., features]
(tails against every tile width, residuals, relu or gelu between) or of 2-d convolutions (strides, padding,
dilation; sparse convolutions run as BSR over im2col) with a linear head. They export from `kiln.nn` modules into one
program, and its sparse weights go through C at every CPU capability this machine runs, ONNX, Triton (its
interpreter: the BSR kernel), the .pt2 round trip and torch eager through kiln's sparse .pt2.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from hypothesis import strategies as st

from kiln.ir.ops.nn import conv_output_size

ACTIVATIONS = ("none", "relu", "gelu")


@dataclass(frozen=True)
class SparseNet:
    rows: tuple[int, ...]  # the input's leading dims: (rows...) before features, or (N,) before (C, H, W)
    widths: tuple[int, ...]  # features (or channels) of the input, then of each layer's output
    activation: str
    bias: bool
    residual: bool  # dense layers whose width is kept add their input
    conv: tuple[tuple[int, int, int, int], ...] = ()  # per conv layer: kernel, stride, padding, dilation
    image: tuple[int, int] = (0, 0)
    head: int = 0  # a linear head after a convolutional chain (0: none)


@dataclass(frozen=True)
class SparseBatch:
    pipeline: str
    nets: tuple[SparseNet, ...]
    seed: int


def _width(draw: Any, block: int, multiple: int) -> int:
    """Widths that often tile `block`, and tails otherwise; always a multiple of `multiple` (2:4 prunes groups of
    four inputs)."""
    return draw(st.integers(1, 6).map(lambda n: n * block) | st.integers(1, 96 // multiple).map(lambda n: n * multiple))


@st.composite
def _net(draw: Any, block: int, multiple: int) -> SparseNet:
    activation, bias = draw(st.sampled_from(ACTIVATIONS)), draw(st.booleans())
    if draw(st.integers(0, 3)):
        rows = tuple(draw(st.lists(st.integers(1, 40), min_size=1, max_size=2)))
        widths = tuple(_width(draw, block, multiple) for _ in range(draw(st.integers(2, 4))))
        return SparseNet(rows, widths, activation, bias, draw(st.booleans()))
    layers, channels = [], [_width(draw, block, multiple)]
    height, width = draw(st.integers(3, 12)), draw(st.integers(3, 16))
    image = (height, width)
    for _ in range(draw(st.integers(1, 3))):
        kernel, stride, padding, dilation = (draw(st.integers(1, 3)), draw(st.integers(1, 2)), draw(st.integers(0, 1)),
                                             draw(st.integers(1, 2)))
        reach = dilation * (kernel - 1) + 1
        if height + 2 * padding < reach or width + 2 * padding < reach:
            break
        layers.append((kernel, stride, padding, dilation))
        channels.append(_width(draw, block, multiple))
        height, width = (conv_output_size(size, kernel, stride, padding, dilation) for size in (height, width))
    if not layers:  # (a 1x1 convolution fits any image)
        layers.append((1, 1, 0, 1))
        channels.append(_width(draw, block, multiple))
    head = draw(st.integers(0, 20)) if channels[-1] * height * width <= 2048 else 0
    return SparseNet((draw(st.integers(1, 3)),), tuple(channels), activation, bias, False, tuple(layers), image, head)


PIPELINE_KINDS = ("csr", "bsr", "2:4", "global", "auto")


@st.composite
def sparse_batches(draw: Any, max_nets: int = 8, kinds: Sequence[str] = PIPELINE_KINDS) -> SparseBatch:
    kind = draw(st.sampled_from(kinds))
    sparsity = draw(st.sampled_from([0.5, 0.75, 0.9, 0.97]))
    block = (draw(st.sampled_from([1, 2, 4, 8, 16])), draw(st.sampled_from([1, 2, 4, 8, 16])))
    pipeline = {
        "csr": f"prune{{sparsity={sparsity}}},sparsify{{layout=csr}}",
        "bsr": f"prune{{pattern=block block={block[0]},{block[1]} sparsity={sparsity}}},"
               f"sparsify{{layout=bsr block={block[0]},{block[1]}}}",
        "2:4": "prune{pattern=semi_structured},sparsify{layout=semi_structured}",
        "global": f"prune{{sparsity={sparsity} scope=global}},sparsify",
        "auto": f"prune{{sparsity={sparsity}}},sparsify",
    }[kind]
    tile = max(block) if kind == "bsr" else 8
    nets = tuple(draw(st.lists(_net(tile, 4 if kind == "2:4" else 1), min_size=1, max_size=max_nets)))
    return SparseBatch(pipeline, nets, draw(st.integers(0, 2 ** 32 - 1)))


# -- building

def _module(net: SparseNet) -> Any:
    import kiln
    nn = kiln.nn
    activation = {"none": nn.Identity, "relu": nn.ReLU, "gelu": nn.GELU}[net.activation]

    class Chain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            if net.conv:
                self.layers = nn.ModuleList([
                    nn.Conv2d(cin, cout, kernel, stride, padding, dilation, bias=net.bias)
                    for (kernel, stride, padding, dilation), cin, cout in zip(net.conv, net.widths, net.widths[1:])])
            else:
                self.layers = nn.ModuleList([nn.Linear(a, b, bias=net.bias)
                                             for a, b in zip(net.widths, net.widths[1:])])
            self.activation = activation()
            self.head = nn.Linear(_flat_features(net), net.head) if net.head else None

        def forward(self, x: Any) -> Any:
            for layer in self.layers:
                y = self.activation(layer(x))
                x = y + x if net.residual and tuple(y.shape) == tuple(x.shape) else y
            return self.head(x.flatten(1)) if self.head is not None else x
    return Chain()


def _flat_features(net: SparseNet) -> int:
    height, width = net.image
    for kernel, stride, padding, dilation in net.conv:
        height, width = (conv_output_size(size, kernel, stride, padding, dilation) for size in (height, width))
    return net.widths[-1] * height * width


def _input_shape(net: SparseNet) -> tuple[int, ...]:
    return (*net.rows, net.widths[0], *net.image) if net.conv else (*net.rows, net.widths[0])


def build(batch: SparseBatch) -> tuple[Any, list[np.ndarray]]:
    """The batch's networks as one pruned and sparsified program, and its inputs."""
    import kiln
    kiln.manual_seed(batch.seed % 2 ** 31)
    nets = [_module(net) for net in batch.nets]

    class Many(kiln.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.nets = kiln.nn.ModuleList(nets)

        def forward(self, *xs: Any) -> Any:
            return tuple(net(x) for net, x in zip(self.nets, xs))

    rng = np.random.default_rng(batch.seed)
    inputs = [rng.standard_normal(_input_shape(net)).astype(np.float32) for net in batch.nets]
    program = kiln.export(Many().eval(), tuple(kiln.tensor(x) for x in inputs))
    return kiln.passes.run(program, batch.pipeline), inputs


def sparse_layers(program: Any) -> int:
    """How many weights the program holds in a sparse layout."""
    from kiln.passes.sparsity import sparse_weights
    return len(sparse_weights(program))


# -- checking

@dataclass
class Mismatch:
    backend: str
    net: SparseNet | None  # None: the whole batch failed (a crash)
    detail: str
    pipeline: str

    def __str__(self) -> str:
        return f"{self.backend} ({self.pipeline}): {self.detail}\n    {self.net!r}"


def check(batch: SparseBatch, backends: Sequence[Any] | None = None) -> tuple[list[Mismatch], list[str]]:
    """Every backend against the interpreter; (the mismatches and crashes, the refusals)."""
    from kiln.ir.interpreter import run_program
    from tests.fuzz.differential import WORKER, BackendFailed, compare, computed_in, select_backends
    program, inputs = build(batch)
    expected, kinds = run_program(program, inputs), computed_in(program)
    mismatches, refusals = [], []
    for backend in select_backends(None) if backends is None else backends:
        try:
            got = WORKER.run(backend, program, inputs)
        except BackendFailed as failure:
            if failure.refused:
                refusals.append(f"{backend.name}: {failure}")
            else:
                mismatches.append(Mismatch(backend.name, None, f"crash: {failure}", batch.pipeline))
            continue
        for net, g, e, k in zip(batch.nets, got, expected, kinds):
            if (why := compare(g, e, k)) is not None:
                mismatches.append(Mismatch(backend.name, net, why, batch.pipeline))
    return mismatches, refusals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=200, help="networks to check")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=8, help="networks per program, at most")
    options = parser.parse_args()
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from hypothesis import HealthCheck, Phase, given, seed, settings
    from tests.fuzz.programs import fixed_constant_pool

    done, found, refused, layers, started = [0], [], set(), [0], time.perf_counter()

    @seed(options.seed)
    @settings(max_examples=options.programs, database=None, deadline=None, suppress_health_check=list(HealthCheck),
              phases=[Phase.generate])
    @given(sparse_batches(options.batch))
    def run(batch: SparseBatch) -> None:
        if done[0] >= options.programs:
            return
        mismatches, refusals = check(batch)
        done[0] += len(batch.nets)
        layers[0] += sparse_layers(build(batch)[0])
        found.extend(mismatches)
        refused.update(refusals)
        print(f"[{done[0]}/{options.programs}] {batch.pipeline}: {len(mismatches)} mismatches "
              f"({time.perf_counter() - started:.0f} s)", flush=True)
        for mismatch in mismatches:
            print(mismatch, flush=True)

    with fixed_constant_pool():
        run()
    print(f"{done[0]} sparse networks, {layers[0]} sparse weights, {len(found)} mismatches or crashes, refusals: "
          f"{sorted(refused) or 'none'}")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
