"""Matrix products: mm, bmm, addmm, pairwise distances (_cdist_forward, _pdist_forward), and the composites
that lower onto them (matmul in every rank combination, baddbmm, einsum, dot/vdot, mv, addmv, outer).

Reference kernels accumulate float32 products in float64 and float16/bfloat16 ones in float32 (ATen's opmath),
then round once to the result dtype; integer products accumulate in int64 and wrap on the cast back, like
ATen's integer gemm. Composite decompositions use only `kiln.ops.aten` handles (mm/bmm/view/expand/permute/...).
"""

from __future__ import annotations

import math
import string

import numpy as np
import sympy

from kiln.ir import dtypes
from kiln.ir.errors import OpArgumentError
from kiln.ir.meta import (
    broadcast_shapes, dtype_of, numel, require, require_arg, require_dtype, shape_of, tensor,
)
from kiln.ir.registry import defop, ops, register_decomposition
from kiln.ir.symbolic import as_dim, sym_eq


# ---------------------------------------------------------------------------------------------
# Shared kernel helpers

def _accumulation_dtype(dtype: np.dtype) -> np.dtype:
    """Where products are accumulated: wider than the result so one rounding happens at the end."""
    if dtype in (np.float16, dtypes.bfloat16.numpy):
        return np.dtype(np.float32)
    if dtype == np.float32:
        return np.dtype(np.float64)
    if dtype.kind in "biu":
        return np.dtype(np.int64)
    return dtype


