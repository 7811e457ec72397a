"""How long kiln takes from a model to a loaded C package, cold (an empty build cache), and where the time goes.

Usage: python benchmarks/compile_time.py [--rows transformer,gpt2_small] [--repeat R]

Rows (benchmarks/c_realistic.py's modules):
  transformer  nn.TransformerEncoder, 6 layers, d 512: `kiln.from_torch` once, then `kiln.compile` (goal: <= 3 s);
  gpt2_small   Hugging Face GPT-2 small (124M parameters): `torch.export.export` + `torch.export.save` once, then
               `kiln.load` of the .pt2 and `kiln.compile` (goal: <= 10 s for the two).
Columns, medians of R runs: kiln.load (gpt2_small only), kiln.compile with an empty build cache, the C compiler alone
on the same model.c (one process per build part, as kiln.compile runs it while it writes weights.bin), the parts it
used, and kiln.compile again with the library cached. Every run starts from a new cache directory.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from c_realistic import ROWS, cpu_name  # noqa: E402  (benchmarks/c_realistic.py)
from onnx_quality import build_row  # noqa: E402


def _since(start: float) -> float:
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="transformer,gpt2_small")
    parser.add_argument("--repeat", type=int, default=3)
    options = parser.parse_args()
    logging.disable(logging.WARNING)
    import torch

    import kiln
    from kiln.codegen.c import build, get_cpu_capability
    print(f"{cpu_name()}, capability {get_cpu_capability()}, {build.usable_cpus()} usable CPUs")
    print(f"{'row':<12} {'kiln.load s':>12} {'compile s':>10} {'load+compile s':>15} {'C compiler s':>13} "
          f"{'parts':>6} {'cached compile s':>17}")
    for name in options.rows.split(","):
        model, args, dims, _ = build_row(torch, name, ROWS)
        with tempfile.TemporaryDirectory() as folder:
            archive = Path(folder) / f"{name}.pt2"
            if name == "gpt2_small":  # timed from the .pt2 on, as a user's exported file
                torch.export.save(torch.export.export(model, args), archive)
            program = None if name == "gpt2_small" else kiln.from_torch(model, args)
            loads, compiles, compilers, cached, parts = [], [], [], [], 0
            for run in range(options.repeat):
                os.environ["KILN_CACHE_DIR"] = str(Path(folder) / f"cache{run}")
                start = time.perf_counter()
                program_now = kiln.load(archive) if program is None else program
                loads.append(_since(start))
                start = time.perf_counter()
                kiln.compile(program_now, output=Path(folder) / f"pkg{run}")
                compiles.append(_since(start))
                start = time.perf_counter()
                kiln.compile(program_now, output=Path(folder) / f"pkg{run}")
                cached.append(_since(start))
                source = (Path(folder) / f"pkg{run}" / "model.c").read_text()
                os.environ["KILN_CACHE_DIR"] = str(Path(folder) / f"compiler{run}")
                start = time.perf_counter()
                build.build_library(source)
                compilers.append(_since(start))
                parts = build.build_parts(source)
            os.environ.pop("KILN_CACHE_DIR")
        load = statistics.median(loads) if name == "gpt2_small" else 0.0  # from_torch ran once, before the runs
        compile_seconds = statistics.median(compiles)
        load_text = f"{load:.2f}" if load else "-"
        print(f"{name:<12} {load_text:>12} {compile_seconds:>10.2f} {load + compile_seconds:>15.2f} "
              f"{statistics.median(compilers):>13.2f} {parts:>6} {statistics.median(cached):>17.2f}", flush=True)


if __name__ == "__main__":
    main()
