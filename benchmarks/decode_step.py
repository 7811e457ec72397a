"""One decoding step of a Hugging Face causal LM (GPT-2 small, random weights) with a cache of past keys and values:
kiln's C against onnxruntime and torch eager, side by side in one process.

Usage: python benchmarks/decode_step.py [--past 127] [--threads 2] [--rounds 15]

The step is a torch module taking (input_ids [1, 1], past keys and values [layers, 1, heads, past, head_dim]) and
returning (logits, the grown keys and values), written over transformers' DynamicCache as generation uses it. kiln:
`kiln.from_torch` then `kiln.compile`. onnxruntime runs kiln's ONNX file of the same program (torch.onnx does not
export the cache's Python objects), default graph optimizations. A step reads every weight once (GPT-2 small:
0.5 GB in float32, the LM head 154 MB of it), so it measures memory bandwidth more than arithmetic; the table gives
each peer's weight bytes per second. Then kiln's kernels grouped by kind (`compiled.profile`).
"""

from __future__ import annotations

import argparse
import collections
import logging
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from c_realistic import cpu_name  # noqa: E402  (benchmarks/c_realistic.py)
from kiln.codegen.c.build import get_cpu_capability  # noqa: E402
from onnx_quality import ort_session  # noqa: E402
from timing import interleaved_medians  # noqa: E402


def decode_step(torch: Any, transformers: Any, layers: int = 12) -> Any:
    config = transformers.GPT2Config(n_layer=layers, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()

    class Step(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids: Any, keys: Any, values: Any) -> Any:
            cache = transformers.DynamicCache()
            for layer in range(keys.shape[0]):
                cache.update(keys[layer], values[layer], layer)
            out = self.model(input_ids=ids, past_key_values=cache, use_cache=True)
            grown = out.past_key_values.layers
            return (out.logits, torch.stack([layer.keys for layer in grown]),
                    torch.stack([layer.values for layer in grown]))

    return Step().eval(), config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--past", type=int, default=127, help="cached tokens before the step")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    options = parser.parse_args()
    logging.disable(logging.WARNING)
    import torch
    import transformers

    import kiln
    torch.set_num_threads(options.threads)
    step, config = decode_step(torch, transformers)
    heads, head_dim = config.n_head, config.n_embd // config.n_head
    generator = torch.Generator().manual_seed(1)
    args = (torch.randint(0, config.vocab_size, (1, 1), generator=generator),
            torch.randn(config.n_layer, 1, heads, options.past, head_dim, generator=generator),
            torch.randn(config.n_layer, 1, heads, options.past, head_dim, generator=generator))
    arrays = [a.numpy() for a in args]
    with torch.no_grad():
        expected = step(*args)
    program = kiln.from_torch(step, args)
    weight_bytes = sum(p.numel() * p.element_size() for p in step.parameters())
    with tempfile.TemporaryDirectory() as folder:
        compiled = kiln.compile(program, output=Path(folder) / "step", num_threads=options.threads)
        session = ort_session(kiln.onnx.export(program).model_proto.SerializeToString(), options.threads)
        feeds = {i.name: a for i, a in zip(session.get_inputs(), arrays)}
        got = compiled(*arrays)
        differences = [float(np.max(np.abs(g - e.numpy()))) for g, e in zip(got, expected)]

        def eager() -> Any:
            with torch.inference_mode():
                return step(*args)
        runners = {"kiln C": lambda: compiled(*arrays), "onnxruntime": lambda: session.run(None, feeds),
                   "torch eager": eager}
        medians = interleaved_medians(runners, options.rounds)
        profile = compiled.profile(*arrays, runs=10)
    print(f"GPT-2 small decode step, {options.past} past tokens, {options.threads} threads, {cpu_name()}, "
          f"capability {get_cpu_capability()}")
    print(f"{'peer':<12} {'ms':>8} {'/ kiln':>7} {'weight GB/s':>12}")
    for peer, seconds in medians.items():
        print(f"{peer:<12} {seconds * 1e3:8.2f} {seconds / medians['kiln C']:7.2f} "
              f"{weight_bytes / seconds / 1e9:12.1f}")
    print(f"kiln's max abs difference from torch eager: logits {differences[0]:.1e}, keys {differences[1]:.1e}, "
          f"values {differences[2]:.1e}")
    groups: dict[str, float] = collections.defaultdict(float)
    for name, seconds in profile:
        groups[re.sub(r"_\d+$", "", re.sub(r"^kernel_\d+_", "", name))] += seconds
    total = sum(groups.values())
    print(f"kiln's kernels by kind ({total * 1e3:.2f} ms in all):")
    for kind, seconds in sorted(groups.items(), key=lambda item: -item[1])[:8]:
        print(f"  {seconds * 1e3:7.3f} ms  {kind}")


if __name__ == "__main__":
    main()
