"""Real Hugging Face models end to end: torch.export with dynamic batch and sequence dims, saved, then loaded by kiln
in a process where torch cannot be imported, and run on the interpreter, in ONNX (onnxruntime) and compiled to C,
each at two sizes against torch eager; and kiln.from_torch on the same modules."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.models.hf_zoo import ARCHITECTURES, SIZES  # noqa: E402

import kiln  # noqa: E402
from kiln.ir.pytree import tree_flatten  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
STAGES = ["interpreter", "onnx"] + (["c"] if shutil.which("cc") else [])

# Loads model.pt2 with torch blocked and writes each stage's flattened outputs for each size's inputs.
CHILD = textwrap.dedent("""
    import importlib.abc, sys

    class BlockTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ImportError("torch is blocked in this test")

    sys.meta_path.insert(0, BlockTorch())
    folder, stages, count = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
    import numpy as np
    import kiln
    from kiln.ir.pytree import tree_flatten

    program = kiln.load(folder + "/model.pt2")
    runners = {"interpreter": lambda inputs: program(**inputs)}
    if "onnx" in stages:
        onnx_program = kiln.onnx.export(program)
        runners["onnx"] = lambda inputs: onnx_program(**inputs)
    if "c" in stages:
        compiled = kiln.compile(program, output=folder + "/package")
        runners["c"] = lambda inputs: compiled(*[inputs[i["name"]] for i in compiled.manifest["inputs"]])
    for k in range(count):
        with np.load(f"{folder}/inputs_{k}.npz") as saved:
            inputs = {name: saved[name] for name in saved.files}
        for stage in stages:
            leaves, _ = tree_flatten(runners[stage](inputs))
            np.savez(f"{folder}/{stage}_{k}.npz", *[np.asarray(leaf) for leaf in leaves])
    assert "torch" not in sys.modules or sys.modules["torch"] is None
    print("done", sorted(program.range_constraints, key=str))
""")


def _torch_outputs(model, inputs) -> list:
    with torch.no_grad():
        output = model(**inputs)
    return [t for t in (output.to_tuple() if hasattr(output, "to_tuple") else tree_flatten(output)[0])]


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_torch_exported_file_runs_in_kiln_without_torch(name, tmp_path):
    architecture = ARCHITECTURES[name]
    model = architecture.model()
    sizes = [architecture.make_inputs(*size) for size in SIZES]
    exported = torch.export.export(model, (), sizes[0], dynamic_shapes=architecture.dynamic_shapes(), strict=False)
    torch.export.save(exported, tmp_path / "model.pt2")
    for k, inputs in enumerate(sizes):
        np.savez(tmp_path / f"inputs_{k}.npz", **{key: value.numpy() for key, value in inputs.items()})
    result = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), ",".join(STAGES), str(len(sizes))],
                            capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    for k, inputs in enumerate(sizes):
        expected = _torch_outputs(model, inputs)
        for stage in STAGES:
            with np.load(tmp_path / f"{stage}_{k}.npz") as saved:
                got = [torch.from_numpy(saved[f"arr_{i}"]) for i in range(len(saved.files))]
            assert len(got) == len(expected), f"{stage}: {len(got)} outputs, torch has {len(expected)}"
            for index, (g, e) in enumerate(zip(got, expected)):
                torch.testing.assert_close(g, e, msg=lambda m: f"{name} {stage} size {SIZES[k]} output {index}: {m}")


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
        for g, e in zip(got, _torch_outputs(model, inputs), strict=True):
            torch.testing.assert_close(torch.from_numpy(np.asarray(g)), e)
