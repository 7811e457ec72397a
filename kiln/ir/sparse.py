"""Sparse layouts: the tensor type's layout attribute and the sparse values kiln computes with.

`Layout` is the structured layout of a `TensorType` (kind, block size, index dtype, dense dims, 2:4 metadata
format). `SparseArray` is a sparse value as numpy component arrays, torch's formats exactly: COO (indices,
values), CSR/CSC/BSR/BSC (compressed and plain indices, values), plus kiln's 2:4 semi-structured form (kept
values and 2-bit positions). Its constructors check torch's invariants with torch's messages.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np

from kiln.ir import dtypes
from kiln.ir.errors import OpArgumentError, ParseError, ShapeError, UnsupportedError

STRIDED = "strided"
COMPRESSED_KINDS = ("sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc")
SPARSE_KINDS = ("sparse_coo", *COMPRESSED_KINDS, "semi_structured")
KINDS = (STRIDED, *SPARSE_KINDS)
INDEX_DTYPES = ("int32", "int64")
SEMI_STRUCTURED_META = "2bit"  # two 2-bit positions per group of four, two groups per byte (low nibble first)


class SparseInvariantError(OpArgumentError, ValueError):
    """Component arrays that break a sparse layout's invariants (torch's check_invariants)."""


@dataclass(frozen=True)
class Layout:
    """A tensor type's layout: `strided`, or a sparse kind with its structure."""

    kind: str = STRIDED
    blocksize: tuple[int, int] | None = None  # sparse_bsr / sparse_bsc
    index_dtype: str = "int64"                # indices of the COO and compressed kinds
    dense_dim: int = 0                        # trailing dense dims of a hybrid tensor
    coalesced: bool = False                   # sparse_coo: sorted, distinct indices
    meta: str | None = None                   # semi_structured: the metadata format

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ParseError(f"unknown layout {self.kind!r}", fix="one of " + ", ".join(KINDS))
        if (self.blocksize is not None) != (self.kind in ("sparse_bsr", "sparse_bsc")):
            raise OpArgumentError(f"layout {self.kind} {'needs' if self.blocksize is None else 'takes no'} "
                                  "blocksize")
        if self.index_dtype not in INDEX_DTYPES:
            raise OpArgumentError(f"sparse index dtype must be int32 or int64, got {self.index_dtype}")

    @property
    def is_sparse(self) -> bool:
        return self.kind != STRIDED

    @property
    def is_compressed(self) -> bool:
        return self.kind in COMPRESSED_KINDS

    @property
    def is_blocked(self) -> bool:
        return self.blocksize is not None

    @property
    def compresses_rows(self) -> bool:
        """CSR and BSR compress rows (crow_indices); CSC and BSC compress columns."""
        return self.kind in ("sparse_csr", "sparse_bsr")

    def text(self) -> str:
        """The IR spelling: `sparse_bsr<block=[16, 16], index=i32>`; `strided` is never printed."""
        options = []
        if self.blocksize is not None:
            options.append(f"block=[{self.blocksize[0]}, {self.blocksize[1]}]")
        if self.index_dtype != "int64":
            options.append(f"index={dtypes.dtype(self.index_dtype).short}")
        if self.dense_dim:
            options.append(f"dense_dim={self.dense_dim}")
        if self.coalesced:
            options.append("coalesced")
        if self.meta is not None:
            options.append(f"meta={self.meta}")
        return self.kind + (f"<{', '.join(options)}>" if options else "")

    def __str__(self) -> str:
        return self.text()


STRIDED_LAYOUT = Layout()
_OPTION = re.compile(r"\s*(block=\[\s*(\d+)\s*,\s*(\d+)\s*\]|index=(\w+)|dense_dim=(\d+)|coalesced|meta=(\w+))\s*")


def parse_layout(text: str) -> Layout:
    """The inverse of `Layout.text()`."""
    match = re.fullmatch(r"(\w+)(?:<(.*)>)?", text.strip())
    if match is None or match.group(1) not in KINDS:
        raise ParseError(f"unknown layout {text!r}", fix="one of " + ", ".join(KINDS))
    fields: dict[str, Any] = {"kind": match.group(1)}
    for option in _split_options(match.group(2) or ""):
        parsed = _OPTION.fullmatch(option)
        if parsed is None:
            raise ParseError(f"unknown layout option {option.strip()!r} in {text!r}",
                             fix="options are block=[R, C], index=i32|i64, dense_dim=N, coalesced, meta=2bit")
        if parsed.group(2):
            fields["blocksize"] = (int(parsed.group(2)), int(parsed.group(3)))
        elif parsed.group(4):
            fields["index_dtype"] = dtypes.dtype(parsed.group(4)).name
        elif parsed.group(5):
            fields["dense_dim"] = int(parsed.group(5))
        elif parsed.group(6):
            fields["meta"] = parsed.group(6)
        else:
            fields["coalesced"] = True
    return Layout(**fields)


