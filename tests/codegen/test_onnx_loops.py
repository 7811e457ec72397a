"""`kiln.scan` lowers to an ONNX `Scan` with state variables and `kiln.while_loop` to a `Loop` with no trip count:
each program is exported once with a dynamic sequence dim, passes the checker and strict shape inference, and
onnxruntime computes what kiln's interpreter and torch eager (its scan, while_loop and map HOPs)
compute at several lengths, nested loops included."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
from torch._higher_order_ops.map import map as torch_map  # noqa: E402
from torch._higher_order_ops.scan import scan as torch_scan  # noqa: E402
from torch._higher_order_ops.while_loop import while_loop as torch_while_loop  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402

import kiln  # noqa: E402
from kiln import nn  # noqa: E402
from kiln.codegen.onnx import DEFAULT_OPSET, MAX_OPSET, MIN_OPSET, export_program  # noqa: E402

from tests.codegen.support import assert_matches_interpreter, check_model  # noqa: E402

# Each program's `compute(lib, *parameters, *inputs)` runs on kiln (in the module's forward) or on torch (the
# oracle): the bodies use only tensor methods and operators both share, and take the loops and a counter from `lib`.
KILN = SimpleNamespace(scan=kiln.scan, while_loop=kiln.while_loop, map=kiln.map, counter=lambda: kiln.tensor(0))
TORCH = SimpleNamespace(scan=torch_scan, while_loop=torch_while_loop, map=torch_map, counter=lambda: torch.tensor(0))


class Recurrence(nn.Module):
    """h_t = tanh(x_t @ w + h_{t-1}), emitting 2 h_t and the sum of h_t: a parameter and a matmul in the body."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(kiln.randn(4, 4) * 0.5)

    def forward(self, xs, h):
        return self.compute(KILN, self.w, xs, h)

    @staticmethod
    def compute(lib, w, xs, h):
        def step(h, x):
            h = (x @ w + h).tanh()
            return h, (h * 2, h.sum(-1))

        return lib.scan(step, h, xs)


class TwoStreams(nn.Module):
    """Two carries and two xs scanned in reverse along dim 1 (the dynamic one); the extra input `scale` is read by
    the body from the outer graph."""

    def __init__(self) -> None:
        super().__init__()
        self.u = nn.Parameter(kiln.randn(3, 3) * 0.5)

    def forward(self, a, b, h, scale):
        return self.compute(KILN, self.u, a, b, h, scale)

    @staticmethod
    def compute(lib, u, a, b, h, scale):
        def step(carry, x):
            h, total = carry
            a_t, b_t = x
            h = (a_t @ u + h * scale).sigmoid()
            total = total + b_t * h.mean(-1)
            return (h, total), total * 2

        return lib.scan(step, (h, b[:, 0] * 0), (a, b), dim=1, reverse=True)


class Refine(nn.Module):
    """Five steps of x = tanh(x @ w), counted by an int64 carry: a fixed trip count known only to the cond."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(kiln.randn(4, 4) * 0.5)

    def forward(self, x):
        return self.compute(KILN, self.w, x)

    @staticmethod
    def compute(lib, w, x):
        return lib.while_loop(lambda i, x: i < 5, lambda i, x: (i + 1, (x @ w).tanh()), (lib.counter(), x))


class Grow(nn.Module):
    """`while x.sum() < limit: x = 2x + 0.5`: the trip count depends on the data (none at all when the sum starts
    past the limit); the counter returns it."""

    def forward(self, x, limit):
        return self.compute(KILN, x, limit)

    @staticmethod
    def compute(lib, x, limit):
        return lib.while_loop(lambda i, x: x.sum() < limit, lambda i, x: (i + 1, x * 2 + 0.5), (lib.counter(), x))


class BatchedRecurrence(nn.Module):
    """A scan inside a map: every sequence of the batch runs its own recurrence; the parameter is read two
    subgraphs deep and the scanned length is dim 1 of the outer input."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(kiln.randn(4, 4) * 0.5)

    def forward(self, xs, h):
        return self.compute(KILN, self.w, xs, h)

    @staticmethod
    def compute(lib, w, xs, h):
        def sequence(x, h):
            def step(c, x_t):
                c = (x_t @ w + c).tanh()
                return c, c.abs().sum()

            return lib.scan(step, h, x)

        return lib.map(sequence, xs, h)