def _product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b accumulated in _accumulation_dtype (not yet cast back)."""
    acc = _accumulation_dtype(a.dtype)
    with np.errstate(all="ignore"):  # inf * 0 inside the product is NaN, as in ATen
        return np.matmul(a.astype(acc), b.astype(acc))


def _to_result(value: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if dtype == np.bool_:
        return value != 0
    return value.astype(dtype)


def _scalar_for(dtype: dtypes.DType, value):
    """alpha/beta as ATen applies them: truncated to an integer for integral results."""
    if dtype.is_floating_point or dtype.is_complex:
        return float(value)
    if isinstance(value, float) and not math.isfinite(value):  # ATen: "cannot be converted ... without overflow"
        raise OpArgumentError(f"alpha/beta {value} cannot be converted to {dtype.name} without overflow",
                              fix="use a finite alpha and beta with integer tensors")
    return int(value)


def _same_dtype(op: str, *tensors) -> dtypes.DType:
    first = dtype_of(tensors[0])
    for other in tensors[1:]:
        require_dtype(dtype_of(other) is first, op,
                      f"expected all operands to have the same dtype, got {first} and {dtype_of(other)}",
                      fix="convert the operands to one dtype first")
    return first


# ---------------------------------------------------------------------------------------------
# mm / bmm / addmm

def _mm_meta(self, mat2):
    op = "aten.mm.default"
    require(len(shape_of(self)) == 2 and len(shape_of(mat2)) == 2, op,
            f"expected 2-D matrices, got shapes {list(shape_of(self))} and {list(shape_of(mat2))}")
    require_dtype(dtype_of(self) is dtype_of(mat2), op,
                  f"expected both matrices to have the same dtype, got {dtype_of(self)} and {dtype_of(mat2)}",
                  fix="convert the operands to one dtype first")
    (n, k), (k2, m) = shape_of(self), shape_of(mat2)
    require(sym_eq(k, k2), op, f"mat1 and mat2 shapes cannot be multiplied ({n}x{k} and {k2}x{m})",
            fix="mat1's column count must equal mat2's row count (transpose one of them?)")
    return tensor([n, m], dtype_of(self))


def _matmul_kernel(self, mat2):
    return _to_result(_product(self, mat2), self.dtype)


defop("mm(Tensor self, Tensor mat2) -> Tensor", _mm_meta, _matmul_kernel)


def _bmm_meta(self, mat2):
    op = "aten.bmm.default"
    require(len(shape_of(self)) == 3 and len(shape_of(mat2)) == 3, op,
            f"expected 3-D batches of matrices, got shapes {list(shape_of(self))} and {list(shape_of(mat2))}")
    dtype = _same_dtype(op, self, mat2)
    (b, n, k), (b2, k2, m) = shape_of(self), shape_of(mat2)
    require(sym_eq(b, b2) and sym_eq(k, k2), op,
            f"expected batch2 to have shape [{b}, {k}, *] for batch1 of shape [{b}, {n}, {k}], "
            f"got {list(shape_of(mat2))}")
    return tensor([b, n, m], dtype)


defop("bmm(Tensor self, Tensor mat2) -> Tensor", _bmm_meta, _matmul_kernel)


def _expandable_to(op: str, shape, target) -> None:
    """`shape` must broadcast to exactly `target` (ATen's expand_size check for addmm/baddbmm's self)."""
    require(len(shape) <= len(target), op, f"self of shape {list(shape)} cannot be expanded to {list(target)}")
    for size, want in zip(reversed(shape), reversed(target)):
        require((isinstance(size, int) and size == 1) or sym_eq(size, want), op,
                f"self of shape {list(shape)} cannot be expanded to {list(target)}",
                fix="self must broadcast to the shape of the product")


def _added_to_product(op, self, product, other_name):
    """Meta of `beta * self + alpha * product` (addmm, baddbmm, addmv): self broadcasts to the product."""
    require_dtype(dtype_of(self) is product.dtype, op,
                  f"self and {other_name} must have the same dtype, got {dtype_of(self)} and {product.dtype}")
    _expandable_to(op, shape_of(self), product.shape)
    return product


def _addmm_meta(self, mat1, mat2, beta=1, alpha=1):
    return _added_to_product("aten.addmm.default", self, _mm_meta(mat1, mat2), "mat2")


def _scaled_sum(self, product, beta, alpha, dtype):
    """beta * self + alpha * product, where beta = 0 drops self (NaN/inf there vanish) and alpha = 0 drops the
    product for float32/float64, as BLAS gemm/gemv do; ATen's own float16/bfloat16 kernels multiply the product by 0,
    so a NaN or inf in it gives NaN. Integral results use truncated integer factors."""
    kiln_dtype = dtypes.dtype(dtype)
    beta, alpha = _scalar_for(kiln_dtype, beta), _scalar_for(kiln_dtype, alpha)
    acc = product.dtype
    blas = kiln_dtype in (dtypes.float32, dtypes.float64)
    result = product * alpha if alpha != 0 or not blas else np.zeros_like(product)
    if beta != 0:
        result = result + np.asarray(self).astype(acc) * beta
    return _to_result(np.broadcast_to(result, product.shape), dtype)


def _addmm_kernel(self, mat1, mat2, beta=1, alpha=1):
    with np.errstate(all="ignore"):
        return _scaled_sum(self, _product(mat1, mat2), beta, alpha, mat1.dtype)


defop("addmm(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1) -> Tensor",
      _addmm_meta, _addmm_kernel)


# ---------------------------------------------------------------------------------------------
# Pairwise distances

def _check_p(op: str, p: float) -> None:
    require_arg(not math.isnan(p) and p >= 0, op, f"only non-negative p-norms are supported, got p={p}",
                fix="pass p >= 0 (float('inf') for the max norm)")


def _cdist_meta(x1, x2, p, compute_mode=None):
    op = "aten._cdist_forward.default"
    s1, s2 = shape_of(x1), shape_of(x2)
    require(len(s1) >= 2 and len(s2) >= 2, op,
            f"expected x1 and x2 to be at least 2-D, got shapes {list(s1)} and {list(s2)}")
    dtype = _same_dtype(op, x1, x2)
    require_dtype(dtype in (dtypes.float32, dtypes.float64), op,
                  f"only float32 and float64 inputs are supported, got {dtype}",
                  fix="convert the inputs to float32 or float64")
    require(sym_eq(s1[-1], s2[-1]), op,
            f"x1 and x2 must have the same number of columns, got {s1[-1]} and {s2[-1]}",
            fix="points in x1 and x2 need the same dimension (the last dim)")
    _check_p(op, p)
    require_arg(compute_mode in (None, 0, 1, 2), op,
                f"compute_mode must be None, 0, 1 or 2, got {compute_mode}",
                fix="None/0: automatic, 1: always the matrix-product formula, 2: never")
    batch = broadcast_shapes(op, s1[:-2], s2[:-2])
    return tensor([*batch, s1[-2], s2[-2]], dtype)


def _p_norm(diff: np.ndarray, p: float, *, nan_ignoring_max: bool) -> np.ndarray:
    """The p-norm of |x - y| over the last axis, as ATen's distance kernels compute it."""
    if p == 0:  # number of differing coordinates; NaN stays NaN
        return np.minimum(np.ceil(diff), 1).sum(-1)
    if p == 1:
        return diff.sum(-1)
    if p == 2:
        return np.sqrt((diff * diff).sum(-1))
    if math.isinf(p):
        if nan_ignoring_max:  # cdist's scalar loop uses std::max, which never picks a NaN
            diff = np.where(np.isnan(diff), 0, diff)
        return diff.max(-1, initial=0)
    return np.power(np.power(diff, p).sum(-1), 1 / p)


def _uses_matmul_formula(p, compute_mode, rows1, rows2) -> bool:
    """ATen computes euclidean cdist through a matrix product when asked (1) or when large (None/0)."""
    return p == 2 and (compute_mode == 1 or (compute_mode in (None, 0) and (rows1 > 25 or rows2 > 25)))


