"""Does a fused attention kernel beat kiln's separate GEMM + softmax + GEMM kernels? (issue 14's attention question)

Usage: python benchmarks/attention_fusion.py [--seqs 128,256,512,1024] [--heads 12] [--head-dim 64] [--threads 1,2]

softmax(Q Kᵀ · scale) V over (heads, seq, head_dim) float32 tensors, batch 1, two ways, side by side in one process:
- separate: the torch expression through `kiln.from_torch` and `kiln.compile`, i.e. what kiln runs today: a batched
  GEMM with the scale fused, a softmax row kernel, a second batched GEMM, the seq x seq scores in memory between them;
- fused: one flash-style C kernel written here on kiln_gemm.h's micro-kernels and packing (the same register tiles
  as kiln's GEMMs), built with kiln's flags: a thread takes (head, block of KILN_MR queries), computes the block's
  score rows against every key into a cache-resident buffer, applies the softmax there and multiplies by V, so the
  scores never reach memory. K and V are packed once per head per thread.
Prints median latencies (interleaved rounds), fused / separate, and each one's max abs difference from a float64
numpy reference.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import math
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from timing import interleaved_medians  # noqa: E402  (benchmarks/timing.py)

FUSED_SOURCE = r"""
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
__MATH__
__GEMM__

/* out[h, s, :] = softmax(scale * q[h, s, :] . k[h, :, :]^T) v[h, :, :], contiguous (heads, seq, dim) tensors. */
/* Floats of workspace one thread needs (packed K, packed V, one block's score rows), a multiple of 16. */
int64_t kiln_fused_attention_workspace(int64_t seq, int64_t dim)
{
    const int64_t floats = kiln_panels(seq) * dim * KILN_NR + kiln_panels(dim) * seq * KILN_NR
                           + KILN_MR * kiln_panels(seq) * KILN_NR;
    return (floats + 15) / 16 * 16;
}

/* `workspace`: 64-byte aligned, kiln_fused_attention_workspace floats per thread, allocated once by the caller (a
 * per-call aligned_alloc in each worker mmapped and unmapped it every call, and 2 threads ran slower than 1). */
