"""Sparse ops: layout conversions, torch.sparse's own ops, and the rules by which dense ATen ops take sparse operands.

The conversions (`_to_sparse*`, `_to_dense`) and torch.sparse's ops (`_sparse_mm`, `sparse_sampled_addmm`,
`_sparse_sum`, `_sparse_softmax`, ...) are defined here. Dense ops that accept sparse operands get a `SparseRule`:
- the zero-preserving unary ops apply their kernel to the stored values and keep the layout;
- the matrix products compute on densified operands, with torch's result layouts;
- add, sub and mul keep a sparse layout when torch does, stored where either (add, sub) or both (mul) operands store.
The reference semantics are the dense ones, so every rule is checked against the dense kernel and against torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from kiln.ir import dtypes
from kiln.ir.errors import OpArgumentError, UnsupportedError
from kiln.ir.meta import canonical_dims, dtype_of, require_arg, shape_of
from kiln.ir.registry import REGISTRY, OpDef, defop, lookup
from kiln.ir.symbolic import sym_eq
from kiln.ir.sparse import (
    COMPRESSED_KINDS, STRIDED_LAYOUT, Layout, SparseArray, coalesce, convert, from_dense, layout_of,
)
from kiln.ir.types import TensorType


def _strided(value: Any) -> Any:
    """The dense counterpart of an argument, for the dense meta rule and kernel."""
    if isinstance(value, SparseArray):
        return value.to_dense()
    if isinstance(value, TensorType) and value.is_sparse:
        return value.with_layout(None)
    if isinstance(value, list):
        return [_strided(v) for v in value]
    return value


def _stored_mask(value: SparseArray) -> np.ndarray:
    """Where a sparse value stores elements (blocks store all their elements)."""
    ones = value.with_values(np.ones(value.values.shape, dtype=np.bool_))
    return ones.to_dense() if value.layout.kind != "sparse_coo" else coalesce(ones).to_dense()


def _restructured(dense: np.ndarray, stored: np.ndarray, layout: Layout) -> SparseArray:
    """`dense` stored at `stored` positions (explicit zeros included) in `layout`."""
    options: dict[str, Any] = {}
    if layout.blocksize is not None:
        options["blocksize"] = layout.blocksize
    if layout.kind == "sparse_coo":
        options["sparse_dim"] = dense.ndim - layout.dense_dim
    elif layout.kind in COMPRESSED_KINDS:
        options["dense_dim"] = layout.dense_dim
    pattern = from_dense(stored, layout.kind, **options)
    positions = pattern.with_values(np.arange(1, pattern.values.size + 1).reshape(pattern.values.shape))
    # Gather the dense values at the pattern's positions: number the stored slots, scatter the numbers, read back.
    numbering = positions.to_dense()
    values = np.zeros(pattern.values.shape, dtype=dense.dtype)
    flat_values = values.reshape(-1)
    slot = numbering.reshape(-1)
    taken = slot > 0
    flat_values[slot[taken] - 1] = dense.reshape(-1)[taken]
    return pattern.with_values(values)


# ---------------------------------------------------------------------------------------------
# Rules for dense ops with sparse operands


@dataclass(frozen=True)
class SparseRule:
    """How one dense op takes sparse operands: `result_layout(layouts)` gives the result's layout from the tensor
    arguments' layouts, or raises; `mode` is `values` (kernel on the stored values) or `dense` (kernel on densified
    operands, restructured by `stored(masks)` when the result is sparse)."""

    result_layout: Callable[[list[Layout]], Layout]
    mode: str = "dense"
    stored: Callable[[list[np.ndarray]], np.ndarray] | None = None

    def _tensor_layouts(self, opdef: OpDef, arguments: list[Any]) -> list[Layout]:
        layouts = []
        for argument, value in zip(opdef.schema.arguments, arguments):
            if argument.type.is_tensor and not argument.type.is_list and value is not None:
                layouts.append(layout_of(value))
        return layouts

    def meta(self, opdef: OpDef, arguments: list[Any]) -> TensorType:
        layout = self.result_layout(self._tensor_layouts(opdef, arguments))
        return opdef.meta(*[_strided(a) for a in arguments]).with_layout(layout)

    def run(self, opdef: OpDef, arguments: list[Any]) -> Any:
        from kiln.ir.registry import conform
        layout = self.result_layout(self._tensor_layouts(opdef, arguments))
        if self.mode == "values":
            (sparse,) = [a for a in arguments if isinstance(a, SparseArray)]
            if sparse.layout.kind == "sparse_coo" and not sparse.layout.coalesced:
                sparse = coalesce(sparse)  # nonlinear functions of summed duplicates
            rest = [sparse.values if a is not None and isinstance(a, SparseArray) else a for a in arguments]
            expected = opdef.meta(*[_strided(a) for a in arguments])
            values = conform(opdef, opdef.kernel(*rest), expected.with_shape(sparse.values.shape))
            return sparse.with_values(values)
        dense_arguments = [_strided(a) for a in arguments]
        dense = conform(opdef, opdef.kernel(*dense_arguments), opdef.meta(*dense_arguments))
        if not layout.is_sparse:
            return dense
        masks = [_stored_mask(a) if isinstance(a, SparseArray) else None for a in arguments]
        stored = self.stored([m for m in masks if m is not None]) if self.stored else dense != 0
        return _restructured(dense, np.broadcast_to(stored, dense.shape), layout)


def _refuse(op: str, layouts: list[Layout]) -> Layout:
    kinds = ", ".join(layout.kind for layout in layouts)
    raise UnsupportedError(f"{op} does not support operands of layouts ({kinds})",
                           fix="convert the operands with .to_dense(), or to one sparse layout")


def _same_layout(layouts: list[Layout]) -> Layout:
    return next(layout for layout in layouts if layout.is_sparse)


def _product_layout(op: str) -> Callable[[list[Layout]], Layout]:
    """torch's mm: sparse x sparse stays sparse (COO x COO -> COO; CSR/CSC x CSR/CSC -> CSR); otherwise dense."""
    def rule(layouts: list[Layout]) -> Layout:
        first, second = layouts[-2], layouts[-1]
        if first.is_sparse and second.is_sparse:
            if first.kind == second.kind == "sparse_coo":
                return Layout("sparse_coo")
            if first.kind in ("sparse_csr", "sparse_csc") and second.kind in ("sparse_csr", "sparse_csc"):
                return Layout("sparse_csr", index_dtype=first.index_dtype)
            return _refuse(op, layouts)
        return STRIDED_LAYOUT
    return rule


