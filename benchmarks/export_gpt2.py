"""Export time of the GPT-2-small-sized model (12 layers, d=768): kiln.export vs torch.export.export.

Both trace the same source (kiln/models/gpt.py, run under torch by swapping the namespace) with dynamic
batch and sequence dims. Reports medians over --repeat runs and the ratio. Usage:
    python benchmarks/export_gpt2.py [--repeat 3] [--layers 12]
"""

from __future__ import annotations

import argparse

import kiln
from timing import median_seconds  # benchmarks/timing.py (scripts run from their folder)
import kiln.models


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--layers", type=int, default=12)
    args = parser.parse_args()
    config = kiln.models.GPTConfig(vocab_size=50257, block_size=1024, n_layer=args.layers, n_head=12, n_embd=768)

    kiln.manual_seed(0)
    model = kiln.models.GPT(config).eval()
    idx = kiln.randint(0, config.vocab_size, (2, 16))
    batch, seq = kiln.Dim("batch", max=64), kiln.Dim("seq", max=config.block_size)
    shapes = {"idx": {0: batch, 1: seq}}
    kiln_s = median_seconds(lambda: kiln.export(model, (idx,), dynamic_shapes=shapes), args.repeat)
    program = kiln.export(model, (idx,), dynamic_shapes=shapes)
    print(f"kiln.export:          {kiln_s:7.2f} s  ({sum(1 for _ in program.nodes())} ops)")

    try:
        import torch
    except ImportError:
        print("torch is not installed: no comparison")
        return
    twin = kiln.models.torch_twin("kiln.models.gpt")
    torch.manual_seed(0)
    torch_model = twin.GPT(twin.GPTConfig(**config.__dict__)).eval()
    torch_idx = torch.from_numpy(idx.numpy().copy())
    tbatch, tseq = torch.export.Dim("batch", max=64), torch.export.Dim("seq", max=config.block_size)
    torch_shapes = {"idx": {0: tbatch, 1: tseq}}
    torch_s = median_seconds(lambda: torch.export.export(torch_model, (torch_idx,), dynamic_shapes=torch_shapes),
                             args.repeat)
    print(f"torch.export.export:  {torch_s:7.2f} s")
    print(f"ratio torch/kiln:     {torch_s / kiln_s:7.1f}x  (goal: >= 10x)")


if __name__ == "__main__":
    main()
