"""Data-dependent sizes in C: a size read from a tensor's values while running (torch's unbacked `u0`: `.item()`,
`.tolist()` of counts, nonzero's rows, a boolean mask's count). A `bind` kernel reads it between the run's parallel
regions; kiln_run then checks it against its range and the program's runtime assertions, and allocates the
temporaries it sizes (they have no place in the static arena plan). An output sized by such a size is allocated by
the run too and handed to the caller (kiln.h's kiln_allocated_output), unless the program asserts it equal to a
size of the inputs (split pieces concatenated back): the caller allocates that one. Checked against torch eager and
kiln's interpreter, including under ASan."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import kiln
from kiln.codegen.c.package import plan
from kiln.codegen.c.target import TARGET
from kiln.codegen.driver import DEFAULT_PIPELINE
from kiln.codegen.legalize import legalize
from kiln.codegen.memory import plan_memory, verify_plan
from kiln.compiler import compile as compile_c
from kiln.frontend.tensor import dispatch as call
from kiln.ir.errors import KilnError, UnsupportedError
from kiln.passes import run as run_passes
from tests.modules import LambdaModule
from tests.serde.support import assert_same

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
aten = kiln.ops.aten
EXPERTS = 3


class RouteByCounts(torch.nn.Module):
    """A mixture of experts as JetMoE writes it: tokens sorted by expert, split by the experts' token counts
    (`.tolist()`: three data-dependent sizes), each piece through its expert's matrix, concatenated back (the
    program asserts the counts add up to the tokens, so the output has the tokens' size)."""

    def __init__(self, features: int = 40):
        super().__init__()
        torch.manual_seed(0)
        self.weight = torch.nn.Parameter(torch.randn(EXPERTS, features, features) / features ** 0.5)

    def forward(self, x, expert):
        order = torch.argsort(expert, stable=True)
        counts = torch.stack([(expert == k).sum() for k in range(EXPERTS)])
        pieces = torch.split(x[order], counts.tolist())
        return torch.cat([torch.relu(piece @ self.weight[k]) + piece.sum(0) for k, piece in enumerate(pieces)])


class SplitGiven(torch.nn.Module):
    """Rows split by counts the caller passes: the program assumes they add up to the rows."""

    def forward(self, x, counts):
        pieces = torch.split(x, counts.tolist())
        return torch.cat([piece * (k + 1) for k, piece in enumerate(pieces)])


def _export(model, examples, dynamic, tmp_path):
    exported = torch.export.export(model, examples, dynamic_shapes=dynamic)
    torch.export.save(exported, tmp_path / "model.pt2")
    return kiln.load(tmp_path / "model.pt2")


def _routing(tmp_path):
    n = torch.export.Dim("n", min=2, max=64)
    x, expert = torch.randn(7, 40), torch.tensor([2, 0, 1, 2, 2, 0, 1])
    return _export(RouteByCounts(), (x, expert), ({0: n}, {0: n}), tmp_path)


ROUTINGS = [[2, 0, 1, 2, 2, 0, 1], [1, 1, 0, 2], [0, 0, 0, 0, 0], [2, 2], list(np.arange(64) % EXPERTS)]


def test_tokens_routed_by_counts_run_in_c(tmp_path):
    program = _routing(tmp_path)
    model = compile_c(program, output=tmp_path / "pkg")
    manifest = json.loads((tmp_path / "pkg" / "manifest.json").read_text())
    # the caller binds the tokens' size only; the output has that size (the program asserts the counts add up)
    assert len(manifest["symbols"]) == 1 and manifest["outputs"][0]["shape"] == [manifest["symbols"][0]["name"], "40"]
    reference = RouteByCounts()
    for rows in ROUTINGS:  # experts with no tokens, or all of them (each expert's GEMM sizes scratch by its tokens)
        x, expert = torch.randn(len(rows), 40), torch.tensor(rows)
        assert_same(model(x.numpy(), expert.numpy()), reference(x, expert))