def _cdist_kernel(x1, x2, p, compute_mode=None):
    batch = np.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
    a = np.broadcast_to(x1.astype(np.float64), batch + x1.shape[-2:])
    b = np.broadcast_to(x2.astype(np.float64), batch + x2.shape[-2:])
    with np.errstate(all="ignore"):
        if _uses_matmul_formula(p, compute_mode, a.shape[-2], b.shape[-2]):
            # ATen's _euclidean_dist: |a|^2 + |b|^2 - 2ab, clamped at 0. Reproduced so that inf/NaN inputs
            # give the same results (inf - inf = NaN there, unlike the direct difference).
            a_norm = (a * a).sum(-1, keepdims=True)
            b_norm = (b * b).sum(-1, keepdims=True)
            squared = a_norm + np.swapaxes(b_norm, -1, -2) - 2 * np.matmul(a, np.swapaxes(b, -1, -2))
            return np.sqrt(np.maximum(squared, 0)).astype(x1.dtype)
        diff = np.abs(a[..., :, None, :] - b[..., None, :, :])
        return _p_norm(diff, p, nan_ignoring_max=True).astype(x1.dtype)


defop("_cdist_forward(Tensor x1, Tensor x2, float p, int? compute_mode) -> Tensor", _cdist_meta, _cdist_kernel,
      doc="compute_mode: None/0 = matrix-product formula for p=2 when either side has more than 25 rows, "
          "1 = always for p=2, 2 = never.")


def _floor_half(value):
    return value // 2 if isinstance(value, int) else as_dim(sympy.floor(sympy.sympify(value) / 2))


def _pdist_meta(self, p=2.0):
    op = "aten._pdist_forward.default"
    shape = shape_of(self)
    require(len(shape) == 2, op, f"expected a 2-D input, got shape {list(shape)}")
    require_dtype(dtype_of(self) in (dtypes.float32, dtypes.float64), op,
                  f"only float32 and float64 inputs are supported, got {dtype_of(self)}",
                  fix="convert the input to float32 or float64")
    _check_p(op, p)
    n = shape[0]
    return tensor([_floor_half(n * (n - 1))], dtype_of(self))


def _pdist_kernel(self, p=2.0):
    rows, cols = np.triu_indices(self.shape[0], 1)  # the row-major order of the pairs i < j, like ATen
    x = self.astype(np.float64)
    with np.errstate(all="ignore"):
        diff = np.abs(x[rows] - x[cols])
        # pdist's vectorized max propagates NaN, unlike cdist's scalar loop.
        return _p_norm(diff, p, nan_ignoring_max=False).astype(self.dtype)


defop("_pdist_forward(Tensor self, float p=2.) -> Tensor", _pdist_meta, _pdist_kernel)


# ---------------------------------------------------------------------------------------------
# Composites: matmul and friends

def _view(x, shape):
    return x if list(shape_of(x)) == list(shape) else ops.aten.view.default(x, list(shape))


def _expand_then_view(x, expanded, final):
    """Broadcast x to `expanded` and reshape to `final`; a real broadcast is materialized with clone first,
    so the view is also valid in torch (which refuses to view a non-contiguous expansion)."""
    aten = ops.aten
    if [str(d) for d in shape_of(x)] != [str(d) for d in expanded]:
        x = aten.clone.default(aten.expand.default(x, list(expanded)))
    return _view(x, final)


def _transpose_last(x):
    rank = len(shape_of(x))
    return ops.aten.permute.default(x, [*range(rank - 2), rank - 1, rank - 2])


def _matmul_meta(self, other):
    op = "aten.matmul.default"
    a, b = shape_of(self), shape_of(other)
    require(len(a) >= 1 and len(b) >= 1, op,
            f"both arguments need at least 1 dimension, got shapes {list(a)} and {list(b)}")
    dtype = _same_dtype(op, self, other)
    k_a = a[-1]
    k_b = b[0] if len(b) == 1 else b[-2]
    require(sym_eq(k_a, k_b), op, f"shapes {list(a)} and {list(b)} cannot be multiplied ({k_a} vs {k_b})",
            fix="the first operand's last dim must equal the second's second-to-last (or only) dim")
    if len(a) == 1 and len(b) == 1:
        return tensor([], dtype)
    if len(b) == 1:
        return tensor(a[:-1], dtype)
    if len(a) == 1:
        return tensor([*b[:-2], b[-1]], dtype)
    batch = broadcast_shapes(op, a[:-2], b[:-2])
    return tensor([*batch, a[-2], b[-1]], dtype)


def _matmul_kernel_composite(self, other):
    return _to_result(_product(self, other), self.dtype)


defop("matmul(Tensor self, Tensor other) -> Tensor", _matmul_meta, _matmul_kernel_composite, tags=("composite",))


