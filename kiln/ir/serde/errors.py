"""Errors of the .pt2 reader and writer."""

from __future__ import annotations

from kiln.ir.errors import KilnError


class SerdeError(KilnError, ValueError):
    """A .pt2 file kiln cannot read or a program it cannot write (malformed, unsupported, or refused)."""


class UnsafeArchiveError(SerdeError):
    """A .pt2 file refused as hostile: zip bombs, escaping paths, absurd sizes, pickles needed to run."""
