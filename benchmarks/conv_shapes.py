"""Convolution shapes one at a time: kiln's C backend against onnxruntime and torch eager, side by side in one process.

Usage: python benchmarks/conv_shapes.py [--shapes resnet18|depthwise] [--threads T] [--repeat R]

Each row is one torch `Conv2d` + `ReLU` at batch 1, compiled by `kiln.compile` and exported by `torch.onnx.export`.
`resnet18` (the default): ResNet-18's stem, then each stage's 3x3 convolutions and its stride-2 entry. `depthwise`:
the depthwise convolutions of MobileNetV2 (3x3 over 112x112 down to 7x7, stride 1 and 2), EfficientNet-B0 (5x5) and
ConvNeXt-T (7x7), which kiln runs as a stencil (conv._conv_depthwise). Columns: median latency per peer (ms),
GFLOP/s, kiln / onnxruntime, the path kiln's C code took (`pixel rows`: output pixels as the GEMM's rows and the
weights as B panels, packing.conv_weight_layout; `stencil`: depthwise; else output channels as the rows), and
kiln's max abs difference from torch eager. Rows of the whole model mix these with memory effects (45 MB of weights
stream through every ResNet-18 forward); this table isolates the kernels.
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

# (input channels, output channels, kernel, stride, padding, image size, groups)
SHAPES = {
    "resnet18": [(3, 64, 7, 2, 3, 224, 1), (64, 64, 3, 1, 1, 56, 1), (64, 128, 3, 2, 1, 56, 1),
                 (128, 128, 3, 1, 1, 28, 1), (128, 256, 3, 2, 1, 28, 1), (256, 256, 3, 1, 1, 14, 1),
                 (256, 512, 3, 2, 1, 14, 1), (512, 512, 3, 1, 1, 7, 1)],
    # MobileNetV2's pointwise (1x1) expansions and projections at its largest images: few input channels
    "pointwise": [(16, 96, 1, 1, 0, 112, 1), (32, 16, 1, 1, 0, 112, 1), (24, 144, 1, 1, 0, 56, 1),
                  (144, 24, 1, 1, 0, 56, 1), (32, 192, 1, 1, 0, 28, 1), (192, 32, 1, 1, 0, 28, 1)],
    "depthwise": [(32, 32, 3, 1, 1, 112, 32), (96, 96, 3, 2, 1, 112, 96), (144, 144, 3, 1, 1, 56, 144),
                  (192, 192, 3, 1, 1, 28, 192), (384, 384, 3, 1, 1, 14, 384), (960, 960, 3, 1, 1, 7, 960),
                  (240, 240, 5, 1, 2, 28, 240), (672, 672, 5, 2, 2, 14, 672), (96, 96, 7, 1, 3, 56, 96),
                  (384, 384, 7, 1, 3, 14, 384), (768, 768, 7, 1, 3, 7, 768)],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", choices=sorted(SHAPES), default="resnet18")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=15)
    options = parser.parse_args()
    logging.disable(logging.WARNING)
    import torch

    import kiln
    from kiln.codegen.c.conv import FLAT_MARK, ROWS_MARK
    from kiln.codegen.c import get_cpu_capability
    torch.set_num_threads(options.threads)
    print(f"{cpu_name()}, capability {get_cpu_capability()}, {options.threads} thread(s)")
    print(f"{'convolution':<30} {'ORT ms':>8} {'kiln ms':>8} {'torch ms':>9} {'ORT GF/s':>9} {'kiln GF/s':>10} "
          f"{'kiln/ORT':>9} {'kiln/torch':>11} {'kiln path':>11} {'max diff':>9}")
    for cin, cout, k, stride, padding, size, groups in SHAPES[options.shapes]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Conv2d(cin, cout, k, stride, padding, groups=groups),
                                    torch.nn.ReLU()).eval()
        args = (torch.randn(1, cin, size, size),)
        with torch.no_grad():
            expected = model(*args).numpy()
        x = args[0].numpy()
        with tempfile.TemporaryDirectory() as folder:
            compiled = kiln.compile(kiln.from_torch(model, args), output=Path(folder) / "conv",
                                    num_threads=options.threads)
            source = (Path(folder) / "conv" / "model.c").read_text()
            path = "stencil rows" if ROWS_MARK in source else "stencil flat" if FLAT_MARK in source \
                else "pixel rows" if "packed_unit" in source else "channels"
            session = ort_session(export_torch(torch, model, args, {}), options.threads)
            feeds = ort_feeds(session, args)
            with torch.no_grad():
                medians = interleaved_medians({"kiln": lambda: compiled(x), "ort": lambda: session.run(None, feeds),
                                               "torch": lambda: model(*args)}, options.repeat)
            difference = float(np.max(np.abs(np.asarray(compiled(x), np.float64) - expected)))
        out = (size + 2 * padding - k) // stride + 1
        flops = 2 * cout * (cin // groups) * k * k * out * out
        kiln_s, ort_s, torch_s = medians["kiln"], medians["ort"], medians["torch"]
        name = f"{cin}->{cout} {k}x{k} s{stride} at {size}x{size}" + (" dw" if groups > 1 else "")
        print(f"{name:<30} {ort_s * 1e3:>8.3f} {kiln_s * 1e3:>8.3f} {torch_s * 1e3:>9.3f} {flops / ort_s / 1e9:>9.1f} "
              f"{flops / kiln_s / 1e9:>10.1f} {kiln_s / ort_s:>9.2f} {kiln_s / torch_s:>11.2f} {path:>11} "
              f"{difference:>9.1e}", flush=True)


if __name__ == "__main__":
    main()
