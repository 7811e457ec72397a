"""Each built-in pass does what it says: effects asserted on op counts and signatures, numerics on the
interpreter with torch.testing.assert_close's default tolerances."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn as nn
import kiln.nn.functional as F
import kiln.passes
from kiln import Dim
from kiln.ir import GraphBuilder, InputKind, TensorType
from kiln.ir.dialect import bound_arguments
from kiln.ir.core_ops import CORE_ATEN_OPS

from tests.passes.support import assert_same_outputs, count, op_names, outputs, zoo

aten = kiln.ops.aten


def export(module, *args, dynamic_shapes=None):
    return kiln.export(module, args, dynamic_shapes=dynamic_shapes)


def optimize(program, pipeline):
    return kiln.passes.run(program, pipeline, verify_each=True)


def check_numerics(program, optimized, *args):
    assert_same_outputs(optimized, outputs(program, args), args)


# ---------------------------------------------------------------------------------------------
# canonicalize


def test_canonicalize_removes_transpose_of_transpose_and_composes_permutes():
    class M(nn.Module):
        def forward(self, x):
            a = x.transpose(0, 1).transpose(0, 1)  # identity
            b = x.permute(2, 0, 1).permute(2, 0, 1)  # one permute: (1, 2, 0)
            c = x.transpose(1, 2).permute(0, 2, 1).permute(2, 1, 0)
            return a * 2, b, c

    x = kiln.randn(2, 3, 4)
    program = export(M(), x)
    optimized = optimize(program, "canonicalize")
    assert count(program, "transpose.int", "permute.default") == 7
    assert count(optimized, "transpose.int") == 0
    assert count(optimized, "permute.default") == 2
    check_numerics(program, optimized, x)


def test_canonicalize_collapses_reshape_chains_and_squeeze_unsqueeze_pairs():
    class M(nn.Module):
        def forward(self, x):
            a = x.reshape(2, 3, 4).reshape(6, 4).reshape(24).reshape(4, 6)  # back to x's shape
            b = x.view(24).view(2, 12).view(3, 8)
            c = x.unsqueeze(0).squeeze(0) + 1
            d = x.flatten().unsqueeze(1)
            return a, b, c, d

    x = kiln.randn(4, 6, dtype=kiln.float32)
    program = export(M(), x, dynamic_shapes=None)
    optimized = optimize(program, "canonicalize")
    assert count(optimized, "unsqueeze.default", "squeeze.dim", "flatten.using_ints") == 0
    # a (returned, so it must not alias x), b and d: one op each; flatten may copy, so d stays a reshape.
    assert count(optimized, "view.default") == 2 and count(optimized, "reshape.default") == 1
    check_numerics(program, optimized, x)


def test_canonicalize_folds_algebraic_identities_and_no_op_ops():
    class M(nn.Module):
        def forward(self, x, n):
            a = (x * 1 + 0 - 0) / 1
            b = -(-a)
            c = b.clone().contiguous().to(kiln.float32).expand(4, 6)[0:4] * kiln.ones(4, 6)
            d = c + kiln.zeros(6)
            e = n - n  # an integer: 0 everywhere
            return d.sin(), e, ~(~n) * 3

    x, n = kiln.randn(4, 6), kiln.randint(0, 5, (4, 6))
    program = export(M(), x, n)
    optimized = optimize(program, "canonicalize")
    assert op_names(optimized) == ["aten.full_like.default", "aten.sin.default", "aten.mul.Scalar"]
    check_numerics(program, optimized, x, n)


def test_canonicalize_keeps_what_only_looks_like_an_identity():
    class M(nn.Module):
        def forward(self, x, n):
            promoted = n * 1.0  # int64 * 1.0 is float32: a real cast
            not_zero = x - x  # inf - inf is nan: not folded for floats
            broadcast = x + kiln.zeros(3, 4, 6)  # 0 broadcasts x to a bigger shape
            real_transpose = x.t()
            return promoted, not_zero, broadcast, real_transpose, x.clone()  # clone: outputs never alias inputs

    x, n = kiln.randn(4, 6), kiln.randint(0, 5, (4, 6))
    program = export(M(), x, n)
    optimized = optimize(program, "canonicalize")
    assert count(optimized, "mul.Scalar") == 1 and count(optimized, "sub.Tensor") == 1
    assert count(optimized, "add.Tensor") == 1 and count(optimized, "t.default") == 1
    assert count(optimized, "clone.default") == 1
    check_numerics(program, optimized, x, n)


def test_canonicalize_drops_cat_inputs_that_add_nothing():
    """A Hugging Face cache's first update is cat([tensor([]), past], -2): the past itself, not a copy of it."""
    class M(nn.Module):
        def forward(self, past, new, none):
            empty = kiln.zeros(0)  # a legacy 1-D empty tensor, as DynamicLayer starts from
            cache = kiln.cat([empty, past], -2)  # past
            grown = kiln.cat([cache, new], -2)  # a real cat
            rows = kiln.cat([none, past, empty, none], -2)  # past, from inputs empty along the dim too
            flags = past > 0
            promoted = kiln.cat([none, flags, flags], -2)  # float only because of `none`: stays as it is
            return grown * 2, rows + 1, kiln.cat([past, empty], -2), promoted  # an output must not alias the input

    past, new, none = kiln.randn(2, 3, 5, 4), kiln.randn(2, 3, 1, 4), kiln.randn(2, 3, 0, 4)
    program = export(M(), past, new, none)
    optimized = optimize(program, "canonicalize,dce")
    assert count(program, "cat.default") == 5
    assert count(optimized, "cat.default") == 3  # the real one, the returned one and the promoting one
    check_numerics(program, optimized, past, new, none)


