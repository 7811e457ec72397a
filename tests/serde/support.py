"""Helpers shared by the .pt2 tests: converting values and comparing kiln with torch at default tolerances."""

from __future__ import annotations

import io
import json
import zipfile
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")


def to_torch(value: Any) -> Any:
    if hasattr(value, "__kiln_array__"):
        value = value.__kiln_array__()
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.array(value, copy=True, order="C"))
    if isinstance(value, (tuple, list)):
        return type(value)(to_torch(v) for v in value)
    if isinstance(value, dict):
        return {k: to_torch(v) for k, v in value.items()}
    return value


def to_numpy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().numpy().copy()
    if isinstance(value, (tuple, list)):
        return type(value)(to_numpy(v) for v in value)
    return value


def assert_same(kiln_value: Any, torch_value: Any) -> None:
    """torch.testing.assert_close with its default tolerances, after turning kiln's arrays into tensors."""
    torch.testing.assert_close(to_torch(kiln_value), torch_value)


# -- archives taken apart and put back together (for malformed-file tests)

def archive_members(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {info.filename: archive.read(info) for info in archive.infolist()}


def zip_members(members: dict[str, bytes], compress: set[str] = frozenset()) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data, zipfile.ZIP_DEFLATED if name in compress else zipfile.ZIP_STORED)
    return buffer.getvalue()


def model_document(data: bytes) -> dict[str, Any]:
    """The program's JSON in a .pt2 archive."""
    return json.loads(archive_members(data)["archive/models/model.json"])