void kiln_fused_attention(int64_t heads, int64_t seq, int64_t dim, float scale, const float* q, const float* k,
                          const float* v, float* out, int threads, float* workspace)
{
    const int64_t key_panels = kiln_panels(seq), value_panels = kiln_panels(dim);
    const int64_t padded = key_panels * KILN_NR, query_blocks = (seq + KILN_MR - 1) / KILN_MR;
    #pragma omp parallel num_threads(threads)
    {
        float* keys = workspace + omp_get_thread_num() * kiln_fused_attention_workspace(seq, dim);
        float* values = keys + key_panels * dim * KILN_NR;
        float* scores = values + value_panels * seq * KILN_NR;
        float tile[KILN_MR * KILN_NR] __attribute__((aligned(64)));
        int64_t packed_head = -1;
        #pragma omp for collapse(2) schedule(static)
        for (int64_t h = 0; h < heads; ++h)
        for (int64_t block = 0; block < query_blocks; ++block)
        {
            if (packed_head != h) {  /* B = K^T [dim x seq] and B = V [seq x dim], as panels */
                kiln_pack_b(dim, seq, k + h * seq * dim, 1, dim, keys);
                kiln_pack_b(seq, dim, v + h * seq * dim, dim, 1, values);
                packed_head = h;
            }
            const int64_t first = block * KILN_MR;
            const int rows = (int)(seq - first < KILN_MR ? seq - first : KILN_MR);
            const float* a = q + (h * seq + first) * dim;
            for (int64_t j = 0; j < key_panels; ++j) {
                const float* panel = keys + j * dim * KILN_NR;
                kiln_ukernel(rows, dim, a, dim, 1, panel, panel, tile);
                for (int r = 0; r < rows; ++r)
                    _Pragma("omp simd") for (int c = 0; c < KILN_NR; ++c)
                        scores[r * padded + j * KILN_NR + c] = tile[r * KILN_NR + c] * scale;
            }
            for (int r = 0; r < rows; ++r) {  /* the softmax of each score row, in cache (kiln's float32 row body) */
                float* row = scores + r * padded;
                float m = -INFINITY;
                _Pragma("omp simd reduction(max:m)") for (int64_t s = 0; s < seq; ++s) m = row[s] > m ? row[s] : m;
                double sum = 0.0;
                _Pragma("omp simd reduction(+:sum)") for (int64_t s = 0; s < seq; ++s)
                    { row[s] = kiln_expf(row[s] - m); sum += row[s]; }
                const float inv = (float)(1.0 / sum);
                _Pragma("omp simd") for (int64_t s = 0; s < seq; ++s) row[s] *= inv;
            }
            for (int64_t j = 0; j < value_panels; ++j) {
                const float* panel = values + j * seq * KILN_NR;
                kiln_ukernel(rows, seq, scores, padded, 1, panel, panel, tile);
                const int64_t width = dim - j * KILN_NR < KILN_NR ? dim - j * KILN_NR : KILN_NR;
                for (int r = 0; r < rows; ++r)
                    memcpy(out + (h * seq + first + r) * dim + j * KILN_NR, tile + r * KILN_NR,
                           (size_t)width * sizeof(float));
            }
        }
    }
}
"""


def _fused_library() -> Any:
    from kiln.codegen.c.build import build_library
    headers = Path(__file__).resolve().parents[1] / "kiln" / "codegen" / "c"
    source = FUSED_SOURCE.replace("__MATH__", (headers / "kiln_math.h").read_text())
    library = ctypes.CDLL(str(build_library(source.replace("__GEMM__", (headers / "kiln_gemm.h").read_text()))))
    pointer = ctypes.POINTER(ctypes.c_float)
    library.kiln_fused_attention.argtypes = [ctypes.c_int64] * 3 + [ctypes.c_float] + [pointer] * 4 + \
        [ctypes.c_int, pointer]
    library.kiln_fused_attention.restype = None
    library.kiln_fused_attention_workspace.argtypes = [ctypes.c_int64] * 2
    library.kiln_fused_attention_workspace.restype = ctypes.c_int64
    return library


def _reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    scores = np.einsum("hsd,htd->hst", q.astype(np.float64), k.astype(np.float64)) * scale
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    return np.einsum("hst,htd->hsd", scores / scores.sum(-1, keepdims=True), v.astype(np.float64))


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
    import kiln.runtime
    from kiln.codegen.c import get_cpu_capability

    class Attention(torch.nn.Module):
        def forward(self, q: Any, k: Any, v: Any) -> Any:
            return torch.softmax(q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5), dim=-1) @ v

    fused = _fused_library()
    pointer = ctypes.POINTER(ctypes.c_float)
    heads, dim = options.heads, options.head_dim
    scale = 1.0 / math.sqrt(dim)
    print(f"capability {get_cpu_capability()}, heads {heads}, head dim {dim}")
    print(f"{'seq':>5} {'threads':>7} {'separate ms':>12} {'fused ms':>9} {'fused/separate':>15} "
          f"{'separate diff':>14} {'fused diff':>11}")
    for seq in (int(s) for s in options.seqs.split(",")):
        rng = np.random.default_rng(seq)
        q, k, v = (rng.standard_normal((heads, seq, dim)).astype(np.float32) for _ in range(3))
        expected = _reference(q, k, v, scale)
        program = kiln.from_torch(Attention(), tuple(torch.from_numpy(t[None]) for t in (q, k, v)))
        package = kiln.compile(program)
        for threads in (int(t) for t in options.threads.split(",")):
            os.environ["OMP_NUM_THREADS"] = str(threads)
            separate_model = kiln.runtime.load(package.path, num_threads=threads)
            out = np.empty_like(q)
            floats = threads * fused.kiln_fused_attention_workspace(seq, dim)
            storage = np.zeros(floats + 16, np.float32)
            workspace = storage[(-storage.ctypes.data % 64) // 4:]  # 64-byte aligned for the packed panels
            arguments = [a.ctypes.data_as(pointer) for a in (q, k, v, out)]

            def run_fused() -> None:
                fused.kiln_fused_attention(heads, seq, dim, scale, *arguments, threads,
                                           workspace.ctypes.data_as(pointer))

            def run_separate() -> Any:
                return separate_model(q[None], k[None], v[None])
            medians = interleaved_medians({"separate": run_separate, "fused": run_fused}, options.repeat)
            separate_diff = float(np.max(np.abs(np.asarray(run_separate())[0] - expected)))
            run_fused()
            fused_diff = float(np.max(np.abs(out - expected)))
            print(f"{seq:>5} {threads:>7} {medians['separate'] * 1e3:>12.3f} {medians['fused'] * 1e3:>9.3f} "
                  f"{medians['fused'] / medians['separate']:>15.2f} {separate_diff:>14.1e} {fused_diff:>11.1e}",
                  flush=True)


if __name__ == "__main__":
    main()
