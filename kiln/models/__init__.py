"""kiln.models: a small bundled model zoo used by the demo, the tests and the benchmarks.

Each entry builds a model (seeded, eval mode), example inputs and the dynamic shapes it exports with.
The model sources use only the PyTorch-compatible API, so the tests run the same files under torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import kiln
from kiln.models.cnn import ResNet
from kiln.models.gpt import GPT, GPT2_SMALL, SMALL, GPTConfig
from kiln.models.lstm import LSTMTagger
from kiln.models.mlp import MLP
from kiln.models.recurrent import RecurrentStack
from kiln.models.transformer import TransformerClassifier


@dataclass
class ZooEntry:
    """A model with example inputs; `dynamic_shapes` names the dims that vary (None: static)."""

    name: str
    model: Any
    args: tuple
    dynamic_shapes: Any
    dim_examples: dict[str, list[int]]  # other sizes each Dim is tested at


def _tokens(batch: int, length: int, vocab: int) -> kiln.Tensor:
    return kiln.randint(0, vocab, (batch, length))


def _mlp_entry() -> ZooEntry:
    batch = kiln.Dim("batch", max=4096)
    return ZooEntry("mlp", MLP().eval(), (kiln.randn(4, 32),), {"x": {0: batch}}, {"batch": [1, 13]})


def _cnn_entry() -> ZooEntry:
    batch = kiln.Dim("batch", max=256)
    return ZooEntry("cnn", ResNet().eval(), (kiln.randn(2, 3, 16, 16),), {"x": {0: batch}}, {"batch": [1, 5]})


def _transformer_entry() -> ZooEntry:
    batch, seq = kiln.Dim("batch", max=256), kiln.Dim("seq", max=64)
    model = TransformerClassifier().eval()
    return ZooEntry("transformer", model, (_tokens(2, 10, 100),), {"tokens": {0: batch, 1: seq}},
                    {"batch": [1, 3], "seq": [4, 17]})


def _gpt_entry(config: GPTConfig = SMALL) -> ZooEntry:
    batch, seq = kiln.Dim("batch", max=64), kiln.Dim("seq", max=config.block_size)
    model = GPT(config).eval()
    return ZooEntry("gpt", model, (_tokens(2, 8, config.vocab_size),), {"idx": {0: batch, 1: seq}},
                    {"batch": [1, 3], "seq": [5, 16]})


def _gpt2_small_entry() -> ZooEntry:
    entry = _gpt_entry(GPT2_SMALL)
    entry.name = "gpt2_small"
    return entry


def _lstm_entry() -> ZooEntry:
    batch = kiln.Dim("batch", max=256)
    return ZooEntry("lstm", LSTMTagger().eval(), (_tokens(3, 7, 50),), {"tokens": {0: batch}}, {"batch": [1, 4]})


def _rnn_entry() -> ZooEntry:
    batch, seq = kiln.Dim("batch", max=256), kiln.Dim("seq", max=4096)
    return ZooEntry("rnn", RecurrentStack().eval(), (kiln.randn(2, 6, 12),), {"x": {0: batch, 1: seq}},
                    {"batch": [1, 3], "seq": [1, 9]})  # 300 steps: tests/models/test_recurrent_zoo.py


# The zoo the tests and demo iterate over (gpt2_small is large: benchmarks only).
MODELS: dict[str, Callable[[], ZooEntry]] = {
    "mlp": _mlp_entry, "cnn": _cnn_entry, "transformer": _transformer_entry, "gpt": _gpt_entry, "lstm": _lstm_entry,
    "rnn": _rnn_entry,
}
LARGE_MODELS: dict[str, Callable[[], ZooEntry]] = {"gpt2_small": _gpt2_small_entry}


def torch_twin(module_name: str) -> Any:
    """The zoo source file `module_name` (e.g. "kiln.models.gpt") run against torch instead of kiln: the same
    text with `kiln` swapped for `torch`, which is how the tests and benchmarks compare kiln with torch on one
    model definition. Needs torch."""
    import importlib
    import inspect
    import sys
    import types

    kiln_module = importlib.import_module(module_name)
    source = (inspect.getsource(kiln_module)
              .replace("import kiln.nn.functional as F", "import torch.nn.functional as F")
              .replace("import kiln.nn as nn", "import torch.nn as nn").replace("import kiln", "import torch")
              .replace("kiln.", "torch."))
    twin = types.ModuleType(module_name.replace("kiln", "torch_twin"))
    sys.modules[twin.__name__] = twin  # dataclasses look their module up there
    exec(compile(source, kiln_module.__file__, "exec"), twin.__dict__)
    return twin


def get(name: str, seed: int = 0) -> ZooEntry:
    """Build zoo model `name` with deterministic weights and inputs."""
    factories = {**MODELS, **LARGE_MODELS}
    if name not in factories:
        raise kiln.KilnError(f"unknown model {name!r}", fix="choose one of " + ", ".join(factories))
    kiln.manual_seed(seed)
    return factories[name]()


__all__ = ["MLP", "ResNet", "TransformerClassifier", "GPT", "GPTConfig", "LSTMTagger", "RecurrentStack", "MODELS",
           "LARGE_MODELS", "ZooEntry", "get", "torch_twin"]
