"""kiln programs with buffers, constants, buffer mutations, cond and derived dims load in torch.export.load
and run with kiln's outputs; extra files and symbol names survive."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn as nn
from kiln.ir.interpreter import run_program
from tests.serde.support import assert_same, to_torch

torch = pytest.importorskip("torch")


class TrainingNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(4)
        self.scale = kiln.tensor([1.0, 2.0, 3.0, 4.0])  # a lifted constant

    def forward(self, x):
        return self.bn(x) * self.scale


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return kiln.cond(x.sum() > 0, lambda t: self.lin(t), lambda t: t * 2.0, (x,))


class Derived(nn.Module):
    def forward(self, x, y):
        return kiln.cat([x, y], 0).reshape(-1), x[1:] * 2


def _kiln_to_torch(program, tmp_path, **save_options):
    path = tmp_path / "program.pt2"
    kiln.save(program, path, **save_options)
    return path, torch.export.load(path)


def test_buffer_mutations_and_constants_reach_torch(tmp_path):
    kiln.manual_seed(0)
    model = TrainingNorm().train()
    x = kiln.randn(6, 4)
    program = kiln.export(model, (x,), dynamic_shapes={"x": {0: kiln.Dim("batch", min=2, max=64)}})
    _, loaded = _kiln_to_torch(program, tmp_path)
    flat = run_program(program, [x.numpy()])
    module = loaded.module()
    torch.testing.assert_close(module(to_torch(x.numpy())), to_torch(flat[-1]))
    for spec, value in zip(program.graph_signature.output_specs, flat):
        if spec.kind is kiln.OutputKind.BUFFER_MUTATION:
            assert_same(value, module.get_buffer(spec.target))


def test_cond_reaches_torch(tmp_path):
    kiln.manual_seed(0)
    model = Branchy()
    program = kiln.export(model, (kiln.randn(3, 4),))
    _, loaded = _kiln_to_torch(program, tmp_path)
    for sign in (1.0, -1.0):
        x = np.abs(np.random.default_rng(0).standard_normal((3, 4))).astype(np.float32) * sign
        torch.testing.assert_close(loaded.module()(to_torch(x)), to_torch(np.asarray(program(x))))


def test_derived_dims_reach_torch_and_symbol_names_survive(tmp_path):
    batch = kiln.Dim("batch", min=2, max=32)
    program = kiln.export(Derived(), (kiln.randn(3, 5), kiln.randn(3, 5)),
                          dynamic_shapes={"x": {0: batch}, "y": {0: batch}})
    path, loaded = _kiln_to_torch(program, tmp_path, extra_files={"note.txt": "made by kiln"})
    x, y = np.ones((7, 5), np.float32), np.full((7, 5), 2.0, np.float32)
    torch.testing.assert_close(loaded.module()(to_torch(x), to_torch(y)),
                               tuple(to_torch(np.asarray(v)) for v in program(x, y)))
    extra = {"note.txt": ""}
    torch.export.load(path, extra_files=extra)
    assert extra["note.txt"] == "made by kiln"
    mine = {"note.txt": None}
    reloaded = kiln.load(path, extra_files=mine)
    assert mine["note.txt"] == "made by kiln"
    assert {str(s): r for s, r in reloaded.range_constraints.items()} == {"batch": program.range_constraints[
        next(iter(program.range_constraints))]}


def test_torch_file_with_an_op_kiln_lacks_fails_with_the_census(tmp_path):
    class Shrink(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.hardshrink(x) + torch.nn.functional.softshrink(x) + \
                torch.nn.functional.hardshrink(x, 0.1)

    path = tmp_path / "shrink.pt2"
    ep = torch.export.export(Shrink(), (torch.randn(3, 3),))
    torch.export.save(ep, path)
    with pytest.raises(kiln.KilnError, match=r"aten.hardshrink.default \(x2\)") as raised:
        kiln.load(path)
    # The suggested fix works: run the torch code it names, save again, and kiln loads and runs the file.
    code = raised.value.fix.split("decompose just these ops before saving: ", 1)[1].split("; or ", 1)[0]
    assert "torch.ops.aten.hardshrink.default" in code and "torch.ops.aten.softshrink.default" in code
    scope = {"torch": torch, "ep": ep}
    exec(code, scope)
    torch.export.save(scope["ep"], tmp_path / "fixed.pt2")
    x = torch.randn(3, 3)
    np.testing.assert_allclose(kiln.load(tmp_path / "fixed.pt2")(x.numpy()), Shrink()(x).numpy(), rtol=1.3e-6,
                               atol=1e-5)
