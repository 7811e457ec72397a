"""A suggested fix must be one that works: following the C backend's advice compiles the program."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import kiln
import kiln.nn as nn
from kiln.ir.errors import UnsupportedError

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")


class Differences(nn.Module):
    def forward(self, x):
        return kiln.diff(x, prepend=x[:, :1])


def test_a_pipeline_without_decompose_is_told_to_add_it(tmp_path):
    program = kiln.export(Differences(), (kiln.randn(3, 8),), dynamic_shapes={"x": {0: kiln.Dim("batch")}})
    with pytest.raises(UnsupportedError, match=r"aten.diff.default \(no C lowering\)") as raised:
        kiln.compile(program, pipeline="canonicalize,cse,dce", output=tmp_path / "bad")
    assert raised.value.fix.startswith("add 'decompose' to the pipeline")
    compiled = kiln.compile(program, pipeline="decompose,canonicalize,cse,dce", output=tmp_path / "good")
    x = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
    kiln.testing.assert_close(compiled(x), np.asarray(program(x)))
