"""docs/writing-passes.md's examples are tests: the worked example runs through `kiln opt --pass-plugin`."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import kiln
import kiln.nn as nn
import kiln.passes
from kiln import Dim

from tests.passes.support import assert_same_outputs, count, outputs

DOC = Path(__file__).resolve().parents[2] / "docs" / "writing-passes.md"


def code_block(file_name: str) -> str:
    """The ```python block of the doc whose first line is `# <file_name>`."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    matches = [block for block in blocks if block.startswith(f"# {file_name}\n")]
    assert len(matches) == 1, f"docs/writing-passes.md should have one block starting with '# {file_name}'"
    return matches[0]


def test_worked_example_runs_through_the_cli_with_a_pass_plugin(tmp_path):
    plugin = tmp_path / "my_passes.py"
    plugin.write_text(code_block("my_passes.py"))
    kiln.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).eval()
    x = kiln.randn(3, 8)
    program = kiln.export(model, (x,), dynamic_shapes={"input": {0: Dim("batch")}})
    (tmp_path / "model.mlir").write_text(program.to_mlir())

    result = subprocess.run([sys.executable, "-m", "kiln.cli.main", "opt", "model.mlir", "--pass-plugin",
                             "my_passes.py", "-p", "gelu-tanh,dce", "-o", "out.mlir"],
                            cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr

    rewritten = kiln.ExportedProgram.from_mlir((tmp_path / "out.mlir").read_text(), program.state_dict)
    assert count(rewritten, "gelu.default") == 0 and count(rewritten, "tanh.default") == 1
    model[1].approximate = "tanh"  # the reference: the same model with torch's tanh approximation
    reference = kiln.export(model, (x,), dynamic_shapes={"input": {0: Dim("batch")}})
    for batch in (3, 1, 7):
        args = (kiln.randn(batch, 8),)
        assert_same_outputs(rewritten, outputs(reference, args), args)


def test_dag_and_options_examples(tmp_path, registry):
    for name in ("fuse_silu.py", "bounded_relu.py"):
        (tmp_path / name).write_text(code_block(name))
        kiln.passes.load_plugin(tmp_path / name)

    class M(nn.Module):
        def forward(self, x):
            return (x * x.sigmoid()).relu()

    x = kiln.randn(4, 5) * 10
    program = kiln.export(M(), (x,))
    optimized = kiln.passes.run(program, "fuse-silu,bounded-relu{max=4}", verify_each=True)
    assert [op.name for op in optimized.nodes()] == ["aten.silu.default", "aten.clamp.default"]
    expected = [kiln.ops.aten.clamp.default(kiln.ops.aten.silu.default(x.numpy()), 0, 4.0)]
    assert_same_outputs(optimized, expected, (x,))
