""".pt2 files changed at random places (tests/serde/mutate.py) load, or are refused with a KilnError: the reader
checks the type of every field it reads. Before, a mutation campaign found a reader that trusted the file's
structure at 24 lines (a KeyError, TypeError, AttributeError, IndexError, ValueError, OverflowError or
ZeroDivisionError instead of a SerdeError) and an integer beyond int64 that reached xDSL; reading the code then
found a symbolic `pow` a file could make compute without end."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

import kiln
from kiln.ir.serde import SerdeError
from tests.serde.mutate import CAMPAIGN, check_mutants, kiln_convnet, torch_branching
from tests.serde.support import archive_members, zip_members

MUTANTS = 120  # per genuine file and member; `python -m tests.serde.mutate` runs longer campaigns

# (name, how to make the genuine file, the member mutated); a case's seed is its position
CASES = [(name, make, member) for name, make, members in CAMPAIGN for member in members]


@pytest.fixture(scope="module")
def genuine_files():
    return {}


@pytest.mark.parametrize("seed", range(len(CASES)), ids=[f"{name}-{member}" for name, _, member in CASES])
def test_every_mutant_loads_or_is_refused_with_a_kiln_error(genuine_files, seed):
    name, make, member = CASES[seed]
    if name not in genuine_files:
        genuine_files[name] = make()
    escapes = check_mutants(genuine_files[name], member, MUTANTS, seed)
    assert not escapes, "\n".join(f"{e.where}: {e.error} after {e.changes}" for e in escapes[:5])


def _with_program(data: bytes, change) -> bytes:
    members = archive_members(data)
    path = next(name for name in members if name.endswith("models/model.json"))
    document = json.loads(members[path])
    change(document)
    return zip_members({**members, path: json.dumps(document).encode()})


def _sym_node(target: str, *values: int, name: str = "p") -> dict:
    return {"target": target, "inputs": [{"name": f"a{k}", "arg": {"as_int": v}, "kind": 1}
                                         for k, v in enumerate(values)],
            "outputs": [{"as_sym_int": {"as_name": name}}], "metadata": {}}


@pytest.mark.parametrize("node, match", [
    (_sym_node("_operator.mul", 2 ** 62, 2 ** 62), "beyond int64"),
    (_sym_node("_operator.add", 1), "_operator.add of"),
    (_sym_node("_operator.floordiv", 2 ** 63), "is not an int64"),
])
def test_a_symbolic_node_with_odd_integers_is_refused(node, match):
    data = _with_program(kiln_convnet().data, lambda document: document["graph_module"]["graph"]["nodes"]
                         .insert(0, node))
    with pytest.raises(SerdeError, match=match):
        kiln.load(io.BytesIO(data))


def test_a_symbolic_power_beyond_int64_is_refused_before_it_is_computed(tmp_path):
    """10 ** 2**62 would never finish: the reader refuses it from its operands (in a child, so that the failure this
    guards against is a timeout rather than a hung suite)."""
    data = _with_program(kiln_convnet().data, lambda document: document["graph_module"]["graph"]["nodes"]
                         .insert(0, _sym_node("_operator.pow", 10, 2 ** 62)))
    (tmp_path / "power.pt2").write_bytes(data)
    script = ("import sys, kiln\nfrom kiln.ir.serde import SerdeError\n"
              "try:\n    kiln.load(sys.argv[1])\nexcept SerdeError as error:\n    print(error)\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "power.pt2")], capture_output=True,
                          text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert "beyond int64" in done.stdout, done.stderr[-2000:]


@pytest.mark.parametrize("change, match", [
    (lambda d: d["graph_module"]["graph"]["nodes"][0]["inputs"].__setitem__(0, None), "an input of"),
    (lambda d: d["graph_module"]["graph"]["nodes"][0]["inputs"][0]["arg"].__setitem__("as_tensor", {"name": []}),
     "lacks a valid .name."),
    (lambda d: d.__setitem__("range_constraints", -1), "invalid 'range_constraints'"),
    (lambda d: d["graph_module"].__setitem__("module_call_graph", 3), "invalid 'module_call_graph'"),
])
def test_a_field_of_the_wrong_type_is_a_malformed_program(change, match):
    """Each was a TypeError or AttributeError from inside the reader."""
    with pytest.raises(SerdeError, match=match):
        kiln.load(io.BytesIO(_with_program(torch_branching().data, change)))
