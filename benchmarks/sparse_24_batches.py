"""2:4 against dense by batch size: the measurements behind sparsify's choice of 2:4 (passes/sparsity.py,
TWO_FOUR_FEW_ROWS and TWO_FOUR_MANY_ROWS).

Usage: python benchmarks/sparse_24_batches.py [--rows mlp,ffn] [--batches 1,2,3,4,5,6,8,12,16,32,64] [--threads T]
                                              [--rounds R]

For each row of benchmarks/sparse.py (Linear, GELU, Linear; mlp 1024 -> 4096 -> 1024, ffn 768 -> 3072 -> 768) and each
batch: kiln's C on the dense model and on the same model pruned 2:4 and stored 2:4 (`sparsify{layout=semi_structured}`),
T threads each (default 2; KILN_ADAPTIVE_THREADS=0, so a noisy neighbour does not shrink one peer's team for seconds),
medians of interleaved rounds; the 2:4 output is checked against kiln's interpreter on the
pruned program first. Prints the milliseconds and the speedup over dense per batch, with the CPU and its capability
(KILN_CPU_CAPABILITY picks another).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from c_realistic import cpu_name  # noqa: E402  (benchmarks/c_realistic.py)
from timing import interleaved_medians  # noqa: E402

import kiln  # noqa: E402
from kiln.codegen.c.build import get_cpu_capability  # noqa: E402

ROWS = {"mlp": (1024, 4096), "ffn": (768, 3072)}
os.environ["KILN_ADAPTIVE_THREADS"] = "0"  # read when a compiled model is created


def run_row(name: str, batches: list[int], threads: int, rounds: int) -> None:
    width, hidden = ROWS[name]
    nn = kiln.nn
    kiln.manual_seed(0)
    model = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width)).eval()
    print(f"\n{name} {width}->{hidden}->{width}, {threads} thread(s), {get_cpu_capability()}, {cpu_name()}")
    print(f"{'batch':>6} {'dense ms':>9} {'2:4 ms':>9} {'2:4 / dense':>12}")
    for batch in batches:
        x = np.random.default_rng(batch).standard_normal((batch, width)).astype(np.float32)
        program = kiln.export(model, (kiln.tensor(x),))
        pruned = kiln.passes.run(program, "prune{pattern=semi_structured}")
        sparse = kiln.passes.run(pruned, "sparsify{layout=semi_structured}")
        dense_c, sparse_c = kiln.compile(program, num_threads=threads), kiln.compile(sparse, num_threads=threads)
        kiln.testing.assert_close(sparse_c(x), pruned(x))
        medians = interleaved_medians({"dense": lambda: dense_c(x), "2:4": lambda: sparse_c(x)}, rounds)
        print(f"{batch:>6} {medians['dense'] * 1e3:9.3f} {medians['2:4'] * 1e3:9.3f} "
              f"{medians['dense'] / medians['2:4']:12.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--batches", default="1,2,3,4,5,6,8,12,16,32,64")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args()
    for name in args.rows.split(","):
        run_row(name, [int(b) for b in args.batches.split(",")], args.threads, args.rounds)


if __name__ == "__main__":
    main()
