"""Structure-aware mutation of .pt2 archives: a genuine file's JSON members (the program, the weights and constants
tables, kiln's sparse layouts) changed at random places, as a damaged or hostile file would be. kiln.load must load
each mutant or refuse it with a KilnError, and a loaded program must run or refuse its inputs with a KilnError:
never a KeyError, a TypeError or a hang from a reader that trusted the file's structure.

    python -m tests.serde.mutate --mutants 20000 --seed 1    (a longer campaign than the test's)
"""

from __future__ import annotations

import argparse
import collections
import copy
import io
import json
import random
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

import kiln
from kiln.ir.errors import KilnError
from tests.serde.support import archive_members, zip_members

# What a mutation may put in place of a value: every JSON type, and the integers at int64's edges and beyond.
ODD_VALUES = [None, 0, -1, 1, 2 ** 63, -2 ** 63, 2 ** 70, 1.5, float("nan"), "", "x", [], {}, True]


def _nodes(tree: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    yield path, tree
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _nodes(value, path + (key,))
    elif isinstance(tree, list):
        for index, value in enumerate(tree):
            yield from _nodes(value, path + (index,))


def _at(tree: Any, path: tuple) -> Any:
    for step in path:
        tree = tree[step]
    return tree


def mutate(document: Any, rng: random.Random) -> str:
    """Change `document` in place at one random place; a description of the change."""
    paths = [path for path, _ in _nodes(document) if path]
    if not paths:
        return "nothing"
    path = rng.choice(paths)
    parent, key = _at(document, path[:-1]), path[-1]
    value = parent[key]
    strings = sorted({v for _, v in _nodes(document) if isinstance(v, str)}) or ["x"]
    integers = sorted({v for _, v in _nodes(document) if isinstance(v, int) and not isinstance(v, bool)}) or [0]
    is_int = isinstance(value, int) and not isinstance(value, bool)
    kind = rng.randrange(9)
    if kind == 0:
        del parent[key]
        return f"delete {path}"
    if kind == 2 and isinstance(value, str):
        new = rng.choice(strings)  # another name the file uses
    elif kind == 3 and is_int:
        new = value + rng.choice([-1, 1, -value - 1, 1000, -1000])
    elif kind == 4 and isinstance(value, list) and value:
        new = value + [copy.deepcopy(rng.choice(value))]
    elif kind == 5 and isinstance(value, list) and len(value) > 1:
        new = list(value)
        i, j = rng.sample(range(len(new)), 2)
        new[i], new[j] = new[j], new[i]
    elif kind == 6 and isinstance(value, list) and value:
        new = list(value)
        new.pop(rng.randrange(len(new)))
    elif kind == 7 and is_int:
        new = rng.choice(integers)
    elif kind == 8 and isinstance(value, dict) and value:
        new = dict(value)
        new[rng.choice(list(new))] = copy.deepcopy(rng.choice([v for _, v in _nodes(document)][:200]))
    else:
        new = rng.choice(ODD_VALUES)
    parent[key] = new
    return f"set {path} = {json.dumps(new)[:60]}"


@dataclass
class Genuine:
    """A genuine archive and inputs its program runs on."""
    name: str
    data: bytes
    inputs: tuple


@dataclass
class Escape:
    """A mutant that got past kiln's checks as an exception other than a KilnError."""
    error: str
    where: str
    changes: list[str]


def check_mutants(genuine: Genuine, member: str, count: int, seed: int) -> list[Escape]:
    """`count` mutants of the archive member `member` (a JSON file), each one to three changes; the escapes."""
    members = archive_members(genuine.data)
    path = next(name for name in members if name.endswith(member))
    original = json.loads(members[path])
    rng = random.Random(seed)
    escapes = []
    for _ in range(count):
        document = copy.deepcopy(original)
        changes = [mutate(document, rng) for _ in range(rng.choice([1, 1, 2, 3]))]
        data = zip_members({**members, path: json.dumps(document).encode()})
        try:
            program = kiln.load(io.BytesIO(data))
            try:
                program(*genuine.inputs)
            except KilnError:
                pass
        except KilnError:
            continue
        except Exception as error:  # noqa: BLE001  (what the check is for)
            frame = traceback.extract_tb(error.__traceback__)[-1]
            escapes.append(Escape(f"{type(error).__name__}: {error}"[:200],
                                  f"{frame.filename.rsplit('/kiln/', 1)[-1]}:{frame.lineno}", changes))
    return escapes


def kiln_convnet() -> Genuine:
    """kiln's own writer: a convolution, a mean and a linear layer, with a dynamic batch."""
    class Net(kiln.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = kiln.nn.Conv2d(3, 4, 3, padding=1)
            self.lin = kiln.nn.Linear(4, 2)

        def forward(self, x):
            y = self.conv(x).relu().mean([2, 3])
            return self.lin(y).softmax(-1), y[:, :2]
    kiln.manual_seed(0)
    x = kiln.randn(2, 3, 8, 8)
    program = kiln.export(Net(), (x,), dynamic_shapes=({0: kiln.Dim("batch", max=64)},))
    buffer = io.BytesIO()
    kiln.save(program, buffer)
    return Genuine("kiln convnet", buffer.getvalue(), (np.asarray(x),))


def torch_convnet() -> Genuine:
    """torch.export's writer: a convolution with batch norm, a dynamic batch and a nested output."""
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.norm, self.lin = torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4), \
                torch.nn.Linear(4, 2)

        def forward(self, x):
            y = self.norm(self.conv(x)).relu().mean([2, 3])
            return self.lin(y).softmax(-1), y[:, :2].reshape(-1)
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8)
    program = torch.export.export(Net().eval(), (x,), dynamic_shapes=({0: torch.export.Dim("batch", max=64)},))
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    return Genuine("torch convnet", buffer.getvalue(), (x.numpy(),))


