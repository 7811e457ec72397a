"""float16 and bfloat16 models in kiln's C backend against float32, torch eager and onnxruntime: a GPT-2 from
transformers (random weights, 4 layers of 256) on one prompt, one thread each. C stores half precision and computes in
float32 (docs/c-backend.md, Numerics): its GEMMs read float32 weights converted at compile time, so a half model
costs the conversions of its activations on top of float32's; torch's CPU kernels compute half precision natively
(oneDNN's bfloat16 GEMMs where the CPU has AVX-512 BF16 or AMX). onnxruntime runs kiln's ONNX of each program (its CPU
provider computes most float16 ops in float32, docs/onnx.md).

Run: .venv/bin/python benchmarks/half_precision.py [--rounds N] [--seq N]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kiln  # noqa: E402

from timing import interleaved_medians  # noqa: E402  (benchmarks/timing.py: scripts run from their folder)

DTYPES = ["float32", "float16", "bfloat16"]


def gpt2() -> object:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    config = GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=1000, n_positions=128, use_cache=False)
    return GPT2LMHeadModel(config).eval()


def runners(dtype: str, tokens: object, folder: Path) -> dict:
    import onnxruntime
    import torch

    class Logits(torch.nn.Module):  # in float32 (onnxruntime's Python API has no numpy bfloat16)
        def __init__(self, dtype: str):
            super().__init__()
            self.gpt2 = gpt2().to(getattr(torch, dtype))

        def forward(self, tokens):
            return self.gpt2(tokens).logits.float()
    model = Logits(dtype)
    program = kiln.from_torch(model, (tokens,))
    compiled = kiln.compile(program, output=folder / dtype, num_threads=1)
    ids = tokens.numpy()
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads, options.log_severity_level = 1, 1, 3
    onnx_program = kiln.onnx.export(program)
    session = onnxruntime.InferenceSession(onnx_program.model_proto.SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name

    def eager() -> object:
        with torch.no_grad():
            return model(tokens)
    expected = eager().numpy()
    got = np.asarray(compiled(ids)).astype(np.float32)
    print(f"{dtype}: kiln C logits max |error| against eager {np.abs(got - expected).max():.3g}")
    return {f"kiln C {dtype}": lambda: compiled(ids), f"torch eager {dtype}": eager,
            f"onnxruntime {dtype}": lambda: session.run(None, {name: ids})}


def main() -> None:
    import torch
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seq", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokens = torch.randint(0, 1000, (1, args.seq))
    with tempfile.TemporaryDirectory() as folder:
        every = {}
        for dtype in DTYPES:
            every.update(runners(dtype, tokens, Path(folder)))
        medians = interleaved_medians(every, args.rounds)
    print(f"\nGPT-2 (4 x 256), 1 x {args.seq} tokens, one thread; median ms (ratio to kiln C float32)")
    print("| dtype | kiln C | torch eager | onnxruntime | kiln / eager | kiln / ORT |")
    print("|---|---|---|---|---|---|")
    base = medians["kiln C float32"]
    for dtype in DTYPES:
        kiln_ms, eager_ms, ort_ms = (medians[f"{peer} {dtype}"] * 1e3 for peer in ("kiln C", "torch eager",
                                                                                  "onnxruntime"))
        print(f"| {dtype} | {kiln_ms:.2f} ({kiln_ms / (base * 1e3):.2f}x) | {eager_ms:.2f} | {ort_ms:.2f} | "
              f"{kiln_ms / eager_ms:.2f} | {kiln_ms / ort_ms:.2f} |")


if __name__ == "__main__":
    main()
