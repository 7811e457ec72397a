"""kiln.export against torch.export's documented behaviour: the seed examples and constraint violations."""

from __future__ import annotations


import dataclasses
import warnings

import numpy as np
import pytest

import kiln
import kiln.nn as nn
from kiln import Dim
from kiln.ir import InputError, InputKind, OutputKind


def close(a, b):
    np.testing.assert_allclose(np.asarray(a.numpy(), np.float64), np.asarray(b.numpy(), np.float64),
                               rtol=1.3e-6, atol=1e-5)


def op_names(program):
    return [op.name for op in program.nodes()]


def test_sin_cos_module():
    class Mod(nn.Module):
        def forward(self, x, y):
            a = kiln.sin(x)
            b = kiln.cos(y)
            return a + b

    x, y = kiln.randn(10, 10), kiln.randn(10, 10)
    program = kiln.export(Mod(), (x, y))
    assert op_names(program) == ["aten.sin.default", "aten.cos.default", "aten.add.Tensor"]
    close(program(x, y), Mod()(x, y))
    assert program.graph_signature.user_inputs == ["x", "y"]
    assert 'sin: "f32[10, 10]" = aten.sin.default(x)' in str(program)


def test_conv_inplace_add_relu_maxpool_is_functionalized():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(in_channels=3, out_channels=16, kernel_size=3, padding=1)
            self.relu = nn.ReLU()
            self.maxpool = nn.MaxPool2d(kernel_size=3)

        def forward(self, x, constant=None):
            a = self.conv(x)
            a.add_(constant)
            return self.maxpool(self.relu(a))

    model = M()
    x, constant = kiln.randn(1, 3, 32, 32), kiln.ones(1, 16, 32, 32)
    program = kiln.export(model, (x, constant))
    names = op_names(program)
    assert "aten.add.Tensor" in names and not any(n.endswith("_") for n in names)
    assert [s.kind for s in program.graph_signature.input_specs[:2]] == [InputKind.PARAMETER] * 2
    assert program.graph_signature.parameters == ["conv.weight", "conv.bias"]
    close(program(x, constant), model(x, constant))
    conv = next(op for op in program.nodes() if "conv" in op.name)
    assert "conv" in str(conv.attributes["kiln.nn_module_stack"])


def test_two_branches_share_one_batch_symbol():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.branch1 = nn.Sequential(nn.Linear(64, 32), nn.ReLU())
            self.branch2 = nn.Sequential(nn.Linear(128, 64), nn.ReLU())
            self.register_buffer("buffer", kiln.ones(32))

        def forward(self, x1, x2):
            out1 = self.branch1(x1)
            out2 = self.branch2(x2)
            return (out1 + self.buffer, out2)

    model = M()
    batch = Dim("batch")
    program = kiln.export(model, (kiln.randn(32, 64), kiln.randn(32, 128)),
                          dynamic_shapes={"x1": {0: batch}, "x2": {0: batch}})
    assert [str(s) for s in program.range_constraints] == ["batch"]
    for size in (32, 3, 70):
        x1, x2 = kiln.randn(size, 64), kiln.randn(size, 128)
        for got, expected in zip(program(x1, x2), model(x1, x2)):
            close(got, expected)
    with pytest.raises(InputError, match="must equal batch"):
        program(kiln.randn(4, 64), kiln.randn(5, 128))


def test_derived_dims():
    class M(nn.Module):
        def forward(self, x, y):
            return x + y[1:]

    dx = Dim("dx", min=3, max=6)
    dy = dx + 1
    program = kiln.export(M(), (kiln.randn(5), kiln.randn(6)), dynamic_shapes={"x": (dx,), "y": (dy,)})
    assert {str(k): str(v) for k, v in program.range_constraints.items()} == {"dx": "VR[3, 6]", "dx + 1": "VR[4, 7]"}
    for size in (3, 4, 6):
        x, y = kiln.randn(size), kiln.randn(size + 1)
        close(program(x, y), M()(x, y))
    with pytest.raises(InputError, match="outside the range of symbol dx"):
        program(kiln.randn(7), kiln.randn(8))