@register_decomposition("aten.matmul.default")
def _matmul_decomposition(self, other):
    """torch.matmul's rank cases: dot, matrix-vector, folding batch dims into mm, or broadcast + bmm."""
    aten = ops.aten
    _matmul_meta(self, other)  # validates and reports errors the same way as the op itself
    a, b = list(shape_of(self)), list(shape_of(other))
    if len(a) == 1 and len(b) == 1:
        return _view(aten.mm.default(_view(self, [1, a[0]]), _view(other, [b[0], 1])), [])
    if len(a) == 2 and len(b) == 1:
        return _view(aten.mm.default(self, _view(other, [b[0], 1])), [a[0]])
    if len(a) == 1 and len(b) == 2:
        return _view(aten.mm.default(_view(self, [1, a[0]]), other), [b[1]])
    if len(a) == 2 and len(b) == 2:
        return aten.mm.default(self, other)
    if len(a) >= 3 and len(b) <= 2:
        # Fold the batch dims of self into the rows of one mm.
        rows = numel(a[:-1])
        matrix = other if len(b) == 2 else _view(other, [b[0], 1])
        out = aten.mm.default(_view(self, [rows, a[-1]]), matrix)
        return _view(out, a[:-1] + ([b[-1]] if len(b) == 2 else []))
    if len(a) == 1:
        # A vector times a batch of matrices: a row vector per batch, then drop that row.
        out = _matmul_decomposition(_view(self, [1, a[0]]), other)
        return _view(out, [*b[:-2], b[-1]])
    batch = list(broadcast_shapes("aten.matmul.default", a[:-2], b[:-2]))
    count = numel(batch)
    left = _expand_then_view(self, batch + a[-2:], [count, a[-2], a[-1]])
    right_matrix = b if len(b) >= 2 else [b[0], 1]
    right = _expand_then_view(other, batch + right_matrix[-2:], [count, right_matrix[-2], right_matrix[-1]])
    return _view(aten.bmm.default(left, right), batch + [a[-2], b[-1]])


def _baddbmm_meta(self, batch1, batch2, beta=1, alpha=1):
    return _added_to_product("aten.baddbmm.default", self, _bmm_meta(batch1, batch2), "batch2")


def _baddbmm_kernel(self, batch1, batch2, beta=1, alpha=1):
    kiln_dtype = dtypes.dtype(batch1.dtype)
    alpha_value, beta_value = _scalar_for(kiln_dtype, alpha), _scalar_for(kiln_dtype, beta)
    with np.errstate(all="ignore"):
        product = _product(batch1, batch2)
        # Unlike addmm, ATen's batched kernel multiplies by alpha even when it is 0 (NaN * 0 stays NaN);
        # only beta == 0 drops its term.
        result = product * alpha_value
        if beta_value != 0:
            result = result + np.asarray(self).astype(product.dtype) * beta_value
        return _to_result(np.broadcast_to(result, product.shape), batch1.dtype)


defop("baddbmm(Tensor self, Tensor batch1, Tensor batch2, *, Scalar beta=1, Scalar alpha=1) -> Tensor",
      _baddbmm_meta, _baddbmm_kernel, tags=("composite",))


def _scaled(x, factor):
    return x if factor == 1 else ops.aten.mul.Scalar(x, factor)


def _cast(x, dtype):
    return x if dtype_of(x) is dtype else ops.aten._to_copy.default(x, dtype=dtype)


@register_decomposition("aten.baddbmm.default")
def _baddbmm_decomposition(self, batch1, batch2, beta=1, alpha=1):
    aten = ops.aten
    dtype = _baddbmm_meta(self, batch1, batch2, beta, alpha).dtype
    beta, alpha = _scalar_for(dtype, beta), _scalar_for(dtype, alpha)
    # float16/bfloat16 run in float32 and round once at the end, as ATen's fused kernel does.
    compute = dtypes.opmath_dtype(dtype)
    product = _scaled(aten.bmm.default(_cast(batch1, compute), _cast(batch2, compute)), alpha)
    if beta != 0:  # beta == 0 ignores self entirely (NaN in it does not propagate)
        product = aten.add.Tensor(product, _scaled(_cast(self, compute), beta))
    return _cast(product, dtype)


def _dot_meta(op):
    def meta(self, other):
        require(len(shape_of(self)) == 1 and len(shape_of(other)) == 1, op,
                f"expected two 1-D tensors, got shapes {list(shape_of(self))} and {list(shape_of(other))}")
        dtype = _same_dtype(op, self, other)
        require(sym_eq(shape_of(self)[0], shape_of(other)[0]), op,
                f"inconsistent tensor size: {shape_of(self)[0]} and {shape_of(other)[0]} elements")
        return tensor([], dtype)
    return meta


for _name in ("dot", "vdot"):  # vdot conjugates self, which is the identity for kiln's real tensors
    defop(f"{_name}(Tensor self, Tensor {'tensor' if _name == 'dot' else 'other'}) -> Tensor",
          _dot_meta(f"aten.{_name}.default"), _matmul_kernel_composite, tags=("composite",))
    register_decomposition(f"aten.{_name}.default")(_matmul_decomposition)


def _mv_meta(self, vec):
    op = "aten.mv.default"
    require(len(shape_of(self)) == 2 and len(shape_of(vec)) == 1, op,
            f"expected a matrix and a vector, got shapes {list(shape_of(self))} and {list(shape_of(vec))}")
    return _matmul_meta(self, vec)


defop("mv(Tensor self, Tensor vec) -> Tensor", _mv_meta, _matmul_kernel_composite, tags=("composite",))
register_decomposition("aten.mv.default")(_matmul_decomposition)


