"""Every kiln.models model, static and with its dynamic dims: kiln -> .pt2 -> torch gives kiln's outputs, and
torch's re-saved file -> kiln gives torch's outputs (at the example size and at another size of each dim)."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.models
from kiln.models import MODELS
from tests.frontend.test_models import _inputs_at
from tests.serde.support import assert_same, to_torch

torch = pytest.importorskip("torch")


def _arrays(args) -> list[np.ndarray]:
    return [a.numpy().copy() for a in args]


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_zoo_model_round_trips_between_kiln_and_torch(name, dynamic, tmp_path):
    entry = kiln.models.get(name)
    program = kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes if dynamic else None)
    sizes = [entry.args] + ([_inputs_at(entry, {dim: values[0]}) for dim, values in entry.dim_examples.items()]
                            if dynamic else [])

    kiln_file = tmp_path / "kiln.pt2"
    program.save(kiln_file)
    loaded = torch.export.load(kiln_file)
    assert len(loaded.range_constraints) == (len(entry.dim_examples) if dynamic else 0)
    for args in sizes:
        torch.testing.assert_close(loaded.module()(*to_torch(_arrays(args))), to_torch(program(*args).numpy()))

    torch_file = tmp_path / "torch.pt2"
    torch.export.save(loaded, torch_file)
    reloaded = kiln.load(torch_file)
    assert sorted(reloaded.range_constraints.values(), key=str) == sorted(program.range_constraints.values(), key=str)
    for args in sizes:
        assert_same(reloaded(*_arrays(args)), loaded.module()(*to_torch(_arrays(args))))

    resaved = tmp_path / "again.pt2"
    kiln.save(reloaded, resaved)
    assert_same(kiln.load(resaved)(*_arrays(entry.args)), loaded.module()(*to_torch(_arrays(entry.args))))
