"""The PT2 zip container: reading members under limits that refuse hostile files, and atomic writing.

Members are never extracted to disk; each is read into memory only after its declared size, its
compression ratio and its place in the zip have been checked, and reading stops at the declared size.
"""

from __future__ import annotations

import io
import os
import secrets
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO, Union

from kiln.ir.serde.errors import SerdeError, UnsafeArchiveError
from kiln.ir.files import atomic_write

FileLike = Union[str, os.PathLike, BinaryIO, IO[bytes]]

# Facts of torch 2.13's writer (torch/csrc/export/pt2_archive_constants.h and PyTorchFileWriter).
ARCHIVE_FORMAT_PATH = "archive_format"
ARCHIVE_FORMAT_VALUE = "pt2"
ARCHIVE_VERSION_PATH = "archive_version"
ARCHIVE_VERSION_VALUE = "0"
BYTEORDER_PATH = "byteorder"
DATA_VERSION_PATH = ".data/version"
DATA_VERSION_VALUE = "6\n"
SERIALIZATION_ID_PATH = ".data/serialization_id"
MODELS_FILENAME_FORMAT = "models/{}.json"
WEIGHTS_DIR = "data/weights/"
WEIGHTS_CONFIG_FILENAME_FORMAT = "data/weights/{}_weights_config.json"
WEIGHT_FILENAME_PREFIX = "weight_"
CONSTANTS_DIR = "data/constants/"
CONSTANTS_CONFIG_FILENAME_FORMAT = "data/constants/{}_constants_config.json"
TENSOR_CONSTANT_FILENAME_PREFIX = "tensor_"
SAMPLE_INPUTS_DIR = "data/sample_inputs/"
SAMPLE_INPUTS_FILENAME_FORMAT = "data/sample_inputs/{}.pt"
EXTRA_DIR = "extra/"


@dataclass
class Limits:
    """What a reader accepts; raise them for genuinely huge models."""

    max_members: int = 100_000
    max_member_bytes: int = 64 << 30
    max_total_bytes: int = 256 << 30
    max_json_bytes: int = 1 << 30
    max_compression_ratio: float = 200.0  # only checked for compressed members larger than 1 MiB


DEFAULT_LIMITS = Limits()


def _check_member_name(name: str) -> None:
    parts = name.replace("\\", "/").split("/")
    if (name.startswith(("/", "\\")) or "\\" in name or ".." in parts or (len(name) > 1 and name[1] == ":")
            or "\x00" in name):
        raise UnsafeArchiveError(f"archive member {name!r} has a path that escapes the archive",
                                 fix="the file is not a genuine .pt2; do not load it")


class ArchiveReader:
    """A checked view of a PT2 zip: `read(path)` returns one member's bytes, relative to the root folder."""

    def __init__(self, source: FileLike, limits: Limits = DEFAULT_LIMITS):
        self.limits = limits
        try:
            self._zip = zipfile.ZipFile(source if not isinstance(source, os.PathLike) else os.fspath(source))
        except (zipfile.BadZipFile, EOFError, OSError, ValueError) as error:
            raise SerdeError(f"not a .pt2 archive (a zip file): {error}",
                             fix="pass a file written by kiln.save or torch.export.save") from error
        infos = self._zip.infolist()
        if len(infos) > limits.max_members:
            raise UnsafeArchiveError(f"the archive has {len(infos)} members, more than the limit {limits.max_members}")
        total = 0
        for info in infos:
            _check_member_name(info.filename)
            if info.file_size > limits.max_member_bytes:
                raise UnsafeArchiveError(f"archive member {info.filename!r} declares {info.file_size} bytes, more "
                                         f"than the limit {limits.max_member_bytes}")
            if (info.compress_type != zipfile.ZIP_STORED and info.file_size > (1 << 20)
                    and info.file_size > limits.max_compression_ratio * max(info.compress_size, 1)):
                raise UnsafeArchiveError(
                    f"archive member {info.filename!r} expands {info.compress_size} bytes to {info.file_size} "
                    f"(ratio > {limits.max_compression_ratio:g}): a zip bomb")
            total += info.file_size
        if total > limits.max_total_bytes:
            raise UnsafeArchiveError(f"the archive declares {total} bytes in all, more than the limit "
                                     f"{limits.max_total_bytes}")
        self._check_no_overlap(infos, getattr(self._zip, "start_dir", None))
        self.root = self._find_root(infos)
        self._infos = {info.filename: info for info in infos}

    @staticmethod
    def _check_no_overlap(infos: list[zipfile.ZipInfo], central_directory: int | None) -> None:
        """Members whose data overlap are how small zips expand to petabytes; genuine writers never do it.
        A member whose data would run into the central directory was cut short."""
        ordered = sorted(infos, key=lambda i: i.header_offset)
        for before, after in zip(ordered, ordered[1:]):
            if before.header_offset + 30 + before.compress_size > after.header_offset:
                raise UnsafeArchiveError(f"archive members {before.filename!r} and {after.filename!r} overlap: "
                                         "a zip bomb")
        if ordered and central_directory is not None:
            last = ordered[-1]
            if last.header_offset + 30 + len(last.filename.encode()) + last.compress_size > central_directory:
                raise SerdeError(f"archive member {last.filename!r} is truncated: its data runs past the end",
                                 fix="the file was cut short or damaged; write it again")

    @staticmethod
    def _find_root(infos: list[zipfile.ZipInfo]) -> str:
        roots = {info.filename.split("/", 1)[0] for info in infos if "/" in info.filename}
        for root in sorted(roots):
            if any(info.filename == f"{root}/{ARCHIVE_FORMAT_PATH}" for info in infos):
                return root + "/"
        raise SerdeError("the archive has no <root>/archive_format member, so it is not a PT2 archive",
                         fix="pass a file written by kiln.save or torch.export.save")

    def names(self) -> list[str]:
        """Member paths relative to the root folder."""
        return [name[len(self.root):] for name in self._infos if name.startswith(self.root)]

    def has(self, path: str) -> bool:
        return self.root + path in self._infos

    def size(self, path: str) -> int:
        return self._infos[self.root + path].file_size

    def read(self, path: str, max_bytes: int | None = None) -> bytes:
        info = self._infos.get(self.root + path)
        if info is None:
            raise SerdeError(f"the archive has no member {path!r}", fix="the file is incomplete or not a .pt2")
        limit = min(info.file_size, max_bytes if max_bytes is not None else info.file_size)
        if info.file_size > limit:
            raise UnsafeArchiveError(f"archive member {path!r} is {info.file_size} bytes, more than the limit {limit}")
        try:
            with self._zip.open(info) as member:
                data = member.read(limit + 1)  # one byte more exposes data beyond the declared size
        except (zipfile.BadZipFile, EOFError, zlib.error, OSError, ValueError) as error:
            raise SerdeError(f"archive member {path!r} is truncated or corrupt: {error}",
                             fix="the file was cut short or damaged; write it again") from error
        if len(data) != info.file_size:
            raise SerdeError(f"archive member {path!r} declares {info.file_size} bytes but holds {len(data)}: "
                             "truncated or corrupt", fix="the file was cut short or damaged; write it again")
        return data

    def read_text(self, path: str) -> str:
        try:
            return self.read(path, 1 << 20).decode("utf-8")
        except UnicodeDecodeError as error:
            raise SerdeError(f"archive member {path!r} is not UTF-8 text") from error

    def close(self) -> None:
        self._zip.close()


