"""ResNet-18's convolution shapes one at a time: kiln's C backend against onnxruntime, side by side in one process.

Usage: python benchmarks/conv_shapes.py [--threads T] [--repeat R]

Each row is one torch `Conv2d` + `ReLU` at batch 1 (the stem, then each stage's 3x3 convolutions and its stride-2
entry), compiled by `kiln.compile` and exported by `torch.onnx.export`. Columns: median latency per peer (ms),
GFLOP/s, kiln / onnxruntime, the path kiln's C code took (`pixel rows`: output pixels as the GEMM's rows and the
weights as B panels, packing.conv_weight_layout; else output channels as the rows), and kiln's max abs
difference from torch eager. Rows of the whole model mix these with memory effects (45 MB of weights stream
through every forward); this table isolates the kernels.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from c_realistic import cpu_name  # noqa: E402  (benchmarks/c_realistic.py)
from onnx_quality import export_torch, ort_feeds, ort_session  # noqa: E402
from timing import interleaved_medians  # noqa: E402

# (input channels, output channels, kernel, stride, padding, image size)
SHAPES = [(3, 64, 7, 2, 3, 224), (64, 64, 3, 1, 1, 56), (64, 128, 3, 2, 1, 56), (128, 128, 3, 1, 1, 28),
          (128, 256, 3, 2, 1, 28), (256, 256, 3, 1, 1, 14), (256, 512, 3, 2, 1, 14), (512, 512, 3, 1, 1, 7)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=15)
    options = parser.parse_args()
    logging.disable(logging.WARNING)
    import torch

    import kiln
    from kiln.codegen.c import get_cpu_capability
    torch.set_num_threads(options.threads)
    print(f"{cpu_name()}, capability {get_cpu_capability()}, {options.threads} thread(s)")
    print(f"{'convolution':<26} {'ORT ms':>8} {'kiln ms':>8} {'ORT GF/s':>9} {'kiln GF/s':>10} {'kiln/ORT':>9} "
          f"{'kiln path':>11} {'max diff':>9}")
    for cin, cout, k, stride, padding, size in SHAPES:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Conv2d(cin, cout, k, stride, padding), torch.nn.ReLU()).eval()
        args = (torch.randn(1, cin, size, size),)
        with torch.no_grad():
            expected = model(*args).numpy()
        x = args[0].numpy()
        with tempfile.TemporaryDirectory() as folder:
            compiled = kiln.compile(kiln.from_torch(model, args), output=Path(folder) / "conv",
                                    num_threads=options.threads)
            path = "pixel rows" if "packed_unit" in (Path(folder) / "conv" / "model.c").read_text() else "channels"
            session = ort_session(export_torch(torch, model, args, {}), options.threads)
            feeds = ort_feeds(session, args)
            medians = interleaved_medians({"kiln": lambda: compiled(x), "ort": lambda: session.run(None, feeds)},
                                          options.repeat)
            difference = float(np.max(np.abs(np.asarray(compiled(x), np.float64) - expected)))
        out = (size + 2 * padding - k) // stride + 1
        flops = 2 * cout * cin * k * k * out * out
        kiln_s, ort_s = medians["kiln"], medians["ort"]
        print(f"{f'{cin}->{cout} {k}x{k} s{stride} at {size}x{size}':<26} {ort_s * 1e3:>8.3f} {kiln_s * 1e3:>8.3f} "
              f"{flops / ort_s / 1e9:>9.0f} {flops / kiln_s / 1e9:>10.0f} {kiln_s / ort_s:>9.2f} {path:>11} "
              f"{difference:>9.1e}", flush=True)


if __name__ == "__main__":
    main()
