"""kiln.verify and `kiln verify`: clean zoo models agree op by op on ONNX and C, and a wrong lowering injected with
kiln.testing.wrong_lowering is named exactly: the first op of its kind, its operands' statistics as the reference
interpreter computes them, and the error a hand computation of the wrong lowering predicts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pytest

import kiln
from kiln.cli.main import main
from kiln.ir.closeness import default_tolerances
from kiln.ir.interpreter import run_program, watching
from kiln.ir.program import value_names
from kiln.ir.types import TensorType
from kiln.testing import wrong_lowering
from kiln.verification import VerifyResult, verify

RELU, NEG, ADD, SUB, EXP = ("aten.relu.default", "aten.neg.default", "aten.add.Tensor", "aten.sub.Tensor",
                            "aten.exp.default")


class Gated(kiln.nn.Module):
    """exp between other pointwise ops: C renders float32 exp with its own rule (FLOAT32_RULES)."""

    def __init__(self):
        super().__init__()
        self.fc1 = kiln.nn.Linear(8, 16)
        self.fc2 = kiln.nn.Linear(16, 4)

    def forward(self, x):
        h = self.fc1(x).tanh()
        return self.fc2(h.exp() * h)


@dataclass
class Model:
    program: kiln.ExportedProgram
    args: tuple

    @property
    def arrays(self) -> list[np.ndarray]:
        return [np.asarray(a.__kiln_array__()) for a in self.args]


@pytest.fixture(scope="module")
def models() -> dict[str, Model]:
    found = {}
    for name in ("mlp", "cnn", "transformer"):
        entry = kiln.models.get(name)
        found[name] = Model(kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes), entry.args)
    kiln.manual_seed(0)
    args = (kiln.randn(3, 8),)
    found["gated"] = Model(kiln.export(Gated().eval(), args), args)
    return found


def interpreter_values(program: kiln.ExportedProgram, inputs: list[np.ndarray]) -> dict[Any, Any]:
    """Every value the reference interpreter computes for `program` (arguments and op results)."""
    values: dict[Any, Any] = {}
    with watching(values.__setitem__):
        run_program(program, inputs)
    return values


def tensor_ops(program: kiln.ExportedProgram) -> list[Any]:
    return [op for op in program.nodes() if any(isinstance(r.type, TensorType) for r in op.results)]


# ---------------------------------------------------------------------------------------------
# Clean models


@pytest.mark.parametrize("target", ["onnx", "c"])
@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_clean_model_agrees_on_every_op(models, name, target):
    model = models[name]
    result = verify(model.program, model.args, target=target)
    assert isinstance(result, VerifyResult)
    assert result.ok and result.op_name is None and result.op_index is None
    ops = list(result.program.nodes())
    assert result.checked == len(tensor_ops(result.program)) == len(ops) > 0
    assert str(result) == f"ok: {result.checked} ops agree (target {target})"


@pytest.mark.parametrize("target", ["onnx", "c"])
def test_clean_transformer_agrees(models, target):
    """Views, attention (bmm and softmax in C), layer norm and multi-result ops all come back as debug outputs."""
    model = models["transformer"]
    result = verify(model.program, model.args, target=target)
    assert result.ok and result.checked == len(tensor_ops(result.program)) > 50


def test_mlp_op_count_by_hand(models):
    """ONNX lowers the exported ops as they are: linear, relu, linear, relu, linear, log_softmax."""
    result = verify(models["mlp"].program, models["mlp"].args, target="onnx")
    assert result.checked == 6


# ---------------------------------------------------------------------------------------------
# Injected faults


@dataclass
class Fault:
    model: str
    op: str
    like: str
    wrong: Callable[..., np.ndarray]  # what the wrong lowering computes from the op's tensor operands
    repeated: bool  # the op occurs more than once: the first is the one to name


FAULTS = {
    "mlp-relu-as-neg": Fault("mlp", RELU, NEG, lambda x: -x, True),
    "cnn-residual-add-as-sub": Fault("cnn", ADD, SUB, lambda a, b: a - b, True),  # op 6 of 17
    "gated-exp-as-neg": Fault("gated", EXP, NEG, lambda x: -x, False),
}


@pytest.mark.parametrize("target", ["onnx", "c"])
@pytest.mark.parametrize("fault", list(FAULTS), ids=str)
def test_injected_fault_is_named(models, fault, target):
    case, model = FAULTS[fault], models[FAULTS[fault].model]
    with wrong_lowering(target, case.op, like=case.like):
        result = verify(model.program, model.args, target=target)
    assert not result.ok and result.target == target

    ops = list(result.program.nodes())
    first = next(index for index, op in enumerate(ops) if op.name == case.op)
    assert (result.op_name, result.op_index) == (case.op, first)
    assert (sum(op.name == case.op for op in ops) > 1) == case.repeated
    if fault == "cnn-residual-add-as-sub":
        assert 0 < first < len(ops) // 2  # in the middle of the model, after convolutions and pooling
    op = ops[first]
    names = value_names(result.program.body)
    assert result.op_text.startswith(f"{names[op.results[0]]} = {case.op}(")
    assert result.source is not None and result.source == op.attributes["kiln.source"].data

    # The inputs' statistics are the interpreter's values of the op's operands.
    values = interpreter_values(result.program, model.arrays)
    operands = [v for v in op.operands if isinstance(v.type, TensorType)]
    assert [s.name for s in result.inputs] == [names[v] for v in operands]
    for stats, value in zip(result.inputs, operands):
        array = np.asarray(values[value], np.float64)
        assert stats.shape == array.shape and stats.dtype == "float32" and stats.nans == 0
        assert (stats.min, stats.max) == (array.min(), array.max())
        assert stats.mean == pytest.approx(array.mean(), rel=1e-12)

    # The error is that of the wrong lowering, computed by hand on the interpreter's operands.
    expected = np.asarray(values[op.results[0]])
    wrong = case.wrong(*(np.asarray(values[v]) for v in operands))
    difference = np.abs(expected.astype(np.float64) - wrong.astype(np.float64))
    assert result.max_abs_error == pytest.approx(difference.max(), rel=1e-5, abs=1e-5)
    rtol, atol = default_tolerances(kiln.float32)
    assert (result.rtol, result.atol) == (rtol, atol)
    assert result.mismatched == np.count_nonzero(difference > atol + rtol * np.abs(expected))
    worst = np.unravel_index(np.argmax(difference), difference.shape)
    assert result.worst[0] == tuple(int(i) for i in worst)
    assert result.worst[1] == expected[worst]
    assert result.worst[2] == pytest.approx(wrong[worst], rel=1e-5, abs=1e-5)
    assert (result.expected.min, result.expected.max) == (expected.min(), expected.max())
    assert result.actual.max == pytest.approx(wrong.max(), rel=1e-5, abs=1e-5)
    assert result.diverged >= 1 and result.checked == len(tensor_ops(result.program))

    text = str(result)
    assert f"at op {first}: {case.op}" in text and result.op_text in text and result.source in text
    assert all(names[v] in text for v in operands)


def test_first_of_several_occurrences_is_named(models):
    """The CNN applies relu five times; relu lowered as neg is first wrong at the first one."""
    model = models["cnn"]
    with wrong_lowering("onnx", RELU, like=NEG):
        result = verify(model.program, model.args, target="onnx")
    relus = [index for index, op in enumerate(result.program.nodes()) if op.name == RELU]
    assert len(relus) == 5
    assert (result.op_name, result.op_index) == (RELU, relus[0])
    assert result.diverged > 1  # the later ones read wrong values and differ too, but come after


def test_triton_fault_is_named(models):
    pytest.importorskip("torch")
    pytest.importorskip("triton")  # without a GPU, tests/conftest.py runs Triton through its interpreter
    model = models["mlp"]
    assert verify(model.program, model.args, target="triton").ok
    with wrong_lowering("triton", RELU, like=NEG):
        result = verify(model.program, model.args, target="triton")
    first = next(index for index, op in enumerate(result.program.nodes()) if op.name == RELU)
    assert (result.ok, result.op_name, result.op_index) == (False, RELU, first)


# ---------------------------------------------------------------------------------------------
# The fault hook


def test_wrong_lowering_restores_the_tables(models):
    from kiln.codegen.c.pointwise import FLOAT32_RULES, POINTWISE_RULES
    from kiln.codegen.onnx.export import LOWERING_TABLE
    before = dict(LOWERING_TABLE), dict(POINTWISE_RULES), dict(FLOAT32_RULES)
    with wrong_lowering("onnx", RELU, like=NEG):
        assert LOWERING_TABLE[RELU] is LOWERING_TABLE[NEG]
    with wrong_lowering("c", EXP, like=NEG):
        assert POINTWISE_RULES[EXP] is POINTWISE_RULES[NEG] and EXP not in FLOAT32_RULES
    with pytest.raises(RuntimeError), wrong_lowering("c", ADD, like=SUB):
        raise RuntimeError("a failing test inside the block")
    assert (dict(LOWERING_TABLE), dict(POINTWISE_RULES), dict(FLOAT32_RULES)) == before

    model = models["gated"]
    for target in ("onnx", "c"):
        assert verify(model.program, model.args, target=target).ok


@pytest.mark.parametrize("target, op, like", [
    ("onnx", "aten.no_such_op.default", NEG),
    ("onnx", RELU, "aten.no_such_op.default"),
    ("c", "aten.convolution.default", NEG),  # not pointwise: C has no rule to swap
    ("tpu", RELU, NEG),
])
def test_wrong_lowering_refuses_what_it_cannot_swap(target, op, like):
    with pytest.raises(kiln.KilnError), wrong_lowering(target, op, like=like):
        pass


# ---------------------------------------------------------------------------------------------
# Python API


def test_kiln_verify_is_exported(models):
    assert kiln.verify is verify and kiln.VerifyResult is VerifyResult
    assert "verify" in kiln.__all__ and "verify" in dir(kiln)


def test_verify_a_module_with_example_args():
    kiln.manual_seed(1)
    module, args = Gated().eval(), (kiln.randn(2, 8),)
    with wrong_lowering("onnx", EXP, like=NEG):
        result = verify(module, example_args=args, target="onnx")
    assert result.op_name == EXP
    assert result.inputs[0].shape == (2, 16)  # ran on the example arguments


def test_verify_takes_inputs_by_name_and_tolerances(models):
    model = models["mlp"]
    x = np.random.default_rng(3).standard_normal((5, 32)).astype(np.float32)
    with wrong_lowering("onnx", RELU, like=NEG):
        named = verify(model.program, {"x": x}, target="onnx")
        loose = verify(model.program, {"x": x}, target="onnx", rtol=0.0, atol=1e3)
    assert named.op_name == RELU and named.expected.shape == (5, 64)
    assert loose.ok
    with pytest.raises(kiln.KilnError):
        verify(model.program, {"y": x})
    with pytest.raises(kiln.KilnError):
        verify(model.program, (x,), target="tpu")
    with pytest.raises(kiln.KilnError):
        verify(model.program, (x,), rtol=1e-3)


# ---------------------------------------------------------------------------------------------
# The command line (in-process, so the injected fault applies)


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(["verify", *argv, "-q"])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_cli_clean_model(capsys):
    status, out, err = run_cli(capsys, "kiln.models:mlp", "--target", "onnx")
    assert (status, out, err) == (0, "ok: 6 ops agree (target onnx)\n", "")


def test_cli_names_the_faulty_op(capsys):
    with wrong_lowering("c", RELU, like=NEG):
        status, out, _ = run_cli(capsys, "kiln.models:mlp", "--target", "c")
    assert status == 1
    assert "c diverges from the reference interpreter at op 2: aten.relu.default" in out
    assert "relu = aten.relu.default(addmm)" in out and "kiln/models/mlp.py:" in out
    for piece in ("inputs:", "addmm: float32[4, 64]", "expected:", "got:", "max abs error", "max rel error",
                  "256 of 256 elements", "worst:"):
        assert piece in out


def test_cli_reads_inputs_from_npz_and_tolerances(capsys, tmp_path, models):
    x = np.random.default_rng(0).standard_normal((3, 32)).astype(np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    with wrong_lowering("onnx", RELU, like=NEG):
        status, out, _ = run_cli(capsys, "kiln.models:mlp", "--inputs", str(tmp_path / "x.npz"))
        assert status == 1 and "linear: float32[3, 64]" in out  # the batch of 3 from the file
        status, out, _ = run_cli(capsys, "kiln.models:mlp", "--inputs", str(tmp_path / "x.npz"), "--rtol", "0",
                                 "--atol", "1000")
        assert (status, out) == (0, "ok: 6 ops agree (target onnx)\n")


def test_cli_verifies_a_pt2(capsys, tmp_path, models):
    kiln.save(models["mlp"].program, tmp_path / "mlp.pt2")
    status, out, _ = run_cli(capsys, str(tmp_path / "mlp.pt2"), "--target", "onnx")
    assert (status, out) == (0, "ok: 6 ops agree (target onnx)\n")


@pytest.mark.parametrize("case", ["target", "model", "inputs", "pickled", "tolerance"])
def test_cli_usage_errors_exit_2_with_one_line(capsys, tmp_path, case):
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, x=np.array([{"a": 1}], dtype=object))
    argv = {"target": ["kiln.models:mlp", "--target", "tpu"],
            "model": [str(tmp_path / "missing.pt2")],
            "inputs": ["kiln.models:mlp", "--inputs", str(tmp_path / "missing.npz")],
            "pickled": ["kiln.models:mlp", "--inputs", str(pickled)],
            "tolerance": ["kiln.models:mlp", "--rtol", "1e-3"]}[case]
    status, out, err = run_cli(capsys, *argv)
    assert status == 2 and out == ""
    lines = err.splitlines()
    assert lines[0].startswith("kiln: error: ") and "Traceback" not in err
    assert all(line.startswith("  fix: ") for line in lines[1:]) and len(lines) <= 2
