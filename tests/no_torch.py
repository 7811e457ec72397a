"""The prelude of every child process that must run as if torch were not installed: `import torch` raises
ModuleNotFoundError there, as on a machine without it."""

from __future__ import annotations

import textwrap

BLOCK_TORCH = textwrap.dedent("""
    import importlib.abc, sys

    class BlockTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ModuleNotFoundError("No module named 'torch'", name="torch")
            return None

    sys.meta_path.insert(0, BlockTorch())
    sys.modules["torch"] = None  # also when something imported it before the block
""")


def without_torch(body: str) -> str:
    """A `python -c` script: the block, then `body` (dedented)."""
    return BLOCK_TORCH + textwrap.dedent(body)