def _split_options(text: str) -> list[str]:
    """Split on commas outside brackets."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += char == "["
        depth -= char == "]"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [*parts, current] if current.strip() else parts


def layout_of(value: Any) -> Layout:
    """A value's layout: a SparseArray's or a TensorType's (an IR value through its type); dense arrays are strided."""
    layout = getattr(value, "layout", None)
    if layout is None and hasattr(value, "type"):
        layout = getattr(value.type, "layout", None)
    return layout if isinstance(layout, Layout) else STRIDED_LAYOUT


def as_layout(layout: "Layout | str | None") -> Layout:
    if layout is None:
        return STRIDED_LAYOUT
    if isinstance(layout, Layout):
        return layout
    return parse_layout(layout)


# ---------------------------------------------------------------------------------------------
# Sparse values

COMPONENTS = {  # each layout's component arrays, in torch's accessor names and order
    "sparse_coo": ("indices", "values"),
    "sparse_csr": ("crow_indices", "col_indices", "values"),
    "sparse_bsr": ("crow_indices", "col_indices", "values"),
    "sparse_csc": ("ccol_indices", "row_indices", "values"),
    "sparse_bsc": ("ccol_indices", "row_indices", "values"),
    "semi_structured": ("values", "metadata"),
}


class SparseArray:
    """A sparse tensor value: its layout, its dense shape and torch's component arrays.

    It answers `.shape`, `.dtype` and `.ndim` like a numpy array, so the interpreter's input checks and meta
    rules read it as they read dense values.
    """

    __slots__ = ("layout", "shape", "components")

    def __init__(self, layout: Layout, shape: Sequence[int], components: dict[str, np.ndarray]):
        self.layout = layout
        self.shape = tuple(int(d) for d in shape)
        self.components = components

    # -- numpy-like metadata
    @property
    def dtype(self) -> np.dtype:
        return self.values.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def values(self) -> np.ndarray:
        return self.components["values"]

    def component(self, name: str) -> np.ndarray:
        if name not in self.components:
            raise OpArgumentError(f"a {self.layout.kind} tensor has no {name}",
                                  fix="its components are " + ", ".join(self.components))
        return self.components[name]

    @property
    def nnz(self) -> int:
        """Stored elements (blocks for BSR/BSC), as torch's `_nnz()`."""
        if self.layout.kind == "semi_structured":
            return int(self.values.size)
        return int(self.values.shape[0])

    @property
    def sparse_dim(self) -> int:
        return self.ndim - self.layout.dense_dim

    def with_values(self, values: np.ndarray) -> "SparseArray":
        """The same sparsity structure holding other values (a zero-preserving op's result)."""
        return SparseArray(self.layout, self.shape, {**self.components, "values": values})

    def to_dense(self) -> np.ndarray:
        kind = self.layout.kind
        values = self.values
        dense = np.zeros(self.shape, dtype=values.dtype)
        if kind == "sparse_coo":
            np.add.at(dense, tuple(self.components["indices"].astype(np.intp)), values)
            return dense
        if kind == "semi_structured":
            rows = self.shape[0]
            positions = _unpack_metadata(self.components["metadata"], self.shape[-1])
            dense.reshape(rows, -1)[np.arange(rows)[:, None], positions] = values
            return dense
        compressed, plain = (self.components[name] for name in COMPONENTS[kind][:2])
        counts = np.diff(compressed.astype(np.intp))
        major = np.repeat(np.arange(counts.size), counts)
        minor = plain.astype(np.intp)
        if not self.layout.compresses_rows:
            major, minor = minor, major
        if self.layout.blocksize is None:
            dense[major, minor] = values
            return dense
        block_rows, block_cols = self.layout.blocksize
        blocked = dense.reshape(self.shape[0] // block_rows, block_rows, self.shape[1] // block_cols, block_cols,
                                *self.shape[2:])
        blocked[major, :, minor] = values
        return dense

    def __repr__(self) -> str:
        parts = [f"{name}={np.array2string(array, separator=', ', precision=4)}"
                 for name, array in self.components.items()]
        return (f"tensor({', '.join(parts)}, size={self.shape}, nnz={self.nnz}, "
                f"layout=kiln.{self.layout.kind})")