def test_temporaries_sized_by_values_are_allocated_while_running(tmp_path):
    program = legalize(run_passes(_routing(tmp_path), DEFAULT_PIPELINE), TARGET)
    schedule = plan(program)
    memory = plan_memory(schedule, program.range_constraints)
    assert len(schedule.unbacked) == EXPERTS and not set(schedule.unbacked) & set(schedule.symbols)
    assert [k.kind for k in schedule.kernels].count("bind") == EXPERTS
    assert memory.dynamic and all(schedule.is_dynamic(buf) for buf in memory.dynamic)
    assert not set(memory.dynamic) & set(memory.offsets)  # the arena holds only what the input sizes decide
    for n in (2, 17, 64):
        verify_plan(schedule, memory, {schedule.symbols[0]: n})


def test_counts_that_break_the_programs_assumptions_fail_cleanly(tmp_path):
    n = torch.export.Dim("n", min=2, max=64)
    program = _export(SplitGiven(), (torch.randn(7, 3), torch.tensor([2, 4, 1])), ({0: n}, None), tmp_path)
    model = compile_c(program, output=tmp_path / "pkg")
    x = torch.randn(9, 3)
    for counts in ([9, 0, 0], [3, 3, 3], [0, 2, 7]):
        assert_same(model(x.numpy(), np.array(counts)), SplitGiven()(x, torch.tensor(counts)))
    for counts, message in (([3, 3, 2], r"the program assumes Eq\(.*\), which the values the program read while "
                                        r"running break"),
                            ([10, -1, 0], "is outside its range")):
        with pytest.raises(RuntimeError, match="split_with_sizes expects split_sizes"):  # as torch does
            SplitGiven()(x, torch.tensor(counts))
        with pytest.raises(KilnError, match=message):
            model(x.numpy(), np.array(counts))
    assert_same(model(x.numpy(), np.array([4, 4, 1])), SplitGiven()(x, torch.tensor([4, 4, 1])))  # nothing left over


def _masked(x, mask, grid):
    """Rows picked by a mask, changed and put back; a 2-D mask's elements summed; nonzero's coordinates summed."""
    picked = call(aten.index.Tensor, x, [mask])
    changed = call(aten.mul.Scalar, call(aten.sin.default, picked), 2.0)
    put = call(aten.index_put.default, x, [mask], changed)
    flat = call(aten.sum.default, call(aten.index.Tensor, x, [grid]))
    coordinates = call(aten.sum.dim_IntList, call(aten.nonzero.default, grid), [0])
    return put, flat, coordinates


def _torch_masked(x, mask, grid):
    put = x.clone()
    put[mask] = torch.sin(x[mask]) * 2.0
    return put, x[grid].sum(), torch.nonzero(grid).sum(0)


def test_masks_and_nonzero_run_in_c(tmp_path):
    rows = kiln.Dim("rows", max=32)
    rng = np.random.default_rng(0)
    examples = (kiln.randn(5, 6), kiln.tensor(np.array([True, False, True, True, False])),
                kiln.tensor(rng.random((5, 6)) < 0.5))
    program = kiln.export(LambdaModule(_masked), examples, dynamic_shapes=({0: rows}, {0: rows}, {0: rows}))
    model = compile_c(program, output=tmp_path / "pkg")
    for n, density in ((5, 0.5), (1, 0.0), (17, 1.0), (32, 0.3)):
        x = rng.standard_normal((n, 6)).astype(np.float32)
        x[0, 0] = np.nan  # a NaN element is nonzero; under the mask, it stays NaN
        mask, grid = rng.random(n) < density, rng.random((n, 6)) < density
        got = model(x, mask, grid.astype(np.float32) != 0)
        expected = _torch_masked(torch.from_numpy(x), torch.from_numpy(mask), torch.from_numpy(grid))
        for value, want in zip(got, expected):  # default tolerances; the NaN must come out as NaN
            torch.testing.assert_close(torch.from_numpy(np.asarray(value)), want, equal_nan=True)


def _picked(x, mask):
    """Outputs sized by values: nonzero's coordinates and the rows a mask picks; and one sized by the inputs."""
    return call(aten.nonzero.default, mask), call(aten.index.Tensor, x, [mask]), call(aten.mul.Scalar, x, 2.0)


PICKS = [(5, 0.5), (1, 0.0), (9, 1.0), (32, 0.3)]


