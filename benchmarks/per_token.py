"""Dynamic int8 linear layers in kiln's C: activations quantized per tensor against per token, beside fp32.

Usage: python benchmarks/per_token.py [--rounds R]

The model is the MLP 1024 -> 4096 (GELU) -> 1024 at batch 32 with int8 per-channel weights (random, seeded),
written as the reference Q/DQ programs: fp32 (the weights dequantized), dynamic per tensor (choose_qparams ->
quantize -> dequantize, quant.qlinear_pointwise.tensor once lowered) and dynamic per token
(choose_qparams_per_token_asymmetric -> quantize_per_token -> dequantize_per_token, quant.qlinear_pointwise.token).
Each compiles to C at the capability KILN_CPU_CAPABILITY names (default: the CPU's); medians of interleaved rounds,
and each int8 program's SQNR against fp32.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from c_realistic import cpu_name  # noqa: E402  (benchmarks/c_realistic.py)
from timing import interleaved_medians  # noqa: E402

import kiln  # noqa: E402
from kiln.ir import dtypes  # noqa: E402
from kiln.ir.program import GraphBuilder, InputKind  # noqa: E402
from kiln.ir.types import TensorType  # noqa: E402

quantized = kiln.ops.quantized_decomposed
aten = kiln.ops.aten
LAYERS = [(1024, 4096), (4096, 1024)]
BATCH = 32


def program(scheme: str) -> kiln.ExportedProgram:
    rng = np.random.default_rng(0)
    builder, constants = GraphBuilder(), {}

    def constant(name: str, array: np.ndarray):
        constants[name] = array
        return builder.add_input(name, TensorType.of(array.shape, dtypes.dtype(array.dtype)),
                                 InputKind.CONSTANT_TENSOR, target=name)
    hidden = builder.add_input("x", TensorType.of([BATCH, LAYERS[0][0]], dtypes.float32))
    with builder:
        for index, (k, n) in enumerate(LAYERS):
            weight = quantized.dequantize_per_channel.default(
                constant(f"w{index}", rng.integers(-128, 128, (n, k)).astype(np.int8)),
                constant(f"s{index}", rng.uniform(0.001, 0.003, n).astype(np.float32)), None, 0, -128, 127,
                dtypes.int8)
            bias = constant(f"b{index}", rng.standard_normal(n).astype(np.float32))
            if scheme == "per tensor":
                scale, zero = quantized.choose_qparams.tensor(hidden, -128, 127, 2.0 ** -12, dtypes.int8)
                q = quantized.quantize_per_tensor.tensor(hidden, scale, zero, -128, 127, dtypes.int8)
                hidden = quantized.dequantize_per_tensor.tensor(q, scale, zero, -128, 127, dtypes.int8)
            elif scheme == "per token":
                scale, zero = quantized.choose_qparams_per_token_asymmetric.default(hidden, dtypes.int8)
                q = quantized.quantize_per_token.default(hidden, scale, zero, -128, 127, dtypes.int8)
                hidden = quantized.dequantize_per_token.default(q, scale, zero, -128, 127, dtypes.int8,
                                                                dtypes.float32)
            hidden = aten.linear.default(hidden, weight, bias)
            if index == 0:
                hidden = aten.gelu.default(hidden)
    return builder.build([hidden], constants=constants)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    options = parser.parse_args()
    x = np.random.default_rng(1).standard_normal((BATCH, LAYERS[0][0])).astype(np.float32)
    schemes = ("fp32", "per tensor", "per token")
    with tempfile.TemporaryDirectory() as folder:
        models = {scheme: kiln.compile(program(scheme), output=Path(folder) / scheme.replace(" ", "_"))
                  for scheme in schemes}
        reference = models["fp32"](x)
        times = interleaved_medians({scheme: (lambda m=model: m(x)) for scheme, model in models.items()},
                                    options.rounds)
        print(f"MLP 1024-4096-1024 batch {BATCH}, kiln C at {models['fp32'].manifest['cpu_capability']}, "
              f"{cpu_name()}")
        for scheme in schemes:
            error = models[scheme](x) - reference
            sqnr = "" if scheme == "fp32" else \
                f"  SQNR {10 * np.log10(np.sum(reference ** 2) / np.sum(error ** 2)):.1f} dB"
            print(f"{scheme:>10}  {times[scheme] * 1e3:7.3f} ms  {times['fp32'] / times[scheme]:5.2f}x fp32{sqnr}")


if __name__ == "__main__":
    main()
