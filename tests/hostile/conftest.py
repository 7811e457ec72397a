"""Fixtures shared by the hostile-input tests: small compiled packages, built once for the folder."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterator

import pytest

import kiln


class Small(kiln.nn.Module):
    def __init__(self, outputs: int = 2):
        super().__init__()
        self.lin = kiln.nn.Linear(3, outputs)

    def forward(self, x):
        return self.lin(x).relu() + 1


def _compile(folder: Path, outputs: int) -> tuple[kiln.ExportedProgram, Path]:
    kiln.manual_seed(0)
    program = kiln.export(Small(outputs), (kiln.randn(4, 3),), dynamic_shapes={"x": {0: kiln.Dim("batch", max=64)}})
    kiln.compile(program, output=folder)
    return program, folder


@pytest.fixture(scope="package")
def genuine(tmp_path_factory) -> tuple[kiln.ExportedProgram, Path]:
    """(program, package folder) of a small model: x f32[batch, 3] with batch in [1, 64] -> f32[batch, 2]."""
    if shutil.which("cc") is None:
        pytest.skip("needs a C compiler")
    return _compile(tmp_path_factory.mktemp("genuine") / "pkg", 2)


@pytest.fixture(scope="package")
def other_package(tmp_path_factory) -> Path:
    """Another package with the same inputs and outputs count (a different model.c): its model.so is a swap."""
    if shutil.which("cc") is None:
        pytest.skip("needs a C compiler")
    return _compile(tmp_path_factory.mktemp("other") / "pkg", 4)[1]


@pytest.fixture
def package(genuine, tmp_path) -> Path:
    """A fresh copy of the genuine package for one test to damage."""
    return Path(shutil.copytree(genuine[1], tmp_path / "pkg"))


@pytest.fixture
def unwritable_dir(tmp_path: Path) -> Iterator[Path]:
    """A folder that exists but where no file can be created. As root, permission bits stop nothing, so there it is
    /proc/self (a folder in which the kernel refuses new files)."""
    if os.geteuid() == 0:
        if not Path("/proc/self").is_dir():
            pytest.skip("needs /proc to stand for a read-only folder when running as root")
        yield Path("/proc/self")
        return
    folder = tmp_path / "readonly"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        yield folder
    finally:
        folder.chmod(0o755)
