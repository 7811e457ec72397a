"""Differential fuzzing of quantized programs: random chains of quantized layers (the reference Q/DQ form that
`convert_pt2e` produces) through the integer lowering and every backend, compared exactly.

    python -m tests.fuzz.quantized --programs 2000 --seed 0 [--batch 16]

The general fuzzer (programs.py) leaves quantization out: its ops' results depend on float rounding before each
quantize, so a float32 backend may land one step away. Here every scale is a power of two, every weight and
activation an integer multiple of its scale, every bias a whole number of accumulator steps, every residual a
multiple of 2^-8, and every layer's sums short enough (K <= 512) to be exact in float32: then dequantize, the
layer, the requantization and the float32 results are exact in every backend, and any difference, even one
quantization step (ties round to even in ATen's quantize), is a bug. Ties are drawn on purpose: inputs halfway
between two steps.

A recipe (`Chain`) draws a dense chain (`linear` layers over [rows..., features]) or a convolutional one (`conv2d`
layers with strides, padding, dilation, groups and residual adds, max pools and power-of-two average pools on the
integers, a flatten into a linear head). Each layer ends in a quantize to uint8, int8 or 7-bit uint8 (reduce_range)
with its own scale and zero point, or, for the last, in float32. Backends: the interpreter on the lowered program
(`lower-quantized`: the fused integer ops' reference kernels), C at every CPU capability this machine runs (AMX, VNNI,
AVX2 and portable integer kernels), ONNX (QDQ) in onnxruntime, Triton through its interpreter, the .pt2 round trip
and torch eager through the .pt2 (torch's `quantized_decomposed` ops).
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

from kiln.ir import dtypes
from kiln.ir.interpreter import run_program
from kiln.ir.ops.nn import conv_output_size
from kiln.ir.program import ExportedProgram, GraphBuilder, InputKind
from kiln.ir.registry import ops
from kiln.ir.types import TensorType

aten, quantized = ops.aten, ops.quantized_decomposed

# activation kinds: (dtype, quant_min, quant_max); uint7 is reduce_range's 0..127 in uint8
ACTIVATIONS = {"uint8": (dtypes.uint8, 0, 255), "int8": (dtypes.int8, -128, 127), "uint7": (dtypes.uint8, 0, 127)}
# The longest row of a layer whose float32 sums stay exact: |sum| <= K * 255 * 128 steps of the finest scale < 2^24.
MAX_K = 512


@dataclass(frozen=True)
class Quantized:
    """An activation's qparams: its kind (ACTIVATIONS), scale 2^-exponent and zero point."""
    kind: str
    exponent: int
    zero_point: int

    @property
    def scale(self) -> float:
        return 2.0 ** -self.exponent


@dataclass(frozen=True)
class Linear:
    features: int
    bias: bool
    relu: bool
    out: Quantized | None  # None: the float32 result (the last layer only)


@dataclass(frozen=True)
class Conv:
    channels: int
    kernel: tuple[int, int]
    stride: int
    padding: int
    dilation: int
    groups: int
    bias: bool
    residual: bool
    relu: bool
    out: Quantized | None


@dataclass(frozen=True)
class MaxPool:
    kernel: int
    stride: int
    padding: int


@dataclass(frozen=True)
class AvgPool:
    """adaptive_avg_pool2d to (H / 2^k, W / 2^k): every window a power of two, so the mean is exact."""
    halvings: int


@dataclass(frozen=True)
class Flatten:
    pass


@dataclass(frozen=True)
class Chain:
    shape: tuple[int, ...]  # the input's: (rows..., features) or (N, C, H, W)
    input: Quantized
    layers: tuple[Any, ...]
    seed: int
    weight_scales: str = "per-channel"  # or "per-tensor": one scale repeated per channel


# -- drawing

