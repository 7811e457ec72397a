"""Recurrent models with a dynamic sequence length: kiln's compiled C loop kernels against their peers.

Usage: python benchmarks/loops.py [--threads N] [--rounds R] [--lengths 32,512] [--rows tagger,lstm256]
Rows: the zoo's LSTM tagger (embedding, 2-layer bidirectional LSTM of hidden 24, a linear tagger) and a 2-layer
LSTM of hidden 256 (input 256), both at batch 1. Each is exported by kiln ONCE with a dynamic sequence dim (the
time loops are `kiln.scan`s), and that one program is compiled to C and exported to ONNX for every length (each
scan is ONNX's LSTM op, see kiln/codegen/onnx/recurrent.py).
Peers: kiln C; onnxruntime on kiln's ONNX; onnxruntime on torch.onnx's export (its LSTM op, exported at each fixed
length, which is what torch.onnx gives); torch eager. Every peer runs with the same thread count, timed in
interleaved rounds (medians). Each output is checked against torch eager, so a fast wrong answer shows.
Columns: median ms per peer and kiln C / onnxruntime (kiln's ONNX) and kiln C / onnxruntime (torch.onnx); "C unfused"
is kiln C with each LSTM step as a GEMM and two pointwise kernels (kiln/codegen/c/recurrent.py's FUSE off), and
"fused/unfused" the fused step's time over it.
"""

from __future__ import annotations

import argparse
import io
import os
import tempfile
import warnings
from pathlib import Path

import numpy as np

import kiln
import kiln.models
import kiln.onnx
import kiln.runtime
from kiln.codegen.c import recurrent
from timing import interleaved_medians  # benchmarks/timing.py (scripts run from their folder)


def _rows(names: list[str]):
    import torch
    for name in names:
        if name == "tagger":
            kiln.manual_seed(0)
            model = kiln.models.LSTMTagger().eval()
            twin = kiln.models.torch_twin("kiln.models.lstm").LSTMTagger().eval()
            twin.load_state_dict({k: torch.from_numpy(np.asarray(v.numpy()).copy())
                                  for k, v in model.state_dict().items()})

            def make(length: int, rng: np.random.Generator) -> np.ndarray:
                return rng.integers(0, 50, (1, length)).astype(np.int64)
            yield "tagger", model, twin, make, {"tokens": {1: kiln.Dim("seq")}}
        elif name == "lstm256":
            torch.manual_seed(0)
            twin = torch.nn.LSTM(256, 256, num_layers=2).eval()
            model = kiln.nn.LSTM(256, 256, num_layers=2).eval()
            model.load_state_dict({k: kiln.Tensor(v.detach().numpy()) for k, v in twin.state_dict().items()})

            def make(length: int, rng: np.random.Generator) -> np.ndarray:
                return rng.standard_normal((length, 1, 256)).astype(np.float32)
            yield "lstm256", model, twin, make, {"input": {0: kiln.Dim("seq")}}
        else:
            raise SystemExit(f"unknown row {name}: choose tagger, lstm256")


def _first(value):
    return value[0] if isinstance(value, (tuple, list)) else value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--lengths", default="32,512")
    parser.add_argument("--rows", default="tagger,lstm256")
    args = parser.parse_args()
    import onnxruntime
    import torch
    torch.set_num_threads(args.threads)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = args.threads, 1
    work = Path(tempfile.mkdtemp(prefix="kiln_loops_"))
    lengths = [int(n) for n in args.lengths.split(",")]
    print(f"threads={args.threads}  capability={os.environ.get('KILN_CPU_CAPABILITY', 'native')}")
    header = (f"{'row':<9}{'seq':>5}  {'kiln C':>9}{'C unfused':>11}{'ort(kiln)':>11}{'ort(torch)':>11}{'torch':>9}"
              f"  {'C/ort(kiln)':>12}{'C/ort(torch)':>13}{'fused/unfused':>14}")
    print(header)
    for name, model, twin, make, dynamic in _rows(args.rows.split(",")):
        rng = np.random.default_rng(0)
        program = kiln.export(model, (kiln.Tensor(make(5, rng)),), dynamic_shapes=dynamic)
        compiled = kiln.compile(program, output=work / f"{name}_c", num_threads=args.threads)
        recurrent.FUSE = False
        unfused = kiln.compile(program, output=work / f"{name}_c_unfused", num_threads=args.threads)
        recurrent.FUSE = True
        onnx_path = work / f"{name}.onnx"
        kiln.onnx.export(program, f=onnx_path)
        kiln_session = onnxruntime.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
        kiln_input = kiln_session.get_inputs()[0].name
        for length in lengths:
            x = make(length, rng)
            with torch.no_grad():
                expected = _first(twin(torch.from_numpy(x))).numpy()
            buffer = io.BytesIO()
            with warnings.catch_warnings(), torch.no_grad():
                warnings.simplefilter("ignore")
                torch.onnx.export(twin, (torch.from_numpy(x),), buffer, dynamo=False)
            torch_session = onnxruntime.InferenceSession(buffer.getvalue(), options,
                                                         providers=["CPUExecutionProvider"])
            torch_input = torch_session.get_inputs()[0].name

            def run_torch() -> np.ndarray:
                with torch.no_grad():
                    return _first(twin(torch.from_numpy(x))).numpy()
            runners = {
                "kiln C": lambda: _first(compiled(x)),
                "C unfused": lambda: _first(unfused(x)),
                "ort(kiln)": lambda: kiln_session.run(None, {kiln_input: x})[0],
                "ort(torch)": lambda: torch_session.run(None, {torch_input: x})[0],
                "torch": run_torch,
            }
            for peer, run in runners.items():
                np.testing.assert_allclose(np.asarray(run()), expected, rtol=1e-4, atol=1e-4,
                                           err_msg=f"{peer} differs from torch eager on {name} at seq {length}")
            medians = interleaved_medians(runners, args.rounds)
            ms = {peer: seconds * 1e3 for peer, seconds in medians.items()}
            print(f"{name:<9}{length:>5}  {ms['kiln C']:>9.3f}{ms['C unfused']:>11.3f}{ms['ort(kiln)']:>11.3f}"
                  f"{ms['ort(torch)']:>11.3f}{ms['torch']:>9.3f}  {ms['kiln C'] / ms['ort(kiln)']:>12.2f}"
                  f"{ms['kiln C'] / ms['ort(torch)']:>13.2f}{ms['kiln C'] / ms['C unfused']:>14.2f}", flush=True)


if __name__ == "__main__":
    main()