def _index_dtype_name(array: np.ndarray) -> str:
    return "int32" if array.dtype == np.int32 else "int64"


# -- constructors from components, with torch's checks

_TORCH_DTYPE_NAMES = {"int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte",
                      "float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16",
                      "bool": "Bool"}


def _torch_name(array: np.ndarray) -> str:
    return _TORCH_DTYPE_NAMES.get(dtypes.dtype(array.dtype).name, str(array.dtype))


def coo(indices: Any, values: Any, size: Sequence[int] | None = None, *, is_coalesced: bool = False,
        check_invariants: bool = False) -> SparseArray:
    """torch.sparse_coo_tensor: `indices` is sparse_dim x nnz, `values` is nnz x dense dims."""
    indices, values = np.asarray(indices), np.asarray(values)
    if indices.ndim != 2:
        raise SparseInvariantError(f"indices must be sparse_dim x nnz, but got: {list(indices.shape)}")
    if indices.shape[1] != values.shape[0]:
        raise SparseInvariantError(f"indices and values must have same nnz, but got nnz from indices: "
                                   f"{indices.shape[1]}, nnz from values: {values.shape[0]}")
    sparse_dim, dense_dim = indices.shape[0], values.ndim - 1
    if size is None:  # torch infers the smallest size that holds every index
        size = [int(indices[d].max()) + 1 if indices.shape[1] else 0 for d in range(sparse_dim)]
        size += list(values.shape[1:])
    size = tuple(int(d) for d in size)
    if len(size) != sparse_dim + dense_dim:
        raise SparseInvariantError(f"'len(size) == sparse_dim + dense_dim' is not satisfied: len(size) = "
                                   f"{len(size)}, sparse_dim = {sparse_dim}, dense_dim = {dense_dim}")
    if tuple(values.shape[1:]) != size[sparse_dim:]:
        raise SparseInvariantError(f"values has incorrect size, expected {[values.shape[0], *size[sparse_dim:]]}, "
                                   f"got {list(values.shape)}")
    if check_invariants and indices.shape[1]:
        for dim in range(sparse_dim):
            low, high = int(indices[dim].min()), int(indices[dim].max())
            if low < 0:
                raise SparseInvariantError(f"found negative index {low} for dim {dim}")
            if high >= size[dim]:
                raise SparseInvariantError(f"size is inconsistent with indices: for dim {dim}, size is {size[dim]} "
                                           f"but found index {high}")
    layout = Layout("sparse_coo", dense_dim=dense_dim, coalesced=bool(is_coalesced))
    return SparseArray(layout, size, {"indices": indices.astype(np.int64), "values": values})


