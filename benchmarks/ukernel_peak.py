"""The float32 micro-kernel's own speed on one core: the ceiling the C backend's GEMMs and convolutions work under.

Usage: python benchmarks/ukernel_peak.py [--k 576,4608]

Builds a small C harness over kiln_gemm.h with the flags of this CPU's capability (or KILN_CPU_CAPABILITY) and times
`kiln_ukernel` on full KILN_MR x KILN_NR tiles, one thread, best of 7 runs of a few thousand calls:
  in cache   the same packed A block and B panel every call (about the FMA peak where the tile is FMA-bound);
  B streamed each call a new B panel, round-robin over 48 MB of panels, the next one prefetched as the kernels do
             (a GEMM whose weights come from L3 or memory, as a linear layer's at a small batch);
and the leftover tiles of 4 and 8 rows (fewer than KILN_MR: 64 output channels leave a 4-row tile of 12), in
cache. The issue notes quote these figures beside c_realistic.py's whole-model tables, so "x% of peak" can be read
against the kernel's own ceiling.
"""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from kiln.codegen.c.build import compiler, flags_for, get_cpu_capability  # noqa: E402

HARNESS = r"""
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <time.h>
#include "kiln_gemm.h"

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

/* GFLOP/s of `calls` tiles of `rows` rows, K deep, over `panels` B panels taken in turn (best of 7). */
static double rate(int rows, int64_t K, int64_t panels, int calls)
{
    float* a = aligned_alloc(64, sizeof(float) * K * KILN_MR);
    float* b = aligned_alloc(64, sizeof(float) * K * KILN_NR * panels);
    static float tile[KILN_MR * KILN_NR] __attribute__((aligned(64)));
    for (int64_t i = 0; i < K * KILN_MR; ++i) a[i] = (float)(i % 7) * 0.1f;
    for (int64_t i = 0; i < K * KILN_NR * panels; ++i) b[i] = (float)(i % 5) * 0.1f;
    double best = 1e30;
    for (int run = 0; run < 7; ++run) {
        const double start = now();
        for (int call = 0; call < calls; ++call) {
            const int64_t p = call % panels;
            kiln_ukernel(rows, K, a, 1, KILN_MR, b + p * K * KILN_NR, b + (p + 1) % panels * K * KILN_NR, tile);
        }
        const double seconds = now() - start;
        if (seconds < best) best = seconds;
    }
    free(a);
    free(b);
    return 2.0 * rows * KILN_NR * K * calls / best / 1e9 + 0.0 * tile[0];  /* the tiles are read: kept */
}

int main(int argc, char** argv)
{
    for (int i = 1; i < argc; ++i) {
        const int64_t K = atoll(argv[i]);
        const int64_t streamed = (48 << 20) / (int64_t)(sizeof(float) * K * KILN_NR) + 1;
        const int calls = (int)(2e8 / (2.0 * KILN_MR * KILN_NR * K)) + 1;
        printf("%lld %d %d %.1f %.1f %.1f %.1f\n", (long long)K, KILN_MR, KILN_NR, rate(KILN_MR, K, 1, calls),
               rate(KILN_MR, K, streamed, calls), rate(4, K, 1, calls), 8 < KILN_MR ? rate(8, K, 1, calls) : 0.0);
    }
    return 0;
}
"""


def run_harness(harness: str, arguments: list[str], extra_flags: tuple[str, ...] = ()) -> str:
    """Build a C harness over kiln's headers (kiln/codegen/c) with this capability's flags, run it, return its
    stdout."""
    cc = compiler()
    if cc is None:
        sys.exit("no C compiler (set CC)")
    headers = pathlib.Path(__file__).resolve().parents[1] / "kiln" / "codegen" / "c"
    with tempfile.TemporaryDirectory() as folder:
        source, binary = pathlib.Path(folder) / "harness.c", pathlib.Path(folder) / "harness"
        source.write_text(harness)
        flags = [f for f in flags_for(get_cpu_capability()) if f not in ("-shared", "-fPIC")]
        subprocess.run([cc, *flags, *extra_flags, f"-I{headers}", str(source), "-o", str(binary), "-lm"],
                       check=True)
        return subprocess.run([str(binary), *arguments], check=True, capture_output=True, text=True).stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", default="576,4608", help="K depths to time (comma-separated)")
    options = parser.parse_args()
    capability = get_cpu_capability()
    lines = run_harness(HARNESS, options.k.split(",")).split("\n")
    print(f"kiln_ukernel at {capability}, one thread, GFLOP/s")
    print(f"{'K':>6} {'tile':>7} {'in cache':>9} {'B streamed':>11} {'4 rows':>7} {'8 rows':>7}")
    for line in filter(None, lines):
        k, mr, nr, cached, streamed, four, eight = line.split()
        eight = eight if float(eight) else "-"  # a full tile where KILN_MR is 6 (AVX2)
        print(f"{k:>6} {mr + 'x' + nr:>7} {cached:>9} {streamed:>11} {four:>7} {eight:>7}")


if __name__ == "__main__":
    main()
