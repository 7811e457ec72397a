"""`kiln.scan`, `kiln.while_loop` and `kiln.map` against torch's scan / while_loop / map higher-order ops.

Every model is written twice, as a torch.nn.Module calling torch's function and as the same kiln.nn.Module calling
kiln's, kiln holding torch's weights; torch eager is the oracle under torch.testing.assert_close's defaults. Each
loop runs eagerly and exported with symbolic shapes (one program for every length), nested in another, printed
as torch prints it, verified, through run_decompositions and the pass pipeline, and refuses the user mistakes torch
refuses with a clear KilnError.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch._higher_order_ops.cond import cond as torch_cond  # noqa: E402
from torch._higher_order_ops.map import map as torch_map  # noqa: E402
from torch._higher_order_ops.scan import scan as torch_scan  # noqa: E402
from torch._higher_order_ops.while_loop import while_loop as torch_while_loop  # noqa: E402
from xdsl.ir import Block  # noqa: E402

import kiln  # noqa: E402
import kiln.passes  # noqa: E402
from kiln import nn  # noqa: E402
from kiln.ir.control_flow import CondOp, MapOp, ScanOp, WhileLoopOp, YieldOp  # noqa: E402
from kiln.ir.errors import KilnError, VerificationError  # noqa: E402
from kiln.ir.types import TensorType  # noqa: E402

FEATURES = 4
LENGTHS = (1, 7, 300)  # scanned lengths one exported program must serve
BATCHES = (2, 3, 1)  # a batch size for each length: the batch dim is symbolic too
DECAY = [0.9, 0.8, 0.7, 0.6]


# ---------------------------------------------------------------------------------------------
# helpers


def _to_torch(value: Any) -> Any:
    """kiln results (Tensors or numpy arrays, nested in tuples, lists and dicts) as torch tensors."""
    if isinstance(value, (tuple, list)):
        return type(value)(_to_torch(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_torch(v) for k, v in value.items()}
    array = value.numpy() if isinstance(value, kiln.Tensor) else value
    return torch.from_numpy(np.array(array, copy=True))


def _close(actual: Any, expected: Any) -> None:
    torch.testing.assert_close(_to_torch(actual), expected)


def _run_torch(module: Any, arrays: list[np.ndarray]) -> Any:
    # torch compiles its loop ops for eager use, and its compile caches are shared by every scan; after a few
    # shapes it retraces them with dynamic shapes, where scan(while_loop) trips an internal torch assertion
    torch._dynamo.reset()
    with torch.no_grad():
        return module(*(torch.from_numpy(a) for a in arrays))


def _run_kiln_eager(module: Any, arrays: list[np.ndarray]) -> Any:
    return module(*(kiln.Tensor(a) for a in arrays))


def _pair(torch_class: type, kiln_class: type) -> tuple[Any, Any]:
    """The same model in torch and kiln, kiln holding torch's weights."""
    torch.manual_seed(0)
    reference = torch_class().eval()
    module = kiln_class().eval()
    module.load_state_dict(reference.state_dict())
    return reference, module


def _randn(seed: int, *shapes: tuple[int, ...]) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for shape in shapes]


def _ops(program: Any, op_class: type) -> list[Any]:
    return [op for op in program.body.walk() if isinstance(op, op_class)]


def _only(program: Any, op_class: type) -> Any:
    (op,) = _ops(program, op_class)
    return op


def _names(block: Block) -> list[str]:
    return [op.name for op in block.ops]


# ---------------------------------------------------------------------------------------------
# kiln.scan: pytree carries and xs, dim=1, reverse=True, a parameter and closures, symbolic batch and length


