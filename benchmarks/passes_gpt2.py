"""Pass-pipeline time on the GPT-2-small-sized program (12 layers, d=768, dynamic batch and sequence).

Exports kiln.models.get("gpt2_small") once, then runs the default pipeline (or --pipeline) --repeat times and
prints the per-pass wall times of the median run, the total (target: under 5 s), and the op counts.
Usage:
    python benchmarks/passes_gpt2.py [--repeat 3] [--pipeline "decompose,canonicalize,cse,dce"]
"""

from __future__ import annotations

import argparse
import time

import kiln
import kiln.models
import kiln.passes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pipeline", default=kiln.passes.DEFAULT_PIPELINE)
    args = parser.parse_args()

    start = time.perf_counter()
    entry = kiln.models.get("gpt2_small")
    program = kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes)
    print(f"model + export: {time.perf_counter() - start:.2f} s, {len(list(program.nodes()))} ops, "
          f"{len(program.state_dict)} weights")

    runs = []
    for _ in range(args.repeat):
        manager = kiln.passes.PassManager(args.pipeline)
        start = time.perf_counter()
        optimized = manager.run(program)
        runs.append((time.perf_counter() - start, manager))
    runs.sort(key=lambda run: run[0])
    total, manager = runs[len(runs) // 2]
    print(f"\npipeline: {args.pipeline}  (median of {args.repeat} runs)")
    print(manager.report())
    print(f"\nmedian total of PassManager.run (including copying the input program): {total:.3f} s (target < 5 s)")
    print(f"runs: {', '.join(f'{t:.3f}' for t, _ in runs)} s")
    print(f"ops: {len(list(program.nodes()))} exported -> {len(list(optimized.nodes()))} after the pipeline")
    histogram = sorted(optimized.op_histogram().items(), key=lambda item: -item[1])
    print("top ops after:", ", ".join(f"{name.removeprefix('aten.')}={count}" for name, count in histogram[:8]))


if __name__ == "__main__":
    main()