def torch_branching() -> Genuine:
    """torch.export's writer: a reshape by a symbolic size, a buffer updated in place, cond, a dict output."""
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)
            self.register_buffer("count", torch.zeros(1))

        def forward(self, x):
            batch = x.shape[0]
            y = self.lin(x.reshape(batch, -1, 8)).reshape(batch, -1)
            self.count.add_(1)
            z = torch.cond(y.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (y,))
            return {"z": z[:, 1:], "n": y.new_zeros(batch)}, y.argmax(-1)
    torch.manual_seed(0)
    x = torch.randn(4, 2, 8)
    program = torch.export.export(Net(), (x,), dynamic_shapes=({0: torch.export.Dim("batch", min=2, max=32)},))
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    return Genuine("torch branching", buffer.getvalue(), (x.numpy(),))


def kiln_sparse(layout: str) -> Genuine:
    """kiln's writer with a sparse weight (tests/sparse/test_pt2.py's layouts): its components as weights, its layout
    in extra/kiln_sparse.json, and the graph that builds it for torch."""
    from tests.sparse.test_pt2 import SparseWeight, _weight
    _, weight = _weight(layout)
    x = kiln.randn(3, 16)
    program = kiln.export(SparseWeight(weight), (x,))
    buffer = io.BytesIO()
    kiln.save(program, buffer)
    return Genuine(f"kiln {layout}", buffer.getvalue(), (np.asarray(x),))


# Each genuine file (its name, how to make it) and the JSON members a campaign mutates.
CAMPAIGN: list[tuple[str, Callable[[], Genuine], tuple[str, ...]]] = [
    ("kiln_convnet", kiln_convnet, ("models/model.json", "model_weights_config.json")),
    ("torch_convnet", torch_convnet, ("models/model.json", "model_weights_config.json")),
    ("torch_branching", torch_branching, ("models/model.json", "model_weights_config.json",
                                          "model_constants_config.json")),
    *[(f"kiln_{layout}", lambda layout=layout: kiln_sparse(layout),
       ("models/model.json", "kiln_sparse.json", "model_weights_config.json"))
      for layout in ("sparse_csr", "sparse_bsr", "semi_structured", "sparse_coo")],
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mutants", type=int, default=2000, help="per genuine file and member")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    found: collections.Counter = collections.Counter()
    examples = {}
    for _, make, members in CAMPAIGN:
        genuine = make()
        for member in members:
            escapes = check_mutants(genuine, member, args.mutants, args.seed)
            print(f"{genuine.name}, {member}: {args.mutants} mutants, {len(escapes)} escaped", flush=True)
            for escape in escapes:
                found[escape.where] += 1
                examples.setdefault(escape.where, escape)
    for where, count in found.most_common():
        print(f"{count} x {where}: {examples[where].error}\n    changes: {examples[where].changes}")


if __name__ == "__main__":
    main()