def compressed(kind: str, compressed_indices: Any, plain_indices: Any, values: Any, size: Sequence[int] | None,
               *, check_invariants: bool = False) -> SparseArray:
    """torch.sparse_{csr,csc,bsr,bsc}_tensor: compressed indices, plain indices and values."""
    if kind not in COMPRESSED_KINDS:
        raise OpArgumentError(f"{kind} is not a compressed sparse layout", fix="one of " + ", ".join(COMPRESSED_KINDS))
    compressed_indices, plain_indices, values = (np.asarray(a) for a in (compressed_indices, plain_indices, values))
    compressed_name, plain_name = COMPONENTS[kind][:2]
    rows_compressed = kind in ("sparse_csr", "sparse_bsr")
    blocked = kind in ("sparse_bsr", "sparse_bsc")
    if compressed_indices.ndim != plain_indices.ndim:
        raise SparseInvariantError(f"{compressed_name} and {plain_name} dimensionalities must be equal but got "
                                   f"{compressed_indices.ndim} and {plain_indices.ndim}, respectively")
    if compressed_indices.dtype != plain_indices.dtype:
        raise SparseInvariantError(f"{compressed_name} and {plain_name} must have the same dtype, bot got "
                                   f"{_torch_name(compressed_indices)} and {_torch_name(plain_indices)}, "
                                   "respectively")
    if compressed_indices.dtype not in (np.int32, np.int64):
        raise SparseInvariantError(f"{compressed_name} and {plain_name} must be an int32 or int64 type, but got: "
                                   f"{_torch_name(compressed_indices)}")
    if compressed_indices.ndim != 1:
        raise UnsupportedError(f"{kind} tensors with batch dimensions are not supported by kiln",
                               fix="use one 2-D sparse tensor per batch entry, or the COO layout")
    block = tuple(int(d) for d in values.shape[1:3]) if blocked else (1, 1)
    dense_dim = values.ndim - (3 if blocked else 1)
    if size is None:
        major = (compressed_indices.shape[0] - 1) * block[0 if rows_compressed else 1]
        minor = (int(plain_indices.max()) + 1 if plain_indices.size else 0) * block[1 if rows_compressed else 0]
        size = (major, minor) if rows_compressed else (minor, major)
        size = (*size, *values.shape[3 if blocked else 1:])
    size = tuple(int(d) for d in size)
    if len(size) != 2 + dense_dim:
        raise SparseInvariantError(f"tensor dimensionality must be sum of batch, base, and dense dimensionalities "
                                   f"(=0 + 2 + {dense_dim}) but got {len(size)}")
    if blocked:
        if 0 in block:  # torch builds one, but nothing can index its blocks
            raise UnsupportedError(f"{kind} tensors with blocks of size {block[0]}x{block[1]} are not supported by "
                                   "kiln", fix="use blocks of at least 1x1")
        for dim in (0, 1):
            if size[dim] % block[dim]:
                raise SparseInvariantError(f"tensor shape[{dim}] (={size[dim]}) must be divisible with "
                                           f"blocksize[{dim}] (={block[dim]}) as defined by values shape")
    rows, cols = size[0] // block[0], size[1] // block[1]
    major, minor = (rows, cols) if rows_compressed else (cols, rows)
    what = ("row" if rows_compressed else "column") + (" blocks" if blocked else "s")
    if compressed_indices.shape[-1] != major + 1:
        raise SparseInvariantError(f"{compressed_name}.shape[-1] must be equal to the number of {what} + 1 "
                                   f"(={major + 1}), but got {compressed_indices.shape[-1]}")
    nnz = values.shape[0]
    if plain_indices.shape[-1] != nnz:
        raise SparseInvariantError(f"{plain_name}.shape[-1] must be equal to nnz (={nnz}) as defined by "
                                   f"values.shape[0], but got {plain_indices.shape[-1]}")
    if check_invariants:
        _check_compressed_indices(compressed_name, plain_name, compressed_indices, plain_indices, nnz, major, minor,
                                  rows_compressed)
    layout = Layout(kind, blocksize=block if blocked else None, index_dtype=_index_dtype_name(compressed_indices),
                    dense_dim=dense_dim)
    return SparseArray(layout, size, {compressed_name: compressed_indices, plain_name: plain_indices,
                                      "values": values})


def _check_compressed_indices(compressed_name: str, plain_name: str, compressed_indices: np.ndarray,
                              plain_indices: np.ndarray, nnz: int, major: int, minor: int,
                              rows_compressed: bool) -> None:
    """torch's `_validate_compressed_sparse_indices`, in its order and with its messages."""
    minor_name, major_name = ("ncols", "nrows") if rows_compressed else ("nrows", "ncols")
    if compressed_indices[0] != 0:
        raise SparseInvariantError(f"`{compressed_name}[..., 0] == 0` is not satisfied.")
    if compressed_indices[-1] != nnz:
        raise SparseInvariantError(f"`{compressed_name}[..., -1] == nnz` is not satisfied.")
    steps = np.diff(compressed_indices.astype(np.int64))
    if steps.size and (steps.min() < 0 or steps.max() > minor):
        raise SparseInvariantError(f"`0 <= {compressed_name}[..., 1:] - {compressed_name}[..., :-1] <= "
                                   f"{minor_name}` is not satisfied.")
    if plain_indices.size and (plain_indices.min() < 0 or plain_indices.max() >= minor):
        raise SparseInvariantError(f"`0 <= {plain_name} < {minor_name}` is not satisfied.")
    segment_start = np.repeat(compressed_indices[:-1].astype(np.int64), steps)
    position = np.arange(nnz)
    increasing = np.diff(plain_indices.astype(np.int64)) > 0
    if nnz and not np.all(increasing | (position[1:] == segment_start[1:])):
        raise SparseInvariantError(
            f"`{plain_name}[..., {compressed_name}[..., i - 1]:{compressed_name}[..., i]] for all i = 1, ..., "
            f"{major_name} are sorted and distinct along the last dimension values` is not satisfied.")


