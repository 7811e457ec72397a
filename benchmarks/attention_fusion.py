"""Fused attention against kiln's separate GEMM + softmax + GEMM kernels (issue 14's attention question).

Usage: python benchmarks/attention_fusion.py [--seqs 128,256,512,1024] [--heads 12] [--head-dim 64] [--threads 1,2]

softmax(Q Kᵀ · scale) V over (1, heads, seq, head_dim) float32 tensors, as torch's scaled_dot_product_attention
(which kiln receives as the safe softmax), through `kiln.from_torch` and `kiln.compile` twice, side by side in one
process:
- separate: with `kiln.codegen.c.attention.FUSE` off, a batched GEMM with the scale fused, the softmax row kernels
  (amax, _softmax, eq, where), a second batched GEMM, the seq x seq scores in memory between them;
- fused: `kiln.compile`'s default, one attention kernel (kiln/codegen/c/attention.py, render._attention): a thread
  takes (head, block of KILN_MR queries), computes the block's score rows against every key in a cache-resident
  buffer, applies the softmax there and multiplies by V.
Prints median latencies (interleaved rounds), fused / separate, and each one's max abs difference from a float64
numpy reference.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
from typing import Any

import numpy as np

from timing import interleaved_medians  # benchmarks/timing.py (scripts run from their folder)


def _reference(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    scores = np.einsum("bhsd,bhtd->bhst", q.astype(np.float64), k.astype(np.float64)) / math.sqrt(q.shape[-1])
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    return np.einsum("bhst,bhtd->bhsd", scores / scores.sum(-1, keepdims=True), v.astype(np.float64))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", default="128,256,512,1024")
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--repeat", type=int, default=9)
    options = parser.parse_args()
    logging.disable(logging.WARNING)
    import torch

    import kiln
    import kiln.codegen.c.attention
    import kiln.runtime
    from kiln.codegen.c import get_cpu_capability

    class Attention(torch.nn.Module):
        def forward(self, q: Any, k: Any, v: Any) -> Any:
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    print(f"capability {get_cpu_capability()}, heads {options.heads}, head dim {options.head_dim}")
    print(f"{'seq':>5} {'threads':>7} {'separate ms':>12} {'fused ms':>9} {'fused/separate':>15} "
          f"{'separate diff':>14} {'fused diff':>11}")
    for seq in (int(s) for s in options.seqs.split(",")):
        rng = np.random.default_rng(seq)
        q, k, v = (rng.standard_normal((1, options.heads, seq, options.head_dim)).astype(np.float32)
                   for _ in range(3))
        expected = _reference(q, k, v)
        program = kiln.from_torch(Attention(), tuple(torch.from_numpy(t) for t in (q, k, v)))
        packages = {}
        for fuse in (False, True):
            kiln.codegen.c.attention.FUSE = fuse
            packages["fused" if fuse else "separate"] = kiln.compile(program).path
        for threads in (int(t) for t in options.threads.split(",")):
            os.environ["OMP_NUM_THREADS"] = str(threads)
            models = {name: kiln.runtime.load(path, num_threads=threads) for name, path in packages.items()}
            runners = {name: (lambda model: lambda: model(q, k, v))(model) for name, model in models.items()}
            medians = interleaved_medians(runners, options.repeat)
            diffs = {name: float(np.max(np.abs(np.asarray(run()) - expected))) for name, run in runners.items()}
            print(f"{seq:>5} {threads:>7} {medians['separate'] * 1e3:>12.3f} {medians['fused'] * 1e3:>9.3f} "
                  f"{medians['fused'] / medians['separate']:>15.2f} {diffs['separate']:>14.1e} "
                  f"{diffs['fused']:>11.1e}", flush=True)


if __name__ == "__main__":
    main()