def test_static_shape_condition_specializes():
    class M(nn.Module):
        def forward(self, x):
            if x.shape[0] > 5:
                return x + 1
            return x - 1

    program = kiln.export(M(), (kiln.randn(10, 2),))
    assert op_names(program) == ["aten.add.Scalar"]
    with pytest.raises(InputError, match="static size 10"):
        program(kiln.randn(3, 2))


def test_dynamic_shape_condition_is_a_guard_that_narrows_the_range():
    class M(nn.Module):
        def forward(self, x):
            if x.shape[0] > 5:
                return x + 1
            return x - 1

    batch = Dim("batch", max=100)
    with pytest.raises(kiln.ConstraintViolationError) as info:
        kiln.export(M(), (kiln.randn(10, 2),), dynamic_shapes={"x": {0: batch}})
    message = str(info.value)
    assert "batch = Dim('batch', min=6, max=100)" in message and "test_export.py" in message
    fixed = kiln.refine_dynamic_shapes_from_suggested_fixes(message, {"x": {0: batch}})
    program = kiln.export(M(), (kiln.randn(10, 2),), dynamic_shapes=fixed)
    assert str(program.range_constraints[kiln.ir.symbol("batch")]) == "VR[6, 100]"
    close(program(kiln.ones(8, 2)), kiln.full((8, 2), 2.0))


def test_primitive_arguments_are_specialized():
    class M(nn.Module):
        def forward(self, x, const, times):
            for _ in range(times):
                x = x + const
            return x

    x = kiln.randn(2, 2)
    program = kiln.export(M(), (x, 1, 3))
    assert op_names(program) == ["aten.add.Scalar"] * 3
    close(program(x, 1, 3), x + 3)
    with pytest.raises(InputError, match="baked into the program"):
        program(x, 2, 3)


def test_batch_norm_train_mode_mutates_running_stats():
    model = nn.BatchNorm2d(3)
    model.train()
    x = kiln.randn(4, 3, 5, 5)
    program = kiln.export(model, (x,))
    mutations = [s for s in program.graph_signature.output_specs if s.kind is OutputKind.BUFFER_MUTATION]
    assert {s.target for s in mutations} == {"running_mean", "running_var", "num_batches_tracked"}
    eager = nn.BatchNorm2d(3)
    eager.train()
    expected = eager(x)
    from kiln.ir.interpreter import run_program
    outputs = run_program(program, [x.numpy()])
    by_target = {spec.target: value for spec, value in zip(program.graph_signature.output_specs, outputs)}
    np.testing.assert_allclose(by_target["running_mean"], eager.running_mean.numpy(), rtol=1.3e-6, atol=1e-5)
    np.testing.assert_allclose(by_target["running_var"], eager.running_var.numpy(), rtol=1.3e-6, atol=1e-5)
    close(program(x), expected)


def test_context_manager_in_forward_with_strict_false():
    class ContextManager:
        def __init__(self):
            self.count = 0

        def __enter__(self):
            self.count += 1

        def __exit__(self, *exc):
            self.count -= 1

    class M(nn.Module):
        def forward(self, x):
            with ContextManager():
                return x.sin() + x.cos()

    x = kiln.randn(3, 3)
    program = kiln.export(M(), (x,), strict=False)
    close(program(x), M()(x))


