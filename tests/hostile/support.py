"""Helpers of the hostile-input tests: the CLI's failure contract, a record of the files a block opens, and a
listing of what a folder holds."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Iterator

import pytest

from kiln.cli.main import main

_RECORDERS: list[list[str]] = []


def _audit(event: str, args: tuple) -> None:
    if _RECORDERS and event in ("open", "ctypes.dlopen") and isinstance(args[0], (str, bytes, os.PathLike)):
        _RECORDERS[-1].append(os.fsdecode(args[0]))


sys.addaudithook(_audit)  # audit hooks cannot be removed; this one records only inside `opened_paths`


@contextlib.contextmanager
def opened_paths() -> Iterator[list[str]]:
    """The paths Python opens (builtins.open, os.open, numpy's mmap) or dlopens (ctypes) inside the block."""
    paths: list[str] = []
    _RECORDERS.append(paths)
    try:
        yield paths
    finally:
        _RECORDERS.pop()


def opened_under(paths: list[str], folder: Path) -> list[str]:
    """Those of `paths` that lie in `folder` (symlinks resolved)."""
    root = folder.resolve()
    return [p for p in paths if Path(p).resolve() == root or root in Path(p).resolve().parents]


def cli_error(capsys: pytest.CaptureFixture, *argv: str) -> str:
    """Run `kiln ARGV` in this process and check the failure contract: exit status 2, exactly one `kiln: error: ...`
    line on stderr, followed only by its `fix:` / `at` lines, and no Python traceback. Returns the error line."""
    try:
        status = main(list(argv))
    except SystemExit as exit_:  # argparse's errors
        status = exit_.code
    err = capsys.readouterr().err
    assert status == 2, err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if not line.startswith("kiln: warning:")]
    errors = [index for index, line in enumerate(lines) if line.startswith("kiln: error: ")]
    assert len(errors) == 1, err
    assert all(line.startswith(("  fix: ", "  at ")) for line in lines[errors[0] + 1:]), err
    return lines[errors[0]]


def tree(folder: Path) -> set[str]:
    """Every path under `folder`, relative to it: to prove a failed command wrote nothing."""
    return {str(path.relative_to(folder)) for path in folder.rglob("*")}


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Fail the test, instead of hanging it, if the block takes longer than `seconds` (SIGALRM; main thread)."""
    import signal

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"still running after {seconds} s: a hang")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
