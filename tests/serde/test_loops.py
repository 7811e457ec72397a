""".pt2 interop for torch's loops (`higher_order.scan`, `while_loop`, `map_impl`): programs torch saves load in kiln
and run as torch eager does at several lengths from one export with a dynamic dim; programs kiln saves load in
torch.export.load and run as kiln's interpreter does; malformed loop nodes are a SerdeError."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from functools import cache
from typing import Any, Callable

import numpy as np
import pytest

import kiln
import kiln.nn as nn
from kiln.ir.serde import SerdeError
from kiln.testing import assert_close
from tests.serde.support import archive_members, model_document, to_numpy, to_torch, zip_members

torch = pytest.importorskip("torch")
from torch._higher_order_ops.map import map as torch_map  # noqa: E402
from torch._higher_order_ops.scan import scan as torch_scan  # noqa: E402
from torch._higher_order_ops.while_loop import while_loop as torch_while_loop  # noqa: E402


def _rng(length: int) -> np.random.Generator:
    return np.random.default_rng(length)


def _normal(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


# -- torch models: saved by torch, read by kiln

class TorchRNN(torch.nn.Module):
    """A scan over a dynamic sequence dim; the cell's weights reach the combine graph as additional inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = torch.nn.Linear(4, 4)

    def forward(self, xs, h):
        def step(h, x):
            h = torch.tanh(self.cell(x) + h)
            return h, h * 2

        return torch_scan(step, h, xs)


class TorchPytreeScan(torch.nn.Module):
    """Two carries and two xs, scanned backwards along dim 1."""

    def forward(self, x, y, h1, h2):
        def step(carry, xs):
            (a, b), (u, v) = carry, xs
            a, b = a + u.sum(0), b * v.mean().cos()
            return (a, b), (a * 1.5, u * 2)

        return torch_scan(step, (h1, h2), (x, y), dim=1, reverse=True)


class TorchSizeScan(torch.nn.Module):
    """The combine graph uses the sequence length: torch passes it in as a SymInt additional input."""

    def forward(self, xs, h):
        length = xs.shape[0]

        def step(c, x):
            c = c + x / length
            return c, c.sum()

        return torch_scan(step, h, xs)


class TorchMixedSizeScan(torch.nn.Module):
    """A parameter and the sequence length in the combine graph: torch names the SymInt inside the tensor list."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4))

    def forward(self, xs, h):
        length = xs.shape[0]

        def step(c, x):
            c = c + x * self.w / length
            return c, c.sum()

        return torch_scan(step, h, xs)


class TorchWhile(torch.nn.Module):
    """A counter and a tensor carried until the counter reaches a limit given as an input."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor([0.5, -1.0, 2.0]))

    def forward(self, limit, x):
        def cond(i, acc):
            return i < limit

        def body(i, acc):
            return i + 1, torch.tanh(acc * self.scale + i)

        return torch_while_loop(cond, body, (torch.tensor(0), x))


class TorchMap(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, xs, y):
        return torch_map(lambda x, y: torch.nn.functional.gelu(self.linear(x * y)), xs, y)


@dataclass(frozen=True)
class Case:
    model: Callable[[], Any]
    inputs: Callable[[int], tuple[np.ndarray, ...]]  # the inputs at one length of the dynamic dim
    dynamic_shapes: Any
    lengths: tuple[int, ...]
    printed: str  # what the loaded program's text shows of the loop


def _while_inputs(length: int) -> tuple[np.ndarray, ...]:
    return np.array(length % 5 * 3, np.int64), _normal(_rng(length), length, 3)  # 3, 12 and 0 steps


