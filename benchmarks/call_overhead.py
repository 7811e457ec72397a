"""What one call of a compiled model costs beyond its kernels, from Python: a package that computes one relu of 16
floats (a static shape, and a dynamic batch), called as users call it, against onnxruntime's session.run on the same
graph (one thread each) and torch eager's relu. On a small model this is a real share of the latency (the tiny
ResNet of the Hugging Face sweep spends 70 us in kernels per call).

Run: .venv/bin/python benchmarks/call_overhead.py [--rounds N]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kiln  # noqa: E402
from kiln.ir.program import GraphBuilder  # noqa: E402
from kiln.ir.registry import ops  # noqa: E402
from kiln.ir.types import TensorType  # noqa: E402

from timing import interleaved_medians  # noqa: E402  (benchmarks/timing.py: scripts run from their folder)


def relu_program(dynamic: bool) -> kiln.ExportedProgram:
    builder = GraphBuilder()
    batch = builder.shape_env.create_symbol(1, name="batch", min=1, max=64) if dynamic else 1
    x = builder.add_input("x", TensorType.of([batch, 16], kiln.float32))
    with builder:
        y = ops.aten.relu.default(x)
    return builder.build([y])


def peers(program: kiln.ExportedProgram, folder: Path, x: np.ndarray) -> dict:
    import onnxruntime
    compiled = kiln.compile(program, output=folder / "package", num_threads=1)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads, options.log_severity_level = 1, 1, 3
    session = onnxruntime.InferenceSession(kiln.onnx.export(program).model_proto.SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    runners = {"kiln C": lambda: compiled(x), "onnxruntime": lambda: session.run(None, {name: x})}
    try:
        import torch
        torch.set_num_threads(1)
        tensor = torch.from_numpy(x)
        runners["torch eager"] = lambda: torch.relu(tensor)
    except ImportError:
        pass
    np.testing.assert_array_equal(compiled(x), np.maximum(x, 0))
    return runners


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    x = np.random.default_rng(0).standard_normal((1, 16)).astype(np.float32)
    print("| shape | " + " | ".join(["kiln C us", "onnxruntime us", "torch eager us", "kiln / ORT"]) + " |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for dynamic in (False, True):
            runners = peers(relu_program(dynamic), Path(folder) / str(dynamic), x)
            medians = interleaved_medians(runners, args.rounds)
            cells = [f"{medians[name] * 1e6:.2f}" if name in medians else "-"
                     for name in ("kiln C", "onnxruntime", "torch eager")]
            ratio = medians["kiln C"] / medians["onnxruntime"]
            print(f"| {'[batch, 16]' if dynamic else '[1, 16]'} | " + " | ".join(cells) + f" | {ratio:.2f} |")


if __name__ == "__main__":
    main()
