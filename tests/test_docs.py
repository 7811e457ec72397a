"""Every ```python block in README.md and docs/*.md runs: the blocks of one file in order, in one fresh process,
in an empty folder, so a documented example can never break unnoticed."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks(doc: Path) -> list[str]:
    return BLOCK.findall(doc.read_text())


@pytest.mark.cpu_capability
@pytest.mark.parametrize("doc", [d for d in DOCS if python_blocks(d)], ids=lambda d: d.relative_to(ROOT).as_posix())
def test_python_blocks_run(doc, tmp_path):
    blocks = python_blocks(doc)
    if any(re.search(r"^\s*import torch\b", b, re.M) for b in blocks) and importlib.util.find_spec("torch") is None:
        pytest.skip("the examples use torch, which is not installed")
    # Each block compiles under its own name, so a traceback says which block of which file failed.
    runner = "\n".join(f"exec(compile({block!r}, {f'{doc.name} python block {k + 1}'!r}, 'exec'), namespace)"
                       for k, block in enumerate(blocks))
    result = subprocess.run([sys.executable, "-c", f"namespace = {{'__name__': '__main__'}}\n{runner}"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]


def test_the_readme_has_examples():
    assert len(python_blocks(ROOT / "README.md")) >= 1