T = torch.export.Dim("T", max=512)
TORCH_CASES = {
    "scan": Case(TorchRNN, lambda n: (_normal(_rng(n), n, 3, 4), _normal(_rng(n + 1), 3, 4)),
                 {"xs": {0: T}, "h": None}, (1, 7, 300), "torch.ops.higher_order.scan(scan_combine_graph_0, [h], [xs]"),
    "pytree_scan": Case(TorchPytreeScan,
                        lambda n: (_normal(_rng(n), 3, n, 4), _normal(_rng(n + 1), 5, n), _normal(_rng(0), 4),
                                   _normal(_rng(1))),
                        {"x": {1: T}, "y": {1: T}, "h1": None, "h2": None}, (1, 6, 40),
                        "torch.ops.higher_order.scan(scan_combine_graph_0, [h1, h2], [flip, flip_1], [])"),
    "size_scan": Case(TorchSizeScan, lambda n: (_normal(_rng(n), n, 4), _normal(_rng(0), 4)),
                      {"xs": {0: T}, "h": None}, (1, 7, 300), "aten.div.Scalar(arg1, "),
    "mixed_size_scan": Case(TorchMixedSizeScan, lambda n: (_normal(_rng(n), n, 4), _normal(_rng(0), 4)),
                            {"xs": {0: T}, "h": None}, (1, 7, 30),
                            "torch.ops.higher_order.scan(scan_combine_graph_0, [h], [xs], [p_w])"),
    "while_loop": Case(TorchWhile, _while_inputs, {"limit": None, "x": {0: T}}, (1, 4, 50),
                       "torch.ops.higher_order.while_loop(while_loop_cond_graph_0, while_loop_body_graph_0, "),
    "map": Case(TorchMap, lambda n: (_normal(_rng(n), n, 5, 4), _normal(_rng(0), 4)),
                {"xs": {0: T}, "y": None}, (1, 7, 30),
                "torch.ops.higher_order.map_impl(body_graph_0, [xs], [y, p_linear_weight, p_linear_bias])"),
}


@cache
def _torch_model(name: str) -> Any:
    torch.manual_seed(0)
    return TORCH_CASES[name].model()


@cache
def _torch_saved(name: str) -> bytes:
    """The case exported once, with its dim dynamic, and saved by torch."""
    case = TORCH_CASES[name]
    exported = torch.export.export(_torch_model(name), to_torch(case.inputs(3)), dynamic_shapes=case.dynamic_shapes)
    buffer = io.BytesIO()
    torch.export.save(exported, buffer)
    return buffer.getvalue()


def _eager(name: str, inputs: tuple[np.ndarray, ...]) -> list[np.ndarray]:
    with torch.no_grad():
        return _flat(to_numpy(_torch_model(name)(*to_torch(inputs))))


def _flat(value: Any) -> list[Any]:
    if isinstance(value, (tuple, list)):
        return [leaf for item in value for leaf in _flat(item)]
    return [np.asarray(value)]


def _check_at_every_length(program: Any, name: str) -> None:
    case = TORCH_CASES[name]
    for length in case.lengths:
        inputs = case.inputs(length)
        assert_close(_flat(program.module()(*inputs)), _eager(name, inputs), msg=lambda m, n=length: f"length {n}: {m}")


@pytest.mark.parametrize("name", sorted(TORCH_CASES))
def test_torch_saved_loop_loads_in_kiln_and_matches_eager_at_every_length(name):
    program = kiln.load(io.BytesIO(_torch_saved(name)))
    program.verify()
    assert TORCH_CASES[name].printed in str(program)
    assert program.range_constraints, "the dynamic dim survives"
    _check_at_every_length(program, name)


@pytest.mark.parametrize("name", sorted(TORCH_CASES))
def test_from_torch_converts_loops(name):
    case = TORCH_CASES[name]
    program = kiln.from_torch(_torch_model(name), to_torch(case.inputs(3)), dynamic_shapes=case.dynamic_shapes)
    program.verify()
    assert "torch.ops.higher_order." in str(program)
    _check_at_every_length(program, name)


@pytest.mark.parametrize("name", ["scan", "size_scan", "mixed_size_scan", "while_loop"])
def test_torch_saved_loop_goes_back_to_torch_through_kiln(name, tmp_path):
    path = tmp_path / f"{name}.pt2"
    kiln.save(kiln.load(io.BytesIO(_torch_saved(name))), path)
    module = torch.export.load(path).module()
    case = TORCH_CASES[name]
    for length in case.lengths:
        inputs = case.inputs(length)
        with torch.no_grad():
            got = _flat(to_numpy(module(*to_torch(inputs))))
        assert_close(got, _eager(name, inputs))


# -- kiln models: saved by kiln, read by torch

# Each mirrors the torch model of its name, so that the files kiln writes can be compared with torch's.

class KilnRNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.Linear(4, 4)

    def forward(self, xs, h):
        def step(h, x):
            h = kiln.tanh(self.cell(x) + h)
            return h, h * 2

        return kiln.scan(step, h, xs)


class KilnPytreeScan(nn.Module):
    def forward(self, x, y, h1, h2):
        def step(carry, xs):
            (a, b), (u, v) = carry, xs
            a, b = a + u.sum(0), b * v.mean().cos()
            return (a, b), (a * 1.5, u * 2)

        return kiln.scan(step, (h1, h2), (x, y), dim=1, reverse=True)


