"""Static memory planning: temporaries share one arena, live buffers never overlap, and the saving is real."""

from __future__ import annotations

import functools
import itertools
import json
import shutil

import pytest
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

import kiln
import kiln.models
from kiln.cli.main import main
from kiln.codegen.c.packing import tile_sizes
from kiln.codegen.c.render import dim_expr
from kiln.codegen.memory import (
    Lifetime, MemoryPlanError, align, buffer_bytes, kernel_reads, kernel_writes, lifetimes, plan_memory, verify_plan)
from kiln.codegen.c.target import TARGET
from kiln.codegen.kernels import (
    Apply, Buffer, CatDetail, Gather, Kernel, Load, MatmulDetail, PadDetail, Schedule, View, WindowDetail,
)
from kiln.codegen.schedule import schedule
from kiln.ir import dtypes
from kiln.ir.errors import KilnError
from kiln.ir.symbolic import ValueRange, evaluate_dim, parse_dim, symbol
from kiln.passes import run as run_passes
from kiln.codegen.driver import DEFAULT_PIPELINE

N, M = symbol("n"), symbol("m")
F32 = dtypes.float32


@functools.lru_cache(maxsize=None)
def _zoo(name):
    entry = kiln.models.get(name)
    program = kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes)
    program = run_passes(program, DEFAULT_PIPELINE)
    return entry, program, schedule(program, TARGET)


def _bindings(entry, program, plan_schedule):
    """Each dynamic dim at its example size, its other test sizes and its range's ends (every combination)."""
    dims = entry.dynamic_shapes[next(iter(entry.dynamic_shapes))]
    x = entry.args[0]
    values = {}
    for axis, dim in dims.items():
        s = symbol(dim.__name__)
        allowed = program.range_constraints[s]
        values[s] = sorted({x.shape[axis], *entry.dim_examples[dim.__name__], int(allowed.lower), int(allowed.upper)})
    assert set(values) == set(plan_schedule.symbols)
    return [dict(zip(values, combo)) for combo in itertools.product(*values.values())]


def _live_peak(sched, binding):
    """The least any plan can use: the largest total of buffers live during one kernel."""
    live = lifetimes(sched)
    return max(sum(evaluate_dim(buffer_bytes(b), binding) for b, life in live.items()
                   if life.first <= k <= life.last) for k in range(len(sched.kernels)))


@pytest.mark.parametrize("name", sorted(kiln.models.MODELS))
def test_zoo_plan_never_overlaps_live_buffers_and_saves_memory(name):
    entry, program, sched = _zoo(name)
    plan = plan_memory(sched, program.range_constraints)
    temps = [b for b in sched.buffers if b.kind == "temp" and b.inside is None]
    assert set(plan.offsets) == set(temps) and plan.peak_bytes == plan.arena_bytes
    # a cat's part placed in its result (the LSTM's stacked steps) has no offset: it lives at its home's
    assert all(b.home()[0] in plan.offsets or b.home()[0].kind == "output" for b in sched.buffers if b.inside)
    bindings = _bindings(entry, program, sched)
    assert all(len({b[s] for b in bindings}) >= 3 for s in sched.symbols)
    for binding in bindings:
        verify_plan(sched, plan, binding)
        arena, naive = evaluate_dim(plan.arena_bytes, binding), evaluate_dim(plan.unplanned_bytes, binding)
        assert _live_peak(sched, binding) <= arena <= naive
        if len(temps) > 3:
            assert arena < naive, (name, binding, plan.describe())
    # The renderer's dim_expr turns every offset and the arena size into C as it stands.
    for expr in [plan.arena_bytes, *plan.offsets.values()]:
        assert dim_expr(expr)


def test_zoo_mlp_plan_by_hand():
    """relu [b,64] and relu_1 [b,64] (256*b bytes each) are live together; addmm [b,10] (40*b) reuses relu's slot."""
    _, program, sched = _zoo("mlp")
    plan = plan_memory(sched, program.range_constraints)
    batch = symbol("batch")
    relu, relu_1, addmm = [b for b in sched.buffers if b.kind == "temp"]
    assert [s.buffers for s in plan.slots] == [[relu, addmm], [relu_1]]
    assert plan.offset_of(relu) == plan.offset_of(addmm) == 0 and plan.offset_of(relu_1) == 256 * batch
    assert plan.arena_bytes == 512 * batch
    assert plan.unplanned_bytes == 512 * batch + align(40 * batch)
    assert plan.describe() == "arena 512*batch bytes (naive 512*batch + 64*ceiling(5*batch/8); 2 slots for 3 temps)"
    with pytest.raises(KilnError, match="not a temporary"):
        plan.offset_of(sched.inputs[0])


