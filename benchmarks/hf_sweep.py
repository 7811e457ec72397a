"""The Hugging Face sweep: every architecture in tests/models/hf_zoo.py (small configs, random weights, nothing
downloaded) through torch.export with dynamic batch and sequence dims, torch.export.save, kiln.load in a process
where torch cannot be imported, then kiln's interpreter, ONNX (onnxruntime) and C at both of the architecture's sizes
(hf_zoo.SIZES unless it keeps its own) against torch eager (torch.testing.assert_close defaults).

Usage (from the repo root): python benchmarks/hf_sweep.py [NAME ...] [--timeout S] [--results PATH] [--table-only]

Each architecture runs in its own process with a timeout, so one crash or hang doesn't stop the sweep; results are
appended to a JSON-lines file as they come (rerun with --table-only to print the table from it). Timings: export
(torch.export.export + save), kiln load, C compile, and the C/onnxruntime latency ratio (median of --repeat runs
each, one thread each, at the example size). The table is the one in docs/models.md: architecture x stage, with
`pass` or the stage's first error cut to one line."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.models.hf_zoo import (ARCHITECTURES, expected_outputs, export_to_folder,  # noqa: E402
                                 run_in_kiln, stage_mismatch)

STAGES = ["export", "load", "interpreter", "onnx", "c"]
KILN_STAGES = ["interpreter", "onnx", "c"]
WIDTH = 100


def one_line(text: str) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= WIDTH else text[:WIDTH - 3] + "..."


def run_worker(name: str, folder: Path, repeat: int) -> dict:
    """Everything for one architecture, in this process (the worker); writes folder/result.json after each step
    so a timeout still says how far it got."""
    import warnings
    warnings.filterwarnings("ignore")
    import torch
    torch.set_num_threads(1)
    architecture = ARCHITECTURES[name]
    result: dict = {"name": name, "stages": {}, "seconds": {}}

    def write() -> dict:
        (folder / "result.json").write_text(json.dumps(result))
        return result

    model = architecture.model()
    write()
    start = time.perf_counter()
    try:
        export_to_folder(architecture, model, folder)
    except Exception as exc:
        result["stages"]["export"] = f"{type(exc).__name__}: {exc}"
        return write()
    result["seconds"]["export"] = time.perf_counter() - start
    result["stages"]["export"] = None
    write()
    report, stderr = run_in_kiln(folder, KILN_STAGES, repeat=repeat, timeout=3600)
    result["stages"].update(report["stages"])
    result["seconds"].update(report.get("seconds", {}))
    result["latency"] = report.get("latency", {})
    if any(report["stages"].get(stage) for stage in ["load", *KILN_STAGES]):
        result["stderr"] = stderr
    expected = expected_outputs(architecture, model)
    for stage in KILN_STAGES:
        if stage in report["stages"] and report["stages"][stage] is None:
            mismatch = stage_mismatch(folder, stage, expected)
            if mismatch:
                result["stages"][stage] = f"mismatch: {mismatch}"
    return write()


def run_one(name: str, timeout: float, repeat: int) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"sweep-{name}-") as folder:
        command = [sys.executable, __file__, "--worker", name, "--folder", folder, "--repeat", str(repeat)]
        started = time.perf_counter()
        try:
            done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=timeout)
            crashed = done.returncode != 0
            tail = done.stderr[-3000:]
        except subprocess.TimeoutExpired:
            crashed, tail = True, f"timeout after {timeout:.0f} s"
        path = Path(folder) / "result.json"
        result = json.loads(path.read_text()) if path.exists() else {"name": name, "stages": {}, "seconds": {}}
        if crashed:  # the first stage without a verdict is where it died
            missing = next((stage for stage in STAGES if stage not in result["stages"]), None)
            last = [line for line in tail.splitlines() if line.strip()]
            if missing:
                result["stages"][missing] = f"worker died: {last[-1] if last else 'no output'}"
            result["stderr"] = tail
        result["wall"] = time.perf_counter() - started
        return result


def cell(result: dict, stage: str) -> str:
    stages = result["stages"]
    if stage not in stages:
        return "-"
    return "pass" if stages[stage] is None else one_line(stages[stage])


def table(results: list[dict]) -> str:
    lines = ["| architecture | export | load | interpreter | onnx | c | export s | load s | C compile s | C/ORT |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for result in results:
        seconds, latency = result.get("seconds", {}), result.get("latency", {})
        ratio = f"{latency['c'] / latency['onnx']:.2f}" if latency.get("c") and latency.get("onnx") else "-"
        timing = [f"{seconds[key]:.1f}" if key in seconds else "-" for key in ("export", "load", "c_compile")]
        lines.append(f"| {result['name']} | " + " | ".join(cell(result, stage) for stage in STAGES) + " | "
                     + " | ".join(timing) + f" | {ratio} |")
    counts = {stage: sum(result["stages"].get(stage, "x") is None for result in results) for stage in STAGES}
    lines.append("")
    lines.append(f"Passing, of {len(results)} architectures: "
                 + ", ".join(f"{stage} {count}" for stage, count in counts.items()))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="architectures (default: all in hf_zoo.ARCHITECTURES)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per architecture")
    parser.add_argument("--repeat", type=int, default=5, help="runs per latency median")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results" / "hf_sweep.jsonl",
                        help="JSON lines, appended")
    parser.add_argument("--table-only", action="store_true", help="print the table from --results and stop")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.worker:
        run_worker(options.worker, options.folder, options.repeat)
        return
    names = options.names or list(ARCHITECTURES)
    if not options.table_only:
        unknown = sorted(set(names) - set(ARCHITECTURES))
        if unknown:
            parser.error(f"unknown architectures: {', '.join(unknown)}")
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        options.results.parent.mkdir(parents=True, exist_ok=True)
        for name in names:
            result = run_one(name, options.timeout, options.repeat)
            with options.results.open("a") as f:
                f.write(json.dumps(result) + "\n")
            print(f"{name}: " + ", ".join(f"{stage} {cell(result, stage)}" for stage in STAGES)
                  + f" ({result['wall']:.0f} s)", flush=True)
    latest = {}
    for line in options.results.read_text().splitlines():  # the latest run of each architecture wins
        result = json.loads(line)
        latest[result["name"]] = result
    order = [name for name in ARCHITECTURES if name in latest and name in names]
    print(table([latest[name] for name in order]))


if __name__ == "__main__":
    main()
