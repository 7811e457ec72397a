"""Pipeline strings, their errors, and what `kiln.passes.run` guarantees about the program it returns."""

from __future__ import annotations

import io

import pytest
from xdsl.context import Context

import kiln
import kiln.nn as nn
import kiln.passes
from kiln.ir import VerificationError
from kiln.passes import PipelineError, parse_pipeline

from tests.passes.support import assert_same_outputs, count, outputs, zoo


# ---------------------------------------------------------------------------------------------
# Parsing


def test_pipeline_parses_passes_and_typed_options():
    passes = parse_pipeline("decompose{keep=gelu,layer_norm},canonicalize, fold-constants{freeze=true},"
                            "fuse-activations{activations=relu add-relu=false},cse,dce")
    assert [p.name for p in passes] == ["decompose", "canonicalize", "fold-constants", "fuse-activations", "cse",
                                        "dce"]
    assert passes[0].keep == ("gelu", "layer_norm")
    assert passes[2].freeze is True
    assert passes[3].activations == ("relu",) and passes[3].add_relu is False


def test_pipeline_text_round_trips_through_str():
    text = "decompose{keep=gelu,layer_norm},fold-constants{freeze=true},fuse-activations{add-relu=false},dce"
    passes = parse_pipeline(text)
    assert ",".join(str(p) for p in passes) == text
    assert parse_pipeline(",".join(str(p) for p in passes)) == passes


def test_pipeline_conveniences():
    assert parse_pipeline("fold-constants{freeze}")[0].freeze is True  # a bare flag means true
    assert parse_pipeline("decompose{keep=aten.gelu.default,add.Tensor}")[0].keep == (
        "aten.gelu.default", "add.Tensor")  # op names need no quotes
    assert parse_pipeline("") == []


def test_unknown_pass_names_it_and_lists_the_valid_ones():
    with pytest.raises(PipelineError) as caught:
        parse_pipeline("decompose,canonicalise")
    assert "unknown pass 'canonicalise'" in str(caught.value)
    assert "did you mean canonicalize" in str(caught.value)
    for name in kiln.passes.PASSES:
        assert name in caught.value.fix


def test_unknown_option_names_the_pass_and_lists_its_options():
    with pytest.raises(PipelineError) as caught:
        parse_pipeline("fold-constants{frozen=true}")
    assert "unknown option 'frozen' for pass 'fold-constants'" in str(caught.value)
    assert "freeze (bool)" in caught.value.fix


