"""Own packed GEMM micro-kernels vs a maintained BLAS: the measurement behind docs/c-backend.md's decision.

One process, same thread count for everyone. For each (M, K, N) a float32 `linear` (y = x W^T + b) runs as:
  kiln C     a kiln-compiled nn.Linear: W packed into 32-wide panels at create, AVX-512 register tiles, bias fused;
  openblas32 cblas_sgemm from the scipy-openblas32 wheel (pip install scipy-openblas32), the BLAS kiln could
             link instead, plus the bias as a separate numpy pass (what linking a BLAS would do);
  numpy      x @ W.T + b on numpy's own OpenBLAS build.
Usage: python benchmarks/gemm_choice.py [--threads N] [--repeat R]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import median_seconds  # noqa: E402

import kiln  # noqa: E402
import kiln.runtime  # noqa: E402

SHAPES = [(1, 1024, 4096), (1, 4096, 1024), (32, 1024, 4096), (32, 4096, 1024), (128, 768, 3072),
          (512, 768, 768), (2048, 2048, 2048)]


def openblas_sgemm(threads: int):
    """x, w -> x @ w.T through scipy-openblas32's cblas_sgemm, or None when the wheel is not installed."""
    try:
        import scipy_openblas32
    except ImportError:
        return None
    lib = ctypes.CDLL(os.path.join(scipy_openblas32.get_lib_dir(), "libscipy_openblas.so"))
    lib.scipy_openblas_set_num_threads(threads)
    sgemm = lib.scipy_cblas_sgemm
    sgemm.restype = None
    pointer, integer, real = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    sgemm.argtypes = [integer, integer, integer, integer, integer, integer, real, pointer, integer, pointer, integer,
                      real, pointer, integer]
    row_major, no_trans, trans = 101, 111, 112

    def run(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> np.ndarray:
        m, k = x.shape
        n = w.shape[0]
        sgemm(row_major, no_trans, trans, m, n, k, 1.0, x.ctypes.data, k, w.ctypes.data, k, 0.0, out.ctypes.data, n)
        return out
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    blas = openblas_sgemm(args.threads)
    if blas is None:
        print("scipy-openblas32 is not installed (pip install scipy-openblas32): its column shows n/a")
    rng = np.random.default_rng(0)
    print(f"threads: {args.threads}; median of {args.repeat} calls; GFLOP/s = 2*M*K*N / time\n")
    print("| M | K | N | kiln C ms | openblas32 ms | numpy ms | kiln GFLOP/s | openblas32 GFLOP/s "
          "| kiln / openblas32 |")
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for m, k, n in SHAPES:
            layer = kiln.nn.Linear(k, n).eval()
            program = kiln.export(layer, (kiln.randn(m, k),))
            compiled = kiln.compile(program, output=os.path.join(folder, f"linear_{m}_{k}_{n}"),
                                            num_threads=args.threads)
            x = rng.standard_normal((m, k)).astype(np.float32)
            w, b = layer.weight.numpy(), layer.bias.numpy()
            repeat = max(3, args.repeat // (8 if m * k * n > 1e9 else 1))
            kiln_s = median_seconds(lambda: compiled(x), repeat)
            numpy_s = median_seconds(lambda: x @ w.T + b, repeat)
            expected = x.astype(np.float64) @ w.T.astype(np.float64) + b
            scale = np.abs(expected).max()
            assert np.abs(compiled(x) - expected).max() <= 1e-5 * scale + 1e-5, "kiln C result is wrong"
            flops = 2 * m * k * n
            row = [str(m), str(k), str(n), f"{kiln_s * 1e3:.3f}"]
            if blas is not None:
                out = np.empty((m, n), np.float32)
                blas_s = median_seconds(lambda: np.add(blas(x, w, out), b, out=out), repeat)
                row += [f"{blas_s * 1e3:.3f}", f"{numpy_s * 1e3:.3f}", f"{flops / kiln_s / 1e9:.0f}",
                        f"{flops / blas_s / 1e9:.0f}", f"{kiln_s / blas_s:.2f}"]
            else:
                row += ["n/a", f"{numpy_s * 1e3:.3f}", f"{flops / kiln_s / 1e9:.0f}", "n/a", "n/a"]
            print("| " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
