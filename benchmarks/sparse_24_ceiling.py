"""How fast 2:4 can be at batch 32 on one core: kiln's 2:4 kernel against the ceiling of its inner loop's shape and
the dense micro-kernel, so the 2:4 / dense goal (1.3x) can be judged against what the core allows.

Usage: python benchmarks/sparse_24_ceiling.py

Builds a C harness over kiln_gemm.h and kiln_sparse.h with the flags of this CPU's capability (or
KILN_CPU_CAPABILITY) and times, one thread, best of 7 runs, in GFLOP/s (2 per multiply-add):
  dense ukernel   kiln_ukernel on a full tile, A and B in cache (the dense GEMM's ceiling);
  2:4 loop shape  the 2:4 kernel's inner loop without its metadata: per stored weight, one broadcast from memory
                  and one load of activations from L1 per vector of batch rows, each feeding one multiply-add
                  (32 rows: 2 vectors with AVX-512, 4 with AVX2), four weight rows interleaved;
  kiln_24_rows    the 2:4 kernel on a 4096 x 1024 layer at batch 32 (its multiply-adds: half the dense ones).
Then the best 2:4 / dense ratio the loop shape allows, 2 x shape / ukernel, beside the kernel's own,
2 x kiln_24_rows / ukernel: the shape is bounded by its loads (a vector of activations per multiply-add, plus the
broadcasts; on the Xeon of the notes, about 1.3 64-byte loads a cycle), where the dense kernel's weights stay in
registers.
"""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from kiln.codegen.c.build import get_cpu_capability  # noqa: E402
from c_realistic import cpu_name  # noqa: E402  (benchmarks/c_realistic.py)
from ukernel_peak import run_harness  # noqa: E402  (benchmarks/ukernel_peak.py)

