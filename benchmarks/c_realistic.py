"""kiln's C backend at realistic sizes, on torch modules, against onnxruntime, torch eager and torch.compile.

Usage: python benchmarks/c_realistic.py [--rows mlp,cnn_b1,...] [--threads T] [--repeat R] [--no-torch-compile]
                                       [--plot PATH]

Each row is one torch module. kiln: `kiln.from_torch` then `kiln.compile` (compile time reported). onnxruntime:
`torch.onnx.export(dynamo=True)`, default graph optimizations. All peers run with T threads (default 2), side by
side in one process, medians of interleaved rounds. Columns: latency per peer (ms), kiln / onnxruntime, kiln's
GFLOP/s (matmul and convolution FLOPs of the program) and its % of this machine's fp32 GEMM peak (numpy's 2048^3
matmul with T BLAS threads, the best of several, re-measured before every row: the highest so far is the peak),
onnxruntime's % of the same peak (where that passes 80% on a GEMM-bound row, kiln/ORT <= 0.8 would need kiln
above the peak), compile seconds, kiln's max abs difference from torch eager, and one forward on kiln's reference
interpreter (median of 3). Then a log-scale bar chart of the latencies (default
benchmarks/results/c_realistic_<capability>_<T>t.png). Run it also with `KILN_CPU_CAPABILITY=AVX2` to measure the
AVX2 code on an AVX-512 machine, and with --threads 1.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for tests.models.hf_zoo

from c_backend import count_flops, gemm_peak_gflops, plot_latencies  # noqa: E402  (benchmarks/c_backend.py)
from onnx_quality import ROWS as ONNX_ROWS  # noqa: E402  (the same torch modules as the ONNX comparison)
from onnx_quality import build_row, export_torch, ort_feeds, ort_session, torch_dynamic_shapes  # noqa: E402
from timing import interleaved_medians  # noqa: E402


def _resnet18(torch: Any) -> tuple[Any, tuple, dict]:
    """ResNet-18's shape (torchvision's layout, written out: the PyPI torchvision wheel's C ops do not load here)."""
    nn = torch.nn

    class Basic(nn.Module):
        def __init__(self, inputs: int, width: int, stride: int):
            super().__init__()
            self.conv1 = nn.Conv2d(inputs, width, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            self.conv2 = nn.Conv2d(width, width, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(width)
            self.down = None if stride == 1 and inputs == width else nn.Sequential(
                nn.Conv2d(inputs, width, 1, stride, bias=False), nn.BatchNorm2d(width))

        def forward(self, x: Any) -> Any:
            out = torch.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return torch.relu(out + (x if self.down is None else self.down(x)))

    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    inputs = 64
    for width, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Basic(inputs, width, stride), Basic(width, width, 1)]
        inputs = width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 1000)]
    return nn.Sequential(*layers), (torch.randn(1, 3, 224, 224),), {}


def _he_initialized(torch: Any, model: Any) -> Any:
    """`model` with He-initialized convolutions and linear layers and unit batch norms, so activations keep their
    scale through the network: as transformers initializes them they shrink into subnormals by the last stage
    (EfficientNet's to 1e-42), and every peer then measures subnormal arithmetic."""
    for module in model.modules():
        if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)):
            torch.nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
        elif isinstance(module, torch.nn.BatchNorm2d):
            module.reset_parameters()
    return model


