"""A .pt2 written by torch.export.save loads, runs and re-saves in a process where `import torch` fails."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.no_torch import without_torch

torch = pytest.importorskip("torch")

CHILD = without_torch("""
    import warnings
    folder = sys.argv[1]
    import numpy as np
    import kiln
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        program = kiln.load(folder + "/torch.pt2")
    assert not caught, [str(w.message) for w in caught]  # the skipped sample inputs are a note, not a warning
    assert "never unpickles" in program.metadata["skipped"]["data/sample_inputs/model.pt"]
    for size in ("a", "b"):
        x = np.load(f"{folder}/x_{size}.npy")
        expected = np.load(f"{folder}/y_{size}.npy")
        np.testing.assert_allclose(program(x), expected, rtol=1.3e-6, atol=1e-5)  # torch's float32 defaults
    kiln.save(program, folder + "/kiln.pt2")
    assert sys.modules.get("torch") is None and not any(m.startswith("torch.") for m in sys.modules)
    print("no-torch ok", sorted(program.op_histogram()))
""")


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(8)
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.nn.functional.gelu(self.proj(self.norm(x))) + x


def test_torch_file_loads_runs_and_resaves_without_torch(tmp_path: Path):
    torch.manual_seed(0)
    module = Block().eval()
    batch = torch.export.Dim("batch", min=1, max=64)
    exported = torch.export.export(module, (torch.randn(4, 8),), dynamic_shapes={"x": {0: batch}})
    torch.export.save(exported, tmp_path / "torch.pt2")
    for size, rows in (("a", 4), ("b", 11)):
        x = torch.randn(rows, 8)
        np.save(tmp_path / f"x_{size}.npy", x.numpy())
        np.save(tmp_path / f"y_{size}.npy", module(x).detach().numpy())
    result = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parents[2], timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "no-torch ok" in result.stdout
    reloaded = torch.export.load(tmp_path / "kiln.pt2")
    x = torch.randn(7, 8)
    torch.testing.assert_close(reloaded.module()(x), module(x))