def _addmv_meta(self, mat, vec, beta=1, alpha=1):
    return _added_to_product("aten.addmv.default", self, _mv_meta(mat, vec), "mat")


def _addmv_kernel(self, mat, vec, beta=1, alpha=1):
    with np.errstate(all="ignore"):
        return _scaled_sum(self, _product(mat, vec), beta, alpha, mat.dtype)


defop("addmv(Tensor self, Tensor mat, Tensor vec, *, Scalar beta=1, Scalar alpha=1) -> Tensor",
      _addmv_meta, _addmv_kernel, tags=("composite",))


@register_decomposition("aten.addmv.default")
def _addmv_decomposition(self, mat, vec, beta=1, alpha=1):
    """Through addmm on a column vector, so the zero-factor rules are addmm's (which they match)."""
    aten = ops.aten
    _addmv_meta(self, mat, vec, beta, alpha)
    rows = shape_of(mat)[0]
    bias = _view(self, [shape_of(self)[0], 1]) if len(shape_of(self)) == 1 else self  # (a [1] self broadcasts)
    out = aten.addmm.default(bias, mat, _view(vec, [shape_of(vec)[0], 1]), beta=beta, alpha=alpha)
    return _view(out, [rows])


def _outer_meta(self, vec2):
    op = "aten.outer.default"
    require(len(shape_of(self)) == 1 and len(shape_of(vec2)) == 1, op,
            f"expected two 1-D tensors, got shapes {list(shape_of(self))} and {list(shape_of(vec2))}")
    from kiln.ir.meta import Promotion, elementwise_dtype
    return tensor([shape_of(self)[0], shape_of(vec2)[0]], elementwise_dtype(Promotion.DEFAULT, self, vec2))


def _outer_kernel(self, vec2):
    from kiln.ir.meta import Promotion, elementwise_dtype
    dtype = elementwise_dtype(Promotion.DEFAULT, self, vec2).numpy
    if dtype == np.bool_:
        return np.logical_and.outer(self, vec2)
    from kiln.ir.ops._common import opmath
    return np.multiply.outer(opmath(self.astype(dtype)), opmath(vec2.astype(dtype)))


defop("outer(Tensor self, Tensor vec2) -> Tensor", _outer_meta, _outer_kernel, tags=("composite",))


@register_decomposition("aten.outer.default")
def _outer_decomposition(self, vec2):
    """An elementwise product of a column and a row, like ATen's outer (promotes dtypes like mul)."""
    aten = ops.aten
    return aten.mul.Tensor(aten.unsqueeze.default(self, 1), vec2)


# ---------------------------------------------------------------------------------------------
# einsum

_LETTERS = string.ascii_uppercase + string.ascii_lowercase  # torch orders implicit outputs A-Z, then a-z


class _Equation:
    """A parsed einsum equation: per-operand labels with the ellipsis expanded to private labels."""

    def __init__(self, op: str, equation: str, ranks: list[int]):
        text = equation.replace(" ", "")
        lhs, arrow, rhs = text.partition("->")
        terms = lhs.split(",")
        require_arg(len(terms) == len(ranks), op,
                    f"{len(terms)} operand(s) in the equation {equation!r} but {len(ranks)} tensor(s) given",
                    fix="give one comma-separated subscript term per tensor")
        ellipsis_rank = 0
        parsed: list[tuple[list[str], list[str]]] = []
        for term, rank in zip(terms, ranks):
            require_arg(term.count("...") <= 1 and all(c in _LETTERS for c in term.replace("...", "")), op,
                        f"invalid subscripts {term!r} in the equation {equation!r}",
                        fix="use letters a-z and A-Z, and at most one '...' per operand")
            before, dots, after = term.partition("...")
            named = len(before) + len(after)
            if dots:
                require_arg(rank >= named, op, f"subscripts {term!r} need at least {named} dims, got rank {rank}")
                ellipsis_rank = max(ellipsis_rank, rank - named)
            else:
                require_arg(rank == named, op, f"subscripts {term!r} do not match an operand of rank {rank}",
                            fix="write one label per dim, or '...' for the dims you do not name")
            parsed.append((list(before), list(after)))
        # The ellipsis dims get labels of their own, right-aligned like broadcasting.
        self.ellipsis_labels = [f"...{i}" for i in range(ellipsis_rank)]
        self.inputs: list[list[str]] = []
        for (before, after), term, rank in zip(parsed, terms, ranks):
            middle = self.ellipsis_labels[ellipsis_rank - (rank - len(before) - len(after)):] if "..." in term else []
            self.inputs.append(before + middle + after)
        if arrow:
            require_arg(rhs.count("...") <= 1 and all(c in _LETTERS for c in rhs.replace("...", "")), op,
                        f"invalid output subscripts {rhs!r}")
            before, dots, after = rhs.partition("...")
            output = list(before) + (self.ellipsis_labels if dots else []) + list(after)
            require_arg(len(set(output)) == len(output), op, f"output subscripts {rhs!r} repeat a label")
            seen = {label for labels in self.inputs for label in labels}
            for label in output:
                require_arg(label in seen, op, f"output label {label!r} does not appear in any operand")
            # Ellipsis dims missing from an explicit output are summed, like any other absent label.
        else:
            counts: dict[str, int] = {}
            for labels in self.inputs:
                for label in labels:
                    counts[label] = counts.get(label, 0) + 1
            singles = sorted((label for label, count in counts.items() if count == 1 and not label.startswith(".")),
                             key=_LETTERS.index)
            output = self.ellipsis_labels + singles
        self.output = output