class TorchScanModel(torch.nn.Module):
    """Two carries, the second passed on unchanged; two xs in a dict, scanned along dim 1 from the end; the body
    reads a parameter, a tensor computed from the inputs and a constant tensor it closes over."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(FEATURES, FEATURES) * 0.5)

    def forward(self, a, b, h, c):
        offset = h.mean(0) * 0.5
        decay = torch.tensor(DECAY)

        def combine(carry, x):
            state, passed = carry
            new = torch.tanh(x["a"] @ self.weight + state * decay + offset) * x["b"].unsqueeze(-1)
            # torch refuses a carry returned as it came in (aliasing); kiln takes it as it is
            return (new, passed.clone()), (new + passed, x["b"] * 2)

        return torch_scan(combine, (h, c), {"a": a, "b": b}, dim=1, reverse=True)


class KilnScanModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(kiln.randn(FEATURES, FEATURES))

    def forward(self, a, b, h, c):
        offset = h.mean(0) * 0.5
        decay = kiln.tensor(DECAY)

        def combine(carry, x):
            state, passed = carry
            new = kiln.tanh(x["a"] @ self.weight + state * decay + offset) * x["b"].unsqueeze(-1)
            return (new, passed), (new + passed, x["b"] * 2)

        return kiln.scan(combine, (h, c), {"a": a, "b": b}, dim=1, reverse=True)


def _scan_inputs(batch: int, length: int) -> list[np.ndarray]:
    return _randn(length, (batch, length, FEATURES), (batch, length), (batch, FEATURES), (batch, FEATURES))


@pytest.fixture(scope="module")
def scan_models():
    return _pair(TorchScanModel, KilnScanModel)


@pytest.fixture(scope="module")
def scan_program(scan_models):
    _, module = scan_models
    batch, length = kiln.Dim("batch"), kiln.Dim("length")
    example = [kiln.Tensor(a) for a in _scan_inputs(3, 5)]
    return kiln.export(module, tuple(example), dynamic_shapes={
        "a": {0: batch, 1: length}, "b": {0: batch, 1: length}, "h": {0: batch}, "c": {0: batch}})


@pytest.mark.parametrize("length", [1, 7])
def test_scan_eagerly_matches_torch(scan_models, length):
    reference, module = scan_models
    inputs = _scan_inputs(2, length)
    expected = _run_torch(reference, inputs)
    (state, passed), (ys, doubled) = _run_kiln_eager(module, inputs)
    assert tuple(ys.shape) == (2, length, FEATURES)  # the per-step outputs stacked along dim 1, as torch does
    _close(((state, passed), (ys, doubled)), expected)


def test_one_exported_scan_matches_torch_at_every_length(scan_models, scan_program):
    reference, _ = scan_models
    for batch, length in zip(BATCHES, LENGTHS):
        inputs = _scan_inputs(batch, length)
        _close(scan_program(*inputs), _run_torch(reference, inputs))


def test_exported_scan_is_one_op_with_symbolic_types_and_captured_operands(scan_program):
    scan = _only(scan_program, ScanOp)
    carry_types = [v.type.short() for v in scan.init]
    assert carry_types == ["f32[batch, 4]", "f32[batch, 4]"]
    # scanned over dim 0 after the frontend's movedim: the trip count is the length symbol, the batch stays symbolic
    assert [r.type.short() for r in scan.stacked] == ["f32[length, batch, 4]", "f32[length, batch]"]
    # the parameter, the closure computed from h and the lifted constant became operands, torch's additional_inputs
    kinds = {spec.name: spec.kind.name for spec in scan_program.graph_signature.input_specs}
    operand_names = [v.name_hint for v in scan.operands_]
    assert len(operand_names) == 3 and "p_weight" in operand_names
    assert any(kinds.get(name) == "CONSTANT_TENSOR" for name in operand_names), operand_names
    body = scan.body.block
    assert len(body.args) == 2 + 2 + 3
    assert body.last_op.operands[1] is body.args[1]  # the unchanged carry is yielded as it came in


def test_scan_prints_as_torch_and_verifies(scan_program):
    text = str(scan_program)
    assert "torch.ops.higher_order.scan(scan_combine_graph_0, [h, c], [" in text
    assert "class scan_combine_graph_0(torch.nn.Module):" in text
    body = text[text.index("class scan_combine_graph_0"):]
    assert 'carry0: "f32[batch, 4]"' in body and "aten.tanh.default(" in body
    scan_program.verify()


def test_scan_without_xs_returns_init_as_torch_does():
    init = kiln.randn(3)
    carry, ys = kiln.scan(lambda c, x: (c, x), init, [])
    assert carry is init and ys == []
    torch_init = torch.randn(3)
    assert torch_scan(lambda c, x: (c, x), torch_init, []) == (torch_init, [])


@pytest.mark.parametrize("outer_first", [True, False], ids=["outer-first", "step-first"])
def test_a_body_op_mixing_an_outer_value_with_its_own_records_in_the_body(outer_first):
    """`context * row` in a scan body, the captured value first, records in the body as `row * context` does (the
    op went to the first tensor's trace, the outer one, and failed: "a tensor from another trace was used here")."""
    def step(context):
        def body(h, row):
            h = ((context * row) if outer_first else (row * context)) + h
            return h, h.tanh()
        return body

    class Model(nn.Module):
        def forward(self, x, steps):
            return kiln.scan(step(x.relu()), kiln.zeros(FEATURES), steps)[1]

    x, steps = np.linspace(-1, 1, FEATURES, dtype=np.float32), np.random.default_rng(0).standard_normal(
        (5, FEATURES)).astype(np.float32)
    program = kiln.export(Model(), (kiln.Tensor(x), kiln.Tensor(steps[:3])),
                          dynamic_shapes={"steps": {0: kiln.Dim("seq")}})
    (scan,) = [op for op in program.nodes() if isinstance(op, ScanOp)]
    assert [op.name for op in scan.body.block.ops][:1] == ["aten.mul.Tensor"]
    torch_body = step(torch.from_numpy(x).relu())
    expected = torch_scan(torch_body, torch.zeros(FEATURES), torch.from_numpy(steps))[1]
    torch.testing.assert_close(torch.from_numpy(np.asarray(program(x, steps))), expected)


# ---------------------------------------------------------------------------------------------
# kiln.while_loop: a counter loop with a captured parameter, and a data-dependent trip count


class TorchCounterLoop(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(FEATURES, FEATURES) * 0.5)

    def forward(self, x):
        def cond_fn(i, state):
            return i < 5

        def body_fn(i, state):
            return i + 1, torch.tanh(state @ self.weight + 0.1)

        return torch_while_loop(cond_fn, body_fn, (torch.zeros((), dtype=torch.int64), x))


class KilnCounterLoop(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(kiln.randn(FEATURES, FEATURES))

    def forward(self, x):
        def cond_fn(i, state):
            return i < 5

        def body_fn(i, state):
            return i + 1, kiln.tanh(state @ self.weight + 0.1)

        return kiln.while_loop(cond_fn, body_fn, (kiln.zeros((), dtype=kiln.int64), x))


class TorchDoublingLoop(torch.nn.Module):
    """`while x.abs().sum() < limit: x = x * 2`: the trip count depends on the values."""

    def forward(self, x, limit):
        def cond_fn(steps, x):
            return x.abs().sum() < limit

        def body_fn(steps, x):
            return steps + 1, x * 2

        return torch_while_loop(cond_fn, body_fn, (torch.zeros((), dtype=torch.int64), x))


class KilnDoublingLoop(nn.Module):
    def forward(self, x, limit):
        def cond_fn(steps, x):
            return x.abs().sum() < limit

        def body_fn(steps, x):
            return steps + 1, x * 2

        return kiln.while_loop(cond_fn, body_fn, (kiln.zeros((), dtype=kiln.int64), x))


@pytest.fixture(scope="module")
def counter_models():
    return _pair(TorchCounterLoop, KilnCounterLoop)


@pytest.fixture(scope="module")
def counter_program(counter_models):
    _, module = counter_models
    return kiln.export(module, (kiln.Tensor(_randn(0, (3, FEATURES))[0]),),
                       dynamic_shapes={"x": {0: kiln.Dim("batch")}})


@pytest.fixture(scope="module")
def doubling_program():
    example = [kiln.Tensor(a) for a in _randn(0, (2, FEATURES))] + [kiln.tensor(10.0)]
    return kiln.export(KilnDoublingLoop(), tuple(example), dynamic_shapes={"x": {0: kiln.Dim("batch")}, "limit": None})


def test_counter_loop_eagerly_matches_torch(counter_models):
    reference, module = counter_models
    inputs = _randn(1, (3, FEATURES))
    _close(_run_kiln_eager(module, inputs), _run_torch(reference, inputs))


def test_exported_counter_loop_matches_torch(counter_models, counter_program):
    reference, _ = counter_models
    for batch in (1, 6):
        inputs = _randn(batch, (batch, FEATURES))
        count, state = counter_program(*inputs)
        assert int(count) == 5
        _close((count, state), _run_torch(reference, inputs))
    loop = _only(counter_program, WhileLoopOp)
    assert [v.name_hint for v in loop.operands_] == ["p_weight"]  # the captured parameter is an operand
    assert [r.type.short() for r in loop.results] == ["i64[]", "f32[batch, 4]"]


@pytest.mark.parametrize("limit", [0.5, 10.0, 1e6])  # zero, a few and many trips
def test_data_dependent_while_loop_matches_torch_eagerly_and_exported(doubling_program, limit):
    inputs = _randn(2, (2, FEATURES)) + [np.array(limit, np.float32)]
    expected = _run_torch(TorchDoublingLoop(), inputs)
    _close(_run_kiln_eager(KilnDoublingLoop(), inputs), expected)
    _close(doubling_program(*inputs), expected)
    wider = _randn(3, (5, FEATURES)) + [np.array(limit, np.float32)]
    _close(doubling_program(*wider), _run_torch(TorchDoublingLoop(), wider))


def test_while_loop_prints_as_torch_and_verifies(counter_program):
    text = str(counter_program)
    assert "torch.ops.higher_order.while_loop(while_loop_cond_graph_0, while_loop_body_graph_0, [" in text
    assert "class while_loop_cond_graph_0(torch.nn.Module):" in text
    cond_graph = text[text.index("class while_loop_cond_graph_0"):text.index("class while_loop_body_graph_0")]
    assert "aten.lt.Scalar(" in cond_graph and "return (lt,)" in cond_graph
    counter_program.verify()


# ---------------------------------------------------------------------------------------------
# kiln.map: several xs and extra arguments


class TorchMapModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(FEATURES, 3) * 0.5)

    def forward(self, xs, zs, bias):
        def body(sliced, bias, scale):
            x, z = sliced["x"], sliced["z"]
            return torch.relu(x @ self.weight + bias) * scale, z.softmax(-1)

        return torch_map(body, {"x": xs, "z": zs}, bias, torch.tensor(2.0))


class KilnMapModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(kiln.randn(FEATURES, 3))

    def forward(self, xs, zs, bias):
        def body(sliced, bias, scale):
            x, z = sliced["x"], sliced["z"]
            return kiln.relu(x @ self.weight + bias) * scale, z.softmax(-1)

        return kiln.map(body, {"x": xs, "z": zs}, bias, kiln.tensor(2.0))


def _map_inputs(rows: int) -> list[np.ndarray]:
    return _randn(rows, (rows, 5, FEATURES), (rows, 6), (3,))


def test_map_matches_torch_eagerly_and_exported():
    reference, module = _pair(TorchMapModel, KilnMapModel)
    _close(_run_kiln_eager(module, _map_inputs(3)), _run_torch(reference, _map_inputs(3)))
    rows = kiln.Dim("rows")
    program = kiln.export(module, tuple(kiln.Tensor(a) for a in _map_inputs(3)),
                          dynamic_shapes={"xs": {0: rows}, "zs": {0: rows}, "bias": None})
    program.verify()
    map_op = _only(program, MapOp)
    assert len(map_op.xs) == 2 and [v.name_hint for v in map_op.operands_][:1] == ["bias"]
    assert [r.type.short() for r in map_op.results] == ["f32[rows, 5, 3]", "f32[rows, 6]"]
    assert "torch.ops.higher_order.map_impl(body_graph_0, [xs, zs], [bias" in str(program)
    for count in (1, 7):
        inputs = _map_inputs(count)
        _close(program(*inputs), _run_torch(reference, inputs))


# ---------------------------------------------------------------------------------------------
# nesting: scan in map, while_loop in a scan body, cond in a scan body


class TorchScanInMap(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(FEATURES, FEATURES) * 0.5)

    def forward(self, rows):
        def per_row(row, weight):
            def combine(carry, x):
                new = torch.tanh(carry @ weight + x)
                return new, new * 2

            return torch_scan(combine, torch.zeros(FEATURES), row)[1]

        return torch_map(per_row, rows, self.weight)


class KilnScanInMap(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(kiln.randn(FEATURES, FEATURES))

    def forward(self, rows):
        def per_row(row, weight):
            def combine(carry, x):
                new = kiln.tanh(carry @ weight + x)
                return new, new * 2

            return kiln.scan(combine, kiln.zeros(FEATURES), row)[1]

        return kiln.map(per_row, rows, self.weight)


class TorchWhileInScan(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(FEATURES, FEATURES) * 0.5)

    def forward(self, xs, h):
        def combine(carry, x):
            new = torch.tanh(carry @ self.weight + x)
            steps, grown = torch_while_loop(lambda i, v: v.abs().sum() < 10.0, lambda i, v: (i + 1, v * 2 + 0.1),
                                            (torch.zeros((), dtype=torch.int64), new))
            return new, grown + steps

        return torch_scan(combine, h, xs)


class KilnWhileInScan(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(kiln.randn(FEATURES, FEATURES))

    def forward(self, xs, h):
        def combine(carry, x):
            new = kiln.tanh(carry @ self.weight + x)
            steps, grown = kiln.while_loop(lambda i, v: v.abs().sum() < 10.0, lambda i, v: (i + 1, v * 2 + 0.1),
                                           (kiln.zeros((), dtype=kiln.int64), new))
            return new, grown + steps

        return kiln.scan(combine, h, xs)


class TorchCondInScan(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(FEATURES, FEATURES) * 0.5)

    def forward(self, xs, h):
        def combine(carry, x):
            new = torch.tanh(carry @ self.weight + x)
            return new, torch_cond(new.sum() > 0, lambda v: v * 2, lambda v: v - 1, (new,))

        return torch_scan(combine, h, xs)


class KilnCondInScan(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(kiln.randn(FEATURES, FEATURES))

    def forward(self, xs, h):
        def combine(carry, x):
            new = kiln.tanh(carry @ self.weight + x)
            return new, kiln.cond(new.sum() > 0, lambda v: v * 2, lambda v: v - 1, (new,))

        return kiln.scan(combine, h, xs)


NESTED = {
    # name: (torch model, kiln model, inputs for a (batch, length), dynamic shapes, ops (outer, inner), printed)
    "scan_in_map": (TorchScanInMap, KilnScanInMap, lambda b, n: _randn(n, (b, n, FEATURES)),
                    {"rows": {0: kiln.Dim("batch"), 1: kiln.Dim("length")}}, (MapOp, ScanOp),
                    "torch.ops.higher_order.scan(scan_combine_graph_0"),
    "while_in_scan": (TorchWhileInScan, KilnWhileInScan, lambda b, n: _randn(n, (n, b, FEATURES), (b, FEATURES)),
                      {"xs": {0: kiln.Dim("length"), 1: kiln.Dim("batch")}, "h": {0: kiln.Dim("batch")}},
                      (ScanOp, WhileLoopOp), "torch.ops.higher_order.while_loop(while_loop_cond_graph_0"),
    "cond_in_scan": (TorchCondInScan, KilnCondInScan, lambda b, n: _randn(n, (n, FEATURES), (FEATURES,)),
                     {"xs": {0: kiln.Dim("length")}, "h": None}, (ScanOp, CondOp),
                     "torch.ops.higher_order.cond(gt, true_graph_0, false_graph_0"),
}


@pytest.mark.parametrize("name", NESTED)
def test_nested_loops_match_torch_eagerly_and_exported(name):
    torch_class, kiln_class, inputs, dynamic_shapes, (outer_class, inner_class), printed = NESTED[name]
    reference, module = _pair(torch_class, kiln_class)
    _close(_run_kiln_eager(module, inputs(2, 3)), _run_torch(reference, inputs(2, 3)))
    program = kiln.export(module, tuple(kiln.Tensor(a) for a in inputs(2, 3)), dynamic_shapes=dynamic_shapes)
    program.verify()
    outer = _only(program, outer_class)
    inner = [op for op in outer.walk() if isinstance(op, inner_class)]
    assert len(inner) == 1 and inner[0].parent_op() is outer  # the inner loop lives in the outer one's region
    assert printed in str(program)
    for batch, length in ((1, 1), (3, 7)):
        arrays = inputs(batch, length)
        _close(program(*arrays), _run_torch(reference, arrays))


# ---------------------------------------------------------------------------------------------
# verification of hand-built and hand-broken loops


def test_a_scan_whose_body_yields_a_carry_of_another_type_fails_verification():
    carry_type, xs_type = TensorType.of([3], "float32"), TensorType.of([5, 2], "float32")
    outer = Block(arg_types=[carry_type, xs_type])
    body = Block(arg_types=[carry_type, TensorType.of([2], "float32")])
    body.add_op(YieldOp([body.args[1], body.args[0]]))  # yields the f32[2] slice as the f32[3] carry
    scan = ScanOp([outer.args[0]], [outer.args[1]], [], [carry_type, TensorType.of([5, 3], "float32")], body)
    with pytest.raises(VerificationError, match=r"kiln\.scan: the body yields carries \[f32\[2\]\] but the initial "
                                                r"carries are \[f32\[3\]\]") as caught:
        scan.verify()
    assert "fix: return a next carry with the initial carry's shape and dtype" in str(caught.value)


def test_a_broken_scan_inside_a_program_fails_program_verify(scan_program):
    broken = kiln.passes.clone_program(scan_program)
    body = _only(broken, ScanOp).body.block
    body.last_op.operands[1] = body.args[3]  # the f32[batch] slice of b in place of the f32[batch, 4] carry
    with pytest.raises(VerificationError, match=r"kiln\.scan: the body yields carries \[f32\[batch, 4\], "
                                                r"f32\[batch\]\] but the initial carries are"):
        broken.verify()
    scan_program.verify()  # the original is untouched


def test_a_while_loop_whose_cond_yields_a_float_fails_verification(counter_program):
    broken = kiln.passes.clone_program(counter_program)
    cond_block = _only(broken, WhileLoopOp).cond_region.block
    cond_block.last_op.operands[0] = cond_block.args[1]  # the f32[batch, 4] state instead of the bool predicate
    with pytest.raises(VerificationError, match=r"kiln\.while_loop: the cond region must yield one 0-d bool "
                                                r"tensor, got \[f32\[batch, 4\]\]"):
        broken.verify()


def test_a_while_loop_body_changing_a_carried_type_fails_verification(counter_program):
    broken = kiln.passes.clone_program(counter_program)
    body = _only(broken, WhileLoopOp).body.block
    body.last_op.operands[0] = body.args[1]
    with pytest.raises(VerificationError, match=r"kiln\.while_loop: the body yields \[f32\[batch, 4\], "
                                                r"f32\[batch, 4\]\] but the carried values are"):
        broken.verify()


# ---------------------------------------------------------------------------------------------
# run_decompositions and the pass pipeline recurse into loop bodies and keep the values


class TorchPassModel(torch.nn.Module):
    """A scan body with something for each pass: a linear to decompose, an expression written twice, a dead op,
    a multiplication by one, and a zeros factory the forward also builds; the scan reads `decay * 0.5`, which
    fold-constants{freeze=true} folds outside the loop."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(FEATURES, FEATURES)
        self.decay = torch.nn.Parameter(torch.tensor(DECAY))

    def forward(self, xs, h):
        floor = torch.zeros(FEATURES)
        decay = self.decay * 0.5

        def combine(carry, x):
            x.exp()  # unused
            first = torch.tanh(self.linear(x) + carry)
            second = torch.tanh(self.linear(x) + carry)
            new = torch.maximum(first * decay, torch.zeros(FEATURES)) * 1.0
            return new, first + second

        return torch_scan(combine, torch.maximum(h, floor), xs)


class KilnPassModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(FEATURES, FEATURES)
        self.decay = nn.Parameter(kiln.zeros(FEATURES))

    def forward(self, xs, h):
        floor = kiln.zeros(FEATURES)
        decay = self.decay * 0.5

        def combine(carry, x):
            x.exp()  # unused
            first = kiln.tanh(self.linear(x) + carry)
            second = kiln.tanh(self.linear(x) + carry)
            new = kiln.maximum(first * decay, kiln.zeros(FEATURES)) * 1.0
            return new, first + second

        return kiln.scan(combine, kiln.maximum(h, floor), xs)


def _pass_inputs(length: int) -> list[np.ndarray]:
    return _randn(length, (length, FEATURES), (FEATURES,))


@pytest.fixture(scope="module")
def pass_case():
    """(the exported program, torch's results at each length)."""
    reference, module = _pair(TorchPassModel, KilnPassModel)
    program = kiln.export(module, tuple(kiln.Tensor(a) for a in _pass_inputs(3)),
                          dynamic_shapes={"xs": {0: kiln.Dim("length")}, "h": None})
    expected = {length: _run_torch(reference, _pass_inputs(length)) for length in LENGTHS[:2]}
    return program, expected


def _body(program: Any) -> Block:
    return _only(program, ScanOp).body.block


def _assert_closed(block: Block) -> None:
    """The body reads nothing from outside but its arguments, as torch's subgraphs take every outer value as an
    input (the interpreter and the .pt2 writer rely on it)."""
    defined = set(block.args) | {result for op in block.ops for result in op.results}
    outside = [op.name for op in block.ops if any(operand not in defined for operand in op.operands)]
    assert not outside, f"{outside} read values from outside the region"


def _assert_matches_torch(program: Any, expected: dict[int, Any]) -> None:
    program.verify()
    _assert_closed(_body(program))
    for length, torch_result in expected.items():
        _close(program(*_pass_inputs(length)), torch_result)


def test_pass_model_matches_torch_before_any_pass(pass_case):
    program, expected = pass_case
    _assert_matches_torch(program, expected)
    names = _names(_body(program))
    assert names.count("aten.linear.default") == 2 and names.count("aten.tanh.default") == 2
    assert "aten.exp.default" in names and "aten.full.default" in names and "aten.mul.Scalar" in names


def test_run_decompositions_decomposes_inside_the_scan_body(pass_case):
    program, expected = pass_case
    decomposed = program.run_decompositions()
    names = _names(_body(decomposed))
    assert "aten.linear.default" not in names and names.count("aten.addmm.default") == 2, names
    assert "torch.ops.higher_order.scan(scan_combine_graph_0" in str(decomposed)
    _assert_matches_torch(decomposed, expected)
    # the retraced scan keeps its symbolic trip count
    assert str(_only(decomposed, ScanOp).stacked[0].type.shape[0]) == "length"


def test_cse_merges_the_duplicate_expression_in_the_body(pass_case):
    program, expected = pass_case
    merged = kiln.passes.run(program, "cse", verify_each=True)
    names = _names(_body(merged))
    assert names.count("aten.tanh.default") == 1 and names.count("aten.linear.default") == 1, names
    # the body keeps its own zeros, identical to the forward's: reusing that one would read from outside the body
    assert names.count("aten.full.default") == 1 and _names(merged.body).count("aten.full.default") == 1
    _assert_matches_torch(merged, expected)


def test_dce_removes_the_dead_op_in_the_body(pass_case):
    program, expected = pass_case
    cleaned = kiln.passes.run(program, "dce", verify_each=True)
    names = _names(_body(cleaned))
    assert "aten.exp.default" not in names and names.count("aten.tanh.default") == 2
    _assert_matches_torch(cleaned, expected)


def test_canonicalize_removes_the_multiplication_by_one_in_the_body(pass_case):
    program, expected = pass_case
    canonical = kiln.passes.run(program, "canonicalize", verify_each=True)
    assert "aten.mul.Scalar" not in _names(_body(canonical))
    _assert_matches_torch(canonical, expected)


def test_fold_constants_folds_the_frozen_weight_the_scan_reads(pass_case):
    program, expected = pass_case
    assert "aten.mul.Scalar" in _names(program.body)  # decay = self.decay * 0.5 in the forward
    folded = kiln.passes.run(program, "fold-constants{freeze=true}", verify_each=True)
    assert "aten.mul.Scalar" not in _names(folded.body)
    scan = _only(folded, ScanOp)
    kinds = {spec.name: spec.kind.name for spec in folded.graph_signature.input_specs}
    assert any(kinds.get(v.name_hint) == "CONSTANT_TENSOR" for v in scan.operands_)
    assert "p_decay" not in kinds  # the parameter it came from left the signature
    # nothing in the loop is constant: only the dead exp goes (fold-constants erases what is left unused)
    assert _names(scan.body.block) == [name for name in _names(_body(program)) if name != "aten.exp.default"]
    _assert_matches_torch(folded, expected)


def test_default_pipeline_keeps_torchs_values(pass_case):
    program, expected = pass_case
    optimized = kiln.passes.run(program, kiln.passes.DEFAULT_PIPELINE, verify_each=True)
    names = _names(_body(optimized))
    assert "aten.linear.default" not in names and "aten.exp.default" not in names
    assert names.count("aten.tanh.default") == 1 and names.count("aten.addmm.default") == 1, names
    _assert_matches_torch(optimized, expected)


@pytest.mark.parametrize("pipeline", ["decompose,cse,dce", "canonicalize,fold-constants{freeze=true},cse,dce"])
def test_pipelines_keep_nested_loops_values(pipeline):
    reference, module = _pair(TorchWhileInScan, KilnWhileInScan)
    inputs = NESTED["while_in_scan"][2]
    program = kiln.export(module, tuple(kiln.Tensor(a) for a in inputs(2, 3)),
                          dynamic_shapes=NESTED["while_in_scan"][3])
    optimized = kiln.passes.run(program, pipeline, verify_each=True)
    assert len(_ops(optimized, WhileLoopOp)) == 1
    for batch, length in ((1, 1), (3, 7)):
        arrays = inputs(batch, length)
        _close(optimized(*arrays), _run_torch(reference, arrays))


# ---------------------------------------------------------------------------------------------
# user mistakes: clear KilnErrors, eagerly and while exporting


class _Calls(nn.Module):
    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, h, x):
        return self.fn(h, x)


def _counter() -> kiln.Tensor:
    return kiln.zeros((), dtype=kiln.int64)


MISTAKES = {
    "scan carry changes shape": (
        lambda h, x: kiln.scan(lambda c, xt: (kiln.cat([c, xt]), xt), h, x),
        r"kiln\.scan: combine_fn returns carries \[f32\[6\]\] but init is \[f32\[3\]\]"),
    "scan carry changes dtype": (
        lambda h, x: kiln.scan(lambda c, xt: ((c + xt).to(kiln.float64), xt), h, x),
        r"kiln\.scan: combine_fn returns carries \[f64\[3\]\] but init is \[f32\[3\]\]"),
    "combine_fn returns one value": (
        lambda h, x: kiln.scan(lambda c, xt: c + xt, h, x), r"kiln\.scan: combine_fn must return \(next_carry, y\)"),
    "combine_fn returns three values": (
        lambda h, x: kiln.scan(lambda c, xt: (c, xt, xt), h, x), r"combine_fn must return \(next_carry, y\)"),
    "scan with empty init": (
        lambda h, x: kiln.scan(lambda c, xt: (c, xt), (), x), r"kiln\.scan needs at least one carry in init"),
    "scan init leaf is a float": (
        lambda h, x: kiln.scan(lambda c, xt: (c, xt), (h, 1.0), x),
        r"kiln\.scan init leaves must be tensors, got float"),
    "scan xs leaf is an int": (
        lambda h, x: kiln.scan(lambda c, xt: (c, xt), h, [x, 3]), r"kiln\.scan xs leaves must be tensors, got int"),
    "scan output is an int": (
        lambda h, x: kiln.scan(lambda c, xt: (c + xt, 3), h, x),
        r"kiln\.scan combine_fn's carries and outputs must be tensors, got int"),
    "while cond returns a float tensor": (
        lambda h, x: kiln.while_loop(lambda i, v: v.sum(), lambda i, v: (i + 1, v * 2), (_counter(), h)),
        r"kiln\.while_loop: cond_fn must return one 0-d bool tensor, got \[f32\[\]\]"),
    "while cond returns a 1-d bool tensor": (
        lambda h, x: kiln.while_loop(lambda i, v: (v.sum() < 10).reshape(1), lambda i, v: (i + 1, v * 2),
                                     (_counter(), h)),
        r"kiln\.while_loop: cond_fn must return one 0-d bool tensor, got \[i1\[1\]\]"),
    "while body changes a carried shape": (
        lambda h, x: kiln.while_loop(lambda v: v.sum() < 10, lambda v: (kiln.cat([v, v]),), (h + 1,)),
        r"kiln\.while_loop: body_fn returns \[f32\[6\]\] but the carried inputs are \[f32\[3\]\]"),
    "while body changes a carried dtype": (
        lambda h, x: kiln.while_loop(lambda v: v.sum() < 10, lambda v: ((v * 2).to(kiln.float64),), (h + 1,)),
        r"kiln\.while_loop: body_fn returns \[f64\[3\]\] but the carried inputs are \[f32\[3\]\]"),
    "while body returns a bare tensor": (
        lambda h, x: kiln.while_loop(lambda v: v.sum() < 10, lambda v: v * 2, (h + 1,)),
        r"kiln\.while_loop: body_fn must return a tuple of the carried values, got Tensor"),
    "while carried int": (
        lambda h, x: kiln.while_loop(lambda i, v: v.sum() < 10, lambda i, v: (i + 1, v * 2), (0, h)),
        r"kiln\.while_loop carried inputs must be tensors, got int"),
    "while with nothing carried": (
        lambda h, x: kiln.while_loop(lambda: True, lambda: (), ()),
        r"kiln\.while_loop needs at least one carried tensor"),
    "map xs leaf is an int": (
        lambda h, x: kiln.map(lambda xs, bias: xs[0] + bias, [x, 2], h),
        r"kiln\.map xs leaves must be tensors, got int"),
    "map without xs": (
        lambda h, x: kiln.map(lambda: h, []), r"kiln\.map needs tensors with a leading dim to map over"),
}


@pytest.mark.parametrize("mode", ["eager", "export"])
@pytest.mark.parametrize("mistake", MISTAKES)
def test_user_mistakes_raise_clear_kiln_errors(mistake, mode):
    fn, message = MISTAKES[mistake]
    h, x = kiln.randn(3), kiln.randn(4, 3)
    with pytest.raises(KilnError, match=message) as caught:
        if mode == "eager":
            fn(h, x)
        else:
            kiln.export(_Calls(fn), (h, x))
    assert "test_loops.py" in (caught.value.source or ""), caught.value  # points at the user's line


TORCH_REFUSES = {
    # the oracle for the mistakes above: torch refuses them too
    "scan carry changes shape": (
        lambda: torch_scan(lambda c, xt: (torch.cat([c, xt]), xt.clone()), torch.zeros(3), torch.randn(4, 3)),
        "Expected init and carry to have same metadata"),
    "while cond returns a float tensor": (
        lambda: torch_while_loop(lambda i, v: v.sum(), lambda i, v: (i + 1, v * 2),
                                 (torch.zeros((), dtype=torch.int64), torch.ones(3))),
        "unsupported cond_fn return type"),
    "while body changes a carried shape": (
        lambda: torch_while_loop(lambda v: v.sum() < 10, lambda v: (torch.cat([v, v]),), (torch.ones(3),)),
        "Expected body_fn_output and carried_inputs to have same metadata"),
}


@pytest.mark.parametrize("mistake", TORCH_REFUSES)
def test_torch_refuses_the_same_mistakes(mistake):
    call, message = TORCH_REFUSES[mistake]
    torch._dynamo.reset()
    with pytest.raises(RuntimeError, match=message):
        call()
