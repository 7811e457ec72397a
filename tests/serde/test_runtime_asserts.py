"""Shapes kiln cannot derive on its own: torch's runtime assertions (`_assert_scalar`), torch's recorded types where
kiln's meta rules cannot prove them, and guards kiln decided from example values. kiln must load such programs, run
them like torch inside what torch proved, refuse inputs outside it with a clear error, and write them back."""

from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import pytest

import kiln
from kiln.ir.errors import InputError
from kiln.ir.program import ExportedProgram
from kiln.ir.verifier import ASSUMED_TYPES
from tests.serde.support import assert_same, to_torch

torch = pytest.importorskip("torch")
Dim = torch.export.Dim


class HeadPlusTail(torch.nn.Module):
    """`x[:k] + x[-k:]` has one length only because `k <= x.shape[0]`, which torch asserts at run time."""

    def forward(self, x, n):
        k = n.item()
        torch._check(k >= 2)
        torch._check(k <= x.shape[0])
        return x[:k] + x[-k:]


class PrefixOfLonger(torch.nn.Module):
    """torch guards `x.shape[0] <= y.shape[0]` on the inputs; kiln's slice rule cannot show `y[:len(x)]` has x's
    length without it, and decides from the example sizes."""

    def forward(self, x, y):
        torch._check(x.shape[0] <= y.shape[0])
        return y[: x.shape[0]] * 2 + x


def _torch_file(module, args, dynamic_shapes, strip_asserts: bool = False) -> bytes:
    exported = torch.export.export(module, args, dynamic_shapes=dynamic_shapes)
    buffer = io.BytesIO()
    torch.export.save(exported, buffer)
    if not strip_asserts:
        return buffer.getvalue()
    # The same program without its runtime assertions: torch still loads and runs it, and kiln, unable to prove the
    # sum's length, must take the type torch recorded for it.
    source, stripped = zipfile.ZipFile(io.BytesIO(buffer.getvalue())), io.BytesIO()
    with zipfile.ZipFile(stripped, "w") as target:
        for item in source.infolist():
            data = source.read(item.filename)
            if item.filename.endswith("models/model.json"):
                document = json.loads(data)
                graph = document["graph_module"]["graph"]
                graph["nodes"] = [n for n in graph["nodes"] if n["target"] != "torch.ops.aten._assert_scalar.default"]
                data = json.dumps(document).encode()
            target.writestr(item, data)
    return stripped.getvalue()


def _head_plus_tail(strip_asserts: bool = False) -> bytes:
    return _torch_file(HeadPlusTail(), (torch.randn(8, 3), torch.tensor(4)),
                       ({0: Dim("rows", min=2, max=64)}, None), strip_asserts)


def _through_torch(program: ExportedProgram) -> torch.export.ExportedProgram:
    buffer = io.BytesIO()
    kiln.save(program, buffer)
    buffer.seek(0)
    return torch.export.load(buffer)


@pytest.mark.parametrize("k", [2, 5, 8])
def test_torch_assertion_is_a_fact_for_meta_rules_and_a_check_at_run_time(k):
    program = kiln.load(io.BytesIO(_head_plus_tail()))
    (guard,) = program.runtime_asserts  # `u0 >= 2` and `u0 <= 64` are the symbol's range, not checks
    rows, u = sorted(guard.expr.free_symbols, key=lambda s: str(s).startswith("u"))
    assert str(guard.expr) == f"{u} <= {rows}" and "test_runtime_asserts.py" in guard.source
    x = np.random.default_rng(k).standard_normal((8, 3)).astype(np.float32)
    expected = HeadPlusTail()(to_torch(x), torch.tensor(k))
    assert_same(program(x, np.array(k)), expected)
    assert_same(program.run_decompositions()(x, np.array(k)), expected)
    assert_same(_through_torch(program).module()(to_torch(x), torch.tensor(k)), expected)
    assert_same(kiln.load(io.BytesIO(_head_plus_tail()))(x, np.array(k)), expected)


@pytest.mark.parametrize("runner", ["loaded", "decomposed", "mlir", "saved"])
def test_input_breaking_a_torch_assertion_is_refused_like_torch(runner):
    program = kiln.load(io.BytesIO(_head_plus_tail()))
    if runner == "decomposed":
        program = program.run_decompositions()
    elif runner == "mlir":
        program = ExportedProgram.from_mlir(program.to_mlir(), program.state_dict, program.constants)
    elif runner == "saved":
        buffer = io.BytesIO()
        kiln.save(program, buffer)
        buffer.seek(0)
        program = kiln.load(buffer)
    x = np.zeros((8, 3), np.float32)
    with pytest.raises(RuntimeError, match="Expected cond to be True"):  # eager torch._check
        HeadPlusTail()(to_torch(x), torch.tensor(9))
    with pytest.raises(InputError, match=r"assumes u\d+ <= s\w* \(from .*test_runtime_asserts.py.*\), which fails "
                                         r"for .*= 9"):
        program(x, np.array(9))
    if runner == "saved":  # kiln wrote the assertion back as torch's _assert_scalar node
        with pytest.raises(RuntimeError, match="Runtime assertion failed"):
            _through_torch(program).module()(to_torch(x), torch.tensor(9))