class KilnSizeScan(nn.Module):
    """The body uses the sequence length, a size none of its tensors has."""

    def forward(self, xs, h):
        length = xs.shape[0]

        def step(c, x):
            c = c + x / length
            return c, c.sum()

        return kiln.scan(step, h, xs)


class KilnMixedSizeScan(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(kiln.randn(4))

    def forward(self, xs, h):
        length = xs.shape[0]

        def step(c, x):
            c = c + x * self.w / length
            return c, c.sum()

        return kiln.scan(step, h, xs)


class KilnWhile(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(kiln.tensor([0.5, -1.0, 2.0]))

    def forward(self, limit, x):
        def cond(i, acc):
            return i < limit

        def body(i, acc):
            return i + 1, kiln.tanh(acc * self.scale + i)

        return kiln.while_loop(cond, body, (kiln.tensor(0), x))


class KilnMap(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, xs, y):
        return kiln.map(lambda x, y: nn.functional.gelu(self.linear(x * y)), xs, y)


class KilnPassThrough(nn.Module):
    """Bodies that yield their own arguments, or one value twice: torch refuses such aliasing, so the writer clones."""

    def forward(self, x, h, limit):
        def step(c, xt):
            return c, xt

        def twice(c, xt):
            n = c + xt
            return n, n

        carry, ys = kiln.scan(step, h, x)
        total, running = kiln.scan(twice, carry, x)
        _, kept, grown = kiln.while_loop(lambda i, a, b: i < limit, lambda i, a, b: (i + 1, a, b + a),
                                         (kiln.tensor(0), total, h))
        return ys, running, kept, grown


L = kiln.Dim("L", max=512)
KILN_CASES = {
    "scan": Case(KilnRNN, TORCH_CASES["scan"].inputs, {"xs": {0: L}, "h": None}, (1, 7, 300),
                 "torch.ops.higher_order.scan(scan_combine_graph_0, [h], [xs], [p_cell_weight, p_cell_bias])"),
    "pytree_scan": Case(KilnPytreeScan, TORCH_CASES["pytree_scan"].inputs,
                        {"x": {1: L}, "y": {1: L}, "h1": None, "h2": None}, (1, 6, 40),
                        "torch.ops.higher_order.scan(scan_combine_graph_0, [h1, h2], [flip, flip_1], [])"),
    "size_scan": Case(KilnSizeScan, TORCH_CASES["size_scan"].inputs, {"xs": {0: L}, "h": None}, (1, 7, 300),
                      "aten.div.Scalar(x0, L)"),
    "mixed_size_scan": Case(KilnMixedSizeScan, TORCH_CASES["mixed_size_scan"].inputs, {"xs": {0: L}, "h": None},
                            (1, 7, 30), "aten.div.Scalar(mul, L)"),
    "while_loop": Case(KilnWhile, _while_inputs, {"limit": None, "x": {0: L}}, (1, 4, 50),
                       "torch.ops.higher_order.while_loop(while_loop_cond_graph_0, while_loop_body_graph_0, "),
    "map": Case(KilnMap, TORCH_CASES["map"].inputs, {"xs": {0: L}, "y": None}, (1, 7, 30),
                "torch.ops.higher_order.map_impl(body_graph_0, [xs], "),
    "pass_through": Case(KilnPassThrough,
                         lambda n: (_normal(_rng(n), n, 4), _normal(_rng(0), 4), np.array(n % 4, np.int64)),
                         {"x": {0: L}, "h": None, "limit": None}, (1, 7, 30), "torch.ops.higher_order.while_loop("),
}


@cache
def _kiln_program(name: str) -> Any:
    kiln.manual_seed(0)
    case = KILN_CASES[name]
    example = tuple(kiln.tensor(a) for a in case.inputs(3))
    program = kiln.export(case.model(), example, dynamic_shapes=case.dynamic_shapes)
    program.verify()
    assert case.printed in str(program)
    return program


@pytest.mark.parametrize("name", sorted(KILN_CASES))
def test_kiln_saved_loop_runs_in_torch_at_every_length(name, tmp_path):
    program = _kiln_program(name)
    path = tmp_path / f"{name}.pt2"
    kiln.save(program, path)
    loaded = torch.export.load(path)
    # torch re-traces the loops here, refusing subgraphs whose outputs alias (hence the writer's clones)
    decomposed = loaded.run_decompositions()
    case = KILN_CASES[name]
    for length in case.lengths:
        inputs = case.inputs(length)
        expected = _flat(program.module()(*inputs))
        for module in (loaded.module(), decomposed.module()):
            with torch.no_grad():
                got = _flat(to_numpy(module(*to_torch(inputs))))
            assert_close(got, expected, msg=lambda m, n=length: f"length {n}: {m}")


@pytest.mark.parametrize("name", sorted(KILN_CASES))
def test_kiln_saved_loop_reads_back_in_kiln(name):
    program = _kiln_program(name)
    buffer = io.BytesIO()
    kiln.save(program, buffer)
    buffer.seek(0)
    reloaded = kiln.load(buffer)
    reloaded.verify()
    assert "torch.ops.higher_order." in str(reloaded)
    for length in KILN_CASES[name].lengths:
        inputs = KILN_CASES[name].inputs(length)
        assert_close(_flat(reloaded.module()(*inputs)), _flat(program.module()(*inputs)))


def _form(node: dict[str, Any]) -> list[Any]:
    """What torch's loader reads of a loop node's form: each argument's name, kind and sort (for a subgraph, its
    inputs' sorts, output count and whether it returns a bare tensor), the outputs' sorts and the node's return."""
    arguments = []
    for entry in node["inputs"]:
        sort, value = next(iter(entry["arg"].items()))
        if sort == "as_graph":
            graph = value["graph"]
            value = ([next(iter(i)) for i in graph["inputs"]], len(graph["outputs"]), graph["is_single_tensor_return"])
        else:
            value = len(value)
        arguments.append((entry["name"], entry["kind"], sort, value))
    return [arguments, [next(iter(o)) for o in node["outputs"]], node["is_hop_single_tensor_return"]]


@pytest.mark.parametrize("name", sorted(set(TORCH_CASES) & set(KILN_CASES)))
def test_kiln_writes_loops_in_torchs_form(name):
    """Argument kinds, SymInt inputs (a SymInt list when alone, named in the tensor list after tensors), the empty
    tensor list of no additional inputs, and the while_loop cond graph's bare predicate, as torch writes them."""
    target = {"map": "map_impl", "while_loop": "while_loop"}.get(name, "scan")
    ours = _loop_node(model_document(_save(_kiln_program(name))), target)
    torchs = _loop_node(model_document(_torch_saved(name)), target)
    assert _form(ours) == _form(torchs)


# -- malformed files

def _save(program: Any) -> bytes:
    buffer = io.BytesIO()
    kiln.save(program, buffer)
    return buffer.getvalue()


def _with_document(data: bytes, document: dict[str, Any]) -> bytes:
    members = archive_members(data)
    members["archive/models/model.json"] = json.dumps(document).encode()
    return zip_members(members)


def _loop_node(document: dict[str, Any], target: str) -> dict[str, Any]:
    return next(node for node in document["graph_module"]["graph"]["nodes"]
                if node["target"] == f"torch.ops.higher_order.{target}")


def _drop_an_input(graph_index: int) -> Callable[[dict[str, Any]], None]:
    def mutate(node: dict[str, Any]) -> None:
        node["inputs"][graph_index]["arg"]["as_graph"]["graph"]["inputs"].pop()
    return mutate


def _drop_an_output(node: dict[str, Any]) -> None:
    node["inputs"][1]["arg"]["as_graph"]["graph"]["outputs"].pop()


def _drop_the_xs(node: dict[str, Any]) -> None:
    del node["inputs"][2]


MALFORMED = {
    "scan_body_lacks_an_input": ("scan", _drop_an_input(0), r"scan's combine graph takes 3 inputs but is given 4"),
    "scan_lacks_its_xs": ("scan", _drop_the_xs, r"scan needs \(combine_graph, init, xs, additional_inputs\)"),
    "while_body_lacks_an_input": ("while_loop", _drop_an_input(1),
                                  r"while_loop's body graph takes 3 inputs but is given 4"),
    "while_body_returns_too_little": ("while_loop", _drop_an_output,
                                      r"kiln\.while_loop: the body yields \[\S*i64\[\]\S*\] but the carried values are "
                                      r"\[.*f32\[L, 3\]"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_loop_is_a_serde_error(case):
    name, mutate, message = MALFORMED[case]
    data = _save(_kiln_program(name))
    document = model_document(data)
    mutate(_loop_node(document, name))
    with pytest.raises(SerdeError, match=message):
        kiln.load(io.BytesIO(_with_document(data, document)))