def _addmm_layout(layouts: list[Layout]) -> Layout:
    """torch's addmm: a sparse `self` with a sparse product keeps self's layout; anything else is dense."""
    product = _product_layout("aten.addmm.default")(layouts)
    return layouts[0] if layouts[0].is_sparse and product.is_sparse else STRIDED_LAYOUT


def _dense_result(layouts: list[Layout]) -> Layout:
    return STRIDED_LAYOUT


def _elementwise_layout(op: str, sparse_with_dense: bool) -> Callable[[list[Layout]], Layout]:
    """add/sub: sparse + sparse of one layout stays sparse, sparse + dense is dense. mul keeps the first sparse
    operand's layout."""
    def rule(layouts: list[Layout]) -> Layout:
        sparse = [layout for layout in layouts if layout.is_sparse]
        if sparse_with_dense:  # mul: the first sparse operand's layout, masked by every sparse operand
            return replace(sparse[0], coalesced=False)
        if len({layout.kind for layout in sparse}) > 1 or any(layout.is_blocked for layout in sparse):
            return _refuse(op, layouts)
        if len(sparse) == len(layouts):
            return replace(sparse[0], coalesced=False)
        return STRIDED_LAYOUT
    return rule


def _union(masks: list[np.ndarray]) -> np.ndarray:
    return np.logical_or.reduce(masks) if len(masks) > 1 else masks[0]


def _intersection(masks: list[np.ndarray]) -> np.ndarray:
    return np.logical_and.reduce(masks) if len(masks) > 1 else masks[0]


# torch's zero-preserving unary functions (torch.sparse's table), which keep the layout
ZERO_PRESERVING_UNARY = (
    "abs", "neg", "sin", "tan", "sqrt", "relu", "tanh", "sign", "floor", "ceil", "round", "trunc", "expm1", "log1p",
    "asin", "atan", "asinh", "atanh", "erf", "sinh", "sgn", "isnan", "isinf", "signbit", "deg2rad", "rad2deg",
    "erfinv", "frac", "nan_to_num", "isposinf", "isneginf", "square", "angle",
)