HARNESS = r"""
#define _POSIX_C_SOURCE 200809L
#pragma GCC optimize("fp-contract=fast")  /* multiply-adds (-std=c11 turns contraction off) */
#include <stdio.h>
#include <time.h>
#include "kiln_gemm.h"
#include "kiln_sparse.h"

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
#define BEST_OF_7(seconds, body) do { seconds = 1e30; for (int run = 0; run < 7; ++run) { \
        const double start = now(); body; const double took = now() - start; if (took < seconds) seconds = took; } \
    } while (0)

#define NV (32 / KILN_SVW)  /* vectors of batch rows */

static double dense_ukernel(void)
{
    const int64_t K = 1024;
    float* a = aligned_alloc(64, sizeof(float) * K * KILN_MR);
    float* b = aligned_alloc(64, sizeof(float) * K * KILN_NR);
    static float tile[KILN_MR * KILN_NR] __attribute__((aligned(64)));
    for (int64_t i = 0; i < K * KILN_MR; ++i) a[i] = (float)(i % 7) * 0.1f;
    for (int64_t i = 0; i < K * KILN_NR; ++i) b[i] = (float)(i % 5) * 0.1f;
    const int calls = 20000;
    double seconds;
    BEST_OF_7(seconds, for (int c = 0; c < calls; ++c) kiln_ukernel(KILN_MR, K, a, 1, KILN_MR, b, b, tile));
    free(a);
    free(b);
    return 2.0 * KILN_MR * KILN_NR * K * calls / seconds / 1e9 + 0.0 * tile[0];
}

/* The 2:4 inner loop's shape: 4 rows x NV accumulators; per stored weight a broadcast and NV activation loads from
 * an L1-resident block at offsets read from memory (so nothing is hoisted), as kiln_24_groups_rows does. */
static double loop_shape(void)
{
    enum { STEPS = 256, ROWS = 4 };
    static float xs[8 * 32 * 8] __attribute__((aligned(64)));
    static float ws[STEPS * ROWS];
    static int offsets[STEPS * ROWS];
    for (int i = 0; i < 8 * 32 * 8; ++i) xs[i] = 0.001f * (i % 13);
    for (int i = 0; i < STEPS * ROWS; ++i) { ws[i] = 0.5f; offsets[i] = (i * 5 % 64) * 32; }
    kiln_sv acc[ROWS][NV];
    for (int r = 0; r < ROWS; ++r) for (int v = 0; v < NV; ++v) for (int l = 0; l < KILN_SVW; ++l) acc[r][v][l] = 0;
    const int reps = 40000;
    double seconds = 1e30;
    for (int run = 0; run < 7; ++run) {  /* (not BEST_OF_7: a _Pragma in a macro argument is dropped) */
        const double start = now();
        for (int rep = 0; rep < reps; ++rep)
            for (int s = 0; s < STEPS; ++s)
                _Pragma("GCC unroll 4") for (int r = 0; r < ROWS; ++r) {
                    const float w = ws[s * ROWS + r];
                    const float* x = xs + offsets[s * ROWS + r];
                    _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v)
                        acc[r][v] += w * kiln_sv_load(x + v * KILN_SVW);
                }
        if (now() - start < seconds) seconds = now() - start;
    }
    float sum = 0;
    for (int r = 0; r < ROWS; ++r) for (int v = 0; v < NV; ++v) sum += acc[r][v][0];
    return 2.0 * reps * STEPS * ROWS * 32 / seconds / 1e9 + 0.0 * sum;
}

/* kiln_24_rows over a 4096 x 1024 2:4 layer, batch 32 (activations transposed, as the generated code passes them). */
static double kernel_24(void)
{
    const int64_t N = 4096, K = 1024, M = 32;
    float* val = aligned_alloc(64, sizeof(float) * N * K / 2);
    uint8_t* meta = aligned_alloc(64, N * K / 8);
    float* xT = aligned_alloc(64, sizeof(float) * K * M);
    static const uint8_t pairs[6] = {0x4, 0x8, 0xC, 0x9, 0xD, 0xE};  /* p0 | p1 << 2, p0 < p1 */
    unsigned seed = 1;
    for (int64_t i = 0; i < N * K / 2; ++i) val[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
    for (int64_t i = 0; i < N * K / 8; ++i) {
        seed = seed * 1103515245u + 12345u;
        meta[i] = (uint8_t)(pairs[(seed >> 16) % 6] | pairs[(seed >> 8) % 6] << 4);
    }
    for (int64_t i = 0; i < K * M; ++i) xT[i] = (float)(i % 11) * 0.1f;
    static float tile[16 * KILN_SMB] __attribute__((aligned(64)));
    double seconds;
    BEST_OF_7(seconds, for (int64_t n0 = 0; n0 < N; n0 += 16)
        kiln_24_rows(K, 16, val + n0 * (K / 2), meta + n0 * (K / 8), xT, M, (int)M, tile, xT));
    free(val);
    free(meta);
    free(xT);
    return 2.0 * N * (K / 2) * M / seconds / 1e9 + 0.0 * tile[0];
}

int main(void)
{
    printf("%.1f %.1f %.1f\n", dense_ukernel(), loop_shape(), kernel_24());
    return 0;
}
"""


def main() -> None:
    capability = get_cpu_capability()
    # (kiln_24_rows's rows are a constant here, which GCC's loop bounds warning reads as a possible overflow)
    output = run_harness(HARNESS, [], ("-Wno-aggressive-loop-optimizations",))
    dense, shape, kernel = (float(v) for v in output.split())
    print(f"2:4 at batch 32, one thread, {capability}, {cpu_name()}; GFLOP/s (2:4: its own multiply-adds)")
    for name, value in (("dense ukernel", dense), ("2:4 loop shape", shape), ("kiln_24_rows", kernel)):
        print(f"  {name:<16} {value:8.1f}  ({value / dense:.0%} of the dense ukernel's)")
    print(f"2:4 / dense: at most {2 * shape / dense:.2f} (loop shape), kiln_24_rows {2 * kernel / dense:.2f} "
          "(kernels only; whole layers: benchmarks/sparse.py)")


if __name__ == "__main__":
    main()
