"""Build + verify a 10,000-op program with a symbolic batch dim; also time printing and parsing.

Usage: python benchmarks/build_verify_10k.py [--ops N] [--repeat R]. Reports medians over R runs.
The issue's target: build + verify well under 1 s.
"""

from __future__ import annotations

import argparse

import kiln
from timing import median_time  # benchmarks/timing.py (scripts run from their folder)
from kiln.ir import ExportedProgram, GraphBuilder, ShapeEnv, TensorType

aten = kiln.ops.aten


def build(num_ops: int) -> ExportedProgram:
    env = ShapeEnv()
    batch = env.create_symbol(8, name="batch", min=1, max=4096)
    builder = GraphBuilder(env)
    x = builder.add_input("x", TensorType.of([batch, 64], "f32"))
    w = builder.add_input("w", TensorType.of([64, 64], "f32"))
    value = x
    with builder:
        # A realistic mix: matmuls, elementwise chains with scalars, views.
        for index in range(num_ops // 4):
            value = aten.mm.default(value, w)
            value = aten.add.Tensor(value, x)
            value = aten.mul.Scalar(value, 0.5)
            value = aten.relu.default(value)
    return builder.build([value])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ops", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    build(100).verify()  # warm up: dialect generation, imports
    build_s, program = median_time(lambda: build(args.ops), args.repeat)
    verify_s, _ = median_time(program.verify, args.repeat)
    print_s, text = median_time(program.to_mlir, args.repeat)
    parse_s, _ = median_time(lambda: ExportedProgram.from_mlir(text), 1)
    ops = sum(1 for _ in program.nodes())
    print(f"ops: {ops}")
    print(f"build:          {build_s * 1000:8.1f} ms  ({build_s / ops * 1e6:.1f} us/op)")
    print(f"verify:         {verify_s * 1000:8.1f} ms")
    print(f"build + verify: {(build_s + verify_s) * 1000:8.1f} ms  (target: well under 1000 ms)")
    print(f"print MLIR:     {print_s * 1000:8.1f} ms")
    print(f"parse MLIR:     {parse_s * 1000:8.1f} ms  (text is for people and tests, not hot paths)")


if __name__ == "__main__":
    main()
