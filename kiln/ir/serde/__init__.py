"""The IR's file format: .pt2 archives exactly as torch.export writes them (no torch needed, nothing unpickled)."""

from kiln.ir.serde.errors import SerdeError, UnsafeArchiveError
from kiln.ir.serde.pt2 import load, save

__all__ = ["save", "load", "SerdeError", "UnsafeArchiveError"]
