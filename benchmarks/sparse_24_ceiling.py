"""How fast 2:4 can be at batch 32 on one core: kiln's 2:4 kernel against the ceiling of its inner loop's shape and
the dense micro-kernel, so the 2:4 / dense goal (1.3x) can be judged against what the core allows.

Usage: python benchmarks/sparse_24_ceiling.py

Builds a C harness over kiln_gemm.h and kiln_sparse.h with the flags of this CPU's capability (or
KILN_CPU_CAPABILITY) and times, one thread, best of 7 runs, in GFLOP/s (2 per multiply-add):
  dense ukernel   kiln_ukernel on a full tile, A and B in cache (the dense GEMM's ceiling);
  2:4 loop shape  kiln_24p_unit's inner loop with everything in L1: per row and group of four columns, one 64-bit
                  broadcast of its two kept values and a vector of (activation row, slot) lanes from its pair plane
                  per multiply-add (32 rows: 4 vectors with AVX-512, 8 with AVX2), the plane's offset read from
                  memory (so nothing is hoisted);
  kiln_24p        the 2:4 kernel on a 4096 x 1024 layer at batch 32: pair planes laid out, then every unit of the
                  packed stream (its multiply-adds: half the dense ones).
Then the best 2:4 / dense ratio the loop shape allows, 2 x shape / ukernel, beside the kernel's own,
2 x kiln_24p / ukernel. Whole layers (transposes, epilogues, threads): benchmarks/sparse.py.
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

#define NV (64 / KILN_SVW)  /* vectors of (row, slot) lanes for 32 rows */

/* kiln_24p_unit's loop on one block of planes and one unit's records, all in L1, repeated. */
static double loop_shape(void)
{
    static float planes[KILN_24P_GROUPS * KILN_24P_GROUP] __attribute__((aligned(64)));
    static char stream[KILN_24P_ROWS * KILN_24P_RECORD] __attribute__((aligned(64)));
    for (int i = 0; i < KILN_24P_GROUPS * KILN_24P_GROUP; ++i) planes[i] = 0.001f * (i % 13);
    for (int r = 0; r < KILN_24P_ROWS; ++r)
        for (int g = 0; g < KILN_24P_GROUPS; ++g) {
            const float pair[2] = {0.5f, -0.25f};
            memcpy(stream + r * KILN_24P_RECORD + 8 * g, pair, 8);
            stream[r * KILN_24P_RECORD + 8 * KILN_24P_GROUPS + g] = (char)((r * 7 + g) % 6 * (KILN_24P_PLANE / 2));
        }
    kiln_sv acc[KILN_24P_INTERLEAVED][NV];  /* (every loop over it unrolled, so it lives in registers) */
    _Pragma("GCC unroll 2") for (int r = 0; r < KILN_24P_INTERLEAVED; ++r)
        _Pragma("GCC unroll 8") for (int v = 0; v < NV; ++v) acc[r][v] = (kiln_sv){0};
    const int reps = 20000;
    double seconds = 1e30;
    for (int run = 0; run < 7; ++run) {  /* (not BEST_OF_7: a _Pragma in a macro argument is dropped) */
        const double start = now();
        for (int rep = 0; rep < reps; ++rep) {
            const char* records = stream;
            for (int r0 = 0; r0 < KILN_24P_ROWS; r0 += KILN_24P_INTERLEAVED,
                 records += KILN_24P_INTERLEAVED * KILN_24P_RECORD)
                _Pragma("GCC unroll 8") for (int g = 0; g < KILN_24P_GROUPS; ++g)
                    _Pragma("GCC unroll 2") for (int r = 0; r < KILN_24P_INTERLEAVED; ++r) {
                        const char* record = records + r * KILN_24P_RECORD;
                        const float* x = (const float*)((const char*)(planes + g * KILN_24P_GROUP)
                                                        + (size_t)(uint8_t)record[8 * KILN_24P_GROUPS + g] * 8);
                        const kiln_sv w = kiln_24p_pair(record + 8 * g);
                        _Pragma("GCC unroll 8") for (int v = 0; v < NV; ++v)
                            acc[r][v] += w * kiln_sv_load(x + v * KILN_SVW);
                    }
            __asm__ volatile("" ::: "memory");
        }
        if (now() - start < seconds) seconds = now() - start;
    }
    float sum = 0;
    _Pragma("GCC unroll 2") for (int r = 0; r < KILN_24P_INTERLEAVED; ++r)
        _Pragma("GCC unroll 8") for (int v = 0; v < NV; ++v) sum += acc[r][v][0];
    return 2.0 * reps * KILN_24P_ROWS * KILN_24P_GROUPS * 2 * 32 / seconds / 1e9 + 0.0 * sum;
}

/* kiln_24p over a 4096 x 1024 2:4 layer, batch 32: planes of the activation rows, then every unit of the stream,
 * span by span. */
static double kernel_24(void)
{
    const int64_t N = 4096, K = 1024, M = 32;
    float* val = aligned_alloc(64, sizeof(float) * N * K / 2);
    uint8_t* meta = aligned_alloc(64, N * K / 8);
    float* x = aligned_alloc(64, sizeof(float) * M * K);
    char* stream = aligned_alloc(64, kiln_24p_bytes(N, K));
    float* planes = aligned_alloc(64, sizeof(float) * kiln_24p_plane_floats(K));
    float* sums = aligned_alloc(64, sizeof(float) * KILN_24P_ROWS * KILN_24P_PLANE);
    static float by_row[KILN_SMB * KILN_24P_ROWS] __attribute__((aligned(64)));
    static const uint8_t pairs[6] = {0x4, 0x8, 0xC, 0x9, 0xD, 0xE};  /* p0 | p1 << 2, p0 < p1 */
    unsigned seed = 1;
    for (int64_t i = 0; i < N * K / 2; ++i) val[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
    for (int64_t i = 0; i < N * K / 8; ++i) {
        seed = seed * 1103515245u + 12345u;
        meta[i] = (uint8_t)(pairs[(seed >> 16) % 6] | pairs[(seed >> 8) % 6] << 4);
    }
    for (int64_t i = 0; i < M * K; ++i) x[i] = (float)(i % 11) * 0.1f;
    kiln_24p_pack(N, K, val, meta, stream);
    const int64_t blocks = kiln_24p_blocks(K);
    double seconds;
    BEST_OF_7(seconds,
        for (int64_t b0 = 0; b0 < blocks; b0 += KILN_24P_SPAN) {
            const int64_t b1 = b0 + KILN_24P_SPAN < blocks ? b0 + KILN_24P_SPAN : blocks;
            for (int64_t g = b0 * KILN_24P_GROUPS; g < b1 * KILN_24P_GROUPS; g += 4)
                kiln_24p_planes(K, g, x, M, 2, planes + (g - b0 * KILN_24P_GROUPS) * KILN_24P_GROUP);
            for (int64_t unit = 0; unit < N / KILN_24P_ROWS; ++unit) {
                kiln_24p_unit(b0, b1, stream + unit * kiln_24p_unit_bytes(K), planes, 32, sums);
                kiln_24p_finish(sums, 32, by_row);
            }
        });
    free(val);
    free(meta);
    free(x);
    free(stream);
    free(planes);
    free(sums);
    return 2.0 * N * (K / 2) * M / seconds / 1e9 + 0.0 * by_row[0];
}

int main(void)
{
    printf("%.1f %.1f %.1f\n", dense_ukernel(), loop_shape(), kernel_24());
    return 0;
}
"""


def main() -> None:
    capability = get_cpu_capability()
    output = run_harness(HARNESS, [])
    dense, shape, kernel = (float(v) for v in output.split())
    print(f"2:4 at batch 32, one thread, {capability}, {cpu_name()}; GFLOP/s (2:4: its own multiply-adds)")
    for name, value in (("dense ukernel", dense), ("2:4 loop shape", shape), ("kiln_24p", kernel)):
        print(f"  {name:<16} {value:8.1f}  ({value / dense:.0%} of the dense ukernel's)")
    print(f"2:4 / dense: at most {2 * shape / dense:.2f} (loop shape), kiln_24p {2 * kernel / dense:.2f} "
          "(kernels only; whole layers: benchmarks/sparse.py)")


if __name__ == "__main__":
    main()