def test_canonicalize_moves_symmetric_zero_pads_into_convolutions():
    depthwise, conv1d = nn.Conv2d(4, 4, 3, groups=4, padding=(1, 0)), nn.Conv1d(4, 5, 3, stride=2)

    class M(nn.Module):
        def forward(self, x, y):
            folded = depthwise(F.pad(x, (1, 1, 2, 2)))  # H by 2 (on top of the layer's 1), W by 1
            folded_1d = conv1d(F.pad(y, (3, 3)))
            asymmetric = depthwise(F.pad(x, (0, 1, 0, 1)))  # TF 'same' at stride 2: stays a pad
            filled = depthwise(F.pad(x, (1, 1, 1, 1), value=1.0))
            negative_zero = depthwise(F.pad(x, (1, 1, 1, 1), value=-0.0))
            channels = depthwise(F.pad(x, (1, 1, 1, 1, 0, 0, 0, 0)))  # zero widths for batch and channel: folds
            padded = F.pad(x, (2, 2, 2, 2))
            shared = depthwise(padded) + padded[:, :, 1:-3, 2:-4].sum()  # the padded copy is read twice: stays
            return folded, folded_1d, asymmetric, filled, negative_zero, channels, shared

    x, y = kiln.randn(2, 4, 7, 9), kiln.randn(2, 4, 10)
    program = export(M(), x, y, dynamic_shapes=({0: Dim("batch")}, {0: Dim("batch")}))
    optimized = optimize(program, "decompose,canonicalize,dce")
    assert count(program, "pad.default") == 7
    assert count(optimized, "constant_pad_nd.default") == 4
    paddings = [tuple(bound_arguments(op)[4]) for op in optimized.nodes() if op.name == "aten.convolution.default"]
    assert paddings.count((3, 1)) == 1 and paddings.count((3,)) == 1 and paddings.count((2, 1)) == 1
    check_numerics(program, optimized, x, y)


def test_canonicalize_works_on_symbolic_shapes():
    class M(nn.Module):
        def forward(self, x):
            b = x.shape[0]
            return x.view(b * 6).view(b, 2, 3).view(b, 6).transpose(0, 1).transpose(0, 1).relu()

    x = kiln.randn(4, 6)
    program = export(M(), x, dynamic_shapes={"x": {0: Dim("batch")}})
    optimized = optimize(program, "canonicalize")
    assert op_names(optimized) == ["aten.relu.default"]
    for size in (1, 7):
        check_numerics(program, optimized, kiln.randn(size, 6))


def test_canonicalize_rewrites_inside_cond_branches():
    class M(nn.Module):
        def forward(self, x):
            return kiln.cond(x.sum() > 0, lambda v: (v * 1).t().t(), lambda v: v.cos(), (x,))

    x = kiln.randn(3, 4)
    program = export(M(), x)
    optimized = optimize(program, "canonicalize")
    branch = next(op for op in optimized.nodes() if op.name == "kiln.cond").true_region.block
    assert [op.name for op in branch.ops] == ["kiln.yield"]
    for value in (x, -kiln.ones(3, 4), kiln.ones(3, 4)):
        check_numerics(program, optimized, value)


