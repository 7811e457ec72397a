"""Build generated C with the system compiler into a shared library, cached by content hash."""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import subprocess
import tempfile

from kiln.ir.errors import KilnError

FLAGS = ["-std=c11", "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC"]


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def cache_dir() -> pathlib.Path:
    root = os.environ.get("KILN_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "kiln")
    path = pathlib.Path(root) / "c"
    path.mkdir(parents=True, exist_ok=True)
    return path


def build_library(source: str) -> pathlib.Path:
    """Compile `source` (or reuse the cached build of identical source and flags); return the library path."""
    cc = compiler()
    if cc is None:
        raise KilnError("no C compiler found (looked for $CC, cc, gcc)", fix="install gcc or clang, or set CC")
    key = hashlib.sha256("\0".join([cc, *FLAGS, source]).encode()).hexdigest()[:24]
    library = cache_dir() / f"kiln_{key}.so"
    if library.exists():
        return library
    with tempfile.TemporaryDirectory(dir=cache_dir()) as work:
        c_file = pathlib.Path(work) / "model.c"
        c_file.write_text(source)
        built = pathlib.Path(work) / "model.so"
        proc = subprocess.run([cc, *FLAGS, str(c_file), "-o", str(built), "-lm"], capture_output=True, text=True)
        if proc.returncode != 0:
            raise KilnError(f"the C compiler failed on generated code:\n{proc.stderr[-4000:]}",
                            fix="this is a kiln bug; please report it with the program")
        os.replace(built, library)  # atomic: concurrent builders of the same source agree
    return library
