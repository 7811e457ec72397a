"""Real Hugging Face models end to end: torch.export with dynamic batch and sequence dims, saved, then loaded by kiln
in a process where torch cannot be imported, and run on the interpreter, in ONNX (onnxruntime) and compiled to C,
each at two sizes against torch eager; and kiln.from_torch on the same modules. This is a representative subset of
tests/models/hf_zoo.py; test_sweep.py (slow) runs every architecture's load and interpreter stages."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.models.hf_zoo import (ARCHITECTURES, SIZES, expected_outputs, export_to_folder,  # noqa: E402
                                 run_in_kiln, stage_mismatch, torch_outputs)

import kiln  # noqa: E402
from kiln.ir.pytree import tree_flatten  # noqa: E402

STAGES = ["interpreter", "onnx"] + (["c"] if shutil.which("cc") else [])
REPRESENTATIVE = ["gpt2", "bert", "llama", "t5", "distilbert", "vit", "whisper", "bart", "resnet", "wav2vec2"]


@pytest.mark.cpu_capability
@pytest.mark.parametrize("name", REPRESENTATIVE)
def test_torch_exported_file_runs_in_kiln_without_torch(name, tmp_path):
    architecture = ARCHITECTURES[name]
    model = architecture.model()
    export_to_folder(architecture, model, tmp_path)
    report, stderr = run_in_kiln(tmp_path, STAGES)
    assert all(error is None for error in report["stages"].values()), (report["stages"], stderr)
    expected = expected_outputs(architecture, model)
    for stage in STAGES:
        assert stage_mismatch(tmp_path, stage, expected) is None, f"{name} {stage}"


@pytest.mark.parametrize("name", ["gpt2", "bert", "llama"])
def test_from_torch_converts_the_same_modules(name):
    architecture = ARCHITECTURES[name]
    model = architecture.model()
    program = kiln.from_torch(model, (), architecture.make_inputs(*SIZES[0]),
                              dynamic_shapes=architecture.dynamic_shapes())
    assert {str(s) for s in program.range_constraints} >= {"batch", "seq"}  # the user's Dim names
    for size in SIZES:
        inputs = architecture.make_inputs(*size)
        got, _ = tree_flatten(program(**{key: value.numpy() for key, value in inputs.items()}))
        for g, e in zip(got, torch_outputs(model, inputs), strict=True):
            torch.testing.assert_close(torch.from_numpy(np.asarray(g)), e)


@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_triton_package_matches_torch(name, tmp_path):
    """GPT-2 and BERT through the Triton backend (Triton's interpreter on CPU), one package for both sizes."""
    pytest.importorskip("triton")
    from kiln.compiler import compile as compile_program
    architecture = ARCHITECTURES[name]
    model = architecture.model()
    program = kiln.from_torch(model, (), architecture.make_inputs(*SIZES[0]),
                              dynamic_shapes=architecture.dynamic_shapes())
    package = compile_program(program, target="triton", output=tmp_path / "pkg")
    names = [spec["name"] for spec in package.manifest["inputs"]]
    for size in SIZES:
        inputs = architecture.make_inputs(*size)
        got, _ = tree_flatten(package(*[inputs[name].numpy() for name in names]))
        for g, e in zip(got, torch_outputs(model, inputs), strict=True):
            torch.testing.assert_close(torch.from_numpy(np.asarray(g)), e)