class DoublingsPerStep(nn.Module):
    """A while_loop inside a scan: each step doubles the carry until it outgrows its input and emits how many
    doublings that took (an int64 per-step output)."""

    def forward(self, xs, h):
        return self.compute(KILN, xs, h)

    @staticmethod
    def compute(lib, xs, h):
        def step(h, x):
            target = x.abs().sum() + 1
            count, grown = lib.while_loop(lambda i, v: v.sum() < target, lambda i, v: (i + 1, v * 2 + 0.1),
                                          (lib.counter(), h.abs()))
            return grown / grown.sum(), count

        return lib.scan(step, h, xs)


class PassThrough(nn.Module):
    """Body outputs that are not computed in the body: a carry returned unchanged, the step's slice and an outer
    input (ONNX wants each subgraph output produced inside it). torch's scan refuses such aliasing, so only the
    interpreter checks it."""

    def forward(self, xs, h, total, offset):
        def step(carry, x):
            h, total = carry
            return (h, total + x.sum()), (x, offset, h)

        return kiln.scan(step, (h, total), xs)


class HalfRotate(nn.Module):
    """float16 carried values (the ops compute in float32 and round back) of a dynamic length, rotated three times."""

    def forward(self, x):
        return kiln.while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, kiln.cat([x[1:], x[:1]]) * 1.5),
                               (kiln.tensor(0), x))


@dataclass(frozen=True)
class Case:
    model: Callable[[], nn.Module]
    shapes: Callable[[int], list[tuple[int, ...]]]  # the inputs' shapes at sequence length T
    dynamic_shapes: Callable[[Any], dict[str, Any]]  # given the Dim of the sequence length
    loops: list[str]  # the ONNX control-flow ops, outer ones first
    inputs: Callable[[np.random.Generator, list[tuple[int, ...]]], list[np.ndarray]] | None = None
    torch_oracle: bool = True  # whether the module has a `compute` torch can run


