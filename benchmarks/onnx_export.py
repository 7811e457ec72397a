"""Export time to ONNX: kiln (trace + kiln.onnx.export) vs torch.onnx.export(..., dynamo=True) on the zoo models.

Usage: python benchmarks/onnx_export.py [--models mlp,cnn,...] [--repeat R] [--large]
The torch twins run the same model sources with `kiln` swapped for `torch` (as tests/frontend/test_models.py does),
with the same dynamic dims. Model construction is not timed. Reports medians over R runs and the
torch / kiln ratio (> 1: kiln is faster).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import warnings

import kiln
from timing import median_seconds  # benchmarks/timing.py (scripts run from their folder)
import kiln.models
import kiln.onnx

ZOO_CLASSES = {"mlp": ("kiln.models.mlp", "MLP", {}), "cnn": ("kiln.models.cnn", "ResNet", {}),
               "transformer": ("kiln.models.transformer", "TransformerClassifier", {}),
               "gpt": ("kiln.models.gpt", "GPT", {}), "lstm": ("kiln.models.lstm", "LSTMTagger", {}),
               "gpt2_small": ("kiln.models.gpt", "GPT", {"config": "GPT2_SMALL"})}


def kiln_case(name: str):
    """(export function, its arguments): the model is built outside the timed region."""
    entry = kiln.models.get(name)
    return lambda: kiln.onnx.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes)


def torch_case(name: str, torch):  # noqa: ANN001
    module_name, class_name, kwargs = ZOO_CLASSES[name]
    twin = kiln.models.torch_twin(module_name)
    kwargs = {k: getattr(twin, v) for k, v in kwargs.items()}
    torch.manual_seed(0)
    model = getattr(twin, class_name)(**kwargs).eval()
    entry = kiln.models.get(name)
    args = tuple(torch.from_numpy(a.numpy().copy()) for a in entry.args)
    dynamic = {arg: {axis: torch.export.Dim(dim.name, max=int(dim.max)) for axis, dim in spec.items()}
               for arg, spec in entry.dynamic_shapes.items() if spec}

    def export() -> None:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            torch.onnx.export(model, args, dynamo=True, dynamic_shapes=dynamic, verbose=False)
    return export


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(kiln.models.MODELS))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--large", action="store_true", help="also gpt2_small (124M parameters)")
    options = parser.parse_args()
    logging.disable(logging.WARNING)  # torch.onnx logs a warning per missing optional package
    names = options.models.split(",") + (["gpt2_small"] if options.large else [])
    try:
        import torch
    except ImportError:
        torch = None
        print("torch is not installed: kiln timings only")
    print(f"{'model':<12} {'kiln (s)':>9} {'torch dynamo (s)':>17} {'torch/kiln':>11}")
    for name in names:
        export = kiln_case(name)
        export()  # warm caches (meta rules, dialect classes); torch's first run is likewise untimed
        kiln_time = median_seconds(export, options.repeat)
        if torch is None:
            print(f"{name:<12} {kiln_time:>9.3f}")
            continue
        export = torch_case(name, torch)
        export()
        torch_time = median_seconds(export, options.repeat)
        print(f"{name:<12} {kiln_time:>9.3f} {torch_time:>17.3f} {torch_time / kiln_time:>10.1f}x")


if __name__ == "__main__":
    main()
