"""The model zoo: every model exports and runs at several sizes; the same sources run under torch."""

from __future__ import annotations

import inspect

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


SWAPS = [
    ("mlp", "kiln.models.mlp", "MLP", {}),
    ("cnn", "kiln.models.cnn", "ResNet", {}),
    ("transformer", "kiln.models.transformer", "TransformerClassifier", {}),
    ("lstm", "kiln.models.lstm", "LSTMTagger", {}),
    ("rnn", "kiln.models.recurrent", "RecurrentStack", {}),
    ("gpt_block", "kiln.models.gpt", "GPT", {}),
]


@pytest.mark.parametrize("name,module_name,class_name,kwargs", SWAPS, ids=[s[0] for s in SWAPS])
def test_same_source_runs_in_kiln_and_torch(name, module_name, class_name, kwargs):
    twin = kiln.models.torch_twin(module_name)
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