CONVOLUTIONS = ("aten.convolution.default", "aten.conv1d.default", "aten.conv2d.default", "aten.conv3d.default")


def _attach(name: str, rule: SparseRule) -> None:
    lookup(name).sparse = rule


def _attach_rules() -> None:
    keep_layout = SparseRule(_same_layout, mode="values")
    for name in ZERO_PRESERVING_UNARY:
        for opdef in [d for key, d in REGISTRY.items() if key.startswith(f"aten.{name}.") and
                      len([a for a in d.schema.arguments if a.type.is_tensor]) == 1 and
                      not key.endswith((".out", "_"))]:
            opdef.sparse = keep_layout
    for name in ("aten.mul.Scalar", "aten.div.Scalar", "aten._to_copy.default", "aten.clone.default"):
        _attach(name, keep_layout)
    for name in ("aten.mm.default", "aten.matmul.default"):
        _attach(name, SparseRule(_product_layout(name)))
    _attach("aten.addmm.default", SparseRule(_addmm_layout))
    _attach("aten.linear.default", SparseRule(_dense_result))
    # convolutions with a sparse weight (kiln's superset: torch refuses them); a hybrid BSR weight [C_out, C_in, *taps]
    # with the taps as dense dims is the BSR matrix over im2col that the C backend runs
    for name in CONVOLUTIONS:
        _attach(name, SparseRule(_dense_result))
    _attach("aten.add.Tensor", SparseRule(_elementwise_layout("aten.add.Tensor", False), stored=_union))
    _attach("aten.sub.Tensor", SparseRule(_elementwise_layout("aten.sub.Tensor", False), stored=_union))
    _attach("aten.mul.Tensor", SparseRule(_elementwise_layout("aten.mul.Tensor", True), stored=_intersection))


# ---------------------------------------------------------------------------------------------
# Conversions


def _converted_type(self: Any, layout: Layout, dtype: Any = None) -> TensorType:
    shape = shape_of(self)
    if layout.blocksize is not None:
        require_arg(all(not isinstance(d, int) or d % b == 0 for d, b in zip(shape, layout.blocksize)), "to_sparse",
                    f"tensor sparse size ({shape[0]},{shape[1]}) must be divisible by given blocksize "
                    f"({layout.blocksize[0]},{layout.blocksize[1]})")
    return TensorType.of(shape, dtype_of(self) if dtype is None else dtypes.dtype(dtype), layout)


def _target_layout(self: Any, kind: str, blocksize: Any = None, dense_dim: Any = None,
                   sparse_dim: Any = None) -> Layout:
    rank = len(shape_of(self))
    if kind == "sparse_coo":
        dense = rank - (rank if sparse_dim is None else int(sparse_dim))
        return Layout("sparse_coo", dense_dim=dense, coalesced=True)
    if kind == "semi_structured":
        return Layout("semi_structured", meta="2bit")
    if kind not in COMPRESSED_KINDS:
        raise OpArgumentError(f"to_sparse: unknown layout {kind!r}",
                              fix="one of sparse_coo, " + ", ".join(COMPRESSED_KINDS) + ", semi_structured")
    blocked = kind in ("sparse_bsr", "sparse_bsc")
    if blocked and (blocksize is None or len(blocksize) != 2):
        raise OpArgumentError(f"to_{kind} needs a blocksize of two ints, got {blocksize}")
    index = layout_of(self).index_dtype if layout_of(self).kind in COMPRESSED_KINDS else "int64"
    return Layout(kind, blocksize=tuple(int(b) for b in blocksize) if blocked else None, index_dtype=index,
                  dense_dim=0 if dense_dim is None else int(dense_dim))