# ---------------------------------------------------------------------------------------------
# Hand-built schedules

def _buffer(index, shape, kind="temp", dtype=F32):
    return Buffer(index, f"b{index}", dtype, list(shape), kind)


def _unary(source, out, name="relu"):
    load = Load(source, [sympy.Integer(1)] * len(source.shape), sympy.Integer(0))
    return Kernel("pointwise", name, [f"aten.{name}.default"], [out], list(out.shape), Apply(f"aten.{name}.default",
                                                                                           [load], out.dtype))


def _schedule(buffers, kernels):
    inputs = [b for b in buffers if b.kind == "input"]
    outputs = [(b, b.shape) for b in buffers if b.kind == "output"]
    symbols = sorted({s for b in buffers for d in b.shape for s in getattr(d, "free_symbols", ())}, key=str)
    return Schedule(buffers, kernels, inputs, outputs, symbols, [b.name for b, _ in outputs], [b.name for b in inputs])


def test_chain_alternates_between_two_slots():
    """in -> t0 -> t1 -> t2 -> t3 -> out: each temp dies when the next-but-one is born, so two slots suffice."""
    x = _buffer(0, [N, 16], "input")
    t = [_buffer(i, [N, 16]) for i in range(1, 5)]
    out = _buffer(5, [N, 16], "output")
    chain = [x, *t, out]
    sched = _schedule(chain, [_unary(a, b) for a, b in zip(chain, chain[1:])])
    plan = plan_memory(sched)
    assert [plan.lifetimes[b] for b in t] == [Lifetime(0, 1), Lifetime(1, 2), Lifetime(2, 3), Lifetime(3, 4)]
    assert [plan.offset_of(b) for b in t] == [0, 64 * N, 0, 64 * N]
    assert plan.arena_bytes == 128 * N and plan.unplanned_bytes == 256 * N and len(plan.slots) == 2
    for n in (1, 2, 7, 1000):
        verify_plan(sched, plan, {N: n})


def test_unread_temp_holds_bytes_while_its_writer_runs():
    x = _buffer(0, [N], "input")
    t0, values, indices, out = _buffer(1, [N]), _buffer(2, [N]), _buffer(3, [N], dtype=dtypes.int64), \
        _buffer(4, [N], "output")
    pool = Kernel("window", "pool", ["aten.max_pool2d_with_indices.default"], [values, indices], [N], None,
                  WindowDetail(View(t0, [N], [sympy.Integer(1)]), 2))
    sched = _schedule([x, t0, values, indices, out], [_unary(x, t0), pool, _unary(values, out)])
    plan = plan_memory(sched)
    assert plan.lifetimes[indices] == Lifetime(1, 1)
    starts = {plan.offset_of(b) for b in (t0, values, indices)}
    assert len(starts) == 3  # all three live in kernel 1
    assert plan.arena_bytes == align(4 * N) * 2 + align(8 * N)
    for n in (1, 3, 16, 17):
        verify_plan(sched, plan, {N: n})


def test_reuse_grow_and_new_slot_policy():
    """Best fit when a dead slot provably covers the buffer; grow a dead slot that is provably smaller;
    a new slot when the sizes are not comparable, unless the ranges make them comparable."""
    x = _buffer(0, [N, M], "input")
    small, done, big, other, out = (_buffer(1, [N, 8]), _buffer(2, [N, 1]), _buffer(3, [N, 16]), _buffer(4, [M, 16]),
                                    _buffer(5, [N, M], "output"))
    kernels = [_unary(x, small), _unary(small, done), _unary(done, big), _unary(big, other), _unary(other, out)]
    sched = _schedule([x, small, done, big, other, out], kernels)
    plan = plan_memory(sched)
    # big (64n) takes small's dead slot (32n), growing it; other (64m) is not comparable with done's slot (4n).
    assert plan.offset_of(big) == plan.offset_of(small) == 0
    assert [s.size for s in plan.slots] == [64 * N, 4 * N, 64 * M]
    assert plan.arena_bytes == 64 * N + align(4 * N) + 64 * M
    ranged = plan_memory(sched, {N: ValueRange(100, 200), M: ValueRange(1, 4)})
    # With n >= 100 and m <= 4, other's 64*m <= 256 <= 4*n bytes: it provably fits done's dead slot.
    assert ranged.offset_of(other) == ranged.offset_of(done) and len(ranged.slots) == 2
    for n, m in itertools.product((1, 5, 100, 200), (1, 3, 4)):
        verify_plan(sched, plan, {N: n, M: m})
    for n, m in itertools.product((100, 150, 200), (1, 2, 4)):
        verify_plan(sched, ranged, {N: n, M: m})


