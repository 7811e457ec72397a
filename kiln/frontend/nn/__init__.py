"""kiln.nn: PyTorch-compatible modules (`kiln.nn.Linear`, ...), `functional` and `init`."""

from kiln.frontend.nn.module import Module
from kiln.frontend.tensor import Parameter

__all__ = ["Module", "Parameter"]