# ---------------------------------------------------------------------------------------------
# cse, dce


class DuplicatedSubgraph(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x):
        first = self.linear(x).relu().sum(-1)
        second = self.linear(x).relu().sum(-1)  # the same subgraph again
        return first + second


def test_cse_removes_a_duplicated_subgraph():
    x = kiln.randn(3, 8)
    program = export(DuplicatedSubgraph(), x, dynamic_shapes={"x": {0: Dim("batch")}})
    optimized = optimize(program, "cse")
    assert count(program, "linear.default", "relu.default", "sum.dim_IntList") == 6
    assert count(optimized, "linear.default", "relu.default", "sum.dim_IntList") == 3
    assert count(optimized, "add.Tensor") == 1
    check_numerics(program, optimized, x)


def test_cse_never_merges_random_ops():
    class M(nn.Module):
        def forward(self, x):
            return F.dropout(x, 0.5, training=True) + F.dropout(x, 0.5, training=True)

    program = export(M(), kiln.randn(3, 4))
    assert count(optimize(program, "cse"), "native_dropout.default") == 2


def test_dce_removes_unused_ops_but_not_outputs():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.unused = nn.Linear(4, 4)

        def forward(self, x):
            x.sin().cos()  # computed, never used
            return x.exp(), x.exp() * 2

    x = kiln.randn(2, 4)
    program = export(M(), x)
    optimized = optimize(program, "dce")
    assert op_names(optimized) == ["aten.exp.default", "aten.exp.default", "aten.mul.Scalar"]
    assert optimized.graph_signature.parameters == [] and optimized.state_dict == {}
    check_numerics(program, optimized, x)


# ---------------------------------------------------------------------------------------------
# decompose


def test_decompose_leaves_only_core_aten():
    _, program, input_sets = zoo("transformer")
    optimized = optimize(program, "decompose")
    assert {op.name for op in optimized.nodes()} <= CORE_ATEN_OPS
    check_numerics(program, optimized, *input_sets[0])


def test_decompose_keeps_the_keep_list():
    _, program, input_sets = zoo("gpt")
    optimized = optimize(program, "decompose{keep=gelu,aten.layer_norm.default,scaled_dot_product_attention}")
    names = {op.name for op in optimized.nodes()}
    assert {"aten.layer_norm.default", "aten.scaled_dot_product_attention.default"} <= names
    assert names - CORE_ATEN_OPS == {"aten.layer_norm.default", "aten.scaled_dot_product_attention.default"}
    assert "aten.linear.default" not in names
    check_numerics(program, optimized, *input_sets[0])


def test_decompose_takes_a_custom_table():
    class M(nn.Module):
        def forward(self, x):
            return F.silu(x) + F.hardswish(x)

    def silu_as_mul(x):
        return aten.mul.Tensor(x, aten.sigmoid.default(x))

    x = kiln.randn(5)
    program = export(M(), x)
    optimized = kiln.passes.run(program, [kiln.passes.Decompose(table={aten.silu.default: silu_as_mul})])
    assert op_names(optimized) == ["aten.sigmoid.default", "aten.mul.Tensor", "aten.hardswish.default",
                                   "aten.add.Tensor"]
    check_numerics(program, optimized, x)


# ---------------------------------------------------------------------------------------------
# fold-constants


def test_fold_constants_materializes_constant_subexpressions():
    class M(nn.Module):
        def forward(self, x):
            mask = kiln.arange(16).reshape(4, 4).float() * 2 - 1  # no input involved: folded into one constant
            return x @ mask

    x = kiln.randn(3, 4)
    program = export(M(), x)
    optimized = optimize(program, "fold-constants")
    assert op_names(optimized) == ["aten.matmul.default"]
    (constant,) = [s for s in optimized.graph_signature.input_specs if s.kind is InputKind.CONSTANT_TENSOR]
    expected = np.arange(16, dtype=np.float32).reshape(4, 4) * 2 - 1
    np.testing.assert_array_equal(optimized.constants[constant.target], expected)
    check_numerics(program, optimized, x)


