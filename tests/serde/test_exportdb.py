"""torch 2.13's ExportDB: every example torch exports loads in kiln without torch, runs, matches torch eager, and
saves back to a .pt2 that torch loads and runs the same.

The examples come from torch's registry (`torch._export.db.examples`, rewrite cases included), so a new example is
covered without editing this file; the ones torch itself cannot export are found by trying, and skipped with
torch's error. kiln's side runs in one subprocess where `import torch` fails.
"""

from __future__ import annotations

import copy
import json
import operator
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.no_torch import without_torch

torch = pytest.importorskip("torch")
from torch._export.db.examples import all_examples, get_rewrite_cases  # noqa: E402
from torch.utils._pytree import tree_leaves, tree_map  # noqa: E402

import kiln  # noqa: E402
from kiln.ir.registry import REGISTRY, OpOverload  # noqa: E402


def _cases() -> dict[str, object]:
    cases = {}
    for name, case in sorted(all_examples().items()):
        cases[name] = case
        for index, rewrite in enumerate(get_rewrite_cases(case)):
            cases[f"{name}[rewrite{index}]"] = rewrite
    return cases


CASES = _cases()

# kiln's side: load each torch file with torch blocked, run it on every input set, compare with torch eager
# (torch.testing.assert_close's defaults, through kiln.testing), check inputs mutated in place, save it back.
CHILD = without_torch("""
    import json, pickle, traceback

    import numpy as np
    import kiln, kiln.testing

    def arrays(tree):
        if isinstance(tree, dict):
            tree = list(tree.values())
        if isinstance(tree, (list, tuple)):
            return [leaf for item in tree for leaf in arrays(item)]
        return [tree] if isinstance(tree, np.ndarray) else []

    folder, names = sys.argv[1], sys.argv[2:]
    results = {}
    for name in names:
        try:
            with open(f"{folder}/{name}/io.pkl", "rb") as f:
                runs = pickle.load(f)
            program = kiln.load(f"{folder}/{name}/torch.pt2")
            for run in runs:
                args, kwargs = run["inputs"]
                kiln.testing.assert_close(program.module()(*args, **kwargs), run["expected"])
                kiln.testing.assert_close(arrays((args, kwargs)), arrays(run["after"]))
            kiln.save(program, f"{folder}/{name}/kiln.pt2")
            results[name] = "ok"
        except Exception as error:
            where = traceback.extract_tb(error.__traceback__)[-1]
            results[name] = (f"{type(error).__name__}: {str(error).strip().splitlines()[0][:300]} "
                             f"({where.filename.rsplit('/', 1)[-1]}:{where.lineno})")
    assert sys.modules.get("torch") is None and not any(m.startswith("torch.") for m in sys.modules)
    print(json.dumps(results))
""")


def _to_numpy(tree):
    return tree_map(lambda v: v.detach().numpy().copy() if isinstance(v, torch.Tensor) else v, tree)


def _to_torch(tree):
    return tree_map(lambda v: torch.from_numpy(v.copy()) if isinstance(v, np.ndarray) else v, tree)


def _tensors(tree):
    return [leaf for leaf in tree_leaves(tree) if isinstance(leaf, torch.Tensor)]