def test_recorded_types_are_taken_where_kiln_cannot_derive_them():
    stripped = _head_plus_tail(strip_asserts=True)
    program = kiln.load(io.BytesIO(stripped))
    assumed = [op for op in program.nodes() if ASSUMED_TYPES in op.attributes]
    assert [op.name for op in assumed] == ["aten.add.Tensor"] and program.runtime_asserts == []
    program.verify()
    x = np.random.default_rng(0).standard_normal((8, 3)).astype(np.float32)
    torch_program = torch.export.load(io.BytesIO(stripped)).module()
    for k in (3, 8):
        expected = torch_program(to_torch(x), torch.tensor(k))
        assert_same(program(x, np.array(k)), expected)
        assert_same(program.run_decompositions()(x, np.array(k)), expected)
        assert_same(_through_torch(program).module()(to_torch(x), torch.tensor(k)), expected)
    # Past the rows torch's shapes no longer describe the values; kiln says so instead of returning them
    with pytest.raises(InputError, match=r"aten.add.Tensor produced shape \[8, 3\], but the program assumes "
                                         r"\[u\d+, 3\] = \[12, 3\]"):
        program(x, np.array(12))


def test_data_dependent_sizes_run_in_c_and_onnx(tmp_path):
    """C reads `k` while running, checks torch's assertions on it and allocates the [k, 3] output; ONNX reads `k`
    from item()'s value."""
    ort = pytest.importorskip("onnxruntime")
    program = kiln.load(io.BytesIO(_head_plus_tail()))
    compiled = kiln.compile(program, output=tmp_path / "pkg")
    session = ort.InferenceSession(kiln.onnx.export(program).model_proto.SerializeToString())
    names = [i.name for i in session.get_inputs()]
    for rows, k in ((8, 4), (8, 8), (5, 2)):
        x = np.random.default_rng(k).standard_normal((rows, 3)).astype(np.float32)
        expected = HeadPlusTail()(to_torch(x), torch.tensor(k))
        assert_same(session.run(None, dict(zip(names, (x, np.array(k)))))[0], expected)
        assert_same(compiled(x, np.array(k)), expected)
    x = np.zeros((8, 3), np.float32)
    with pytest.raises(kiln.KilnError, match=r"the program assumes u\d+ <= s\w*, which the values the program read "
                                             r"while running break"):
        compiled(x, np.array(9))
    with pytest.raises(kiln.KilnError, match=r"the data-dependent size u\d+ = 1 .* is outside its range \[2, "):
        compiled(x, np.array(1))


def _prefix_of_longer() -> ExportedProgram:
    return kiln.load(io.BytesIO(_torch_file(PrefixOfLonger(), (torch.randn(4, 3), torch.randn(6, 3)),
                                            ({0: Dim("short", max=64)}, {0: Dim("long", max=64)}))))


def test_guards_decided_from_hints_become_runtime_assertions():
    program = _prefix_of_longer()
    short, long = (program.body.args[0].type.shape[0], program.body.args[1].type.shape[0])
    assert program.hints == {short: 4, long: 6}
    env = program.shape_env()
    assert env.symbols[short].hint == 4 and env.symbols[long].hint == 6
    (guard,) = program.runtime_asserts  # the slice's length is `short` only while short <= long
    assert guard.expr.free_symbols == {short, long}
    compiled = kiln.compile(program)
    for rows, other in ((4, 6), (5, 5), (0, 3)):
        x = np.random.default_rng(rows).standard_normal((rows, 3)).astype(np.float32)
        y = np.random.default_rng(other).standard_normal((other, 3)).astype(np.float32)
        expected = PrefixOfLonger()(to_torch(x), to_torch(y))
        assert_same(program(x, y), expected)
        assert_same(compiled(x, y), expected)
    x, y = np.zeros((7, 3), np.float32), np.zeros((6, 3), np.float32)
    with pytest.raises(InputError, match=r"the program assumes .*, which fails for"):
        program(x, y)
    with pytest.raises(kiln.KilnError, match=r"the program assumes .*, which these input sizes break"):
        compiled(x, y)
    reloaded = _through_torch(program)
    with pytest.raises(RuntimeError, match="Runtime assertion failed"):
        reloaded.module()(to_torch(x), to_torch(y))


def test_kiln_export_keeps_its_example_values_as_hints():
    class Model(kiln.nn.Module):
        def forward(self, x):
            return x.sum(0)

    program = kiln.export(Model(), (kiln.ones(5, 3),), dynamic_shapes=({0: kiln.Dim("batch")},))
    (batch,) = program.hints
    assert program.hints == {batch: 5} and program.shape_env().symbols[batch].hint == 5
    reparsed = ExportedProgram.from_mlir(program.to_mlir(), program.state_dict, program.constants)
    assert reparsed.hints == program.hints