def test_fold_constants_with_freeze_bakes_parameters_in():
    _, program, input_sets = zoo("mlp")
    decomposed = optimize(program, "decompose")
    unfrozen = optimize(decomposed, "fold-constants")
    frozen = optimize(decomposed, "fold-constants{freeze=true}")
    assert count(unfrozen, "permute.default") == 3  # permute(weight): parameters are not constants
    assert count(frozen, "permute.default") == 0
    assert frozen.graph_signature.parameters == [key for key in program.state_dict if key.endswith("bias")]
    assert not any(key.endswith("weight") for key in frozen.state_dict)
    assert len(frozen.constants) == 3
    check_numerics(program, frozen, *input_sets[0])


class _TiedAndNormalized(nn.Module):
    """A weight read as it is (an embedding) and transposed (a tied output layer), and a weight-normalized one."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(kiln.randn(10, 4))
        self.direction = nn.Parameter(kiln.randn(4, 4))
        self.gain = nn.Parameter(kiln.randn(4, 1))

    def forward(self, tokens):
        weight = self.gain * self.direction / (self.direction * self.direction).sum(1, keepdim=True).sqrt()
        return F.embedding(tokens, self.table) @ weight @ self.table.t()


def test_fold_constants_without_views_stores_a_weight_once():
    """views=false folds the weight norm but keeps the transpose an op over the table, which stays a parameter."""
    program = optimize(export(_TiedAndNormalized(), kiln.tensor(np.array([[1, 7, 3]]))), "decompose")
    frozen = optimize(program, "fold-constants{freeze=true views=false}")
    assert frozen.graph_signature.parameters == ["table"]
    (constant,) = frozen.constants.values()
    assert constant.shape == (4, 4)  # the normalized weight; no transposed copy of the table
    assert count(frozen, "permute.default") == 1 and count(frozen, "sqrt.default") == 0
    materialized = optimize(program, "fold-constants{freeze=true}")  # the table twice: as it is, and transposed
    assert materialized.graph_signature.parameters == ["table"]
    assert sorted(c.shape for c in materialized.constants.values()) == [(4, 4), (4, 10)]
    tokens = kiln.tensor(np.array([[0, 9, 4]]))
    check_numerics(program, frozen, tokens)
    check_numerics(program, materialized, tokens)


class _LinearInNestedLoops(nn.Module):
    """A while_loop whose body runs a scan whose body applies a linear layer: its weight reaches the inner body
    through two levels of invariant operands."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(kiln.randn(4, 4))

    def forward(self, x):
        def step(h, row):
            h = F.linear(h, self.weight).tanh() + row
            return h, h

        def body(i, h):
            h, _ = kiln.scan(step, h, x)
            return i + 1, h

        _, h = kiln.while_loop(lambda i, h: i < 3, body, (kiln.zeros((), dtype=kiln.int64), x[0]))
        return h


def test_rewrites_inside_nested_loops_see_constants_and_pass_new_ones_down():
    """Weight-only quantization puts `dequantize(int8 weight)` in the inner body (its int8 values passed down by
    convert); fold-dequantized-weights sees that weight through both loops (value_of) and its folded float weight
    reaches the inner body as a new invariant operand of each loop (constant)."""
    from kiln import quantization as kq
    from kiln.ir.control_flow import outermost_source

    x = kiln.randn(5, 4)
    program = export(_LinearInNestedLoops().eval(), x)
    quantized = kq.convert_pt2e(kq.prepare_pt2e(program, kq.WeightOnlyQuantizer("int8")))
    folded = optimize(quantized, "fold-dequantized-weights")
    (while_loop,) = [op for op in folded.nodes() if op.name == "kiln.while_loop"]
    (scan,) = [op for op in while_loop.body.block.ops if op.name == "kiln.scan"]
    (linear,) = [op for op in scan.body.block.ops if op.name == "aten.linear.default"]
    assert linear.operands[1].owner is scan.body.block  # a region reads outer values through its arguments only
    source = outermost_source(linear.operands[1])
    spec = folded.graph_signature.input_specs[source.index]
    assert source.block is folded.body and spec.kind is InputKind.CONSTANT_TENSOR
    stored = {name: array for name, array in quantized.constants.items() if name.startswith("quantized_weight")}
    scales = {name: array for name, array in quantized.constants.items() if name.startswith("weight_scale")}
    ((_, int8_weight),), ((_, scale),) = stored.items(), scales.items()
    np.testing.assert_array_equal(folded.constants[spec.target], int8_weight.astype(np.float32) * scale[:, None])
    assert len(while_loop.cond_region.block.args) == len(while_loop.body.block.args)  # both regions got it
    # the int8 weight and its qparams, read by nothing now, left both loops' operands and the program
    assert [outermost_source(v) for v in scan.operands_] == [source]
    assert not any(name.startswith(("quantized_weight", "weight_scale")) for name in folded.constants)
    check_numerics(quantized, folded, x)


