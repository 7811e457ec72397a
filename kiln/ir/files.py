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
    if path.is_dir():  # also `""`, which is the current folder
        raise KilnError(f"cannot write {str(path)!r}: it is a folder", fix="give the path of a file")
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
    except OSError as error:  # e.g. a full disk
        Path(temporary).unlink(missing_ok=True)
        raise KilnError(f"cannot write {path}: {error.strerror or error}") from None
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def path_inside(folder: str | os.PathLike[str], name: str) -> Path | None:
    """The resolved path of `name` in `folder` when it stays inside `folder`, else None: `name` must be a relative
    path without `..`, backslashes, a drive or NUL, and no symlink on the way may lead out. For the files a package
    manifest or a model names, which must never reach outside their folder."""
    if (not isinstance(name, str) or not name or "\x00" in name or "\\" in name or name.startswith("/")
            or (len(name) > 1 and name[1] == ":") or ".." in name.split("/")):
        return None
    root = Path(folder).resolve()
    try:
        resolved = (root / name).resolve()
    except (OSError, RuntimeError):  # a symlink loop
        return None
    return resolved if resolved != root and resolved.is_relative_to(root) else None
