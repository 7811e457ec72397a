"""Sparse linear layers side by side: kiln's C sparse kernels against kiln dense C, torch's CPU sparse and
onnxruntime dense.

Usage: python benchmarks/sparse.py [--rows mlp,ffn,cnn] [--batches 1,32] [--threads T] [--rounds R]

Rows: Linear, GELU, Linear with random weights (kiln.nn, seeded):
  mlp  1024 -> 4096 -> 1024
  ffn  768 -> 3072 -> 768 (a transformer's feed-forward block)
and convolutions (sparse convolution is BSR over im2col: blocks of output x input channels with all their taps):
  cnn  3 x (conv 3x3, 128 -> 128 channels, padding 1, ReLU) on 28 x 28 (a ResNet stage)
Each row runs at every batch. Peers, one process, T threads each (default 2), medians of interleaved rounds:
  kiln C dense; kiln C on weights pruned and sparsified by kiln's passes: CSR at 90% and 95% unstructured sparsity,
  BSR at 80% block sparsity (16x16 and 32x32 blocks), 2:4 (cnn: BSR 16x16 at 50-90% and 8x8 at 80%, the break-even
  sweep behind sparsify's CONV_BSR_BREAK_EVEN); torch eager dense, and torch CPU sparse on the same pruned
  weights (`to_sparse_csr` / `to_sparse_bsr`: F.linear on a sparse weight); onnxruntime dense (kiln's ONNX).
Every sparse peer's output is checked against kiln's interpreter on its pruned program before timing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from c_realistic import cpu_name  # noqa: E402  (benchmarks/c_realistic.py)
from onnx_quality import ort_session  # noqa: E402
from timing import interleaved_medians  # noqa: E402

ROWS = {"mlp": (1024, 4096), "ffn": (768, 3072), "cnn": (128, 28)}
SCHEMES = {
    "CSR 90%": "prune{sparsity=0.9},sparsify{layout=csr}",
    "CSR 95%": "prune{sparsity=0.95},sparsify{layout=csr}",
    "BSR 80% 16x16": "prune{pattern=block block=16,16 sparsity=0.8},sparsify{layout=bsr block=16,16}",
    "BSR 80% 32x32": "prune{pattern=block block=32,32 sparsity=0.8},sparsify{layout=bsr block=32,32}",
    "2:4": "prune{pattern=semi_structured},sparsify{layout=semi_structured}",
}
CONV_SCHEMES = {f"BSR {level}% {block}x{block}": f"prune{{pattern=block block={block},{block} sparsity=0.{level}}},"
                f"sparsify{{layout=bsr block={block},{block}}}" for level, block in
                ((50, 16), (60, 16), (70, 16), (80, 16), (90, 16), (80, 8))}


def _model(nn: Any, name: str) -> Any:
    """The row's model in `nn` (kiln.nn or torch.nn: same layers, same state-dict names)."""
    if name == "cnn":
        channels = ROWS[name][0]
        layers = [layer for _ in range(3) for layer in (nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU())]
        return nn.Sequential(*layers).eval()
    width, hidden = ROWS[name]
    return nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width)).eval()


def _input_shape(name: str, batch: int) -> tuple[int, ...]:
    return (batch, ROWS[name][0], ROWS[name][1], ROWS[name][1]) if name == "cnn" else (batch, ROWS[name][0])


def _torch_sparse(torch: Any, pruned: Any, scheme: str) -> Callable[[Any], Any] | None:
    """torch eager on the pruned weights in torch's sparse layout (None where torch has no CPU kernel: 2:4)."""
    if scheme.startswith("2:4"):
        return None
    weights = {name: torch.from_numpy(np.asarray(value).copy()) for name, value in pruned.state_dict.items()}
    if scheme.startswith("CSR"):
        def convert(w: Any) -> Any:
            return w.to_sparse_csr()
    else:
        block = int(scheme.split()[-1].split("x")[0])

        def convert(w: Any) -> Any:
            return w.to_sparse_bsr((block, block))
    w1, w2 = convert(weights["0.weight"]), convert(weights["2.weight"])
    b1, b2 = weights["0.bias"], weights["2.bias"]
    functional = torch.nn.functional
    return lambda x: functional.linear(functional.gelu(functional.linear(x, w1, b1)), w2, b2)


def run_row(name: str, batch: int, threads: int, rounds: int) -> None:
    import torch

    import kiln
    torch.set_num_threads(threads)
    kiln.manual_seed(0)
    model = _model(kiln.nn, name)
    x = np.random.default_rng(0).standard_normal(_input_shape(name, batch)).astype(np.float32)
    program = kiln.export(model, (kiln.tensor(x),))
    dense = kiln.compile(program, num_threads=threads)
    session = ort_session(kiln.onnx.export(program, (x,)).model_proto.SerializeToString(), threads)
    feed = {session.get_inputs()[0].name: x}
    tx = torch.from_numpy(x)
    torch_dense = _model(torch.nn, name)
    torch_dense.load_state_dict({k: torch.from_numpy(np.asarray(v).copy()) for k, v in program.state_dict.items()})
    runners: dict[str, Callable[[], Any]] = {
        "kiln C dense": lambda: dense(x),
        "onnxruntime dense": lambda: session.run(None, feed),
        "torch eager dense": lambda: torch_dense(tx),
    }
    for scheme, pipeline in (CONV_SCHEMES if name == "cnn" else SCHEMES).items():
        pruned = kiln.passes.run(program, pipeline.split(",sparsify")[0])
        sparse = kiln.passes.run(pruned, pipeline)
        package = kiln.compile(sparse, num_threads=threads)
        kiln.testing.assert_close(package(x), pruned(x))
        runners[f"kiln C {scheme}"] = lambda package=package: package(x)
        reference = _torch_sparse(torch, pruned, scheme) if name != "cnn" else None  # torch: no sparse conv
        if reference is not None:
            np.testing.assert_allclose(reference(tx).numpy(), pruned(x), rtol=1e-4, atol=1e-4)
            runners[f"torch CPU sparse {scheme}"] = lambda reference=reference: reference(tx)
    with torch.no_grad():
        medians = interleaved_medians(runners, rounds)
    base = medians["kiln C dense"]
    shape = "3 x conv3x3 128ch 28x28" if name == "cnn" else "->".join(map(str, [*ROWS[name], ROWS[name][0]]))
    print(f"\n{name} {shape}, batch {batch}, {threads} thread(s), {cpu_name()}")
    print(f"{'peer':<32} {'ms':>9} {'speedup vs kiln dense':>22} {'vs torch sparse':>16}")
    for peer, seconds in medians.items():
        torch_peer = peer.replace("kiln C", "torch CPU sparse")
        versus = f"{medians[torch_peer] / seconds:16.2f}" if peer.startswith("kiln C ") and torch_peer in medians \
            else f"{'':>16}"
        print(f"{peer:<32} {seconds * 1e3:9.3f} {base / seconds:22.2f} {versus}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args()
    for name in args.rows.split(","):
        for batch in map(int, args.batches.split(",")):
            run_row(name, batch, args.threads, args.rounds)


if __name__ == "__main__":
    main()