def _conversion(kind: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
    blocked = kind in ("sparse_bsr", "sparse_bsc")

    def meta(self, *options):
        blocksize, dense_dim = options if blocked else (None, *options)
        return _converted_type(self, _target_layout(self, kind, blocksize, dense_dim))

    def kernel(self, *options):
        blocksize, dense_dim = options if blocked else (None, *options)
        extra = {"blocksize": blocksize} if blocked else {}
        return _keep_index_dtype(convert(self, kind, dense_dim=dense_dim, **extra), self)
    return meta, kernel


def _keep_index_dtype(result: SparseArray, source: Any) -> SparseArray:
    """CSR -> CSR/CSC/BSR conversions keep int32 indices, as torch's do."""
    if layout_of(source).index_dtype == "int32" and result.layout.kind in COMPRESSED_KINDS:
        components = {name: array.astype(np.int32) if name != "values" else array
                      for name, array in result.components.items()}
        return SparseArray(replace(result.layout, index_dtype="int32"), result.shape, components)
    return result


for _kind in ("sparse_csr", "sparse_csc"):
    defop(f"_to_{_kind}(Tensor self, int? dense_dim=None) -> Tensor", *_conversion(_kind), tags=("sparse",))
for _kind in ("sparse_bsr", "sparse_bsc"):
    defop(f"_to_{_kind}(Tensor self, int[2] blocksize, int? dense_dim=None) -> Tensor", *_conversion(_kind),
          tags=("sparse",))


def _layout_kind(layout: Any) -> str:
    """A `Layout?` argument: a Layout, a kind's name, or None for COO."""
    return "sparse_coo" if layout is None else layout.kind if isinstance(layout, Layout) else str(layout)


def _to_sparse_meta(self, layout=None, blocksize=None, dense_dim=None):
    kind = _layout_kind(layout)
    return _converted_type(self, _target_layout(self, kind, blocksize, dense_dim))


def _to_sparse(self, layout=None, blocksize=None, dense_dim=None):
    kind = _layout_kind(layout)
    options = {"blocksize": blocksize} if kind in ("sparse_bsr", "sparse_bsc") else {}
    if kind in COMPRESSED_KINDS:
        options["dense_dim"] = dense_dim
    return convert(self, kind, **options)


defop("_to_sparse(Tensor self, *, Layout? layout=None, int[2]? blocksize=None, int? dense_dim=None) -> Tensor",
      _to_sparse_meta, _to_sparse, tags=("sparse",),
      doc="to_sparse: to COO (the default) or any sparse layout, including kiln's semi_structured (2:4)")
defop("_to_sparse.sparse_dim(Tensor self, int sparse_dim) -> Tensor",
      lambda self, sparse_dim: _converted_type(self, _target_layout(self, "sparse_coo", sparse_dim=sparse_dim)),
      lambda self, sparse_dim: convert(self, "sparse_coo", sparse_dim=sparse_dim), tags=("sparse",))


def _to_dense(self, dtype=None, masked_grad=None):
    dense = self.to_dense() if isinstance(self, SparseArray) else np.asarray(self)
    return dense if dtype is None else dense.astype(dtypes.dtype(dtype).numpy)


defop("_to_dense(Tensor self, ScalarType? dtype=None, bool? masked_grad=None) -> Tensor",
      lambda self, dtype=None, masked_grad=None: _converted_type(self, STRIDED_LAYOUT, dtype), _to_dense,
      tags=("sparse",))


# ---------------------------------------------------------------------------------------------
# torch.sparse's own ops


def _require_sparse(op: str, value: Any, kinds: tuple[str, ...] | None = None) -> Layout:
    layout = layout_of(value)
    if not layout.is_sparse or kinds is not None and layout.kind not in kinds:
        raise UnsupportedError(f"{op} expects a {' or '.join(kinds) if kinds else 'sparse'} tensor, got layout "
                               f"{layout.kind}", fix="convert it with .to_sparse() first")
    return layout


def _sparse_mm_meta(sparse, dense):
    _require_sparse("aten._sparse_mm.default", sparse)
    return lookup("aten.mm.default").sparse.meta(lookup("aten.mm.default"), [sparse, dense])


def _sparse_mm(sparse, dense):
    return lookup("aten.mm.default").sparse.run(lookup("aten.mm.default"), [sparse, dense])


defop("_sparse_mm(Tensor sparse, Tensor dense) -> Tensor", _sparse_mm_meta, _sparse_mm, tags=("sparse",),
      doc="torch.sparse.mm")


def _sampled_addmm_meta(self, mat1, mat2, beta=1, alpha=1):
    _require_sparse("aten.sparse_sampled_addmm.default", self, ("sparse_csr",))
    product = lookup("aten.mm.default").meta(_strided(mat1), _strided(mat2))
    require_arg(all(sym_eq(a, b) for a, b in zip(shape_of(product), shape_of(self))),
                "aten.sparse_sampled_addmm.default",
                f"self has shape {list(shape_of(self))} but mat1 @ mat2 has {list(shape_of(product))}")
    return TensorType.of(shape_of(self), dtype_of(self), layout_of(self))


def _sampled_addmm(self, mat1, mat2, beta=1, alpha=1):
    """beta * self + alpha * (mat1 @ mat2), computed only where self stores elements."""
    product = np.asarray(_strided(mat1)) @ np.asarray(_strided(mat2))
    dense = (beta * self.to_dense() + alpha * product).astype(self.dtype)
    return _restructured(dense, _stored_mask(self), self.layout)


defop("sparse_sampled_addmm(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1) -> Tensor",
      _sampled_addmm_meta, _sampled_addmm, tags=("sparse",), doc="torch.sparse.sampled_addmm")


def _sum_result(self: Any, dim: Any) -> tuple[list[int], Layout]:
    layout = _require_sparse("aten._sparse_sum.dim", self)
    rank = len(shape_of(self))
    dims = canonical_dims("aten._sparse_sum.dim", dim, rank)
    sparse_dim = rank - layout.dense_dim
    remaining = sparse_dim - len([d for d in dims if d < sparse_dim])
    kept_dense = layout.dense_dim - len([d for d in dims if d >= sparse_dim])
    return dims, Layout("sparse_coo", dense_dim=kept_dense, coalesced=True) if remaining else STRIDED_LAYOUT


def _sum_dim_meta(self, dim):
    dims, layout = _sum_result(self, dim)
    shape = [d for axis, d in enumerate(shape_of(self)) if axis not in dims]
    return TensorType.of(shape, dtype_of(self), layout)


def _sum_dim(self, dim):
    dims, layout = _sum_result(self, dim)
    stored = _stored_mask(self).any(axis=tuple(dims))
    summed = self.to_dense().sum(axis=tuple(dims), dtype=self.dtype)
    return _restructured(summed, stored, layout) if layout.is_sparse else summed


def _sum_meta(self):
    _require_sparse("aten._sparse_sum.default", self)
    return TensorType.of((), dtype_of(self))


defop("_sparse_sum(Tensor self) -> Tensor", _sum_meta,
      lambda self: np.asarray(self.to_dense().sum(dtype=self.dtype)), tags=("sparse",), doc="torch.sparse.sum")
defop("_sparse_sum.dim(Tensor self, int[1] dim) -> Tensor", _sum_dim_meta, _sum_dim, tags=("sparse",),
      doc="torch.sparse.sum over dims: COO while sparse dims remain, dense otherwise")


def _softmax_family(log: bool) -> tuple[Callable[..., Any], Callable[..., Any]]:
    op = f"aten._sparse_{'log_' if log else ''}softmax.int"

    def meta(self, dim, dtype=None):
        layout = _require_sparse(op, self)
        canonical_dims(op, [dim], len(shape_of(self)))
        result = dtype_of(self) if dtype is None else dtypes.dtype(dtype)
        return TensorType.of(shape_of(self), result, _softmax_layout(layout))

    def kernel(self, dim, dtype=None):
        """Softmax over the stored elements of each slice; unstored elements count as -inf and stay unstored."""
        stored = _stored_mask(self)
        dense = self.to_dense().astype(np.float64)
        masked = np.where(stored, dense, -np.inf)
        peak = np.max(masked, axis=dim, keepdims=True)
        peak = np.where(np.isfinite(peak), peak, 0.0)
        with np.errstate(all="ignore"):
            total = np.sum(np.where(stored, np.exp(masked - peak), 0.0), axis=dim, keepdims=True)
            result = masked - peak - np.log(total) if log else np.exp(masked - peak) / total
        result_dtype = self.dtype if dtype is None else dtypes.dtype(dtype).numpy
        result = np.where(stored, result, 0.0).astype(result_dtype)
        return _restructured(result, stored, _softmax_layout(self.layout))
    return meta, kernel


def _softmax_layout(layout: Layout) -> Layout:
    return replace(layout, coalesced=True) if layout.kind == "sparse_coo" else layout


defop("_sparse_softmax.int(Tensor self, int dim, ScalarType? dtype=None) -> Tensor", *_softmax_family(False),
      tags=("sparse",), doc="torch.sparse.softmax")
defop("_sparse_log_softmax.int(Tensor self, int dim, ScalarType? dtype=None) -> Tensor", *_softmax_family(True),
      tags=("sparse",), doc="torch.sparse.log_softmax")

_attach_rules()
