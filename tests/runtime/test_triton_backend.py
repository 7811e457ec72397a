"""The Triton backend on CPU through Triton's interpreter (TRITON_INTERPRET=1): every op it claims against the
reference interpreter (registry-driven, as the C backend's sweep), the zoo, symbolic sizes, and the package."""

from __future__ import annotations

import copy
import json
import os

import numpy as np
import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any package's kernels are defined: CPU tensors
pytest.importorskip("torch")
pytest.importorskip("triton")

import kiln  # noqa: E402
from kiln.codegen import LOWERINGS  # noqa: E402
from kiln.compiler import compile as compile_program  # noqa: E402
from kiln.ir.errors import UnsupportedError  # noqa: E402
from kiln.ir.registry import REGISTRY  # noqa: E402
from tests.ir.test_ops import _trace_sample  # noqa: E402
from tests.runtime.test_c_backend import _array, _check, _op_samples  # noqa: E402

import kiln.codegen.triton  # noqa: E402,F401  (registers LOWERINGS["triton"])

TRITON_OPS = sorted(LOWERINGS["triton"])


def _compile(program, path):
    return compile_program(program, target="triton", output=path)


@pytest.mark.parametrize("name", TRITON_OPS)
def test_claimed_op_matches_interpreter(name, tmp_path):
    compiled = 0
    for sample in _op_samples(name):
        if compiled == 3:
            break
        program, inputs = _trace_sample(REGISTRY[name], copy.deepcopy(sample), decompose=False)
        try:
            model = _compile(program, tmp_path / f"sample{compiled}")
        except UnsupportedError:
            continue  # an argument form outside the claimed subset
        _check(model(*inputs), program(*inputs))
        compiled += 1
    if not compiled and not any(a.type.is_tensor for a in REGISTRY[name].schema.arguments):
        pytest.skip("source op (no tensor inputs to size it): covered through the models that produce it")
    assert compiled, f"no sample of {name} compiled for the Triton backend"
