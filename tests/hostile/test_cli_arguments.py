"""Garbage given to every flag of `kiln compile`, `run`, `export`, `inspect`, `opt`, `quantize` and `sparsify`:
non-numbers where numbers go, unknown choices, empty strings, missing files, outputs in missing, read-only or
occupied places. Each exits with status 2 and one `kiln: error:` line, no traceback, and writes nothing."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import kiln
import kiln.models
from tests.hostile.support import cli_error, tree

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")

MLP = "kiln.models:mlp"
# (arguments, a piece of the error line). Placeholders: {pkg} a genuine package, {pt2} a genuine .pt2, {x} an
# .npy input of the package, {file} a text file, {dir} an existing folder, {absent} a missing folder, {ro} a folder
# nothing can be created in.
CASES = {
    "compile": [
        ([], "the following arguments are required: MODEL, -o/--output"),
        ([MLP], "the following arguments are required: -o/--output"),
        (["", "-o", "pkg"], "malformed MODEL ''"),
        (["kiln.models:nope", "-o", "pkg"], "unknown zoo model 'nope'"),
        (["missing.py:Net", "-o", "pkg"], "model file missing.py does not exist"),
        (["missing.pt2", "-o", "pkg"], "model file missing.pt2 does not exist"),
        (["{file}:Net", "-o", "pkg"], "cannot import module"),
        ([MLP, "--target", "bogus", "-o", "pkg"], "argument --target: invalid choice: 'bogus'"),
        ([MLP, "--target", "", "-o", "pkg"], "argument --target: invalid choice: ''"),
        ([MLP, "-o", ""], "cannot write a package to '.'"),
        ([MLP, "-o", "."], "cannot write a package to '.'"),
        ([MLP, "-o", "{file}"], "exists and is not a kiln package"),
        ([MLP, "-o", "{absent}/pkg"], "does not exist"),
        ([MLP, "-o", "{ro}/pkg"], "cannot write"),
        ([MLP, "-o", "pkg", "-p", "bogus"], "unknown pass 'bogus'"),
        ([MLP, "-o", "pkg", "-p", "dce{"], "malformed pass pipeline"),
        ([MLP, "-o", "pkg", "-p", "dce{x=1}"], "unknown option 'x' for pass 'dce'"),
        ([MLP, "-o", "pkg", "--input", ""], "malformed --input ''"),
        (["kiln.models.mlp:MLP", "-o", "pkg", "--input", "x=4,32:float99"], "unknown dtype 'float99'"),
        (["kiln.models.mlp:MLP", "-o", "pkg", "--input", "x=1.5,32"], "malformed --input|malformed dim"),
        ([MLP, "-o", "pkg", "--dynamic", ""], "malformed --dynamic ''"),
        ([MLP, "-o", "pkg", "--dynamic", "batch=abc"], "malformed --dynamic"),
        ([MLP, "-o", "pkg", "--dynamic", "batch=9:1"], "above the maximum"),
        ([MLP, "-o", "pkg", "--bogus"], "unrecognized arguments: --bogus"),
    ],
    "run": [
        ([], "the following arguments are required: PACKAGE"),
        (["", "--input", "x={x}"], "is not a kiln package"),
        (["{absent}", "--input", "x={x}"], "is not a kiln package"),
        (["{x}", "--input", "x={x}"], "is not a kiln package"),
        (["{pkg}", "--input", ""], "malformed --input ''"),
        (["{pkg}", "--input", "x={x}", "--bench", "abc"], "argument --bench: invalid int value: 'abc'"),
        (["{pkg}", "--input", "x={x}", "--bench", ""], "argument --bench: invalid int value: ''"),
        (["{pkg}", "--input", "x={x}", "--bench", "-1"], "--bench -1 is negative"),
        (["{pkg}", "--input", "x={x}", "--profile", "1e3"], "argument --profile: invalid int value"),
        (["{pkg}", "--input", "x={x}", "--profile", "-5"], "--profile -5 is negative"),
        (["{pkg}", "--input", "x={x}", "--threads", "two"], "argument --threads: invalid int value"),
        (["{pkg}", "--input", "x={x}", "--threads", "0"], "--threads 0 is not a positive count"),
        (["{pkg}", "--input", "x={x}", "--threads", "-2"], "--threads -2 is not a positive count"),
        (["{pkg}", "--input", "x={x}", "--output", ""], "cannot write '.': it is a folder"),
        (["{pkg}", "--input", "x={x}", "--output", "{dir}"], "it is a folder"),
        (["{pkg}", "--input", "x={x}", "--output", "{absent}/out.npz"], "does not exist"),
        (["{pkg}", "--input", "x={x}", "--output", "{ro}/out.npz"], "cannot write"),
        (["{pkg}", "--input", "x={x}", "--bogus"], "unrecognized arguments: --bogus"),
    ],
    "export": [
        ([MLP, "-o", "m.onnx"], "the following arguments are required: --format"),
        ([MLP, "--format", "bogus", "-o", "m.onnx"], "argument --format: invalid choice: 'bogus'"),
        ([MLP, "--format", "", "-o", "m.onnx"], "argument --format: invalid choice: ''"),
        ([MLP, "--format", "onnx", "-o", "m.onnx", "--opset", "abc"], "argument --opset: invalid int value"),
        ([MLP, "--format", "onnx", "-o", "m.onnx", "--opset", "999"], "opset 999 is not supported"),
        ([MLP, "--format", "onnx", "-o", "m.onnx", "--opset", "-1"], "opset -1 is not supported"),
        ([MLP, "--format", "onnx", "-o", ""], "cannot write '.': it is a folder"),
        ([MLP, "--format", "pt2", "-o", "{dir}"], "it is a folder"),
        ([MLP, "--format", "onnx", "-o", "{absent}/m.onnx"], "does not exist"),
        ([MLP, "--format", "onnx", "-o", "{ro}/m.onnx"], "cannot write"),
        ([MLP, "--format", "pt2", "-o", "{ro}/m.pt2"], "cannot write"),
        (["", "--format", "onnx", "-o", "m.onnx"], "malformed MODEL ''"),
        (["absent.pt2", "--format", "onnx", "-o", "m.onnx"], "does not exist"),
        ([MLP, "--format", "onnx", "-o", "m.onnx", "--input", ""], "malformed --input ''"),
        ([MLP, "--format", "onnx", "-o", "m.onnx", "--dynamic", "=:"], "malformed --dynamic"),
        ([MLP, "--format", "onnx", "-o", "m.onnx", "--dynamic", "seq=1:4"], "not dynamic dims of this model"),
        ([MLP, "--format", "onnx", "-o", "m.onnx", "--verify=yes"], "ignored explicit argument 'yes'"),
        ([MLP, "--format", "onnx", "-o", "m.onnx", "--external-data=1"], "ignored explicit argument '1'"),
    ],
    "inspect": [
        ([], "the following arguments are required: file"),
        ([""], "is a directory without manifest.json"),
        (["absent.pt2"], "no such file: absent.pt2"),
        (["{x}"], "not a .pt2 archive"),
        (["{file}"], "not a .pt2 archive"),
        (["/dev/null"], "is not a regular file"),
        (["{dir}"], "is a directory without manifest.json"),
        (["{pt2}", "--json=1"], "ignored explicit argument '1'"),
    ],
    "opt": [
        (["absent.pt2", "-o", "out.pt2"], "cannot read absent.pt2: it does not exist"),
        (["", "-o", "out.pt2"], "unknown input format '(no extension)'"),
        (["{x}", "-o", "out.pt2"], "unknown input format '.npy'"),
        (["{pt2}", "-p", "bogus", "-o", "out.pt2"], "unknown pass 'bogus'"),
        (["{pt2}", "-p", "dce{", "-o", "out.pt2"], "malformed pass pipeline"),
        (["{pt2}", "-p", "cse{x=", "-o", "out.pt2"], "malformed pass pipeline"),
        (["{pt2}", "-o", ""], "unknown output format '(no extension)'"),
        (["{pt2}", "-o", "out.txt"], "unknown output format '.txt'"),
        (["{pt2}", "-o", "{absent}/out.pt2"], "cannot write"),
        (["{pt2}", "-o", "{ro}/out.pt2"], "cannot write"),
        (["{pt2}", "-o", "{ro}/out.mlir"], "cannot write"),
        (["{pt2}", "-o", "out.pt2", "--print-ir-after", "bogus"], "unknown pass 'bogus'"),
        (["{pt2}", "-o", "out.pt2", "--pass-plugin", "absent.py"], "pass plugin 'absent.py' does not exist"),
        (["{pt2}", "-o", "out.pt2", "--pass-plugin", ""], "pass plugin '' does not exist"),
        (["{pt2}", "-o", "out.pt2", "--pass-plugin", "{x}"], "cannot import pass plugin"),
        (["{pt2}", "-o", "out.pt2", "--timing=1"], "ignored explicit argument '1'"),
        (["-o", "out.pt2"], "kiln opt needs an input program"),
    ],
    "quantize": [
        ([MLP, "-o", "q.pt2"], "the following arguments are required: --scheme"),
        ([MLP, "--scheme", "bogus", "-o", "q.pt2"], "argument --scheme: invalid choice: 'bogus'"),
        ([MLP, "--scheme", "", "-o", "q.pt2"], "argument --scheme: invalid choice: ''"),
        ([MLP, "--scheme", "weight-only-int4", "--group-size", "abc", "-o", "q.pt2"], "invalid int value: 'abc'"),
        ([MLP, "--scheme", "weight-only-int4", "--group-size", "7", "-o", "q.pt2"], "group size 7 is not supported"),
        ([MLP, "--scheme", "weight-only-int4", "--group-size", "-32", "-o", "q.pt2"], "group size -32 is not"),
        ([MLP, "--scheme", "static", "--calibration", "absent.npz", "-o", "q.pt2"], "does not exist"),
        ([MLP, "--scheme", "static", "--calibration", "", "-o", "q.pt2"], "does not exist"),
        ([MLP, "--scheme", "static", "-o", "q.pt2"], "static quantization needs calibration data"),
        ([MLP, "--scheme", "dynamic", "--report", "-o", "q.pt2"], "--report compares outputs on data"),
        ([MLP, "--scheme", "dynamic", "--calibrate-with", "gpu", "-o", "q.pt2"], "invalid choice: 'gpu'"),
        ([MLP, "--scheme", "dynamic", "-o", ""], "cannot tell the format of ."),
        ([MLP, "--scheme", "dynamic", "-o", "q.bin"], "cannot tell the format of q.bin"),
        ([MLP, "--scheme", "dynamic", "-o", "{absent}/q.pt2"], "does not exist"),
        ([MLP, "--scheme", "dynamic", "-o", "{ro}/q.pt2"], "cannot write"),
        ([MLP, "--scheme", "dynamic", "-o", "q.pt2", "--input", ""], "malformed --input ''"),
        ([MLP, "--scheme", "dynamic", "-o", "q.pt2", "--dynamic", "batch"], "malformed --dynamic"),
    ],
    "sparsify": [
        ([MLP, "--sparsity", "abc", "-o", "s.pt2"], "--sparsity must be a number in [0, 1], got 'abc'"),
        ([MLP, "--sparsity", "", "-o", "s.pt2"], "--sparsity must be a number in [0, 1], got ''"),
        ([MLP, "--sparsity", "1.5", "-o", "s.pt2"], "--sparsity must be a number in [0, 1], got '1.5'"),
        ([MLP, "--sparsity", "nan", "-o", "s.pt2"], "got 'nan'"),
        ([MLP, "--min-sparsity", "-1", "-o", "s.pt2"], "--min-sparsity must be a number in [0, 1]"),
        ([MLP, "--block", "a,b", "-o", "s.pt2"], "malformed --block 'a,b'"),
        ([MLP, "--block", "", "-o", "s.pt2"], "malformed --block ''"),
        ([MLP, "--block", "0,16", "-o", "s.pt2"], "malformed --block '0,16'"),
        ([MLP, "--pattern", "bogus", "-o", "s.pt2"], "unknown --pattern 'bogus'"),
        ([MLP, "--scope", "", "-o", "s.pt2"], "unknown --scope ''"),
        ([MLP, "--layout", "coo", "-o", "s.pt2"], "unknown --layout 'coo'"),
        ([MLP, "--pattern", "semi_structured", "--sparsity", "0.7", "-o", "s.pt2"], "does not apply"),
        ([MLP, "--pattern", "block", "--scope", "global", "-o", "s.pt2"], "--scope global applies to"),
        ([MLP, "-o", ""], "cannot write a package to '.'"),
        ([MLP, "-o", "s.txt"], "cannot tell what to write to s.txt"),
        ([MLP, "-o", "{absent}/s.pt2"], "does not exist"),
        ([MLP, "-o", "{ro}/s.pt2"], "cannot write"),
        ([MLP, "-o", "{ro}/spkg"], "cannot write"),
        ([MLP, "-o", "s.pt2", "--input", "x"], "malformed --input 'x'"),
    ],
}


@pytest.fixture(scope="module")
def inputs(genuine, tmp_path_factory):
    """The files the cases name, in a folder of their own."""
    folder = tmp_path_factory.mktemp("inputs")
    np.save(folder / "x.npy", np.ones((2, 3), np.float32))
    (folder / "notes.txt").write_text("not a model\n")
    (folder / "a folder").mkdir()
    entry = kiln.models.get("mlp")
    kiln.save(kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes), folder / "mlp.pt2")
    return {"pkg": str(genuine[1]), "pt2": str(folder / "mlp.pt2"), "x": str(folder / "x.npy"),
            "file": str(folder / "notes.txt"), "dir": str(folder / "a folder"), "absent": str(folder / "absent")}


@pytest.mark.parametrize("command, arguments, match", [
    (command, arguments, match) for command, cases in CASES.items() for arguments, match in cases],
    ids=[f"{command}:{' '.join(arguments) or '(none)'}" for command, cases in CASES.items() for arguments, _ in cases])
def test_garbage_arguments_exit_2_with_one_line(inputs, genuine, unwritable_dir, tmp_path, capsys, monkeypatch,
                                                command, arguments, match):
    import re
    monkeypatch.chdir(tmp_path)
    argv = []
    for argument in arguments:
        for name, value in {**inputs, "ro": str(unwritable_dir)}.items():
            argument = argument.replace("{" + name + "}", value)
        argv.append(argument)
    if command in ("compile", "export", "quantize", "sparsify"):
        argv.append("-q")
    before, inputs_before = tree(tmp_path), tree(genuine[1].parent)
    line = cli_error(capsys, command, *argv)
    assert re.search(match if "|" in match else re.escape(match), line), line
    assert tree(tmp_path) == before and tree(genuine[1].parent) == inputs_before  # nothing written anywhere