def _label_sizes(op: str, equation: _Equation, shapes) -> dict[str, object]:
    """Each label's size; 1 broadcasts against any size between operands, like torch.einsum, but a label repeated
    within one operand (a diagonal, 'ii') needs equal sizes there."""
    sizes: dict[str, object] = {}
    for index, (labels, shape) in enumerate(zip(equation.inputs, shapes)):
        for label in set(labels):
            repeated = [size for other, size in zip(labels, shape) if other == label]
            require(all(sym_eq(repeated[0], size) for size in repeated[1:]), op,
                    f"subscript {label!r} is repeated for operand {index} but the sizes don't match: "
                    f"{', '.join(map(str, repeated))}", fix="a diagonal's dims must have equal sizes")
        for label, size in zip(labels, shape):
            current = sizes.get(label)
            if current is None or (isinstance(current, int) and current == 1):
                sizes[label] = size
            elif not (isinstance(size, int) and size == 1):
                require(sym_eq(current, size), op,
                        f"label {label!r} has size {size} in one operand and {current} in another",
                        fix="a label's dims must have equal sizes (or size 1, which broadcasts)")
    return sizes


def _einsum_int_sums(equation: _Equation, shapes) -> bool:
    """Whether torch.einsum reduces some label with `sum`, which widens integer results to int64: any
    reduced label with one operand, else a label held by one operand only (size > 1), absent from the output."""
    output = set(equation.output)
    if len(equation.inputs) == 1:
        return any(label not in output for label in equation.inputs[0])
    for index, (labels, shape) in enumerate(zip(equation.inputs, shapes)):
        others = {label for j, other in enumerate(equation.inputs) if j != index for label in other}
        for label, size in zip(labels, shape):
            if label not in output and label not in others and not (isinstance(size, int) and size == 1):
                return True
    return False


def _einsum_meta(equation, tensors, path=None):
    op = "aten.einsum.default"
    require_arg(len(tensors) >= 1, op, "einsum needs at least one operand")
    dtype = _same_dtype(op, *tensors)
    shapes = [shape_of(t) for t in tensors]
    parsed = _Equation(op, equation, [len(s) for s in shapes])
    sizes = _label_sizes(op, parsed, shapes)
    if (dtype.is_integral or dtype.is_bool) and _einsum_int_sums(parsed, shapes):
        dtype = dtypes.int64
    return tensor([sizes[label] for label in parsed.output], dtype)


def _einsum_kernel(equation, tensors, path=None):
    op = "aten.einsum.default"
    parsed = _Equation(op, equation, [t.ndim for t in tensors])
    sizes = _label_sizes(op, parsed, [t.shape for t in tensors])
    names = {label: _LETTERS[i] for i, label in enumerate(sizes)}
    acc = _accumulation_dtype(tensors[0].dtype)
    operands = [np.broadcast_to(t.astype(acc), [sizes[label] for label in labels])  # size-1 labels broadcast
                for t, labels in zip(tensors, parsed.inputs)]
    spec = ",".join("".join(names[label] for label in labels) for labels in parsed.inputs)
    spec += "->" + "".join(names[label] for label in parsed.output)
    return np.einsum(spec, *operands)


defop("einsum(str equation, Tensor[] tensors, *, int[]? path=None) -> Tensor", _einsum_meta, _einsum_kernel,
      tags=("composite",))


class _Labelled:
    """A tensor (array or IR value) whose dims carry einsum labels."""

    def __init__(self, value, labels: list[str]):
        self.value, self.labels = value, list(labels)

    def size(self, label: str):
        return shape_of(self.value)[self.labels.index(label)]

    def permuted(self, order: list[str]) -> "_Labelled":
        if order == self.labels:
            return self
        return _Labelled(ops.aten.permute.default(self.value, [self.labels.index(label) for label in order]), order)

    def summed(self, labels: list[str], *, always_sum: bool = False) -> "_Labelled":
        """Reduce labels away. Size-1 ones are dropped with a view, as torch does between operands (which
        matters for integers: `sum` widens them to int64); a lone operand is always summed, as in torch."""
        if not labels:
            return self
        keep = [label for label in self.labels if label not in labels]
        if not always_sum and all(isinstance(self.size(label), int) and self.size(label) == 1 for label in labels):
            return _Labelled(_view(self.value, [self.size(label) for label in keep]), keep)
        dims = [self.labels.index(label) for label in labels]
        return _Labelled(ops.aten.sum.dim_IntList(self.value, dims), keep)