def _normal(rng: np.random.Generator, shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    return [rng.standard_normal(shape).astype(np.float32) for shape in shapes]


def _half(rng: np.random.Generator, shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    return [a.astype(np.float16) for a in _normal(rng, shapes)]


def _grow_inputs(rng: np.random.Generator, shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    # positive, so the sum grows; a 300-long x starts past the limit and the loop runs no iteration
    return [rng.uniform(0.1, 1.0, shapes[0]).astype(np.float32), np.asarray(100.0, np.float32)]


CASES = {
    "scan_recurrence": Case(Recurrence, lambda t: [(t, 3, 4), (3, 4)],
                            lambda T: {"xs": {0: T}, "h": None}, ["Scan"]),
    "scan_two_carries_two_xs_reverse": Case(TwoStreams, lambda t: [(2, t, 3), (2, t), (2, 3), ()],
                                            lambda T: {"a": {1: T}, "b": {1: T}, "h": None, "scale": None}, ["Scan"]),
    "while_fixed_count": Case(Refine, lambda t: [(t, 4)], lambda T: {"x": {0: T}}, ["Loop"]),
    "while_data_dependent": Case(Grow, lambda t: [(t,), ()], lambda T: {"x": {0: T}, "limit": None}, ["Loop"],
                                 inputs=_grow_inputs),
    "scan_inside_map": Case(BatchedRecurrence, lambda t: [(2, t, 4), (4,)],
                            lambda T: {"xs": {0: kiln.Dim("batch"), 1: T}, "h": None}, ["Scan", "Scan"]),
    "while_inside_scan": Case(DoublingsPerStep, lambda t: [(t, 3), (3,)], lambda T: {"xs": {0: T}, "h": None},
                              ["Scan", "Loop"]),
    "scan_pass_through": Case(PassThrough, lambda t: [(t, 3), (3,), (), (2,)],
                              lambda T: {"xs": {0: T}, "h": None, "total": None, "offset": None}, ["Scan"],
                              torch_oracle=False),
    "while_half_precision": Case(HalfRotate, lambda t: [(t,)], lambda T: {"x": {0: T}}, ["Loop"], inputs=_half,
                                 torch_oracle=False),
}
LENGTHS = (1, 7, 300)


def _inputs(case: Case, length: int) -> list[np.ndarray]:
    rng = np.random.default_rng(length)
    return (case.inputs or _normal)(rng, case.shapes(length))


def _export(case: Case, opset: int | None = None):
    kiln.manual_seed(0)
    model = case.model()
    example = tuple(kiln.from_numpy(a) for a in _inputs(case, 5))
    program = kiln.export(model, example, dynamic_shapes=case.dynamic_shapes(kiln.Dim("T")))
    onnx_program = export_program(program, opset_version=opset)
    check_model(onnx_program)
    return model, program, onnx_program


def _control_flow(graph: onnx.GraphProto) -> list[str]:
    found = []
    for node in graph.node:
        if node.op_type in ("If", "Scan", "Loop"):
            found.append(node.op_type)
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                found += _control_flow(attribute.g)
    return found


def _torch_reference(model: nn.Module, inputs: list[np.ndarray]) -> list[np.ndarray]:
    # torch runs its scan and while_loop HOPs eagerly by compiling them with dynamo (fullgraph). Once its cache holds
    # a scan with another carry structure, compiling a scan around a while_loop fails in torch 2.13
    # ("lift_tracked_freevar_to_input should not be called on root SubgraphTracer"): start every reference afresh.
    torch._dynamo.reset()
    parameters = [torch.from_numpy(p.numpy().copy()) for p in model.parameters()]
    outputs = model.compute(TORCH, *parameters, *(torch.from_numpy(a) for a in inputs))
    return [t.numpy() for t in tree_leaves(outputs)]


@pytest.mark.parametrize("name", sorted(CASES))
def test_loop_matches_the_interpreter_and_torch_at_every_length(name):
    case = CASES[name]
    model, program, onnx_program = _export(case)
    graph = onnx_program.model_proto.graph
    assert _control_flow(graph) == case.loops
    assert "T" in {d.dim_param for i in graph.input for d in i.type.tensor_type.shape.dim}
    for length in LENGTHS:
        inputs = _inputs(case, length)
        assert_matches_interpreter(program, onnx_program, inputs)
        if case.torch_oracle:
            kiln.testing.assert_close(list(onnx_program.run(inputs)), _torch_reference(model, inputs),
                                      rtol=1e-4, atol=1e-5)


def test_scan_carries_are_state_and_per_step_outputs_stack():
    *_, onnx_program = _export(CASES["scan_two_carries_two_xs_reverse"])
    (scan,) = [n for n in onnx_program.model_proto.graph.node if n.op_type == "Scan"]
    attributes = {a.name: a for a in scan.attribute}
    assert attributes["num_scan_inputs"].i == 2 and len(scan.input) == 4  # two carries, then two xs
    assert len(scan.output) == 3  # two final carries, then the stacked totals
    body = attributes["body"].g
    assert len(body.input) == 4 and len(body.output) == 3
    stacked = onnx_program.model_proto.graph.output[-1].type.tensor_type.shape.dim
    assert [d.dim_param or d.dim_value for d in stacked] == [2, "T"]  # stacked along dim 1, as torch's scan does


def test_while_loop_has_no_trip_count_and_tests_its_cond_before_the_first_iteration():
    _, program, onnx_program = _export(CASES["while_data_dependent"])
    graph = onnx_program.model_proto.graph
    (loop,) = [n for n in graph.node if n.op_type == "Loop"]
    assert loop.input[0] == ""  # runs until cond_out is false
    assert any(n.op_type == "Less" and loop.input[1] in n.output for n in graph.node)  # the cond on the initial values
    body = loop.attribute[0].g
    assert [i.type.tensor_type.elem_type for i in body.input[:2]] == [onnx.TensorProto.INT64, onnx.TensorProto.BOOL]
    assert len(body.output) == 1 + len(loop.input) - 2  # cond_out, then the carried values
    trips = [int(onnx_program.run(_inputs(CASES["while_data_dependent"], n))[0]) for n in LENGTHS]
    assert trips[-1] == 0 and trips[0] > trips[1] > 0, trips


@pytest.mark.parametrize("opset", sorted({MIN_OPSET, DEFAULT_OPSET, MAX_OPSET}))
@pytest.mark.parametrize("name", ["scan_recurrence", "while_fixed_count"])
def test_loops_export_at_every_supported_opset(name, opset):
    case = CASES[name]
    _, program, onnx_program = _export(case, opset)
    assert onnx_program.model_proto.opset_import[0].version == opset
    assert_matches_interpreter(program, onnx_program, _inputs(case, 7))