@pytest.mark.parametrize("text, message", [
    ("fold-constants{freeze=3}", "option 'freeze' of pass 'fold-constants' expects bool, got 3"),
    ("fold-constants{freeze=yes}", "option 'freeze' of pass 'fold-constants' expects bool, got yes"),
    ("remove-dropout{force=true,false}", "option 'force' of pass 'remove-dropout' takes one bool"),
    ("decompose{table=x}", "option 'table' of pass 'decompose' can only be set from Python"),
    ("decompose{keep=not_an_op}", "pass 'decompose': unknown op 'not_an_op'"),
])
def test_ill_typed_options_name_the_pass_and_option(text, message):
    with pytest.raises(PipelineError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_pipeline(text)


@pytest.mark.parametrize("text", ["decompose{keep=gelu", "decompose,,dce", "dce cse", "fold-constants{freeze=1,x=2}"])
def test_malformed_pipelines_say_where(text):
    with pytest.raises(PipelineError, match="malformed pass pipeline .* at column"):
        parse_pipeline(text)


# ---------------------------------------------------------------------------------------------
# Running


class WithUnusedWeights(nn.Module):
    def __init__(self):
        super().__init__()
        self.used, self.unused = nn.Linear(4, 3), nn.Linear(4, 3)
        self.norm = nn.BatchNorm1d(3)

    def forward(self, x):
        return self.norm(self.used(x))


def test_run_returns_a_new_consistent_program_and_leaves_the_input_alone():
    model = WithUnusedWeights().eval()
    x = kiln.randn(5, 4)
    program = kiln.export(model, (x,))
    text, state = program.to_mlir(), dict(program.state_dict)
    optimized = kiln.passes.run(program, "fold-batchnorm,dce")
    assert program.to_mlir() == text and program.state_dict.keys() == state.keys()
    # Unused parameters and buffers (the unused layer, the folded norm, num_batches_tracked) are gone.
    assert optimized.graph_signature.parameters == [] and optimized.state_dict == {}
    assert sorted(optimized.constants) == ["used_bias_bn_folded_0", "used_weight_bn_folded_0"]
    specs = optimized.graph_signature.input_specs
    assert [s.kind for s in specs] == [kiln.InputKind.CONSTANT_TENSOR] * 2 + [kiln.InputKind.USER_INPUT]
    names = [a.name_hint for a in optimized.body.args]
    assert [s.name for s in specs] == names
    assert optimized.graph.function_type.inputs.data == tuple(a.type for a in optimized.body.args)
    assert_same_outputs(optimized, outputs(program, (x,)), (x,))
    reparsed = kiln.ExportedProgram.from_mlir(optimized.to_mlir(), optimized.state_dict, optimized.constants)
    assert_same_outputs(reparsed, outputs(program, (x,)), (x,))
    assert optimized(x).shape == model(x).shape  # the calling convention is kept


def test_timing_and_ir_dumps():
    _, program, _ = zoo("mlp")
    stream = io.StringIO()
    manager = kiln.passes.PassManager("decompose,canonicalize,dce", print_ir_after=("canonicalize",),
                                      timing=True, stream=stream)
    manager.run(program)
    report = stream.getvalue()
    assert [t.name for t in manager.timings] == ["decompose", "canonicalize", "dce"]
    assert all(t.seconds >= 0 for t in manager.timings)
    assert report.count("// -----// IR Dump After") == 1 and "IR Dump After canonicalize" in report
    assert "func.func @forward" in report
    assert "Total Execution Time" in report and "decompose" in report.split("Total Execution Time")[1]

    stream = io.StringIO()
    kiln.passes.PassManager("canonicalize,dce", print_ir_after_all=True, stream=stream).run(program)
    assert stream.getvalue().count("// -----// IR Dump After") == 2


def test_print_ir_after_an_unknown_pass_is_an_error():
    with pytest.raises(PipelineError, match="unknown pass 'canonicalise'"):
        kiln.passes.PassManager("canonicalize", print_ir_after=("canonicalise",))


def test_verify_each_names_the_pass_that_broke_the_program(registry):
    @kiln.passes.register_pass("break-types")
    class BreakTypes(kiln.passes.Pass):
        """Corrupt the first op's result type."""

        def apply_program(self, program):
            result = next(program.nodes()).results[0]
            result._type = result.type.with_shape([1] * result.type.ndim)  # what a buggy pass might do
            return program

    _, program, _ = zoo("mlp")
    with pytest.raises(VerificationError, match="after pass 'break-types'"):
        kiln.passes.run(program, "canonicalize,break-types", verify_each=True)


def test_errors_inside_a_pass_name_it(registry):
    @kiln.passes.register_pass("always-fails")
    class AlwaysFails(kiln.passes.Pass):
        """Fail."""

        def apply_program(self, program):
            raise kiln.KilnError("something is wrong", fix="do something else")

    with pytest.raises(kiln.KilnError, match="in pass 'always-fails': something is wrong"):
        kiln.passes.run(zoo("mlp")[1], "always-fails")


def test_passes_run_as_xdsl_module_passes():
    _, program, _ = zoo("cnn")
    module = kiln.ExportedProgram.from_mlir(program.to_mlir()).graph_module
    kiln.passes.Decompose().apply(Context(), module)
    decomposed = kiln.ExportedProgram.from_mlir(str(module), program.state_dict)
    assert count(decomposed, "conv2d.default") == 0 and count(decomposed, "convolution.default") == 6
    decomposed.verify()
