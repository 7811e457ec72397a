"""Compiled models beside CPU-bound processes: kiln's C package with its adaptive team (kiln/codegen/c/kiln_threads.h),
the same package with the team held at its full size (KILN_ADAPTIVE_THREADS=0, kiln's behaviour before), and
onnxruntime, side by side in one process, first on a quiet machine and then beside `--neighbours` busy processes.

Usage (from the repo root): python benchmarks/busy_neighbour.py [--rows mobilenet_v2,cnn_b1,resnet18] [--threads T]
[--neighbours N] [--rounds R] [--round-seconds S]

Rows are benchmarks/c_realistic.py's. Each peer's figure is the median over interleaved rounds of its mean latency in
a round of about S seconds (timing.interleaved_medians): a mean, because a run held at a barrier for a descheduled
worker costs a scheduler time slice, and the throughput a server sees is the mean. "kiln threads" is the team size of
the adaptive package's latest run.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from c_realistic import ROWS, _onnxruntime, build_row, cpu_name  # noqa: E402
from onnx_quality import torch_dynamic_shapes  # noqa: E402
from timing import interleaved_medians  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="mobilenet_v2,cnn_b1,resnet18")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--neighbours", type=int, default=1, help="CPU-bound processes beside the models")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--round-seconds", type=float, default=0.5)
    options = parser.parse_args()
    logging.disable(logging.WARNING)
    import torch

    import kiln
    from kiln.codegen.c import get_cpu_capability
    torch.set_num_threads(options.threads)
    print(f"{cpu_name()}, capability {get_cpu_capability()}, {options.threads} threads, {os.cpu_count()} CPUs; "
          f"busy: {options.neighbours} CPU-bound process(es) beside the models")
    print(f"{'row':<14} {'machine':<8} {'kiln ms':>8} {'kiln full team ms':>18} {'onnxruntime ms':>15} "
          f"{'kiln/ORT':>9} {'kiln threads':>13}")
    for name in options.rows.split(","):
        model, args, dims, _ = build_row(torch, name, ROWS)
        numpy_args = [a.numpy() for a in args]
        program = kiln.from_torch(model, args, dynamic_shapes=torch_dynamic_shapes(torch, args, dims))
        with tempfile.TemporaryDirectory() as folder:
            kiln.compile(program, output=Path(folder) / "model", num_threads=options.threads)
            os.environ["KILN_ADAPTIVE_THREADS"] = "0"  # read when a model is created
            full_team = kiln.runtime.load(Path(folder) / "model", num_threads=options.threads)
            del os.environ["KILN_ADAPTIVE_THREADS"]
            adaptive = kiln.runtime.load(Path(folder) / "model", num_threads=options.threads)
            np.testing.assert_array_equal(adaptive(*numpy_args), full_team(*numpy_args))
            runners = {"kiln": lambda: adaptive(*numpy_args), "kiln full team": lambda: full_team(*numpy_args),
                       "onnxruntime": _onnxruntime(torch, model, args, options.threads)}
            for machine in ("quiet", "busy"):
                neighbours = []
                if machine == "busy":
                    neighbours = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                                  for _ in range(options.neighbours)]
                    time.sleep(0.5)
                try:
                    medians = interleaved_medians(runners, options.rounds, round_seconds=options.round_seconds)
                finally:
                    for process in neighbours:
                        process.kill()
                        process.wait()
                ms = {peer: seconds * 1e3 for peer, seconds in medians.items()}
                print(f"{name:<14} {machine:<8} {ms['kiln']:>8.2f} {ms['kiln full team']:>18.2f} "
                      f"{ms['onnxruntime']:>15.2f} {ms['kiln'] / ms['onnxruntime']:>9.2f} "
                      f"{adaptive.last_run_threads:>13}", flush=True)


if __name__ == "__main__":
    main()