def test_nonstrict_data_dependent_branch_specializes_with_warning():
    class M(nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x * 3

    x = kiln.ones(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        program = kiln.export(M(), (x,), strict=False)
    assert any("specialized to the example value" in str(w.message) for w in caught)
    assert op_names(program) == ["aten.sum.dim_IntList", "aten.gt.Scalar", "aten.mul.Scalar"]


def test_cond_traces_both_branches():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(kiln.full((4,), 2.0))

        def forward(self, x):
            return kiln.cond(x.sum() > 0, lambda v: v * self.scale, lambda v: v.cos(), (x,))

    model = M()
    program = kiln.export(model, (kiln.randn(3, 4),), dynamic_shapes={"x": {0: Dim("b")}})
    assert "torch.ops.higher_order.cond" in str(program)
    for x in (kiln.ones(2, 4), -kiln.ones(5, 4)):
        close(program(x), model(x))
    reparsed = kiln.ExportedProgram.from_mlir(program.to_mlir(), state_dict=program.state_dict)
    close(kiln.Tensor(reparsed(kiln.ones(2, 4).numpy())), model(kiln.ones(2, 4)))


# ---------------------------------------------------------------------------------------------
# Constraint violations: each produces the expected suggested fix, and applying it makes export succeed.

class Add(nn.Module):
    def forward(self, x, y):
        return x + y


class AddShifted(nn.Module):
    def forward(self, x, y):
        return x + y[1:]


class Pairs(nn.Module):
    def forward(self, x):
        return x.view(-1, 2).sum(1)


class Bounded(nn.Module):
    def forward(self, x):
        if x.shape[0] > 16:
            raise ValueError("too long")
        return x * 2


class AddFour(nn.Module):
    def forward(self, x):
        return x + kiln.ones(4)


class NotOne(nn.Module):
    def forward(self, x):
        if x.shape[0] == 1:
            return x.squeeze(0)
        return x[1:] - x[:-1]


dx, dy = Dim("dx"), Dim("dy")
VIOLATIONS = [
    ("dims must be equal", Add(), (kiln.randn(4), kiln.randn(4)), {"x": (dx,), "y": (dy,)}, "dy = dx"),
    ("derived relation", AddShifted(), (kiln.randn(4), kiln.randn(5)), {"x": (dx,), "y": (dy,)}, "dy = dx + 1"),
    ("range too wide", Bounded(), (kiln.randn(8),), {"x": (dx,)}, "dx = Dim('dx', max=16)"),
    ("specialized by a guard", AddFour(), (kiln.randn(4),), {"x": (dx,)}, "dx = 4"),
    ("multiple of 2 for a reshape", Pairs(), (kiln.randn(6),), {"x": (dx,)}, "dx = 2*_dx"),
    ("size 1 excluded", NotOne(), (kiln.randn(5, 3),), {"x": {0: dx}}, "dx = Dim('dx', min=2)"),
]


@pytest.mark.parametrize("name,model,args,shapes,fix", VIOLATIONS, ids=[v[0] for v in VIOLATIONS])
def test_constraint_violation_suggests_fix_that_works(name, model, args, shapes, fix):
    with pytest.raises(kiln.ConstraintViolationError) as info:
        kiln.export(model, args, dynamic_shapes=shapes)
    message = str(info.value)
    assert fix in message, message
    assert "test_export.py" in message, "the message names the user's line"
    refined = kiln.refine_dynamic_shapes_from_suggested_fixes(message, shapes)
    program = kiln.export(model, args, dynamic_shapes=refined)
    close(program(*args), model(*args))


def test_size_one_examples_are_not_specialized():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(3, 2)

        def forward(self, x):
            return self.linear(x).relu()

    model = M()
    program = kiln.export(model, (kiln.randn(1, 3),), dynamic_shapes={"x": {0: Dim("batch", min=1)}})
    assert str(program.range_constraints[kiln.ir.symbol("batch")]) == "VR[1, int_oo]"
    for size in (1, 2, 9):
        x = kiln.randn(size, 3)
        close(program(x), model(x))


def test_auto_and_static_dims():
    model = Add()
    x, y = kiln.randn(3, 4), kiln.randn(3, 4)
    program = kiln.export(model, (x, y), dynamic_shapes={"x": (Dim.AUTO, Dim.STATIC), "y": (Dim.AUTO, None)})
    close(program(kiln.ones(5, 4), kiln.ones(5, 4)), kiln.full((5, 4), 2.0))


def test_shapes_collection_and_dims_helper():
    batch, = kiln.dims("batch", max=64)
    x, y = kiln.randn(3, 4), kiln.randn(3, 4)
    collection = kiln.ShapesCollection()
    collection[x] = {0: batch}
    collection[y] = {0: batch}
    program = kiln.export(Add(), (x, y), dynamic_shapes=collection.dynamic_shapes(Add(), (x, y)))
    assert str(program.range_constraints[kiln.ir.symbol("batch")]) == "VR[1, 64]"


def test_pytree_inputs_and_outputs():
    @kiln.register_dataclass
    @dataclasses.dataclass
    class Pair:
        first: kiln.Tensor
        second: kiln.Tensor

    class M(nn.Module):
        def forward(self, inputs, pair, scale=2.0):
            return {"sum": inputs["a"] + inputs["b"][0] + pair.first, "scaled": [inputs["b"][1] * scale * pair.second]}

    inputs = {"a": kiln.ones(2), "b": (kiln.ones(2), kiln.full((2,), 3.0))}
    pair = Pair(kiln.ones(2), kiln.ones(2))
    program = kiln.export(M(), (inputs, pair))
    # xDSL keeps names unique by numbering them, so `inputs_b_0` prints as `inputs_b` (its first use).
    assert program.graph_signature.user_inputs == ["inputs_a", "inputs_b", "inputs_b_1", "pair_first", "pair_second"]
    result = program(inputs, pair)
    assert set(result) == {"sum", "scaled"} and isinstance(result["scaled"], list)
    close(result["scaled"][0], kiln.full((2,), 6.0))
    with pytest.raises(InputError, match="structure"):
        program({"a": kiln.ones(2)}, pair)


def test_exported_program_api():
    model = nn.Linear(3, 2)
    x = kiln.randn(4, 3)
    program = kiln.export(model, (x,), dynamic_shapes={"input": {0: Dim("batch")}})
    assert dict(program.named_parameters()).keys() == {"weight", "bias"}
    assert len(list(program.parameters())) == 2 and list(program.buffers()) == []
    close(program.module()(x), model(x))
    decomposed = program.run_decompositions()
    assert all(op.opdef.is_core for op in decomposed.nodes())
    close(decomposed(x), model(x))
    kept = program.run_decompositions({})
    assert op_names(kept) == op_names(program)
    table = kiln.default_decompositions()
    del table[kiln.ops.aten.linear.default]
    assert op_names(program.run_decompositions(table)) == ["aten.linear.default"]


def test_custom_decomposition_table_entry():
    aten = kiln.ops.aten

    def relu_as_max(x):
        return aten.maximum.default(x, aten.full_like.default(x, 0))

    class M(nn.Module):
        def forward(self, x):
            return x.relu()

    program = kiln.export(M(), (kiln.randn(5),))
    rewritten = program.run_decompositions({aten.relu.default: relu_as_max})
    assert op_names(rewritten) == ["aten.full_like.default", "aten.maximum.default"]
    x = kiln.randn(5)
    close(rewritten(x), x.relu())





def test_expand_to_the_same_symbol_keeps_size_one_allowed():
    class M(nn.Module):
        def forward(self, x):
            return x.view(x.shape[0], 1, 4).expand(x.shape[0], 3, 4)

    program = kiln.export(M(), (kiln.randn(2, 4),), dynamic_shapes={"x": {0: Dim("b")}})
    assert str(program.range_constraints[kiln.ir.symbol("b")]) == "VR[1, int_oo]"
    x = kiln.randn(1, 4)
    close(program(x), M()(x))


def test_preserve_module_call_signature_records_submodule_calls():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(4, 4)

        def forward(self, x):
            return self.linear(x).relu()

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()

        def forward(self, x):
            return self.block(x * 2) + 1

    program = kiln.export(M(), (kiln.randn(2, 4),), preserve_module_call_signature=("block",))
    root, block = program.module_call_graph
    assert root.fqn == "" and root.signature.inputs == ["x"] and root.signature.outputs == ["add"]
    assert block.fqn == "block" and block.signature.inputs == ["mul"] and block.signature.outputs == ["relu"]
    with pytest.raises(kiln.KilnError, match="not submodules"):
        kiln.export(M(), (kiln.randn(2, 4),), preserve_module_call_signature=("nope",))
