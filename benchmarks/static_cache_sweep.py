"""Every decoder of the Hugging Face zoo exported for generation with a static KV cache, through kiln step by step.

Usage: python benchmarks/static_cache_sweep.py [NAME ...]   (default: every decoder-only LM in tests/models/hf_zoo.py)

Each architecture runs in its own process (a crash or a hang costs one row): its zoo config with the cache on,
transformers' ExecuTorch recipe (`TorchExportableModuleForDecoderOnlyLM`, 16 positions) exported by torch.export with
a dynamic sequence and saved; then a 4-token prompt and three decode steps, one call each, in kiln's interpreter
module, the C package, kiln's ONNXProgram and the Triton package (through Triton's interpreter, TRITON_INTERPRET=1),
each against torch's `ep.module()` under torch.testing.assert_close's defaults. `export` fails where torch.export or
the recipe does, before kiln sees the model. The table goes to stdout, one JSON line per architecture to
benchmarks/results/static_cache_sweep.jsonl.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "static_cache_sweep.jsonl"
STAGES = ("interpreter", "c", "onnx", "triton")


def decoders() -> list[str]:
    """The zoo's decoder-only language models: inputs of token ids alone, and a model that can generate."""
    sys.path.insert(0, str(ROOT))
    from tests.models.hf_zoo import ARCHITECTURES, TOKENS
    return [name for name, architecture in ARCHITECTURES.items()
            if architecture.dims == TOKENS and architecture.model().can_generate()]


def run_one(name: str) -> dict:
    """The row of one architecture (in this process)."""
    import numpy as np
    import torch

    import kiln
    from tests.models.hf_zoo import ARCHITECTURES, export_with_static_cache
    from tests.models.test_static_cache import DECODED, MAX_CACHE, PROMPT
    row: dict = {"name": name}
    try:
        archive, torch_module = export_with_static_cache(ARCHITECTURES[name].model(), MAX_CACHE)
    except Exception as error:  # torch.export or the recipe failed: kiln never saw the model
        row["export"] = f"{type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''}"
        return row
    row["export"] = "pass"
    steps = [(np.array([PROMPT]), np.arange(len(PROMPT)))] + [
        (np.array([[token]]), np.array([len(PROMPT) + k])) for k, token in enumerate(DECODED)]
    with torch.no_grad():
        expected = [torch_module(input_ids=torch.from_numpy(i), cache_position=torch.from_numpy(p)).numpy()
                    for i, p in steps]
    program = kiln.load(io.BytesIO(archive.getvalue()))
    for stage in STAGES:
        try:
            if stage == "interpreter":
                module = program.module()
                run = lambda i, p, m=module: m(input_ids=i, cache_position=p)  # noqa: E731
            elif stage in ("c", "triton"):
                run = kiln.compile(program, target=stage)
            else:
                onnx_program = kiln.onnx.export(program)
                run = lambda i, p, o=onnx_program: o(input_ids=i, cache_position=p)  # noqa: E731
            for (ids, positions), want in zip(steps, expected):
                torch.testing.assert_close(torch.from_numpy(np.asarray(run(ids, positions))), torch.from_numpy(want))
            row[stage] = "pass"
        except Exception as error:
            row[stage] = f"{type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''}"
    return row


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--one":
        import os
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton's first import: CPU tensors
        sys.path.insert(0, str(ROOT))
        print("ROW " + json.dumps(run_one(sys.argv[2])))
        return
    names = sys.argv[1:] or decoders()
    rows = []
    for name in names:
        try:
            done = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True, text=True,
                                  timeout=900, cwd=ROOT)
            line = next((l for l in done.stdout.splitlines() if l.startswith("ROW ")), None)
            row = json.loads(line[4:]) if line else {"name": name, "export": f"crashed: {done.stderr[-160:]}"}
        except subprocess.TimeoutExpired:
            row = {"name": name, "export": "timed out"}
        rows.append(row)
        print(json.dumps(row), flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    passed = [row["name"] for row in rows if all(row.get(stage) == "pass" for stage in STAGES)]
    exported = [row for row in rows if row.get("export") == "pass"]
    print(f"\n{len(passed)} of {len(rows)} decoders generate in every stage; {len(exported)} exported "
          f"({len(rows) - len(exported)} failed in torch.export or the recipe)")
    print("| architecture | " + " | ".join(("export", *STAGES)) + " |\n" + "|---" * (len(STAGES) + 2) + "|")
    for row in rows:
        print("| " + " | ".join([row["name"], *(row.get(k, "-") if row.get(k) in ("pass", "-", None) else "fail"
                                                for k in ("export", *STAGES))]).replace("None", "-") + " |")


if __name__ == "__main__":
    main()