# ---------------------------------------------------------------------------------------------
# fold-batchnorm


def test_fold_batchnorm_removes_every_batch_norm_of_the_eval_cnn():
    _, program, input_sets = zoo("cnn")
    assert count(program, "batch_norm.default") == 6
    folded = optimize(program, "fold-batchnorm")
    assert count(folded, "batch_norm.default") == 0
    assert count(folded, "conv2d.default") == 6
    assert not any("bn" in key or "running" in key for key in folded.state_dict)
    assert len(folded.constants) == 12  # a folded weight and bias per convolution
    for args in input_sets:
        check_numerics(program, folded, *args)


def test_fold_batchnorm_after_decomposition():
    _, program, input_sets = zoo("cnn")
    decomposed = optimize(program, "decompose")
    folded = optimize(decomposed, "fold-batchnorm")
    assert count(decomposed, "_native_batch_norm_legit_no_training.default") == 6
    assert count(folded, "_native_batch_norm_legit_no_training.default") == 0
    check_numerics(program, folded, *input_sets[0])


def test_fold_batchnorm_after_convolutions_padded_same_or_valid():
    """conv2d(padding='same' | 'valid') is its own overload (aten.conv2d.padding, as Hugging Face's EfficientNet
    writes its convolutions); a batch norm after one folds as after any other."""
    layers = nn.Sequential(nn.Conv2d(3, 8, 3, padding="same"), nn.BatchNorm2d(8), nn.ReLU(),
                           nn.Conv2d(8, 4, 3, padding="valid", bias=False), nn.BatchNorm2d(4)).eval()
    for norm in (layers[1], layers[4]):
        norm.running_mean = kiln.randn(norm.num_features) * 0.1
        norm.running_var = kiln.rand(norm.num_features) + 0.5
    x = kiln.randn(2, 3, 9, 9)
    program = export(layers, x)
    folded = optimize(program, "fold-batchnorm")
    assert count(program, "conv2d.padding") == 2 and count(program, "batch_norm.default") == 2
    assert count(folded, "batch_norm.default") == 0 and count(folded, "conv2d.padding") == 2
    check_numerics(program, folded, x)


def test_fold_batchnorm_without_weights_emits_the_folding_as_ops():
    _, program, input_sets = zoo("cnn")
    bare = kiln.ExportedProgram.from_mlir(program.to_mlir())  # .mlir carries no weights
    folded = optimize(bare, "fold-batchnorm")
    assert count(folded, "batch_norm.default") == 0 and count(folded, "rsqrt.default") == 6
    folded.state_dict = dict(program.state_dict)
    check_numerics(program, folded, *input_sets[0])
    frozen = optimize(folded, "fold-constants{freeze=true}")
    assert count(frozen, "rsqrt.default") == 0
    check_numerics(program, frozen, *input_sets[0])


def test_fold_batchnorm_linear_and_the_cases_it_leaves():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear, self.bn = nn.Linear(6, 5), nn.BatchNorm1d(5)
            self.conv, self.bn2 = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)

        def forward(self, x, image):
            shared = self.conv(image)
            return self.bn(self.linear(x)), self.bn2(shared) + shared  # conv read twice: not folded

    model = M()
    for bn in (model.bn, model.bn2):  # non-trivial statistics
        bn.running_mean = kiln.randn(*bn.running_mean.shape)
        bn.running_var = kiln.rand(*bn.running_var.shape) + 0.5
    model.eval()
    x, image = kiln.randn(3, 6), kiln.randn(2, 3, 6, 6)
    program = export(model, x, image)
    folded = optimize(program, "fold-batchnorm")
    assert count(folded, "batch_norm.default") == 1 and count(folded, "linear.default") == 1
    check_numerics(program, folded, x, image)


