"""The ONNX files kiln writes against torch.onnx's, for the same torch module, side by side in one process.

Usage: python benchmarks/onnx_quality.py [--rows mlp,cnn_b1,...] [--repeat R] [--threads T]

For each row both exporters take one torch module: kiln through `kiln.from_torch` then `kiln.onnx.export`,
torch through `torch.onnx.export(dynamo=True)`, with the same dynamic dims. Both files run in onnxruntime with
default graph optimizations and T intra-op threads (default 2); latencies are interleaved medians over R rounds.
Reports node count, file size, export time, onnxruntime latency, kiln / torch latency ratio (< 1: kiln's file
is faster) and each file's max abs difference from torch eager.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for tests.models.hf_zoo

from timing import interleaved_medians  # noqa: E402  (benchmarks/timing.py)


def _mlp(torch: Any) -> tuple[Any, tuple, dict]:
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024))
    return model, (torch.randn(32, 1024),), {"batch": 0}


def _cnn(batch: int) -> Callable[[Any], tuple[Any, tuple, dict]]:
    def build(torch: Any) -> tuple[Any, tuple, dict]:
        layers, channels = [], 3
        for width in (32, 64, 128, 256):
            layers += [torch.nn.Conv2d(channels, width, 3, padding=1), torch.nn.BatchNorm2d(width), torch.nn.ReLU(),
                       torch.nn.MaxPool2d(2)]
            channels = width
        layers += [torch.nn.Flatten(), torch.nn.Linear(256 * 4 * 4, 10)]
        model = torch.nn.Sequential(*layers)
        for module in model.modules():  # trained-looking statistics, so folding them is visible in the numbers
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 2.0)
        # torch.export specializes a size-1 dim, so batch 1 is a static export for both
        return model, (torch.randn(batch, 3, 64, 64),), {"batch": 0} if batch > 1 else {}
    return build


def _transformer(torch: Any) -> tuple[Any, tuple, dict]:
    layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 6, enable_nested_tensor=False)
    return model, (torch.randn(1, 128, 512),), {}


def _zoo(name: str) -> Callable[[Any], tuple[Any, tuple, dict]]:
    def build(torch: Any) -> tuple[Any, tuple, dict]:
        import kiln.models
        from onnx_export import ZOO_CLASSES  # benchmarks/onnx_export.py: the torch twins of the zoo
        module_name, class_name, kwargs = ZOO_CLASSES[name]
        twin = kiln.models.torch_twin(module_name)
        torch.manual_seed(0)
        model = getattr(twin, class_name)(**{k: getattr(twin, v) for k, v in kwargs.items()})
        entry = kiln.models.get(name)
        args = tuple(torch.from_numpy(a.numpy().copy()) for a in entry.args)
        return model, args, {}
    return build


def _hf(name: str) -> Callable[[Any], tuple[Any, tuple, dict]]:
    def build(torch: Any) -> tuple[Any, tuple, dict]:
        from tests.models.hf_zoo import ARCHITECTURES
        architecture = ARCHITECTURES[name]
        inputs = architecture.make_inputs(2, 64)
        return _Positional(architecture.model(), list(inputs)), tuple(inputs.values()), {}
    return build


def _wav2vec2(torch: Any) -> tuple[Any, tuple, Any]:
    """wav2vec2-base's convolutional feature encoder (seven convolutions of 512 channels with layer norms and
    GELUs) and positional convolution, with two of its twelve transformer layers, on one second of 16 kHz audio.
    The waveform's length is dynamic, as a speech model's is: the convolutions index input planes sized at run time."""
    import transformers
    config = transformers.Wav2Vec2Config(num_hidden_layers=2, feat_extract_norm="layer", do_stable_layer_norm=True)
    model = transformers.Wav2Vec2Model(config).eval()
    # (torch proves the encoder's length guards only for whole multiples of its total stride, 320 samples; the
    # wrapper takes *tensors, hence the nesting)
    samples = 320 * torch.export.Dim("frames", min=2, max=500)
    return _Positional(model, ["input_values"]), (torch.randn(1, 16000),), (({1: samples},),)


class _Positional:
    """A Hugging Face model called with positional tensors (both exporters then name the same inputs)."""

    def __new__(cls, model: Any, keys: list[str]) -> Any:
        import torch

        class Wrapper(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, *tensors: Any) -> Any:
                output = self.model(**dict(zip(keys, tensors)))
                return output[0]  # logits / last_hidden_state
        return Wrapper().eval()


ROWS: dict[str, Callable[[Any], tuple[Any, tuple, dict]]] = {
    "mlp": _mlp, "cnn_b1": _cnn(1), "cnn_b16": _cnn(16), "transformer": _transformer,
    "zoo_mlp": _zoo("mlp"), "zoo_cnn": _zoo("cnn"), "zoo_transformer": _zoo("transformer"), "zoo_gpt": _zoo("gpt"),
    "gpt2": _hf("gpt2"), "bert": _hf("bert"), "wav2vec2": _wav2vec2,
}


def torch_dynamic_shapes(torch: Any, args: tuple, dims: dict | tuple) -> tuple | None:
    """The first input's named dims, e.g. {"batch": 0}, the other inputs static; or a row's own dynamic shapes (a
    tuple, as torch.export takes them: wav2vec2's length is a multiple of a Dim)."""
    if not dims or isinstance(dims, tuple):
        return dims or None
    return ({axis: torch.export.Dim(name, max=256) for name, axis in dims.items()},) + (None,) * (len(args) - 1)


def _export_kiln(torch: Any, model: Any, args: tuple, dims: dict) -> bytes:
    import kiln
    dynamic = torch_dynamic_shapes(torch, args, dims)
    program = kiln.from_torch(model, args, dynamic_shapes=dynamic)
    return kiln.onnx.export(program).model_proto.SerializeToString()


def export_torch(torch: Any, model: Any, args: tuple, dims: dict) -> bytes:
    dynamic = torch_dynamic_shapes(torch, args, dims)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        onnx_program = torch.onnx.export(model, args, dynamo=True, dynamic_shapes=dynamic, verbose=False)
    return onnx_program.model_proto.SerializeToString()


def ort_session(data: bytes, threads: int, config: dict[str, str] | None = None) -> Any:
    """An onnxruntime CPU session on `threads` threads; `config`: session config entries."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    for key, value in (config or {}).items():
        options.add_session_config_entry(key, value)
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def ort_feeds(session: Any, args: tuple) -> dict[str, np.ndarray]:
    return {i.name: a.numpy() for i, a in zip(session.get_inputs(), args)}


def _node_count(data: bytes) -> int:
    import onnx
    model = onnx.load_from_string(data)
    return len(model.graph.node) + sum(len(f.node) for f in model.functions)


def build_row(torch: Any, name: str, rows: dict[str, Callable[[Any], tuple[Any, tuple, dict]]] | None = None
              ) -> tuple[Any, tuple, dict, np.ndarray]:
    """(model in eval mode, args, dynamic dims, torch eager's first output) of a row, seeded."""
    torch.manual_seed(0)
    model, args, dims = (rows or ROWS)[name](torch)
    model = model.eval()
    with torch.no_grad():
        expected = model(*args)
    return model, args, dims, (expected[0] if isinstance(expected, (tuple, list)) else expected).numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    options = parser.parse_args()
    logging.disable(logging.WARNING)  # torch.onnx logs a warning per missing optional package
    import torch
    torch.set_num_threads(options.threads)
    header = (f"{'row':<16} {'nodes t/k':>10} {'MB t/k':>12} {'export s t/k':>14} {'ORT ms torch':>13} "
              f"{'ORT ms kiln':>12} {'kiln/torch':>11} {'maxdiff t/k':>20}")
    print(header)
    for name in options.rows.split(","):
        model, args, dims, expected = build_row(torch, name)
        files, export_times = {}, {}
        for who, export in (("torch", export_torch), ("kiln", _export_kiln)):
            start = time.perf_counter()
            try:
                files[who] = export(torch, model, args, dims)
            except Exception as error:  # a row still reports the other exporter
                print(f"{name:<16} {who} export failed: {type(error).__name__}: {str(error).splitlines()[0][:150]}")
            export_times[who] = time.perf_counter() - start
        if len(files) < 2:
            continue
        sessions = {who: ort_session(data, options.threads) for who, data in files.items()}
        diffs = {}
        for who, session in sessions.items():
            got = session.run(None, ort_feeds(session, args))[0]
            diffs[who] = float(np.max(np.abs(got.astype(np.float64) - expected)))
        feeds = {who: ort_feeds(session, args) for who, session in sessions.items()}
        runners = {who: (lambda s=session, f=feeds[who]: s.run(None, f)) for who, session in sessions.items()}
        medians = {who: seconds * 1e3 for who, seconds in interleaved_medians(runners, options.repeat).items()}
        print(f"{name:<16} {_node_count(files['torch']):>4}/{_node_count(files['kiln']):<5} "
              f"{len(files['torch']) / 1e6:>5.1f}/{len(files['kiln']) / 1e6:<6.1f} "
              f"{export_times['torch']:>6.1f}/{export_times['kiln']:<7.2f} {medians['torch']:>13.3f} "
              f"{medians['kiln']:>12.3f} {medians['kiln'] / medians['torch']:>11.2f} "
              f"{diffs['torch']:>9.1e}/{diffs['kiln']:<9.1e}", flush=True)


if __name__ == "__main__":
    main()
