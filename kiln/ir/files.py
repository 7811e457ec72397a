"""Writing files so that nothing is lost: every kiln writer goes through `atomic_write`."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable

from kiln.ir.errors import KilnError


def atomic_write(path: str | os.PathLike[str], content: bytes | Callable[[BinaryIO], object]) -> None:
    """Write `content` (bytes, or a function writing to a binary handle) to `path` through a temporary file
    in the same folder, then rename it into place: readers never see half a file, and an interrupted
    write (an exception, Ctrl-C) leaves the old file, if any, untouched."""
    path = Path(path)
    try:
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as error:
        raise KilnError(f"cannot write {path}: {error.strerror}", fix="check that its folder exists") from None
    try:
        with os.fdopen(descriptor, "wb") as handle:
            if isinstance(content, (bytes, bytearray, memoryview)):
                handle.write(content)
            else:
                content(handle)
            handle.flush()
            os.fsync(handle.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)  # mkstemp's 0600 would make outputs private
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
