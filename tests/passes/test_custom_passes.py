"""The custom-pass API: registration, pattern methods, DAG matching, and the errors that guard it."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

import kiln
import kiln.nn as nn
import kiln.nn.functional as F
import kiln.passes
from kiln.passes import PassError, RewritePass, constant, current_op, pattern, producer, register_pass, value_of

from tests.passes.support import assert_same_outputs, count, op_names, outputs

aten = kiln.ops.aten


class SiluModel(nn.Module):
    def forward(self, x):
        gate = x.sigmoid()
        return x * gate, (x + 1) * gate  # only the first product is silu(x)


def test_dag_pattern_replaces_x_times_sigmoid_x(registry):
    @register_pass
    class FuseSilu(RewritePass):
        """Rewrite x * sigmoid(x) as silu(x)."""

        name = "fuse-silu"

        @pattern(aten.mul.Tensor)
        def mul(self, a, b):
            for x, gate in ((a, b), (b, a)):
                sigmoid = producer(gate, aten.sigmoid.default)
                if sigmoid is not None and sigmoid.args[0] is x:
                    assert not sigmoid.has_one_use  # the second product reads it too
                    return aten.silu.default(x)
            return None

    x = kiln.randn(3, 5)
    program = kiln.export(SiluModel(), (x,))
    optimized = kiln.passes.run(program, "fuse-silu", verify_each=True)
    assert sorted(op_names(optimized)) == sorted(["aten.sigmoid.default", "aten.silu.default", "aten.add.Scalar",
                                                  "aten.mul.Tensor"])
    assert_same_outputs(optimized, outputs(program, (x,)), (x,))
    assert "fuse-silu" in kiln.passes.PASSES and FuseSilu.description() == "Rewrite x * sigmoid(x) as silu(x)."


def test_pattern_with_options_constants_and_multiple_results(registry):
    @register_pass("scale-weights")
    class ScaleWeights(RewritePass):
        """Fold a scalar multiply of a linear's output into its weights."""

        factor: float = kiln.passes.option(2.0, "unused here: the scale comes from the graph")

        @pattern(aten.mul.Scalar)
        def mul(self, y, scale):
            linear = producer(y, aten.linear.default)
            if linear is None or not linear.has_one_use:
                return None
            x, weight, bias = linear.args
            w, b = value_of(weight), value_of(bias)
            if w is None or b is None:
                return None
            assert current_op().results[0].type == y.type
            return linear.handle(x, constant(w * scale, "scaled_weight"), constant(b * scale, "scaled_bias"))

    model = nn.Linear(4, 3)

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = model

        def forward(self, x):
            return self.linear(x) * 3.0

    x = kiln.randn(2, 4)
    program = kiln.export(M(), (x,))
    optimized = kiln.passes.run(program, "scale-weights{factor=1}", verify_each=True)
    assert op_names(optimized) == ["aten.linear.default"]
    assert sorted(optimized.constants) == ["scaled_bias_0", "scaled_weight_0"]
    assert optimized.state_dict == {}
    assert_same_outputs(optimized, outputs(program, (x,)), (x,))


def test_declined_matches_leave_no_trace(registry):
    @register_pass("indecisive")
    class Indecisive(RewritePass):
        """Build a replacement, then decline."""

        @pattern(aten.relu.default)
        def relu(self, x):
            aten.clamp.default(aten.neg.default(x), 0)
            return None

    program = kiln.export(nn.ReLU(), (kiln.randn(3),))
    assert op_names(kiln.passes.run(program, "indecisive")) == ["aten.relu.default"]


def test_a_replacement_of_the_wrong_type_is_an_error(registry):
    @register_pass("bad-type")
    class BadType(RewritePass):
        """Return a value of another shape."""

        @pattern(aten.relu.default)
        def relu(self, x):
            return aten.sum.default(x)

    program = kiln.export(nn.ReLU(), (kiln.randn(3),))
    with pytest.raises(PassError, match=r"BadType.relu on aten.relu.default replaced a f32\[3\] result by a f32\[\]"):
        kiln.passes.run(program, "bad-type")


def test_wrong_result_counts_and_non_values_are_errors(registry):
    @register_pass("bad-results")
    class BadResults(RewritePass):
        """Return the wrong things."""

        @pattern(aten.relu.default)
        def relu(self, x):
            return x, x

        @pattern(aten.sin.default)
        def sin(self, x):
            return np.zeros(3, np.float32)

    program = kiln.export(nn.ReLU(), (kiln.randn(3),))
    with pytest.raises(PassError, match=r"returned 2 value\(s\) for 1 result"):
        kiln.passes.run(program, "bad-results")

    class Sin(nn.Module):
        def forward(self, x):
            return x.sin()

    with pytest.raises(PassError, match="returned ndarray, not an IR value"):
        kiln.passes.run(kiln.export(Sin(), (kiln.randn(3),)), "bad-results")


