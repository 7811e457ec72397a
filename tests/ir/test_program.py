"""Programs: building, both printed forms, MLIR round trip, verification, and the reference interpreter."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import sympy
from xdsl.dialects.builtin import StringAttr

import kiln
from kiln.ir import (
    ExportedProgram, GraphBuilder, InputError, InputKind, KilnError, OutputKind, OutputSpec, ParseError, ShapeEnv,
    TensorType, VerificationError,
)
from kiln.ir.registry import REGISTRY, OpOverload
from kiln.ir.sparse import SparseArray
from kiln.ir.types import SymIntType
from tests.ir.samples import SAMPLES

aten = kiln.ops.aten


def relation_program() -> ExportedProgram:
    """forward(x: f32[s0, 64], y: f32[s0 + 1]) -> (x * 2 summed over nothing, y == 1)."""
    env = ShapeEnv()
    s0 = env.create_symbol(7, min=2, max=1024)
    builder = GraphBuilder(env)
    x = builder.add_input("x", TensorType.of([s0, 64], "f32"))
    y = builder.add_input("y", TensorType.of([s0 + 1], "f32"))
    with builder:
        doubled = aten.mul.Scalar(x, 2.0)
        flat = aten.view.default(doubled, [-1])
        ones = aten.eq.Scalar(y, 1.0)
    program = builder.build([flat, ones])
    program.verify()
    return program


@pytest.mark.parametrize("s0", [2, 7, 1000])
def test_interpreter_binds_symbols_across_inputs(s0):
    program = relation_program()
    x = np.random.default_rng(s0).standard_normal((s0, 64)).astype(np.float32)
    y = np.ones(s0 + 1, np.float32)
    y[0] = 0
    flat, ones = program(x, y)
    np.testing.assert_array_equal(flat, (x * 2).reshape(-1))
    assert flat.shape == (64 * s0,) and ones.dtype == np.bool_ and ones.sum() == s0


def test_interpreter_refuses_out_of_range_and_broken_relation():
    program = relation_program()
    with pytest.raises(InputError, match=r"x.shape\[0\] = 1 is outside the range of symbol s0: VR\[2, 1024\]"):
        program(np.zeros((1, 64), np.float32), np.zeros(2, np.float32))
    with pytest.raises(InputError, match=r"x.shape\[0\] = 1025 is outside"):
        program(np.zeros((1025, 64), np.float32), np.zeros(1026, np.float32))
    with pytest.raises(InputError, match=r"input 'y' dimension 0 is 9 but must equal s0 \+ 1 = 8"):
        program(np.zeros((7, 64), np.float32), np.zeros(9, np.float32))
    with pytest.raises(InputError, match="static size 64"):
        program(np.zeros((7, 63), np.float32), np.zeros(8, np.float32))
    with pytest.raises(InputError, match="dtype float64 but the program expects float32"):
        program(np.zeros((7, 64)), np.zeros(8, np.float32))
    with pytest.raises(InputError, match="rank 1"):
        program(np.zeros(7, np.float32), np.zeros(8, np.float32))
    with pytest.raises(InputError, match="takes 2 user input"):
        program(np.zeros((7, 64), np.float32))


def test_torch_style_print():
    text = str(relation_program())
    assert 'def forward(self, x: "f32[s0, 64]", y: "f32[s0 + 1]"):' in text
    assert 'mul: "f32[s0, 64]" = aten.mul.Scalar(x, 2.0)' in text
    assert 'view: "f32[64*s0]" = aten.view.default(mul, [-1])' in text
    assert "return (view, eq)" in text
    assert "x: USER_INPUT" in text and "view: USER_OUTPUT" in text
    assert text.rstrip().endswith("Range constraints: {s0: VR[2, 1024]}")


def test_signature_survives_mlir_round_trip():
    env = ShapeEnv()
    batch = env.create_symbol(4, name="batch", min=1)
    builder = GraphBuilder(env)
    weight = builder.add_input("p_weight", TensorType.of([3, 5], "f32"), InputKind.PARAMETER, target="weight")
    mean = builder.add_input("b_mean", TensorType.of([5], "f32"), InputKind.BUFFER, target="mean", persistent=True)
    x = builder.add_input("x", TensorType.of([batch, 3], "f32"))
    with builder:
        out = aten.mm.default(x, weight)
        new_mean = aten.add.Tensor(mean, mean)
    specs = [OutputSpec(OutputKind.BUFFER_MUTATION, "add", "mean"), OutputSpec(OutputKind.USER_OUTPUT, "mm")]
    state = {"weight": np.ones((3, 5), np.float32), "mean": np.arange(5, dtype=np.float32)}
    program = builder.build([new_mean, out], specs, state_dict=state)
    text = program.to_mlir()
    reparsed = ExportedProgram.from_mlir(text, state_dict=state)
    assert reparsed.to_mlir() == text
    assert str(reparsed) == str(program)
    assert reparsed.graph_signature.inputs_to_parameters == {"p_weight": "weight"}
    assert reparsed.graph_signature.buffers_to_mutate == {"add": "mean"}
    assert str(list(reparsed.range_constraints.values())[0]) == "VR[1, int_oo]"
    result = reparsed(np.ones((2, 3), np.float32))
    np.testing.assert_array_equal(result, np.full((2, 5), 3, np.float32))
    assert dict(reparsed.named_parameters()).keys() == {"weight"}
    assert [name for name, _ in reparsed.named_buffers()] == ["mean"]


def test_stored_finds_a_weight_in_the_state_dict_or_the_constants():
    builder = GraphBuilder()
    weight = builder.add_input("p_weight", TensorType.of([2], "f32"), InputKind.PARAMETER, target="weight")
    table = builder.add_input("c_table", TensorType.of([2], "f32"), InputKind.CONSTANT_TENSOR, target="table")
    with builder:
        out = aten.add.Tensor(weight, table)
    program = builder.build([out], [OutputSpec(OutputKind.USER_OUTPUT, "add")],
                            state_dict={"weight": np.ones(2, np.float32)},
                            constants={"table": np.full(2, 3, np.float32)})
    np.testing.assert_array_equal(program.stored("weight"), np.ones(2, np.float32))
    np.testing.assert_array_equal(program.stored("table"), np.full(2, 3, np.float32))
    assert program.stored("absent", None) is None
    with pytest.raises(KeyError, match="absent"):
        program.stored("absent")
    np.testing.assert_array_equal(program(), np.full(2, 4, np.float32))  # the interpreter reads both stores


def test_verifier_rejects_wrong_result_shape_naming_the_op():
    program = relation_program()
    mul = next(op for op in program.nodes() if op.name == "aten.mul.Scalar")
    broken = TensorType.of([sympy.Symbol("s0", integer=True), 65], "f32")
    text = program.to_mlir().replace(str(mul.results[0].type), str(broken), 2)
    with pytest.raises(VerificationError, match=r"aten\.mul\.Scalar.*disagree with the meta rule"):
        ExportedProgram.from_mlir(text).verify()


def test_verifier_rejects_wrong_dtype():
    from kiln.ir.dialect import build_op
    builder = GraphBuilder()
    y = builder.add_input("y", TensorType.of([3], "f32"))
    opdef = REGISTRY["aten.eq.Scalar"]
    wrong = build_op(opdef, [y, 1.0], [TensorType.of([3], "f32")])  # eq must give bool
    builder.block.add_op(wrong)
    program = builder.build([wrong.results[0]])
    with pytest.raises(VerificationError, match=r"aten\.eq\.Scalar.*f32\[3\] disagree.*i1\[3\]"):
        program.verify()


@pytest.mark.parametrize("text,message", [
    ("builtin.module {", "line"),
    ('builtin.module { "aten.nope.default"() : () -> () }', "aten.nope.default is not registered"),
    ('builtin.module { func.func @forward(%x: !kiln.tensor<["s0 +"], f32>) { func.return } }', "symbolic dim"),
])
def test_malformed_mlir_is_a_parse_error(text, message):
    with pytest.raises(ParseError, match=message):
        ExportedProgram.from_mlir(text)


def _tensor_leaves(value, found):
    if isinstance(value, np.ndarray):
        found.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _tensor_leaves(v, found)


def test_one_program_with_every_op_round_trips():
    """One hand-built program holding one call of every registered op with a kernel (>= 50 distinct)."""
    builder = GraphBuilder()
    outputs, inputs, names = [], [], set()
    for name, opdef in sorted(REGISTRY.items()):
        if opdef.kernel is None or name not in SAMPLES or "random" in opdef.tags:
            continue
        sample = next(iter(SAMPLES[name](np.random.default_rng(0))))

        def lift(value):
            if isinstance(value, (np.ndarray, SparseArray)):
                inputs.append(value)
                value_type = TensorType.of(value.shape, kiln.ir.dtypes.dtype(value.dtype),
                                           getattr(value, "layout", None))
                return builder.add_input(f"in{len(inputs)}", value_type)
            if isinstance(value, list):
                return [lift(v) for v in value]
            return value

        args = [lift(a) for a in copy.deepcopy(sample.args)]
        kwargs = {k: lift(v) for k, v in copy.deepcopy(sample.kwargs).items()}
        with builder:
            result = OpOverload(opdef)(*args, **kwargs)
        flat = result if isinstance(result, (list, tuple)) else [result]
        outputs.extend(v for v in flat if not isinstance(v.type, SymIntType))
        names.add(name)
    assert len(names) >= 50, f"only {len(names)} ops have kernels and samples"
    program = builder.build(outputs)
    program.verify()
    text = program.to_mlir()
    reparsed = ExportedProgram.from_mlir(text)
    assert reparsed.to_mlir() == text
    reparsed.verify()
    assert len(reparsed.op_histogram()) == len(names)


def test_source_locations_are_kept():
    builder = GraphBuilder()
    x = builder.add_input("x", TensorType.of([2], "f32"))
    builder.source = "model.py:12"
    with builder:
        y = aten.relu.default(x)
    program = builder.build([y])
    node = next(program.nodes())
    assert node.attributes["kiln.source"] == StringAttr("model.py:12")
    assert "# model.py:12" in str(program)
    assert ExportedProgram.from_mlir(program.to_mlir()).to_mlir() == program.to_mlir()


def test_kiln_errors_are_kiln_errors():
    assert issubclass(InputError, KilnError) and issubclass(VerificationError, KilnError)


def test_meta_memo_tells_int_float_and_bool_scalars_apart():
    builder = GraphBuilder()
    x = builder.add_input("x", TensorType.of([3], "i64"))
    with builder:
        as_int = aten.add.Scalar(x, 1)
        as_float = aten.add.Scalar(x, 1.0)
        as_bool = aten.mul.Scalar(x, True)
    assert [v.type.short() for v in (as_int, as_float, as_bool)] == ["i64[3]", "f32[3]", "i64[3]"]