def _take_diagonals(operand: _Labelled) -> _Labelled:
    """Repeated labels within one operand select a diagonal (aten.diagonal moves it to the last dim)."""
    while True:
        repeated = next((label for label in operand.labels if operand.labels.count(label) > 1), None)
        if repeated is None:
            return operand
        first = operand.labels.index(repeated)
        second = operand.labels.index(repeated, first + 1)
        value = ops.aten.diagonal.default(operand.value, 0, first, second)
        labels = [label for i, label in enumerate(operand.labels) if i not in (first, second)] + [repeated]
        operand = _Labelled(value, labels)


def _contract(a: _Labelled, b: _Labelled, keep: set[str], sizes: dict) -> _Labelled:
    """Contract two operands with one bmm: labels in both are batch dims (if still needed) or summed."""
    shared = [label for label in a.labels if label in b.labels]
    batch = [label for label in shared if label in keep]
    summed = [label for label in shared if label not in keep]
    left_only = [label for label in a.labels if label not in b.labels]
    right_only = [label for label in b.labels if label not in a.labels]

    def arrange(operand, order, groups):
        operand = operand.permuted(order)
        full = [sizes[label] for label in order]
        flat = [numel([sizes[label] for label in group]) for group in groups]
        # Labels of size 1 in this operand broadcast against the other operand's size.
        return _expand_then_view(operand.value, full, flat)

    left = arrange(a, batch + left_only + summed, [batch, left_only, summed])
    right = arrange(b, batch + summed + right_only, [batch, summed, right_only])
    if dtype_of(left) is not dtype_of(right):  # one side was widened to int64 by a sum
        wider = dtypes.promote_types(dtype_of(left), dtype_of(right))
        left, right = (ops.aten._to_copy.default(x, dtype=wider) if dtype_of(x) is not wider else x
                       for x in (left, right))
    product = ops.aten.bmm.default(left, right)
    labels = batch + left_only + right_only
    return _Labelled(_view(product, [sizes[label] for label in labels]), labels)


@register_decomposition("aten.einsum.default")
def _einsum_decomposition(equation, tensors, path=None):
    """Diagonals first, then labels only one operand holds are summed, then a left-to-right chain of bmm
    contractions, and a final permute into the output order."""
    op = "aten.einsum.default"
    _einsum_meta(equation, tensors, path)
    shapes = [shape_of(t) for t in tensors]
    parsed = _Equation(op, equation, [len(s) for s in shapes])
    sizes = _label_sizes(op, parsed, shapes)
    operands = [_take_diagonals(_Labelled(t, labels)) for t, labels in zip(tensors, parsed.inputs)]
    output = parsed.output
    if len(operands) == 1:
        result = operands[0].summed([label for label in operands[0].labels if label not in output],
                                    always_sum=True)
    else:
        for index, operand in enumerate(operands):
            others = {label for j, other in enumerate(operands) if j != index for label in other.labels}
            operands[index] = operand.summed(
                [label for label in operand.labels if label not in output and label not in others])
        result = operands[0]
        for index in range(1, len(operands)):
            later = {label for other in operands[index + 1:] for label in other.labels}
            result = _contract(result, operands[index], set(output) | later, sizes)
    # A label of size 1 here may still have to broadcast to the size another operand gave it.
    result = result.permuted(output)
    full = [sizes[label] for label in output]
    if [str(d) for d in shape_of(result.value)] != [str(d) for d in full]:
        return ops.aten.expand.default(result.value, full)
    return result.value


# ---------------------------------------------------------------------------------------------
# VJP rules (torch's derivatives.yaml, FunctionsManual.cpp and the CPU distance kernels, written with kiln.ops
# handles; see register_vjp)

from kiln.ir.ops._grad import cast, sum_like  # noqa: E402
from kiln.ir.registry import register_vjp  # noqa: E402

aten = ops.aten


def _transposed(x):
    """The last two dims swapped (a matrix's or a batch of matrices' transpose)."""
    rank = len(shape_of(x))
    return aten.permute.default(x, [*range(rank - 2), rank - 1, rank - 2])


def _times(x, factor):
    """torch's maybe_multiply: x * factor, or x itself when the factor is 1."""
    return x if factor == 1 else aten.mul.Scalar(x, factor)


@register_vjp("aten.mm.default")
def _mm_vjp(grad, out, self, mat2):
    return aten.mm.default(grad, _transposed(mat2)), aten.mm.default(_transposed(self), grad)


@register_vjp("aten.bmm.default")
def _bmm_vjp(grad, out, self, mat2):
    return aten.bmm.default(grad, _transposed(mat2)), aten.bmm.default(_transposed(self), grad)


@register_vjp("aten.addmm.default")
def _addmm_vjp(grad, out, self, mat1, mat2, *, beta=1, alpha=1):
    return (sum_like(_times(grad, beta), self), _times(aten.mm.default(grad, _transposed(mat2)), alpha),
            _times(aten.mm.default(_transposed(mat1), grad), alpha))