class ArchiveWriter:
    """Collects members, then writes a stored (uncompressed, mmap-able) zip in torch's layout."""

    def __init__(self, root: str, alignment: int = 0):
        self.root = root.strip("/") or "archive"
        self.members: list[tuple[str, bytes]] = []
        # >0: each member's data starts at a multiple of `alignment`, padded as torch's PyTorchFileWriter pads
        self.alignment = alignment

    def add(self, path: str, data: bytes | str) -> None:
        _check_member_name(path)
        self.members.append((path, data.encode("utf-8") if isinstance(data, str) else data))

    def add_header(self) -> None:
        self.add(ARCHIVE_FORMAT_PATH, ARCHIVE_FORMAT_VALUE)
        self.add(ARCHIVE_VERSION_PATH, ARCHIVE_VERSION_VALUE)
        self.add(BYTEORDER_PATH, "little")
        self.add(DATA_VERSION_PATH, DATA_VERSION_VALUE)
        self.add(SERIALIZATION_ID_PATH, self.serialization_id())

    @staticmethod
    def serialization_id() -> str:
        return "".join(str(secrets.randbelow(10)) for _ in range(40))

    def _padding(self, header_offset: int, name: str) -> bytes:
        """torch's `FB` extra field (caffe2 inline_container getPadding): 'FB', its length, then 'Z's."""
        start = header_offset + 30 + len(name.encode("utf-8")) + 4
        size = -start % self.alignment
        return b"FB" + struct.pack("<H", size) + b"Z" * size

    def _write_zip(self, stream: BinaryIO) -> None:
        with zipfile.ZipFile(stream, "w", compression=zipfile.ZIP_STORED) as archive:
            for path, data in self.members:
                info = zipfile.ZipInfo(f"{self.root}/{path}", date_time=(1980, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_STORED
                if self.alignment:
                    info.extra = self._padding(archive.start_dir, info.filename)
                archive.writestr(info, data)

    def to_bytes(self) -> bytes:
        buffer = io.BytesIO()
        self._write_zip(buffer)
        return buffer.getvalue()

    def write(self, target: FileLike) -> None:
        """Write to a path atomically (temp file in the same folder, then os.replace) or to a binary stream."""
        if isinstance(target, (str, os.PathLike)):
            atomic_write(target, self._write_zip)
            return
        target.write(self.to_bytes())


def archive_root_for(target: FileLike) -> str:
    """torch names the root folder after the file's stem; streams get `archive`."""
    if isinstance(target, (str, os.PathLike)):
        stem = Path(target).stem
        return "".join(c if c.isalnum() or c in "_-" else "_" for c in stem) or "archive"
    return "archive"
