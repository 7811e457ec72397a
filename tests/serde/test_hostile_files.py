"""Hostile .pt2 files are refused with a KilnError before anything is allocated, extracted or unpickled."""

from __future__ import annotations

import io
import json
import pickle
import struct
import warnings
import zipfile
import zlib
from pathlib import Path

import pytest

import kiln
from kiln.ir.errors import KilnError, UnknownOpError
from kiln.ir.serde import SerdeError, UnsafeArchiveError
from tests.serde.support import archive_members, model_document, zip_members


class Small(kiln.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = kiln.nn.Linear(3, 2)

    def forward(self, x):
        return self.lin(x).relu() + 1


@pytest.fixture(scope="module")
def genuine() -> bytes:
    kiln.manual_seed(0)
    program = kiln.export(Small(), (kiln.randn(4, 3),))
    buffer = io.BytesIO()
    kiln.save(program, buffer)
    return buffer.getvalue()


def _rewrite(data: bytes, **changes: bytes) -> bytes:
    """The genuine archive with members replaced; keywords spell paths with `__` for `/` and `_json` for `.json`."""
    members = archive_members(data)
    for key, value in changes.items():
        path = key.replace("__", "/")
        for extension in ("json", "pt"):
            if path.endswith("_" + extension):
                path = path[:-len(extension) - 1] + "." + extension
        assert "archive/" + path in members, path
        members["archive/" + path] = value
    return zip_members(members)


def _load(data: bytes):
    return kiln.load(io.BytesIO(data))


def test_the_genuine_file_loads(genuine):
    program = _load(genuine)
    assert program.op_histogram()["aten.linear.default"] == 1


def test_zip_bomb_by_compression_ratio_is_refused(genuine):
    members = archive_members(genuine)
    members["archive/data/weights/bomb"] = bytes(32 << 20)
    with pytest.raises(UnsafeArchiveError, match="zip bomb"):
        _load(zip_members(members, compress={"archive/data/weights/bomb"}))


def _patch_central_sizes(data: bytes, name: str, compressed: int, uncompressed: int) -> bytes:
    """Rewrite one central-directory entry's declared sizes (what `unzip -l` shows)."""
    marker = data.index(b"PK\x01\x02" + data[data.index(b"PK\x01\x02") + 4:][:0])
    position = marker
    while True:
        position = data.index(b"PK\x01\x02", position)
        name_length = struct.unpack("<H", data[position + 28:position + 30])[0]
        if data[position + 46:position + 46 + name_length] == name.encode():
            break
        position += 4
    return data[:position + 20] + struct.pack("<II", compressed, uncompressed) + data[position + 28:]


def test_declared_size_beyond_the_limits_is_refused(genuine):
    patched = _patch_central_sizes(genuine, "archive/data/weights/weight_0", 24, 0xFFFFFFF0)
    with pytest.raises(UnsafeArchiveError, match="declares"):
        kiln.load(io.BytesIO(patched), limits=kiln.ir.serde.archive.Limits(max_member_bytes=1 << 30))


def test_overlapping_members_are_refused(genuine):
    data = zip_members({"archive/archive_format": b"pt2", "archive/a": b"x" * 100, "archive/b": b"y" * 100})
    # point b's central entry at a's local header: two names, one stream (the overlapping-file bomb)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        offset_a = archive.getinfo("archive/a").header_offset
    position = data.index(b"PK\x01\x02archive/b"[:4], data.index(b"PK\x01\x02"))
    while data[position + 46:position + 55] != b"archive/b":
        position = data.index(b"PK\x01\x02", position + 4)
    patched = data[:position + 42] + struct.pack("<I", offset_a) + data[position + 46:]
    with pytest.raises(UnsafeArchiveError, match="overlap"):
        _load(patched)


@pytest.mark.parametrize("name", ["archive/../../etc/passwd", "/etc/passwd", "archive\\..\\evil", "C:/evil"])
def test_member_paths_escaping_the_archive_are_refused(genuine, name):
    members = archive_members(genuine)
    members[name] = b"owned"
    with pytest.raises(UnsafeArchiveError, match="escapes"):
        _load(zip_members(members))


def test_truncated_member_is_refused(genuine):
    members = archive_members(genuine)
    weight = members.pop("archive/data/weights/weight_0")
    members["archive/data/weights/weight_0"] = weight  # last, so its data borders the central directory
    data = zip_members(members)
    patched = _patch_central_sizes(data, "archive/data/weights/weight_0", len(weight) + 4096, len(weight) + 4096)
    with pytest.raises(SerdeError, match="truncated"):
        _load(patched)


def test_corrupt_member_is_refused(genuine):
    members = archive_members(genuine)
    data = zip_members(members)
    weight = members["archive/data/weights/weight_0"]
    corrupted = data.replace(weight, bytes(len(weight)), 1)
    with pytest.raises(SerdeError, match="truncated or corrupt"):
        _load(corrupted)


def test_cut_short_file_is_refused(genuine):
    with pytest.raises(SerdeError):
        _load(genuine[: len(genuine) // 2])


def _weights_config(data: bytes) -> dict:
    return json.loads(archive_members(data)["archive/data/weights/model_weights_config.json"])


def test_absurd_tensor_size_is_refused(genuine):
    config = _weights_config(genuine)
    config["config"]["lin.weight"]["tensor_meta"]["sizes"] = [{"as_int": 1 << 31}, {"as_int": 1 << 31}]
    with pytest.raises(UnsafeArchiveError, match="absurdly large"):
        _load(_rewrite(genuine, data__weights__model_weights_config_json=json.dumps(config).encode()))


def test_shape_that_does_not_match_the_bytes_is_refused(genuine):
    config = _weights_config(genuine)
    config["config"]["lin.weight"]["tensor_meta"]["sizes"] = [{"as_int": 1000}, {"as_int": 3}]
    config["config"]["lin.weight"]["tensor_meta"]["strides"] = [{"as_int": 3}, {"as_int": 1}]
    with pytest.raises(UnsafeArchiveError, match="needing 12000 bytes"):
        _load(_rewrite(genuine, data__weights__model_weights_config_json=json.dumps(config).encode()))


def test_negative_sizes_are_refused(genuine):
    config = _weights_config(genuine)
    config["config"]["lin.weight"]["tensor_meta"]["sizes"] = [{"as_int": -2}, {"as_int": 3}]
    with pytest.raises(UnsafeArchiveError, match="malformed shape"):
        _load(_rewrite(genuine, data__weights__model_weights_config_json=json.dumps(config).encode()))


def test_malformed_json_is_refused(genuine):
    with pytest.raises(SerdeError, match="not valid JSON"):
        _load(_rewrite(genuine, models__model_json=b'{"graph_module": {'))


def test_structurally_wrong_json_is_refused(genuine):
    with pytest.raises(SerdeError, match="malformed program|schema major"):
        _load(_rewrite(genuine, models__model_json=b'{"schema_version": {"major": 8}, "graph_module": []}'))


def test_deeply_nested_json_is_refused_before_parsing(genuine):
    with pytest.raises(UnsafeArchiveError, match="nests deeper"):
        _load(_rewrite(genuine, models__model_json=b"[" * 200_000 + b"]" * 200_000))


def test_unknown_schema_major_version_is_refused(genuine):
    document = model_document(genuine)
    document["schema_version"] = {"major": 99, "minor": 0}
    with pytest.raises(SerdeError, match="major version is 99"):
        _load(_rewrite(genuine, models__model_json=json.dumps(document).encode()))


def test_unknown_ops_are_listed_in_one_error_with_counts(genuine):
    document = model_document(genuine)
    nodes = document["graph_module"]["graph"]["nodes"]
    first = nodes[0]
    nodes.insert(0, dict(first, target="torch.ops.aten.frobnicate.default", outputs=[{"as_tensor": {"name": "f1"}}]))
    nodes.insert(0, dict(first, target="torch.ops.aten.frobnicate.default", outputs=[{"as_tensor": {"name": "f2"}}]))
    nodes.append(dict(first, target="torch.ops.mylib.custom.default", outputs=[{"as_tensor": {"name": "f3"}}]))
    with pytest.raises(UnknownOpError) as raised:
        _load(_rewrite(genuine, models__model_json=json.dumps(document).encode()))
    message = str(raised.value)
    assert "aten.frobnicate.default (x2)" in message and "torch.ops.mylib.custom.default (x1)" in message


class _Exploit:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",))


def test_pickled_sample_inputs_are_skipped_and_never_run(genuine, tmp_path):
    marker = tmp_path / "pwned"
    payload = pickle.dumps(_Exploit(marker))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing the program needs is missing, so no warning
        program = _load(_rewrite(genuine, data__sample_inputs__model_pt=payload))
    assert not marker.exists()
    assert program.op_histogram()
    assert "never unpickles" in program.metadata["skipped"]["data/sample_inputs/model.pt"]


def test_a_needed_pickled_weight_is_refused_and_never_run(genuine, tmp_path):
    marker = tmp_path / "pwned"
    config = _weights_config(genuine)
    config["config"]["lin.weight"]["use_pickle"] = True
    with pytest.raises(UnsafeArchiveError, match="never unpickles"):
        _load(_rewrite(genuine, data__weights__model_weights_config_json=json.dumps(config).encode(),
                       data__weights__weight_0=pickle.dumps(_Exploit(marker))))
    assert not marker.exists()


def test_hostile_symbolic_expression_is_refused(genuine):
    document = model_document(genuine)
    values = document["graph_module"]["graph"]["tensor_values"]
    name = next(iter(values))
    values[name]["sizes"][0] = {"as_expr": {"expr_str": "__import__('os').system('echo pwned')"}}
    with pytest.raises(SerdeError, match="symbolic expression"):
        _load(_rewrite(genuine, models__model_json=json.dumps(document).encode()))


def test_not_a_zip_is_a_kiln_error():
    with pytest.raises(KilnError, match="not a .pt2"):
        _load(b"definitely not a zip file")


def test_atomic_write_leaves_no_partial_file(tmp_path, genuine):
    program = _load(genuine)
    target = tmp_path / "model.pt2"
    kiln.save(program, target)
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt2"]
    with zipfile.ZipFile(target) as archive:
        assert archive.read("model/archive_format") == b"pt2"
        assert zlib.crc32(archive.read("model/byteorder")) == zlib.crc32(b"little")