def test_a_pattern_that_never_converges_is_stopped(registry):
    @register_pass("forever")
    class Forever(RewritePass):
        """Replace relu by relu, forever."""

        @pattern(aten.relu.default)
        def relu(self, x):
            return aten.relu.default(x)

    program = kiln.export(nn.ReLU(), (kiln.randn(3),))
    with pytest.raises(PassError, match="keeps rewriting aten.relu.default without converging"):
        kiln.passes.run(program, "forever")


def test_helpers_outside_a_pattern_say_so():
    with pytest.raises(PassError, match="only inside a @pattern method"):
        current_op()


def test_registration_errors(registry):
    with pytest.raises(kiln.KilnError, match="is not a kiln pass"):
        register_pass(object)

    with pytest.raises(kiln.KilnError, match="needs a name in kebab-case"):
        @register_pass("Not_Kebab")
        class Bad(RewritePass):
            """Doc."""

    with pytest.raises(kiln.KilnError, match="has no docstring"):
        @register_pass("undocumented")
        class Undocumented(RewritePass):
            pass

    with pytest.raises(kiln.KilnError, match="a pass named 'dce' is already registered"):
        @register_pass("dce")
        class MyDce(RewritePass):
            """Another dce."""


def test_load_plugin_registers_passes_once(tmp_path, registry):
    plugin = tmp_path / "plugin.py"
    plugin.write_text(textwrap.dedent('''
        import kiln
        from kiln.passes import RewritePass, pattern, register_pass

        @register_pass
        class SinToCos(RewritePass):
            """Replace sin by cos (for the test)."""

            name = "sin-to-cos"

            @pattern(kiln.ops.aten.sin.default)
            def sin(self, x):
                return kiln.ops.aten.cos.default(x)
    '''))
    module = kiln.passes.load_plugin(plugin)
    assert module.__kiln_new_passes__ == ["sin-to-cos"]
    assert kiln.passes.load_plugin(str(plugin)) is module

    class Sin(nn.Module):
        def forward(self, x):
            return x.sin()

    assert op_names(kiln.passes.run(kiln.export(Sin(), (kiln.randn(3),)), "sin-to-cos")) == ["aten.cos.default"]


def test_load_plugin_errors(tmp_path):
    with pytest.raises(kiln.KilnError, match="does not exist"):
        kiln.passes.load_plugin(tmp_path / "missing.py")
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(kiln.KilnError, match="failed to import: RuntimeError: boom"):
        kiln.passes.load_plugin(broken)


def test_replacing_a_multi_result_op(registry):
    @register_pass("split-to-slices")
    class SplitToSlices(RewritePass):
        """Replace split_with_sizes by slices."""

        @pattern(aten.split_with_sizes.default)
        def split(self, x, sizes, dim=0):
            pieces, start = [], 0
            for size in sizes:
                pieces.append(aten.slice.Tensor(x, dim, start, start + size))
                start += size
            return pieces

    class M(nn.Module):
        def forward(self, x):
            a, b = x.split([2, 3], dim=1)
            return a.sum() + b.sum()

    x = kiln.randn(4, 5)
    program = kiln.export(M(), (x,)).run_decompositions()
    optimized = kiln.passes.run(program, "split-to-slices", verify_each=True)
    assert count(optimized, "split_with_sizes.default") == 0 and count(optimized, "slice.Tensor") == 2
    assert_same_outputs(optimized, outputs(program, (x,)), (x,))


def test_pattern_on_a_packet_matches_every_overload(registry):
    @register_pass("count-squeezes")
    class SqueezeToView(RewritePass):
        """Replace every squeeze overload by a view."""

        @pattern(aten.squeeze)
        def squeeze(self, x, *args):
            return aten.view.default(x, list(current_op().results[0].type.shape))

    class M(nn.Module):
        def forward(self, x):
            return F.relu(x.squeeze(0)), x.squeeze()

    x = kiln.randn(1, 3, 1)
    program = kiln.export(M(), (x,))
    optimized = kiln.passes.run(program, "count-squeezes", verify_each=True)
    assert not any("squeeze" in name for name in op_names(optimized))
    assert_same_outputs(optimized, outputs(program, (x,)), (x,))