def _yolov8n_backbone(torch: Any) -> tuple[Any, tuple, dict]:
    """YOLOv8n's backbone at 640x640 (Ultralytics' layout at width 0.25 and depth 0.33, written out): convolutions
    with batch norm and SiLU, C2f blocks (a convolution's output in two chunks, bottlenecks on the second, all of them
    cat) and SPPF (three chained 5x5 max pools, cat)."""
    nn = torch.nn

    class Conv(nn.Sequential):
        def __init__(self, inputs: int, outputs: int, kernel: int = 1, stride: int = 1):
            super().__init__(nn.Conv2d(inputs, outputs, kernel, stride, kernel // 2, bias=False),
                             nn.BatchNorm2d(outputs), nn.SiLU())

    class Bottleneck(nn.Module):
        def __init__(self, width: int):
            super().__init__()
            self.cv1, self.cv2 = Conv(width, width, 3), Conv(width, width, 3)

        def forward(self, x: Any) -> Any:
            return x + self.cv2(self.cv1(x))

    class C2f(nn.Module):
        def __init__(self, inputs: int, outputs: int, blocks: int):
            super().__init__()
            half = outputs // 2
            self.cv1, self.cv2 = Conv(inputs, 2 * half), Conv((2 + blocks) * half, outputs)
            self.m = nn.ModuleList(Bottleneck(half) for _ in range(blocks))

        def forward(self, x: Any) -> Any:
            parts = list(self.cv1(x).chunk(2, 1))
            parts.extend(block(parts[-1]) for block in self.m)
            return self.cv2(torch.cat(parts, 1))

    class SPPF(nn.Module):
        def __init__(self, inputs: int, outputs: int):
            super().__init__()
            self.cv1, self.cv2 = Conv(inputs, inputs // 2), Conv(inputs // 2 * 4, outputs)
            self.m = nn.MaxPool2d(5, 1, 2)

        def forward(self, x: Any) -> Any:
            parts = [self.cv1(x)]
            parts.extend(self.m(parts[-1]) for _ in range(3))
            return self.cv2(torch.cat(parts, 1))

    model = nn.Sequential(Conv(3, 16, 3, 2), Conv(16, 32, 3, 2), C2f(32, 32, 1), Conv(32, 64, 3, 2), C2f(64, 64, 2),
                          Conv(64, 128, 3, 2), C2f(128, 128, 2), Conv(128, 256, 3, 2), C2f(256, 256, 1),
                          SPPF(256, 256))
    return _he_initialized(torch, model).eval(), (torch.randn(1, 3, 640, 640),), {}


def _gpt2_small(torch: Any) -> tuple[Any, tuple, dict]:
    import transformers
    from onnx_quality import _Positional
    config = transformers.GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
    model = transformers.GPT2LMHeadModel(config).eval()
    return _Positional(model, ["input_ids"]), (torch.randint(0, 50257, (1, 128)),), {}


def _mixtral_small(torch: Any) -> tuple[Any, tuple, dict]:
    """A two-layer Mixtral at hidden 512, 8 experts of 1024, two per token, 64 tokens: transformers' batched_mm
    experts (the form that exports) gather each token's expert weights and multiply them by its one column."""
    import transformers
    from onnx_quality import _Positional
    config = transformers.MixtralConfig(num_hidden_layers=2, hidden_size=512, num_attention_heads=8,
                                        num_key_value_heads=4, intermediate_size=1024, vocab_size=1000,
                                        max_position_embeddings=256, use_cache=False, num_local_experts=8,
                                        num_experts_per_tok=2, experts_implementation="batched_mm")
    model = transformers.MixtralForCausalLM(config).eval()
    return _Positional(model, ["input_ids"]), (torch.randint(0, 1000, (1, 64)),), {}


def _hf_vision(model_class: str, config_class: str, **options: Any) -> Callable[[Any], tuple[Any, tuple, dict]]:
    """A transformers vision backbone at its published size (random weights, nothing downloaded), one 224x224
    image: its depthwise convolutions are most of its time."""
    def build(torch: Any) -> tuple[Any, tuple, dict]:
        import transformers
        from onnx_quality import _Positional
        model = getattr(transformers, model_class)(getattr(transformers, config_class)(**options)).eval()
        return _Positional(_he_initialized(torch, model), ["pixel_values"]), (torch.randn(1, 3, 224, 224),), {}
    return build


ROWS: dict[str, Callable[[Any], tuple[Any, tuple, dict]]] = {
    "mlp": ONNX_ROWS["mlp"], "cnn_b1": ONNX_ROWS["cnn_b1"], "cnn_b16": ONNX_ROWS["cnn_b16"],
    "transformer": ONNX_ROWS["transformer"], "gpt2_small": _gpt2_small, "resnet18": _resnet18,
    "yolov8n_backbone": _yolov8n_backbone,
    # MobileNetV2 1.0 and EfficientNet-B0 (3x3 and 5x5 depthwise), ConvNeXt-T (7x7 depthwise)
    "mobilenet_v2": _hf_vision("MobileNetV2Model", "MobileNetV2Config"),
    "efficientnet_b0": _hf_vision("EfficientNetModel", "EfficientNetConfig", width_coefficient=1.0,
                                  depth_coefficient=1.0, image_size=224, hidden_dim=1280),
    "convnext_tiny": _hf_vision("ConvNextModel", "ConvNextConfig"),
    "mixtral_small": _mixtral_small, "wav2vec2": ONNX_ROWS["wav2vec2"],
}


def _onnxruntime(torch: Any, model: Any, args: tuple, threads: int) -> Callable[[], Any]:
    session = ort_session(export_torch(torch, model, args, {}), threads)
    feeds = ort_feeds(session, args)
    return lambda: session.run(None, feeds)[0]


def cpu_name() -> str:
    """The CPU's model name, as lscpu prints it (every figure is quoted beside the CPU it was measured on), and
    what benchmarks/as_avx2_cpu.py hid from it."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            name = next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
    except (OSError, StopIteration):
        import platform
        name = platform.processor() or "unknown CPU"
    note = os.environ.get("KILN_BENCHMARK_CPU_NOTE")
    return f"{name}, {note}" if note else name


def _seconds(run: Callable[[], Any]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--no-torch-compile", action="store_true")
    parser.add_argument("--plot", type=Path, default=None, help="PNG path for the bar chart")
    options = parser.parse_args()
    logging.disable(logging.WARNING)
    import torch

    import kiln
    from kiln.codegen.c import get_cpu_capability, supported_capabilities
    torch.set_num_threads(options.threads)
    os.environ["OMP_NUM_THREADS"] = str(options.threads)
    peak = gemm_peak_gflops(options.threads)
    print(f"{cpu_name()}, capability {get_cpu_capability()}, {options.threads} threads, numpy fp32 GEMM peak "
          f"proxy {peak:.0f} GFLOP/s at start")
    if get_cpu_capability() != supported_capabilities()[-1]:
        print(f"note: only kiln and the peak proxy are held to {get_cpu_capability()}; onnxruntime and torch use the "
              f"CPU's best ({supported_capabilities()[-1]}), so kiln/ORT overstates the gap a "
              f"{get_cpu_capability()}-only CPU would show")
    peers = ["onnxruntime", "kiln C", "torch eager"] + ([] if options.no_torch_compile else ["torch.compile"])
    print(f"{'row':<12} " + " ".join(f"{p + ' ms':>15}" for p in peers) +
          f" {'kiln/ORT':>9} {'GFLOP/s':>8} {'% peak':>7} {'ORT % peak':>11} {'compile s':>10} {'max diff':>9}"
          f" {'interpreter ms':>15}")
    names, latencies, ratios = [], [], []
    for name in options.rows.split(","):
        peak = max(peak, gemm_peak_gflops(options.threads))
        model, args, dims, expected = build_row(torch, name, ROWS)
        numpy_args = [a.numpy() for a in args]
        program = kiln.from_torch(model, args, dynamic_shapes=torch_dynamic_shapes(torch, args, dims))
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as folder:
            compiled = kiln.compile(program, output=Path(folder) / "model", num_threads=options.threads)
            compile_seconds = time.perf_counter() - start
            runners: dict[str, Callable[[], Any]] = {  # kiln first: the timed batches are sized on it
                "kiln C": lambda: compiled(*numpy_args),
                "onnxruntime": _onnxruntime(torch, model, args, options.threads),
            }

            def eager() -> Any:
                with torch.inference_mode():
                    return model(*args)
            runners["torch eager"] = eager
            if not options.no_torch_compile:
                compiled_torch = torch.compile(model)

                def torch_compiled() -> Any:
                    with torch.inference_mode():
                        return compiled_torch(*args)
                runners["torch.compile"] = torch_compiled
            got = np.asarray(compiled(*numpy_args))
            got = got[0] if got.ndim > expected.ndim else got
            difference = float(np.max(np.abs(got.astype(np.float64) - expected)))
            medians = {peer: seconds * 1e3 for peer, seconds in
                       interleaved_medians(runners, options.repeat, round_seconds=0.05).items()}
        interpreter = statistics.median(_seconds(lambda: program(*numpy_args)) for _ in range(3)) * 1e3
        flops = count_flops(program.run_decompositions(), numpy_args)
        gflops, ort_gflops = (flops / (medians[p] / 1e3) / 1e9 for p in ("kiln C", "onnxruntime"))
        print(f"{name:<12} " + " ".join(f"{medians[p]:>15.3f}" for p in peers) +
              f" {medians['kiln C'] / medians['onnxruntime']:>9.2f} {gflops:>8.1f} {100 * gflops / peak:>6.0f}%"
              f" {100 * ort_gflops / peak:>10.0f}% {compile_seconds:>10.2f} {difference:>9.1e} {interpreter:>15.1f}",
              flush=True)
        names.append(name)
        latencies.append({peer: medians[peer] / 1e3 for peer in peers})
        ratios.append(medians["kiln C"] / medians["onnxruntime"])
    print(f"peak proxy at the end: {peak:.0f} GFLOP/s")
    plot_path = options.plot or (Path(__file__).resolve().parent / "results" /
                                 f"c_realistic_{get_cpu_capability()}_{options.threads}t.png")
    plot_latencies(names, latencies, ratios, f"{cpu_name()}, {get_cpu_capability()}, {options.threads} "
                   f"thread{'s' if options.threads != 1 else ''}: latency per peer", plot_path)


if __name__ == "__main__":
    main()
