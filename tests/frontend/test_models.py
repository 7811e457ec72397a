"""The model zoo: every model exports and runs at several sizes; the same sources run under torch."""

from __future__ import annotations

import importlib
import inspect
import sys
import types

import numpy as np
import pytest

import kiln
import kiln.models
from kiln.models import MODELS


def _inputs_at(entry, sizes: dict[str, int]) -> tuple:
    """The entry's example inputs with each dynamic dim resized to `sizes[dim name]`."""
    names = list(inspect.signature(entry.model.forward).parameters)
    new_args = []
    for name, example in zip(names, entry.args):
        spec = entry.dynamic_shapes.get(name) or {}
        shape = list(example.shape)
        for axis, dim in spec.items():
            shape[axis] = sizes.get(dim.name, shape[axis])
        if example.dtype is kiln.int64:
            high = int(example.numpy().max()) + 1
            new_args.append(kiln.randint(0, high, shape))
        else:
            new_args.append(kiln.randn(*shape))
    return tuple(new_args)


def _close(got, expected):
    np.testing.assert_allclose(np.asarray(got.numpy(), np.float64), np.asarray(expected.numpy(), np.float64),
                               rtol=1.3e-6, atol=1e-5)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_zoo_model_exports_and_matches_eager_at_several_sizes(name):
    entry = kiln.models.get(name)
    program = kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes)
    assert {str(s) for s in program.range_constraints} >= set(entry.dim_examples)
    _close(program(*entry.args), entry.model(*entry.args))
    for dim, values in entry.dim_examples.items():
        for value in values:
            args = _inputs_at(entry, {dim: value})
            _close(program(*args), entry.model(*args))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_zoo_model_decomposes_to_core_aten(name):
    entry = kiln.models.get(name)
    program = kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes).run_decompositions()
    assert all(op.opdef.is_core for op in program.nodes() if hasattr(op, "opdef"))
    _close(program(*entry.args), entry.model(*entry.args))


# ---------------------------------------------------------------------------------------------
# Namespace swap: the zoo's source files, unchanged but for `kiln` -> `torch`, define torch models.

torch = pytest.importorskip("torch")


def _torch_module(kiln_module: types.ModuleType) -> types.ModuleType:
    source = inspect.getsource(kiln_module)
    source = (source.replace("import kiln.nn.functional as F", "import torch.nn.functional as F")
              .replace("import kiln.nn as nn", "import torch.nn as nn").replace("import kiln", "import torch")
              .replace("kiln.", "torch."))
    module = types.ModuleType(kiln_module.__name__.replace("kiln", "torch_twin"))
    sys.modules[module.__name__] = module  # dataclasses look their module up there
    exec(compile(source, kiln_module.__file__, "exec"), module.__dict__)
    return module


SWAPS = [
    ("mlp", importlib.import_module("kiln.models.mlp"), "MLP", {}),
    ("cnn", importlib.import_module("kiln.models.cnn"), "ResNet", {}),
    ("transformer", importlib.import_module("kiln.models.transformer"), "TransformerClassifier", {}),
    ("lstm", importlib.import_module("kiln.models.lstm"), "LSTMTagger", {}),
    ("gpt_block", importlib.import_module("kiln.models.gpt"), "GPT", {}),
]


@pytest.mark.parametrize("name,kiln_module,class_name,kwargs", SWAPS, ids=[s[0] for s in SWAPS])
def test_same_source_runs_in_kiln_and_torch(name, kiln_module, class_name, kwargs):
    twin = _torch_module(kiln_module)
    torch.manual_seed(0)
    torch_model = getattr(twin, class_name)(**kwargs).eval()
    entry = kiln.models.get(name if name != "gpt_block" else "gpt")
    kiln_model = entry.model
    assert list(kiln_model.state_dict()) == list(torch_model.state_dict())
    kiln_model.load_state_dict(torch_model.state_dict())
    for args in (entry.args, *(_inputs_at(entry, {d: v}) for d, vs in entry.dim_examples.items() for v in vs)):
        with torch.no_grad():
            expected = torch_model(*[torch.from_numpy(a.numpy().copy()) for a in args])
        got = kiln_model(*args)
        torch.testing.assert_close(torch.from_numpy(np.array(got.numpy())), expected)
