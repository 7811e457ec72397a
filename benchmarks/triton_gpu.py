"""kiln's Triton backend on a CUDA GPU against torch.compile (inductor) and torch eager, in one process.

Usage: python benchmarks/triton_gpu.py [--rows zoo_mlp,...,gpt2_128,gpt2_1024,resnet18] [--smoke]

Each row is a torch module: kiln reads it with `kiln.from_torch`, compiles it with `target="triton"` and runs it on
CUDA tensors; torch.compile and eager run the same module. Columns: latency (ms, the median of triton.testing.do_bench
after warm-up), kiln / inductor (goal <= 1.1), kiln / eager, kiln's achieved TFLOP/s (matmul and convolution FLOPs of
the program), compile seconds, and kiln's max abs difference from eager.

`--smoke` runs every row at tiny sizes on CPU through Triton's interpreter (TRITON_INTERPRET=1) to check the
script; its timings mean nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _zoo(name: str) -> Callable[[Any, bool], tuple[Any, tuple]]:
    """A zoo model's torch twin (kiln.models' source run against torch) at its example inputs."""
    def build(torch: Any, smoke: bool) -> tuple[Any, tuple]:
        import kiln
        entry = kiln.models.get(name)
        twin = kiln.models.torch_twin(type(entry.model).__module__)
        module = getattr(twin, type(entry.model).__name__)().eval()
        args = tuple(torch.from_numpy(np.asarray(a.numpy() if hasattr(a, "numpy") else a).copy())
                     for a in entry.args)
        return module, args
    return build


def _gpt2(sequence: int) -> Callable[[Any, bool], tuple[Any, tuple]]:
    def build(torch: Any, smoke: bool) -> tuple[Any, tuple]:
        import transformers
        from onnx_quality import _Positional
        layers, width, heads = (2, 64, 2) if smoke else (12, 768, 12)
        config = transformers.GPT2Config(n_layer=layers, n_embd=width, n_head=heads, vocab_size=50257,
                                         n_positions=1024)
        model = transformers.GPT2LMHeadModel(config).eval()
        return _Positional(model, ["input_ids"]), (torch.randint(0, 50257, (1, 16 if smoke else sequence)),)
    return build


def _resnet18(torch: Any, smoke: bool) -> tuple[Any, tuple]:
    from c_realistic import _resnet18 as resnet
    module, args, _ = resnet(torch)
    return module.eval(), ((torch.randn(1, 3, 32, 32),) if smoke else args)


ROWS: dict[str, Callable[[Any, bool], tuple[Any, tuple]]] = {
    **{f"zoo_{name}": _zoo(name) for name in ("mlp", "transformer", "gpt", "cnn", "lstm")},
    "gpt2_128": _gpt2(128), "gpt2_1024": _gpt2(1024), "resnet18": _resnet18,
}


def run_row(name: str, smoke: bool) -> None:
    import torch
    import triton.testing

    import kiln
    from c_backend import count_flops
    device = "cpu" if smoke else "cuda"
    module, args = ROWS[name](torch, smoke)
    start = time.perf_counter()
    program = kiln.from_torch(module, args)
    compiled = kiln.compile(program, target="triton")
    compile_seconds = time.perf_counter() - start
    module = module.to(device)
    inputs = tuple(a.to(device) for a in args)
    with torch.no_grad():
        eager = module(*inputs)
        eager = eager[0] if isinstance(eager, (tuple, list)) else eager
        ours = compiled(*inputs)
        ours = ours[0] if isinstance(ours, (tuple, list)) else ours
        difference = float((ours.float() - eager.float()).abs().max())
        peers = {"kiln Triton": lambda: compiled(*inputs), "torch eager": lambda: module(*inputs)}
        if not smoke:
            inductor = torch.compile(module)
            inductor(*inputs)
            peers["torch.compile"] = lambda: inductor(*inputs)
        timings = {peer: (triton.testing.do_bench(run, warmup=25, rep=200, return_mode="median") if not smoke
                          else _cpu_median(run)) for peer, run in peers.items()}
    flops = count_flops(program, [a.cpu().numpy() for a in args])
    ms = timings["kiln Triton"]
    ratio = f"{ms / timings['torch.compile']:.2f}" if "torch.compile" in timings else "-"
    print(f"{name:<14} " + " ".join(f"{timings.get(peer, float('nan')):9.3f}" for peer in
                                    ("kiln Triton", "torch.compile", "torch eager"))
          + f" {ratio:>9} {ms / timings['torch eager']:9.2f} {flops / ms / 1e9:8.2f} {compile_seconds:8.1f}"
          f" {difference:10.2e}")


def _cpu_median(run: Callable[[], Any]) -> float:
    times = []
    for _ in range(3):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on CPU through Triton's interpreter")
    options = parser.parse_args()
    if options.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        import torch
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device: run with --smoke to check the script on CPU")
        print(f"device: {torch.cuda.get_device_name()}")
    print(f"{'row':<14} {'kiln ms':>9} {'inductor':>9} {'eager':>9} {'/inductor':>9} {'/eager':>9} {'TFLOP/s':>8} "
          f"{'compile s':>8} {'max |diff|':>10}")
    for name in options.rows.split(","):
        run_row(name, options.smoke)


if __name__ == "__main__":
    main()