def semi_structured(values: Any, metadata: Any, size: Sequence[int]) -> SparseArray:
    """A 2:4 tensor from its kept values (rows x K/2) and packed positions (rows x K/8, uint8)."""
    values, metadata = np.asarray(values), np.asarray(metadata)
    size = tuple(int(d) for d in size)
    if len(size) != 2 or size[1] % 8:
        raise ShapeError(f"a 2:4 semi-structured tensor is 2-D with a multiple of 8 columns, got {list(size)}",
                         fix="pad the last dim to a multiple of 8")
    if values.shape != (size[0], size[1] // 2) or metadata.shape != (size[0], size[1] // 8) \
            or metadata.dtype != np.uint8:
        raise SparseInvariantError(f"2:4 components for size {list(size)} must be values {[size[0], size[1] // 2]} "
                                   f"and uint8 metadata {[size[0], size[1] // 8]}, got {list(values.shape)} and "
                                   f"{metadata.dtype} {list(metadata.shape)}")
    positions = _unpack_metadata(metadata, size[1]).reshape(size[0], -1, 2) % 4
    if np.any(positions[..., 0] >= positions[..., 1]):
        raise SparseInvariantError("2:4 metadata must name two distinct, increasing positions in every group of 4")
    return SparseArray(Layout("semi_structured", meta=SEMI_STRUCTURED_META), size,
                       {"values": values, "metadata": metadata})


def _unpack_metadata(metadata: np.ndarray, columns: int) -> np.ndarray:
    """Absolute column of every kept value: rows x columns/2."""
    nibbles = np.stack([metadata & 0xF, metadata >> 4], axis=-1).reshape(metadata.shape[0], -1)  # one per group
    pairs = np.stack([nibbles & 0x3, nibbles >> 2], axis=-1).astype(np.intp)                  # rows x groups x 2
    groups = np.arange(columns // 4, dtype=np.intp)[None, :, None] * 4
    return (groups + pairs).reshape(metadata.shape[0], -1)


# -- from dense (torch's Tensor.to_sparse*)

def from_dense(array: Any, layout: Layout | str, *, blocksize: Sequence[int] | None = None,
               dense_dim: int | None = None, sparse_dim: int | None = None) -> SparseArray:
    """Convert a dense array: torch's `to_sparse(sparse_dim)`, `to_sparse_csr(dense_dim)`, `to_sparse_bsr(blocksize,
    dense_dim)`, ... and `to_sparse_semi_structured`. An element (block, dense slice) is stored when any part of it
    is nonzero (NaN counts as nonzero)."""
    array = np.asarray(array)
    kind = layout.kind if isinstance(layout, Layout) else layout
    if kind == "sparse_coo":
        sparse_dim = array.ndim if sparse_dim is None else sparse_dim
        if not 0 <= sparse_dim <= array.ndim:
            raise ShapeError(f"sparse_dim {sparse_dim} is out of range for a {array.ndim}-D tensor")
        nonzero = (array != 0).reshape(*array.shape[:sparse_dim], -1).any(axis=-1) if sparse_dim < array.ndim \
            else array != 0
        indices = np.array(np.nonzero(nonzero), dtype=np.int64).reshape(sparse_dim, -1)
        values = array[tuple(indices)] if sparse_dim else array[None]
        return coo(indices, values, array.shape, is_coalesced=True)
    if kind == "semi_structured":
        return _semi_structured_from_dense(array)
    if kind not in COMPRESSED_KINDS:
        raise OpArgumentError(f"cannot convert to layout {kind}", fix="one of " + ", ".join(SPARSE_KINDS))
    dense_dim = 0 if dense_dim is None else int(dense_dim)
    if array.ndim - dense_dim != 2:
        raise UnsupportedError(f"to_{kind} needs 2 sparse dims, got a {array.ndim}-D tensor with {dense_dim} "
                               "dense dims", fix="kiln's compressed layouts have no batch dims; use to_sparse()")
    blocked = kind in ("sparse_bsr", "sparse_bsc")
    if blocked:
        if blocksize is None or len(blocksize) != 2:
            raise OpArgumentError(f"to_{kind} needs a blocksize of two ints, got {blocksize}")
        block = (int(blocksize[0]), int(blocksize[1]))
        if array.shape[0] % block[0] or array.shape[1] % block[1]:
            raise ShapeError(f"dense_to_{kind}: tensor sparse size ({array.shape[0]},{array.shape[1]}) must be "
                             f"divisible by given blocksize ({block[0]},{block[1]})")
    else:
        block = (1, 1)
    rows, cols = array.shape[0] // block[0], array.shape[1] // block[1]
    blocks = array.reshape(rows, block[0], cols, block[1], *array.shape[2:]).swapaxes(1, 2)  # rows x cols x R x C
    nonzero = (blocks != 0).reshape(rows, cols, -1).any(axis=-1)
    rows_compressed = kind in ("sparse_csr", "sparse_bsr")
    if not rows_compressed:
        nonzero, blocks = nonzero.T, blocks.swapaxes(0, 1)
    major, minor = np.nonzero(nonzero)  # row-major order: sorted plain indices within each compressed slice
    compressed_indices = np.concatenate([[0], np.cumsum(nonzero.sum(axis=1))]).astype(np.int64)
    values = blocks[major, minor]
    if not blocked:
        values = values.reshape(len(major), *array.shape[2:])
    return compressed(kind, compressed_indices, minor.astype(np.int64), values, array.shape)


def _semi_structured_from_dense(array: np.ndarray) -> SparseArray:
    if array.ndim != 2 or array.shape[1] % 8:
        raise ShapeError(f"to_sparse_semi_structured needs a 2-D tensor with a multiple of 8 columns, got "
                         f"{list(array.shape)}", fix="pad the last dim to a multiple of 8")
    rows, columns = array.shape
    groups = array.reshape(rows, columns // 4, 4)
    nonzero = groups != 0
    counts = nonzero.sum(axis=-1)
    if counts.max(initial=0) > 2:
        row, group = np.argwhere(counts > 2)[0]
        raise ShapeError(f"tensor is not 2:4 sparse: row {row}, columns {4 * group}..{4 * group + 3} hold "
                         f"{counts[row, group]} nonzeros",
                         fix="prune it first: the prune{pattern=semi_structured} pass, or kiln sparsify --pattern "
                             "semi_structured")
    # Keep the nonzeros, padded with the first zero positions: a stable sort puts nonzeros first in position order.
    order = np.argsort(~nonzero, axis=-1, kind="stable")[..., :2]
    order.sort(axis=-1)
    values = np.take_along_axis(groups, order, axis=-1).reshape(rows, columns // 2)
    nibbles = (order[..., 0] | (order[..., 1] << 2)).astype(np.uint8).reshape(rows, -1, 2)
    metadata = (nibbles[..., 0] | (nibbles[..., 1] << 4)).astype(np.uint8)
    return semi_structured(values, metadata, array.shape)


def convert(value: SparseArray | np.ndarray, layout: Layout | str, **options: Any) -> SparseArray | np.ndarray:
    """Any layout to any other, through the dense form (kiln's reference semantics)."""
    kind = layout.kind if isinstance(layout, Layout) else layout
    dense = value.to_dense() if isinstance(value, SparseArray) else np.asarray(value)
    if kind == STRIDED:
        return dense
    return from_dense(dense, kind, **options)


def coalesce(value: SparseArray) -> SparseArray:
    """torch's `coalesce()`: indices sorted row-major and distinct, duplicates summed."""
    if value.layout.kind != "sparse_coo":
        raise OpArgumentError(f"coalesce expected a sparse COO tensor, got layout {value.layout.kind}")
    indices, values = value.components["indices"], value.values
    if indices.shape[1] == 0:
        return SparseArray(replace(value.layout, coalesced=True), value.shape, dict(value.components))
    flat = np.ravel_multi_index(tuple(indices), value.shape[:indices.shape[0]])
    unique, inverse = np.unique(flat, return_inverse=True)
    summed = np.zeros((unique.size, *values.shape[1:]), dtype=values.dtype)
    np.add.at(summed, inverse, values)
    new_indices = np.array(np.unravel_index(unique, value.shape[:indices.shape[0]]), dtype=np.int64)
    return SparseArray(replace(value.layout, coalesced=True), value.shape, {"indices": new_indices, "values": summed})
