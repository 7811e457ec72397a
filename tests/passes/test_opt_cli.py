"""`kiln opt`: pipelines on .mlir files, pass listing, and errors that exit 2 without writing output."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.passes
from kiln.cli.main import main

from tests.passes.support import assert_same_outputs, count, outputs, zoo


@pytest.fixture
def cnn_file(tmp_path):
    """The zoo CNN as model.mlir, with its weights beside it (model.mlir.npz)."""
    _, program, _ = zoo("cnn")
    path = tmp_path / "model.mlir"
    path.write_text(program.to_mlir())
    np.savez(tmp_path / "model.mlir.npz", **program.state_dict)
    return path


def test_list_passes_shows_every_pass_with_options(capsys):
    assert main(["opt", "--list-passes"]) == 0
    listing = capsys.readouterr().out
    for name, pass_class in kiln.passes.PASSES.items():
        assert f"  {name} " in listing and pass_class.description() in listing
        for info in pass_class.options():
            assert f"{info.name}: {info.type_name}" in listing
    assert "linear-transposed" in listing and kiln.passes.DEFAULT_PIPELINE in listing


def test_opt_runs_a_pipeline_and_writes_program_and_weights(cnn_file, capsys):
    out = cnn_file.parent / "out.mlir"
    assert main(["opt", str(cnn_file), "-p", "fold-batchnorm,decompose,canonicalize,cse,dce", "-o", str(out),
                 "--timing", "--print-ir-after", "fold-batchnorm"]) == 0
    log = capsys.readouterr().err
    assert "IR Dump After fold-batchnorm" in log and log.count("IR Dump After") == 1
    assert "Total Execution Time" in log
    with np.load(str(out) + ".npz") as stored:
        weights = {key: stored[key] for key in stored.files}
    result = kiln.ExportedProgram.from_mlir(out.read_text())
    result.state_dict = {k: v for k, v in weights.items() if k in result.graph_signature.parameters}
    result.constants = {k: v for k, v in weights.items() if k not in result.state_dict}
    assert count(result, "_native_batch_norm_legit_no_training.default", "batch_norm.default") == 0
    _, program, input_sets = zoo("cnn")
    assert_same_outputs(result, outputs(program, input_sets[0]), input_sets[0])


def test_opt_writes_to_stdout_and_prints_ir_after_all(cnn_file, capsys):
    assert main(["opt", str(cnn_file), "-p", "canonicalize,dce", "--print-ir-after-all"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("builtin.module") and captured.err.count("IR Dump After") == 2


@pytest.mark.parametrize("arguments, message", [
    (["-p", "canonicalize,frobnicate"], "unknown pass 'frobnicate'"),
    (["-p", "fold-constants{freeze=maybe}"], "option 'freeze' of pass 'fold-constants' expects bool"),
    (["-p", "dce{x=1}"], "unknown option 'x' for pass 'dce'"),
    (["-p", "dce,,cse"], "malformed pass pipeline"),
    (["-p", "dce", "--print-ir-after", "nope"], "unknown pass 'nope'"),
])
def test_pipeline_errors_exit_2_without_output(cnn_file, capsys, arguments, message):
    out = cnn_file.parent / "out.mlir"
    assert main(["opt", str(cnn_file), *arguments, "-o", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_pt2_in_and_out(tmp_path):
    """kiln opt reads torch.export's format and writes it back, weights included."""
    entry, program, inputs = zoo("cnn")
    source, target = tmp_path / "model.pt2", tmp_path / "optimized.pt2"
    kiln.save(program, source)
    assert main(["opt", str(source), "-p", "fold-batchnorm,decompose,dce", "-o", str(target)]) == 0
    optimized = kiln.load(target)
    assert not any("batch_norm" in op.name for op in optimized.nodes())
    for args in inputs:
        np.testing.assert_allclose(np.asarray(optimized(*args).numpy(), np.float64),
                                   np.asarray(program(*args).numpy(), np.float64), rtol=1.3e-6, atol=1e-5)


def test_a_failing_pass_leaves_an_existing_output_untouched(cnn_file, tmp_path, capsys):
    plugin = tmp_path / "failing.py"
    plugin.write_text(
        "import kiln\nfrom kiln.passes import Pass, register_pass\n\n"
        "@register_pass('fail-late')\nclass FailLate(Pass):\n    '''Fail.'''\n\n"
        "    def apply_program(self, program):\n        raise kiln.KilnError('cannot do this')\n")
    out = tmp_path / "out.mlir"
    out.write_text("previous result")
    try:
        assert main(["opt", str(cnn_file), "--pass-plugin", str(plugin), "-p", "canonicalize,fail-late",
                     "-o", str(out)]) == 2
    finally:
        kiln.passes.PASSES.pop("fail-late", None)
    assert "in pass 'fail-late': cannot do this" in capsys.readouterr().err
    assert out.read_text() == "previous result"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_unwritable_output_and_missing_input_exit_2(cnn_file, capsys):
    assert main(["opt", str(cnn_file), "-p", "dce", "-o", str(cnn_file.parent / "missing" / "out.mlir")]) == 2
    assert "cannot write" in capsys.readouterr().err
    assert main(["opt", str(cnn_file.parent / "absent.mlir"), "-p", "dce"]) == 2
    assert "cannot read" in capsys.readouterr().err