def _vector_sign(x):
    """The sign ATen's distance kernels compute (clamped ceil plus clamped floor): NaN stays NaN, unlike sign()."""
    return aten.where.self(aten.isnan.default(x), x, aten.sign.default(x))


def _zero_where(condition, x):
    return aten.where.self(condition, aten.full_like.default(x, 0), x)


def _distance_gradient_terms(diff, grad, dist, p: float):
    """d(dist)/d(x_i) * grad for each coordinate of diff = x_i - y_j, as ATen's CPU distance kernels compute it
    (DistanceOpsKernel.cpp: the p = 1, p < 2, p = 2, inf and general branches; p = 0 has no gradient).
    `grad` and `dist` are broadcast along the coordinate dim."""
    def where_dist_is_zero_then_zero(terms):
        return _zero_where(aten.eq.Scalar(dist, 0), terms)

    if p == 0:
        return aten.full_like.default(diff, 0)
    if p == 1:
        return aten.mul.Tensor(_vector_sign(diff), grad)
    if p == 2:
        return where_dist_is_zero_then_zero(aten.div.Tensor(aten.mul.Tensor(diff, grad), dist))
    magnitude = aten.abs.default(diff)
    if math.isinf(p):
        # 1 - min(1, ceil(| |diff| - dist |)): 1 where |diff| is the maximum, NaN where anything is NaN.
        gap = aten.ceil.default(aten.abs.default(aten.sub.Tensor(magnitude, dist)))
        picked = aten.add.Scalar(aten.neg.default(aten.clamp.default(gap, None, 1)), 1)
        return aten.mul.Tensor(aten.mul.Tensor(_vector_sign(diff), grad), picked)
    dist_power = aten.pow.Tensor_Scalar(dist, p - 1)
    if p < 2:
        scaled = aten.mul.Tensor(_vector_sign(diff), aten.pow.Tensor_Scalar(magnitude, p - 1))
        terms = where_dist_is_zero_then_zero(aten.div.Tensor(aten.mul.Tensor(scaled, grad), dist_power))
        return _zero_where(aten.eq.Scalar(diff, 0), terms) if p < 1 else terms
    scaled = aten.mul.Tensor(diff, aten.pow.Tensor_Scalar(magnitude, p - 2))
    return where_dist_is_zero_then_zero(aten.div.Tensor(aten.mul.Tensor(scaled, grad), dist_power))


@register_vjp("aten._cdist_forward.default")
def _cdist_vjp(grad, out, x1, x2, p, compute_mode):
    """torch's _cdist_backward for both inputs (x2's is x1's with the roles swapped, i.e. the negated terms summed
    over x1's rows); the same kernel formula whichever way the forward computed the distances."""
    diff = aten.sub.Tensor(aten.unsqueeze.default(x1, -2), aten.unsqueeze.default(x2, -3))
    terms = _distance_gradient_terms(diff, aten.unsqueeze.default(grad, -1), aten.unsqueeze.default(out, -1), p)
    grad_x1 = aten.sum.dim_IntList(terms, [-2], False)
    grad_x2 = aten.neg.default(aten.sum.dim_IntList(terms, [-3], False))
    return cast(sum_like(grad_x1, x1), dtype_of(x1)), cast(sum_like(grad_x2, x2), dtype_of(x2))


def _pair_matrix(values, index, padding: float):
    """The pdist-ordered `values` (one per pair i < j) laid out as an [n, n] matrix; `padding` elsewhere."""
    padded = aten.cat.default([aten.full.default([1], padding, dtype=dtype_of(values)), values], 0)
    return aten.index.Tensor(padded, [index])


@register_vjp("aten._pdist_forward.default")
def _pdist_vjp(grad, out, self, p=2.0):
    """torch's _pdist_backward: the pair (i, j) adds its kernel term to row i and subtracts it from row j. The
    pairs are laid out as an [n, n] upper triangle (pair k sits at its rank among the i < j cells, row-major)."""
    n = shape_of(self)[0]
    position = aten.cumsum.default(aten.full_like.default(aten.sum.dim_IntList(self, [1], True), 1,
                                                          dtype=dtypes.int64), 0)
    upper = aten.lt.Tensor(position, aten.permute.default(position, [1, 0]))
    rank = aten.view.default(aten.cumsum.default(aten.view.default(upper, [n * n]), 0), [n, n])
    index = aten.where.self(upper, rank, aten.full_like.default(rank, 0))
    pair_grad = aten.unsqueeze.default(_pair_matrix(grad, index, 0.0), -1)
    pair_dist = aten.unsqueeze.default(_pair_matrix(out, index, 1.0), -1)
    diff = aten.sub.Tensor(aten.unsqueeze.default(self, 1), aten.unsqueeze.default(self, 0))
    terms = _distance_gradient_terms(diff, pair_grad, pair_dist, p)
    terms = aten.where.self(aten.unsqueeze.default(upper, -1), terms, aten.full_like.default(terms, 0))
    return cast(aten.sub.Tensor(aten.sum.dim_IntList(terms, [1], False), aten.sum.dim_IntList(terms, [0], False)),
                dtype_of(self))
