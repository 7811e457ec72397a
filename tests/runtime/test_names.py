"""A compiled package names things as the user did: symbols after their Dims, outputs after their pytree keys."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import kiln
import kiln.nn as nn

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")


class KeyedOutputs(nn.Module):
    def forward(self, x):
        return {"logits": x + 1, "hidden": (x * 2, x - 1)}


def test_manifest_names_symbols_after_dims_and_outputs_after_keys(tmp_path):
    program = kiln.export(KeyedOutputs(), (kiln.randn(2, 3),), dynamic_shapes={"x": {0: kiln.Dim("batch", max=8)}})
    compiled = kiln.compile(program, output=tmp_path / "pkg")
    assert [o["name"] for o in compiled.manifest["outputs"]] == ["logits", "hidden_0", "hidden_1"]
    assert [s["name"] for s in compiled.manifest["symbols"]] == ["batch"]
    assert [o["shape"] for o in compiled.manifest["outputs"]] == [["batch", "3"]] * 3
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    expected = program(x)
    kiln.testing.assert_close(list(compiled(x)), [expected["logits"], *expected["hidden"]])