@pytest.fixture(scope="module")
def exportdb(tmp_path_factory):
    """{name: (torch's export error or None, kiln's result)}: every example exported by torch and saved, then
    all of them loaded, run and saved by kiln in one torch-free subprocess."""
    folder = tmp_path_factory.mktemp("exportdb")
    outcome: dict[str, tuple[str | None, str | None]] = {}
    for name, case in CASES.items():
        torch.manual_seed(0)
        try:
            exported = torch.export.export(case.model, copy.deepcopy(case.example_args),
                                           copy.deepcopy(case.example_kwargs), dynamic_shapes=case.dynamic_shapes)
        except Exception as error:  # torch's own limits: recorded, and the example is skipped
            outcome[name] = (f"{type(error).__name__}: {str(error).strip().splitlines()[0]}", None)
            continue
        runs = []
        input_sets = [(case.example_args, case.example_kwargs)]
        if case.extra_args is not None:
            input_sets.append((case.extra_args, {}))
        for args, kwargs in input_sets:
            args, kwargs = copy.deepcopy(args), copy.deepcopy(kwargs)
            inputs = _to_numpy((args, kwargs))
            expected = _to_numpy(case.model(*args, **kwargs))
            runs.append({"inputs": inputs, "expected": expected, "after": _to_numpy((args, kwargs))})
        (folder / name).mkdir()
        torch.export.save(exported, folder / name / "torch.pt2")
        (folder / name / "io.pkl").write_bytes(pickle.dumps(runs))
        outcome[name] = (None, None)
    exported_names = [name for name, (error, _) in outcome.items() if error is None]
    result = subprocess.run([sys.executable, "-c", CHILD, str(folder), *exported_names], capture_output=True,
                            text=True, cwd=Path(__file__).resolve().parents[2], timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    kiln_results = json.loads(result.stdout.strip().splitlines()[-1])
    for name in exported_names:
        outcome[name] = (None, kiln_results[name])
    return folder, outcome


@pytest.mark.parametrize("name", list(CASES))
def test_exportdb_example_round_trips_through_kiln(name, exportdb):
    folder, outcome = exportdb
    torch_error, kiln_result = outcome[name]
    if torch_error is not None:
        pytest.skip(f"torch 2.13 itself cannot export {name}: {torch_error}")
    assert kiln_result == "ok", f"kiln, with torch blocked: {kiln_result}"
    reloaded = torch.export.load(folder / name / "kiln.pt2")
    for run in pickle.loads((folder / name / "io.pkl").read_bytes()):
        args, kwargs = _to_torch(run["inputs"])
        torch.testing.assert_close(reloaded.module()(*args, **kwargs), _to_torch(run["expected"]))
        torch.testing.assert_close(_tensors((args, kwargs)), _tensors(_to_torch(run["after"])))


def test_exportdb_is_not_empty():
    assert len(CASES) >= 30, "torch's ExportDB registry came back (nearly) empty: the import path moved?"


# -- the pieces the examples need, on their own

@pytest.mark.parametrize("name", sorted(n for n in REGISTRY if n.startswith("_operator.")))
def test_symint_operators_have_pythons_semantics(name):
    python = getattr(operator, name.split(".")[1])
    for a in (-7, -1, 0, 3, 8):
        for b in (-3, -2, 1, 2, 5):
            assert OpOverload(REGISTRY[name])(a, b) == python(a, b), (name, a, b)


def _program(module, *args, **kwargs):
    with torch.no_grad():
        return kiln.from_torch(module, args, **kwargs)


class _MutateInput(torch.nn.Module):
    def forward(self, x):
        x.add_(1)
        return x * 2


def test_calling_a_program_writes_input_mutations_back():
    program = _program(_MutateInput(), torch.zeros(2, 3))
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = program.module()(x)
    np.testing.assert_array_equal(x, np.arange(6, dtype=np.float32).reshape(2, 3) + 1)
    np.testing.assert_array_equal(out, x * 2)
    frozen = np.zeros((2, 3), np.float32)
    frozen.flags.writeable = False
    with pytest.raises(kiln.KilnError, match="mutates input 'x' in place"):
        program(frozen)


class _Map(torch.nn.Module):
    def forward(self, xs, y):
        from functorch.experimental.control_flow import map as torch_map
        return torch_map(lambda x, y: x * y + 1, xs, y)


def test_map_with_a_dynamic_leading_dim_round_trips(tmp_path):
    xs, y = torch.randn(3, 4), torch.randn(4)
    batch = torch.export.Dim("batch", min=1, max=16)
    exported = torch.export.export(_Map(), (xs, y), dynamic_shapes={"xs": {0: batch}, "y": None})
    torch.export.save(exported, tmp_path / "torch.pt2")
    program = kiln.load(tmp_path / "torch.pt2")
    assert any(op.name == "kiln.map" for op in program.body.ops)
    xs = torch.randn(5, 4)
    np.testing.assert_allclose(program(xs.numpy(), y.numpy()), _Map()(xs, y).numpy(), rtol=1.3e-6, atol=1e-5)
    with pytest.raises(kiln.KilnError, match=r"xs.shape\[0\] = 0 is outside the range"):
        program(np.zeros((0, 4), np.float32), y.numpy())  # torch's map refuses an empty leading dim too
    kiln.save(program, tmp_path / "kiln.pt2")
    xs = torch.randn(7, 4)
    torch.testing.assert_close(torch.export.load(tmp_path / "kiln.pt2").module()(xs, y), _Map()(xs, y))


class _ReadSize(torch.nn.Module):
    def forward(self, x):
        size = x.item()
        torch._check(size >= 0)
        torch._check(size <= 5)
        return torch.zeros((size, 2))


def test_data_dependent_values_are_checked_as_torchs_runtime_asserts_check_them(tmp_path):
    exported = torch.export.export(_ReadSize(), (torch.tensor(3),))
    torch.export.save(exported, tmp_path / "torch.pt2")
    program = kiln.load(tmp_path / "torch.pt2")
    assert program(np.array(4)).shape == (4, 2)
    with pytest.raises(kiln.KilnError, match=r"the value read from a tensor is 7, but .* in VR\[0, 5\]"):
        program(np.array(7))
    with pytest.raises(RuntimeError, match="u0 <= 5"):  # torch refuses it too
        exported.module()(torch.tensor(7))


class _Numbers(torch.nn.Module):
    def forward(self, x):
        return x.sum().item(), x.argmax().item(), x.shape[0] * 2 + 1, x * 2


def test_int_float_and_symint_outputs_round_trip(tmp_path):
    x = torch.randn(5)
    exported = torch.export.export(_Numbers(), (x,), dynamic_shapes={"x": {0: torch.export.Dim("n", max=64)}})
    torch.export.save(exported, tmp_path / "torch.pt2")
    program = kiln.load(tmp_path / "torch.pt2")
    x = torch.randn(9)
    total, index, size, doubled = program(x.numpy())
    expected = _Numbers()(x)
    assert (type(total), type(index), type(size)) == (float, int, int)
    kiln.testing.assert_close((total, index, size), expected[:3])
    kiln.save(program, tmp_path / "kiln.pt2")
    torch.testing.assert_close(torch.export.load(tmp_path / "kiln.pt2").module()(x), expected)


def test_baked_in_arguments_are_torchs_constant_inputs(tmp_path):
    import kiln.nn as nn

    class AddTimes(nn.Module):
        def forward(self, x, const, times):
            for _ in range(times):
                x = x + const
            return x

    x = kiln.randn(2, 2)
    kiln.save(kiln.export(AddTimes(), (x, 1, 3)), tmp_path / "kiln.pt2")
    exported = torch.export.load(tmp_path / "kiln.pt2")
    assert [getattr(spec.arg, "value", None) for spec in exported.graph_signature.input_specs] == [None, 1, 3]
    x_torch = torch.from_numpy(x.numpy().copy())
    torch.testing.assert_close(exported.module()(x_torch, 1, 3), x_torch + 3)
    reloaded = kiln.load(tmp_path / "kiln.pt2")
    kiln.testing.assert_close(reloaded(x.numpy(), 1, 3), x.numpy() + 3)
    with pytest.raises(kiln.KilnError, match="baked into the program"):
        reloaded(x.numpy(), 2, 3)