def test_kernel_reads_walks_every_detail_shape():
    buffers = [_buffer(i, [N]) for i in range(8)]
    a, b, bias, table, index, part, view_only, out = buffers
    detail = MatmulDetail((a, [0, 1, 1], 0), (b, [0, 1, 1], 0), N, bias=Load(bias, [1], 0), alpha=1.0)
    expr = Apply("aten.add.Tensor", [Gather(View(table, [N, 4], [4, 1]), Load(index, [1], 0), F32),
                                     Load(a, [1], 0), 1], F32)
    kernel = Kernel("matmul", "addmm", ["aten.addmm.default"], [out], [N], expr, detail)
    assert set(kernel_reads(kernel)) == {a, b, bias, table, index}
    assert len(kernel_reads(kernel)) == 5  # each once
    assert kernel_writes(kernel) == [out]
    cat = Kernel("cat", "cat", ["aten.cat.default"], [out], [N], None, CatDetail([(Load(part, [1], 0), [N], 0)], 0))
    pad = Kernel("pad", "pad", ["aten.constant_pad_nd.default"], [out], [N], None,
                 PadDetail(View(view_only, [N], [1]), [0], 0.0, "constant"))
    assert kernel_reads(cat) == [part] and kernel_reads(pad) == [view_only]


def test_verify_plan_rejects_overlapping_live_buffers():
    x = _buffer(0, [N], "input")
    t0, t1, out = _buffer(1, [N]), _buffer(2, [N]), _buffer(3, [N], "output")
    sched = _schedule([x, t0, t1, out], [_unary(x, t0), _unary(t0, t1), _unary(t1, out)])
    plan = plan_memory(sched)
    verify_plan(sched, plan, {N: 5})
    plan.offsets[t1] = plan.offsets[t0]  # both are live in kernel 1
    with pytest.raises(MemoryPlanError, match="overlap while both are live"):
        verify_plan(sched, plan, {N: 5})
    plan.offsets[t1] = sympy.Integer(4)
    with pytest.raises(MemoryPlanError, match="misaligned"):
        verify_plan(sched, plan, {N: 5})


@st.composite
def _random_schedules(draw):
    """A DAG of pointwise-like kernels: each writes one or two temps and reads up to three earlier buffers."""
    shapes = [[N], [N, 3], [M, 5], [N, M], [7], [N, N], [2, M, 3]]
    pick_dtype = st.sampled_from([F32, dtypes.float64, dtypes.bool_, dtypes.int32])
    buffers = [_buffer(0, [N, M], "input")]
    kernels = []
    for k in range(draw(st.integers(1, 12))):
        reads = draw(st.lists(st.sampled_from(buffers), min_size=1, max_size=3))
        outs = []
        for _ in range(draw(st.integers(1, 2))):
            outs.append(_buffer(len(buffers), draw(st.sampled_from(shapes)), dtype=draw(pick_dtype)))
            buffers.append(outs[-1])
        loads = [Load(r, [1] * len(r.shape), 0) for r in reads]
        kernels.append(Kernel("pointwise", f"k{k}", [], outs, outs[0].shape, Apply("op", loads, F32)))
    buffers[-1].kind = "output"
    return _schedule(buffers, kernels)


@settings(max_examples=60, deadline=None)
@given(_random_schedules(), st.lists(st.tuples(st.integers(1, 40), st.integers(1, 40)), min_size=3, max_size=3))
def test_random_schedules_never_overlap(sched, sizes):
    plan = plan_memory(sched)
    for n, m in sizes:
        binding = {N: n, M: m}
        verify_plan(sched, plan, binding)
        assert evaluate_dim(plan.arena_bytes, binding) <= evaluate_dim(plan.unplanned_bytes, binding)