def _quantized(draw: Any, kinds: Sequence[str] = tuple(ACTIVATIONS)) -> Quantized:
    kind = draw(st.sampled_from(kinds))
    _, low, high = ACTIVATIONS[kind]
    zero_point = draw(st.one_of(st.integers(low, high), st.sampled_from([low, (low + high + 1) // 2, high])))
    return Quantized(kind, draw(st.integers(1, 6)), zero_point)


def _out(draw: Any, last: bool) -> Quantized | None:
    return None if last and draw(st.booleans()) else _quantized(draw)


@st.composite
def chains(draw: Any) -> Chain:
    """A dense or convolutional chain of 1-4 layers."""
    seed = draw(st.integers(0, 2 ** 32 - 1))
    weight_scales = draw(st.sampled_from(["per-channel", "per-tensor"]))
    if draw(st.booleans()):
        rows = tuple(draw(st.lists(st.integers(1, 40), min_size=1, max_size=2)))
        features = draw(st.integers(1, 80) | st.integers(60, 300))
        count = draw(st.integers(1, 4))
        layers = []
        for index in range(count):
            out = _out(draw, index == count - 1)
            layers.append(Linear(draw(st.integers(1, 80) | st.integers(60, 200)), draw(st.booleans()),
                                 draw(st.booleans()), out))
            if out is None:
                break
        return Chain((*rows, features), _quantized(draw), tuple(layers), seed, weight_scales)
    channels = draw(st.integers(1, 24) | st.sampled_from([16, 32, 64]))
    height, width = draw(st.integers(1, 12)), draw(st.integers(1, 40))
    shape = (draw(st.integers(1, 3)), channels, height, width)
    layers, count = [], draw(st.integers(1, 4))
    for index in range(count):
        last = index == count - 1
        kind = draw(st.sampled_from(["conv", "conv", "conv", "maxpool", "avgpool"] + (["head"] if last else [])))
        if kind == "maxpool":
            kernel = draw(st.integers(1, 3))
            padding = draw(st.integers(0, kernel // 2))
            stride = draw(st.integers(1, 2))
            if height + 2 * padding >= kernel and width + 2 * padding >= kernel:
                layers.append(MaxPool(kernel, stride, padding))
                height, width = (conv_output_size(n, kernel, stride, padding, 1) for n in (height, width))
            continue
        if kind == "avgpool":
            halvings = draw(st.integers(0, 2))
            if height % (1 << halvings) == 0 and width % (1 << halvings) == 0:
                layers.append(AvgPool(halvings))
                height, width = height >> halvings, width >> halvings
            continue
        if kind == "head":
            if channels * height * width > MAX_K:
                continue
            out = _out(draw, True)
            layers += [Flatten(), Linear(draw(st.integers(1, 40)), draw(st.booleans()), draw(st.booleans()), out)]
            break
        groups = draw(st.sampled_from([g for g in (1, 2, 3, 4, channels) if channels % g == 0]))
        out_channels = groups * draw(st.integers(1, max(1, 48 // groups)))
        kernel = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
        dilation, stride, padding = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(0, 2))
        reach = [dilation * (k - 1) + 1 for k in kernel]
        if channels // groups * kernel[0] * kernel[1] > MAX_K or height + 2 * padding < reach[0] \
                or width + 2 * padding < reach[1]:
            continue
        out = _out(draw, last)
        layers.append(Conv(out_channels, kernel, stride, padding, dilation, groups, draw(st.booleans()),
                           draw(st.booleans()), draw(st.booleans()), out))
        channels = out_channels
        height, width = (conv_output_size(n, k, stride, padding, dilation) for n, k in zip((height, width), kernel))
        if out is None:
            break
    if not layers:
        layers.append(MaxPool(1, 1, 0))
    return Chain(shape, _quantized(draw), tuple(layers), seed, weight_scales)


# -- building

class _Builder:
    """One program holding many chains, each with its own inputs and one output."""

    def __init__(self) -> None:
        self.graph = GraphBuilder()
        self.constants: dict[str, np.ndarray] = {}
        self.inputs: list[np.ndarray] = []

    def constant(self, array: np.ndarray) -> Any:
        name = f"c{len(self.constants)}"
        self.constants[name] = array
        return self.graph.add_input(name, TensorType.of(array.shape, dtypes.dtype(array.dtype)),
                                    InputKind.CONSTANT_TENSOR, target=name)

    def input(self, array: np.ndarray) -> Any:
        self.inputs.append(array)
        return self.graph.add_input(f"x{len(self.inputs) - 1}", TensorType.of(array.shape, dtypes.float32))


def _qdq(value: Any, q: Quantized) -> tuple[Any, Any]:
    """(the quantized integers, their dequantized floats)."""
    dtype, low, high = ACTIVATIONS[q.kind]
    integers = quantized.quantize_per_tensor.default(value, q.scale, q.zero_point, low, high, dtype)
    return integers, quantized.dequantize_per_tensor.default(integers, q.scale, q.zero_point, low, high, dtype)


def _weights(builder: _Builder, rng: np.random.Generator, shape: tuple[int, ...], per_tensor: bool,
             x: Quantized, bias: bool) -> tuple[Any, Any]:
    """(the dequantized int8 weight, scales 2^-5..2^-9 per output channel or one for all; the bias or None, a whole
    number of its channel's accumulator steps, scale(x) * scale(w), as int8 inference stores it: onnxruntime's fused
    QLinearConv rounds a float bias to those steps)."""
    exponents = np.full(shape[0], rng.integers(5, 10)) if per_tensor else rng.integers(5, 10, shape[0])
    weight = rng.integers(-128, 128, shape).astype(np.int8)
    dequantized = quantized.dequantize_per_channel.default(builder.constant(weight),
                                                           builder.constant((2.0 ** -exponents).astype(np.float32)),
                                                           None, 0, -128, 127, dtypes.int8)
    steps = 2.0 ** -(x.exponent + exponents)
    return dequantized, builder.constant((rng.integers(-4096, 4097, shape[0]) * steps).astype(np.float32)) \
        if bias else None


def _chain_input(rng: np.random.Generator, shape: tuple[int, ...], q: Quantized) -> np.ndarray:
    """Multiples of half a step around the quantized range: ties to round to even, and values to clamp."""
    _, low, high = ACTIVATIONS[q.kind]
    halves = rng.integers(2 * (low - q.zero_point) - 8, 2 * (high - q.zero_point) + 9, shape)
    return (halves * (q.scale / 2)).astype(np.float32)


def _layer(builder: _Builder, rng: np.random.Generator, layer: Linear | Conv, floats: Any, x: Quantized,
           per_tensor: bool) -> Any:
    """The float result of a linear or conv2d layer (its residual add and relu included) of dequantized `floats`."""
    shape = list(floats.type.shape)
    if isinstance(layer, Linear):
        weight, bias = _weights(builder, rng, (layer.features, shape[-1]), per_tensor, x, layer.bias)
        y = aten.linear.default(floats, weight, bias)
    else:
        weight, bias = _weights(builder, rng, (layer.channels, shape[1] // layer.groups, *layer.kernel), per_tensor,
                                x, layer.bias)
        y = aten.conv2d.default(floats, weight, bias, [layer.stride] * 2, [layer.padding] * 2, [layer.dilation] * 2,
                                layer.groups)
        if layer.residual:
            other = (rng.integers(-256, 257, y.type.shape) * 2.0 ** -8).astype(np.float32)
            y = aten.add.Tensor(y, builder.input(other))
    return aten.relu.default(y) if layer.relu else y


def _add_chain(builder: _Builder, chain: Chain) -> Any:
    """The chain's ops in `builder`; returns its output (integers, or the last layer's floats)."""
    rng = np.random.default_rng(chain.seed)
    with builder.graph:
        integers, floats = _qdq(builder.input(_chain_input(rng, chain.shape, chain.input)), chain.input)
        current = chain.input
        for layer in chain.layers:
            if isinstance(layer, (Linear, Conv)):
                y = _layer(builder, rng, layer, floats, current, chain.weight_scales == "per-tensor")
                if layer.out is None:
                    return y
                current = layer.out
            elif isinstance(layer, MaxPool):
                y = aten.max_pool2d.default(floats, [layer.kernel] * 2, [layer.stride] * 2, [layer.padding] * 2)
            elif isinstance(layer, AvgPool):
                height, width = floats.type.shape[2:]
                y = aten._adaptive_avg_pool2d.default(floats, [height >> layer.halvings, width >> layer.halvings])
            else:  # Flatten
                y = aten.flatten.using_ints(floats, 1, -1)
            integers, floats = _qdq(y, current)  # pools and flatten keep their input's qparams
    return integers


def build(chains: Sequence[Chain]) -> tuple[ExportedProgram, list[np.ndarray]]:
    """One program computing every chain (one output each), and its inputs."""
    builder = _Builder()
    outputs = [_add_chain(builder, chain) for chain in chains]
    return builder.graph.build(outputs, constants=builder.constants), builder.inputs


# -- checking

@dataclass
class Mismatch:
    backend: str
    chain: Chain | None  # None: the whole batch failed (a crash)
    detail: str

    def __str__(self) -> str:
        return f"{self.backend}: {self.detail}\n    {self.chain!r}"


def _lowered(program: ExportedProgram, inputs: list[np.ndarray]) -> list[np.ndarray]:
    from kiln.passes import run
    return run_program(run(program, "lower-quantized"), inputs)


def _difference(got: np.ndarray, want: np.ndarray) -> str | None:
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"got {got.dtype}{list(got.shape)}, expected {want.dtype}{list(want.shape)}"
    if np.array_equal(got, want):
        return None
    wrong = np.argwhere(got != want)
    at = tuple(int(i) for i in wrong[0])
    steps = np.abs(got.astype(np.float64) - want.astype(np.float64)).max()
    return f"{len(wrong)}/{got.size} elements differ, at most {steps:g}; first at {list(at)}: got {got[at]!r}, " \
           f"expected {want[at]!r}"


def _known_divergence(backend: str, chain: Chain) -> bool:
    """onnxruntime fuses DequantizeLinear -> AveragePool -> QuantizeLinear into its QLinearAveragePool, which rounds
    the mean of the integers with the zero point added, where ONNX's QuantizeLinear (and ATen's quantize) rounds
    x / scale before adding it: a mean of 116.5 steps with zero point 165 is 116 there, 117 in ATen and in the same
    model with onnxruntime's graph optimizations off. One step on ties, which the layers after it carry on; the model
    kiln writes is right, so such chains are not compared on onnxruntime (docs/onnx.md)."""
    return backend == "onnx" and any(isinstance(layer, AvgPool) for layer in chain.layers)


def check(batch: Sequence[Chain], backends: Sequence[Any] | None = None) -> tuple[list[Mismatch], list[str]]:
    """Every backend against the interpreter on the Q/DQ program, exactly; (the mismatches, the refusals)."""
    from tests.fuzz.differential import WORKER, BackendFailed, select_backends
    program, inputs = build(batch)
    expected = run_program(program, inputs)
    mismatches, refusals = [], []
    runs = [("lowered", lambda: _lowered(program, inputs))]
    runs += [(b.name, lambda b=b: WORKER.run(b, program, inputs)) for b in
             (select_backends(None) if backends is None else backends)]
    for name, run in runs:
        try:
            got = run()
        except BackendFailed as failure:
            if failure.refused:
                refusals.append(f"{name}: {failure}")
            else:
                mismatches.append(Mismatch(name, None, f"crash: {failure}"))
            continue
        for chain, g, e in zip(batch, got, expected):
            if not _known_divergence(name, chain) and (why := _difference(g, e)) is not None:
                mismatches.append(Mismatch(name, chain, why))
    return mismatches, refusals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=16)
    options = parser.parse_args()
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from hypothesis import HealthCheck, Phase, given, seed, settings
    from tests.fuzz.programs import fixed_constant_pool

    done, found, refused, started = [0], [], set(), time.perf_counter()

    @seed(options.seed)
    @settings(max_examples=options.programs // options.batch + 1, database=None, deadline=None,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate])
    @given(st.lists(chains(), min_size=options.batch, max_size=options.batch))
    def run(batch: list[Chain]) -> None:
        if done[0] >= options.programs:
            return
        mismatches, refusals = check(batch)
        done[0] += len(batch)
        found.extend(mismatches)
        refused.update(refusals)
        print(f"[{done[0]}/{options.programs}] {len(mismatches)} mismatches ({time.perf_counter() - started:.0f} s)",
              flush=True)
        for mismatch in mismatches:
            print(mismatch, flush=True)

    with fixed_constant_pool():
        run()
    print(f"{done[0]} quantized programs, {len(found)} mismatches or crashes, refusals: {sorted(refused) or 'none'}")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