def test_fold_batchnorm_keeps_training_mode_batch_norm():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))  # train mode
    program = export(model, kiln.randn(2, 3, 5, 5))
    assert count(optimize(program, "fold-batchnorm"), "batch_norm.default") == 1


# ---------------------------------------------------------------------------------------------
# remove-dropout


def _dropout_program(train):
    builder = GraphBuilder()
    x = builder.add_input("x", TensorType.of([3, 4], "f32"))
    with builder:
        y = aten.dropout.default(x, 0.5, train)
        z, mask = aten.native_dropout.default(y, 0.2, train)
        out = aten.mul.Tensor(z, aten._to_copy.default(mask, dtype=kiln.float32))
    return builder.build([out])


def test_remove_dropout_in_eval_mode():
    program = _dropout_program(train=False)
    optimized = optimize(program, "remove-dropout")
    assert count(optimized, "dropout.default", "native_dropout.default") == 0
    assert count(optimized, "full_like.default") == 1  # the mask is read: all true
    x = kiln.randn(3, 4)
    check_numerics(program, optimized, x)


def test_remove_dropout_leaves_training_dropout_unless_forced():
    program = _dropout_program(train=True)
    assert count(optimize(program, "remove-dropout"), "dropout.default", "native_dropout.default") == 2
    forced = optimize(program, "remove-dropout{force=true}")
    assert count(forced, "dropout.default", "native_dropout.default") == 0


# ---------------------------------------------------------------------------------------------
# fuse-activations, prepack


def _fusion(op):
    attribute = op.attributes.get(kiln.passes.FUSE_ATTRIBUTE)
    if attribute is None:
        return None
    return {key: value.value.data if hasattr(value, "value") else value.data for key, value in attribute.data.items()}


def test_fuse_activations_marks_conv_relu_add_relu_and_linear_relu():
    _, program, input_sets = zoo("cnn")
    fused = optimize(program, "fold-batchnorm,fuse-activations")
    roles = [(op.name, _fusion(op)["role"]) for op in fused.nodes() if _fusion(op)]
    assert roles.count(("aten.conv2d.default", "anchor")) == 3
    assert roles.count(("aten.add.Tensor", "anchor")) == 2
    assert roles.count(("aten.relu.default", "epilogue")) == 5
    anchors = {_fusion(op)["group"] for op in fused.nodes() if _fusion(op) and _fusion(op)["role"] == "anchor"}
    assert len(anchors) == 5
    reparsed = kiln.ExportedProgram.from_mlir(fused.to_mlir(), fused.state_dict, fused.constants)
    assert sum(1 for op in reparsed.nodes() if _fusion(op)) == 10  # annotations survive the text form
    check_numerics(program, fused, *input_sets[0])


def test_fuse_activations_sees_through_views_after_decomposition():
    _, program, _ = zoo("mlp")
    fused = optimize(program, "decompose,fuse-activations{activations=relu}")
    marked = [(op.name, _fusion(op)["role"]) for op in fused.nodes() if _fusion(op)]
    assert ("aten.addmm.default", "anchor") in marked and ("aten.relu.default", "epilogue") in marked


def test_prepack_stores_linear_weights_transposed():
    _, program, input_sets = zoo("mlp")
    for pipeline in ("prepack", "decompose,prepack"):
        packed = optimize(program, pipeline)
        assert count(packed, "linear.default", "permute.default") == 0
        assert count(packed, "addmm.default") == 3
        weights = {s.target: packed.constants[s.target] for s in packed.graph_signature.input_specs
                   if s.kind is InputKind.CONSTANT_TENSOR}
        assert sorted(w.shape for w in weights.values()) == sorted(
            w.T.shape for key, w in program.state_dict.items() if key.endswith("weight"))
        assert not any(key.endswith("weight") for key in packed.state_dict)
        for args in input_sets:
            check_numerics(program, packed, *args)


def test_prepack_rejects_unknown_layouts():
    with pytest.raises(kiln.passes.PipelineError, match=r"prepack.*unknown prepack layout\(s\) nchw-magic"):
        kiln.passes.parse_pipeline("prepack{layouts=nchw-magic}")
