"""Hugging Face models in float16 and bfloat16, compiled to C (which stores half precision and computes in float32,
rounding once per op): as accurate as torch eager in the same dtype. The oracle is torch's own for reduced precision
(torch._dynamo.utils.same with fp64_ref): the same weights and inputs in float64 are the truth, and kiln's
root-mean-square error against it may be at most twice eager's. A bit-level match is not the goal: eager and kiln
round the same ops at different places (ATen's half kernels round inside some ops; kiln's C accumulates in float
or double), so each is a few ulps from the other."""

from __future__ import annotations

import copy
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.models.hf_zoo import ARCHITECTURES, SIZES, torch_outputs  # noqa: E402
from tests.torch_oracle import to_numpy  # noqa: E402

import kiln  # noqa: E402
from kiln.compiler import compile as compile_c  # noqa: E402
from kiln.ir.pytree import tree_flatten  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
MODELS = ["gpt2", "llama", "bert", "vit"]
MULTIPLIER = 2.0  # torch._dynamo.utils.same's for a reduced-precision result against its fp64 reference


def _cast(inputs: dict, dtype) -> dict:
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in inputs.items()}


def _rms_error(value: torch.Tensor, truth: torch.Tensor) -> float:
    return float((value.double() - truth).pow(2).mean().sqrt())


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", MODELS)
def test_half_precision_model_in_c_is_as_accurate_as_eager(name, dtype, tmp_path):
    architecture = ARCHITECTURES[name]
    half = getattr(torch, dtype)
    model = architecture.model().to(half)
    truth_model = copy.deepcopy(model).to(torch.float64)  # the half weights, exactly
    program = kiln.from_torch(model, (), _cast(architecture.make_inputs(*SIZES[0]), half),
                              dynamic_shapes=architecture.dynamic_shapes())
    package = compile_c(program, output=tmp_path / "pkg")
    names = [spec["name"] for spec in package.manifest["inputs"]]
    for size in SIZES:
        inputs = _cast(architecture.make_inputs(*size), half)
        got, _ = tree_flatten(package(*[to_numpy(inputs[n]) for n in names]))
        eager = torch_outputs(model, inputs)
        truth = torch_outputs(truth_model, _cast(inputs, torch.float64))
        for g, e, t in zip(got, eager, truth, strict=True):
            g = torch.from_numpy(np.asarray(g).astype(np.float32)).to(e.dtype)
            assert g.dtype == e.dtype == half and g.shape == e.shape
            assert torch.isfinite(g).all()
            kiln_error, eager_error = _rms_error(g, t), _rms_error(e, t)
            assert kiln_error <= MULTIPLIER * eager_error, (name, size, kiln_error, eager_error)