# ---------------------------------------------------------------------------------------------
# The package manifest and `kiln inspect`

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")


@pytest.fixture(scope="module")
def mlp_package(tmp_path_factory):
    _, program, sched = _zoo("mlp")
    path = tmp_path_factory.mktemp("memory") / "mlp"
    kiln.compile(program, output=path)
    return path, plan_memory(sched, program.range_constraints)


@needs_cc
def test_inspect_package_shows_signature_and_peak_memory(mlp_package, capsys):
    path, plan = mlp_package
    assert main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    assert "x: f32[batch, 32]" in text and "_log_softmax: f32[batch, 10]" in text and "batch: [1, 4096]" in text
    # MLP 32->64->64->10: three biases as they are, three weights only as the compiler packed them, in panels of
    # KILN_NR columns (the 10 outputs pad to one panel)
    capability = kiln.runtime.load(path).manifest["cpu_capability"]
    _, nr = tile_sizes(capability)
    values = 64 + 64 + 10 + sum(k * -(-n // nr) * nr for k, n in [(32, 64), (64, 64), (64, 10)])
    assert f"weights.bin: 6 tensors, {values:,} values, " in text
    assert f"of which 3 packed by the compiler for {capability}'s GEMM tiles" in text
    assert "peak temporary memory: 512*batch bytes" in text
    assert "naive (no reuse): 512*batch + 64*ceiling(5*batch/8) bytes; 2 arena slots for 3 temporaries" in text
    assert "at the largest sizes (batch=4096): 2.0 MiB" in text


@needs_cc
def test_inspect_package_json_formula_matches_plan(mlp_package, capsys):
    path, plan = mlp_package
    assert main(["inspect", str(path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["format"] == "kiln-c-package" and summary["symbols"] == {"batch": [1, 4096]}
    assert summary["memory"]["slots"] == 2 and summary["memory"]["temps"] == 3
    arena, naive = parse_dim(summary["memory"]["arena_bytes"]), parse_dim(summary["memory"]["unplanned_bytes"])
    batch = symbol("batch")
    for b in (1, 2, 13, 4096):
        assert evaluate_dim(arena, {batch: b}) == evaluate_dim(plan.arena_bytes, {batch: b}) == 512 * b
        assert evaluate_dim(naive, {batch: b}) == evaluate_dim(plan.unplanned_bytes, {batch: b})
    assert evaluate_dim(naive, {batch: 13}) == 512 * 13 + 576  # 40*13 = 520 bytes round up to 576


@needs_cc
def test_inspect_package_without_memory_entry(mlp_package, tmp_path, capsys):
    path, _ = mlp_package
    old = tmp_path / "old"
    old.mkdir()
    manifest = json.loads((path / "manifest.json").read_text())
    del manifest["memory"]
    (old / "manifest.json").write_text(json.dumps(manifest))
    assert main(["inspect", str(old)]) == 0
    assert "peak temporary memory: unknown" in capsys.readouterr().out


@pytest.mark.parametrize("content, message", [
    (None, "without manifest.json"),
    ("{not json", "cannot read the package manifest"),
    ('{"format": "something-else"}', "not a kiln package manifest"),
    ('{"format": "kiln-c-package", "inputs": []}', "malformed"),
    ('{"format": "kiln-c-package", "inputs": [{"name": "x", "dtype": "float32", "shape": ["n"]}], "outputs": [],'
     ' "symbols": [], "weights": [], "memory": {"arena_bytes": "1"}}', "malformed"),
    ('[1, 2]', "not an object"),
    ('{"format": "kiln-c-package", "inputs": [], "outputs": [], "symbols": [], "weights": [], "memory": '
     '{"arena_bytes": "64*(", "unplanned_bytes": "1", "slots": 1, "temps": 1}}', "malformed size formula"),
])
def test_inspect_bad_package_is_a_kiln_error(tmp_path, capsys, content, message):
    if content is not None:
        (tmp_path / "manifest.json").write_text(content)
    assert main(["inspect", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert message in error and "fix:" in error