def test_outputs_sized_by_values_are_allocated_by_the_run(tmp_path):
    rows = kiln.Dim("rows", max=32)
    examples = (kiln.randn(5, 3), kiln.tensor(np.array([True, False, True, True, False])))
    program = kiln.export(LambdaModule(_picked), examples, dynamic_shapes=({0: rows}, {0: rows}))
    model = compile_c(program, output=tmp_path / "pkg")
    manifest = json.loads((tmp_path / "pkg" / "manifest.json").read_text())
    assert [o.get("data_dependent", False) for o in manifest["outputs"]] == [True, True, False]
    rng = np.random.default_rng(4)
    for n, density in PICKS:  # none picked, all picked
        x, mask = rng.standard_normal((n, 3)).astype(np.float32), rng.random(n) < density
        got = model(x, mask)
        expected = (torch.nonzero(torch.from_numpy(mask)), torch.from_numpy(x)[torch.from_numpy(mask)],
                    torch.from_numpy(x) * 2)
        for value, want in zip(got, expected):
            assert_same(value, want)
            assert value.flags.owndata  # a copy: the run's memory went back to the library


def test_triton_refuses_sizes_read_while_running(tmp_path):
    pytest.importorskip("triton")
    with pytest.raises(UnsupportedError, match=r"aten._local_scalar_dense.default \(it reads a tensor's values into "
                                               r"a size while running"):
        compile_c(_routing(tmp_path), target="triton", output=tmp_path / "pkg")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_sanitized_run_with_sizes_read_while_running(tmp_path):
    """The routing model, and a model returning outputs sized while running, linked into the deploy runner under
    ASan + UBSan (two threads): every buffer a size read while running allocates is in bounds and freed."""
    from tests.runtime.test_sanitizers import (
        SANITIZER_ENV, SANITIZER_ERRORS, build_sanitized, check_outputs, run_runner, sanitizer_missing,
    )
    reason = sanitizer_missing(tmp_path)
    if reason:
        pytest.skip(reason)
    program = _routing(tmp_path)
    package = tmp_path / "pkg"
    compiled = compile_c(program, output=package)
    binary = [str(build_sanitized(package, tmp_path))]
    names = program.graph_signature.user_inputs
    rng = np.random.default_rng(1)
    for rows in ROUTINGS:
        values = dict(zip(names, (rng.standard_normal((len(rows), 40)).astype(np.float32), np.array(rows))))
        result = run_runner(binary, package, values, tmp_path, SANITIZER_ENV)
        assert not any(marker in result.stderr for marker in SANITIZER_ERRORS), result.stderr[-8000:]
        assert result.returncode == 0, result.stderr[-8000:]
        check_outputs(result.stdout, compiled, program, values, exact=False)
    rows = kiln.Dim("rows", max=32)  # outputs the run allocates: handed over, printed, freed with kiln_free
    examples = (kiln.randn(5, 3), kiln.tensor(np.array([True, False, True, True, False])))
    program = kiln.export(LambdaModule(_picked), examples, dynamic_shapes=({0: rows}, {0: rows}))
    package = tmp_path / "picked"
    compiled = compile_c(program, output=package)
    (tmp_path / "picked_build").mkdir()
    binary = [str(build_sanitized(package, tmp_path / "picked_build"))]
    for n, density in PICKS:
        values = {"x": rng.standard_normal((n, 3)).astype(np.float32), "mask": rng.random(n) < density}
        values = dict(zip(program.graph_signature.user_inputs, values.values()))
        result = run_runner(binary, package, values, tmp_path, SANITIZER_ENV)
        assert not any(marker in result.stderr for marker in SANITIZER_ERRORS), result.stderr[-8000:]
        assert result.returncode == 0, result.stderr[-8000:]
        check_outputs(result.stdout, compiled, program, values)


def test_verify_compares_values_sized_while_running(tmp_path):
    """kiln.verify exposes each op's result as an output, those sized by a size read while running (the mask's
    picked rows) too: the package allocates them."""
    examples = (kiln.randn(5, 6), kiln.tensor(np.array([True, False, True, True, False])),
                kiln.tensor(np.ones((5, 6), bool)))
    program = kiln.export(LambdaModule(_masked), examples)
    result = kiln.verify(program, examples, target="c")
    assert result.ok and result.checked >= 6, result
    routed = kiln.verify(_routing(tmp_path), (np.random.default_rng(2).standard_normal((9, 40)).astype(np.float32),
                                              np.array([0, 1, 2, 2, 1, 0, 0, 0, 1])), target="c")
    assert routed.ok and routed.checked >= 4, routed
