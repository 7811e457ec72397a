"""FFTs: ATen's three primitives (`_fft_r2c`, `_fft_c2r`, `_fft_c2c`) and torch.fft's functions over them
(`fft_fft` ... `fft_irfftn`), which torch.export keeps in its training IR (FNet mixes tokens with `fft_fftn`).
The reference kernels run numpy's pocketfft in double precision. Backends without complex tensors run the
primitives as DFT matrix products (the `lower-complex` pass)."""

from __future__ import annotations

import numpy as np

from kiln.ir import dtypes
from kiln.ir.meta import canonical_dim, dtype_of, like, require_arg, require_dtype, shape_of, tensor
from kiln.ir.ops._grad import cast
from kiln.ir.registry import defop, ops, register_decomposition, register_vjp
from kiln.ir.symbolic import as_dim, floor_div, sym_eq, sym_le

aten = ops.aten

FORWARD_NORM = {0: "backward", 1: "ortho", 2: "forward"}  # ATen's fft_norm_mode (none, 1/sqrt(n), 1/n) for numpy
INVERSE_NORM = {0: "forward", 1: "ortho", 2: "backward"}  # the same modes for numpy's inverse transforms


def fft_dims(op: str, dim, rank: int) -> list[int]:
    require_arg(len(dim) >= 1, op, "dim must name at least one dimension")
    dims = [canonical_dim(op, d, rank) for d in dim]
    require_arg(len(set(dims)) == len(dims), op, f"dim {list(dim)} repeats a dimension")
    return dims


# --- the primitives

def _fft_r2c_meta(self, dim, normalization, onesided):
    op = "aten._fft_r2c.default"
    require_dtype(dtype_of(self) in (dtypes.float32, dtypes.float64), op,
                  f"expected a float32 or float64 input, got {dtype_of(self)}")
    require_arg(normalization in FORWARD_NORM, op, f"normalization must be 0, 1 or 2, got {normalization}")
    shape = list(shape_of(self))
    dims = fft_dims(op, dim, len(shape))
    if onesided:
        shape[dims[-1]] = floor_div(shape[dims[-1]], 2) + 1
    return tensor(shape, dtypes.real_to_complex(dtype_of(self)))


def _fft_r2c_kernel(self, dim, normalization, onesided):
    dims = fft_dims("", dim, self.ndim)
    x = self.astype(np.float64)
    norm = FORWARD_NORM[normalization]
    if onesided:  # the last listed dim keeps its non-negative frequencies, as in torch
        return np.fft.rfftn(x, axes=dims, norm=norm)
    return np.fft.fftn(x, axes=dims, norm=norm)


defop("_fft_r2c(Tensor self, int[] dim, int normalization, bool onesided) -> Tensor",
      _fft_r2c_meta, _fft_r2c_kernel, doc="normalization: 0 none, 1 by 1/sqrt(n), 2 by 1/n.")


def _fft_c2r_meta(self, dim, normalization, last_dim_size):
    op = "aten._fft_c2r.default"
    require_dtype(dtype_of(self).is_complex, op, f"expected a complex input, got {dtype_of(self)}")
    require_arg(normalization in INVERSE_NORM, op, f"normalization must be 0, 1 or 2, got {normalization}")
    require_arg(sym_le(1, last_dim_size), op, f"invalid last_dim_size {last_dim_size}")
    shape = list(shape_of(self))
    dims = fft_dims(op, dim, len(shape))
    shape[dims[-1]] = last_dim_size
    return tensor(shape, dtypes.complex_to_real(dtype_of(self)))


def _fft_c2r_kernel(self, dim, normalization, last_dim_size):
    dims = fft_dims("", dim, self.ndim)
    sizes = [self.shape[d] for d in dims[:-1]] + [int(last_dim_size)]
    return np.fft.irfftn(self.astype(np.complex128), s=sizes, axes=dims, norm=INVERSE_NORM[normalization])


defop("_fft_c2r(Tensor self, int[] dim, int normalization, SymInt last_dim_size) -> Tensor",
      _fft_c2r_meta, _fft_c2r_kernel,
      doc="The inverse of a one-sided r2c over dim; normalization: 0 none, 1 by 1/sqrt(n), 2 by 1/n.")


def _fft_c2c_meta(self, dim, normalization, forward):
    op = "aten._fft_c2c.default"
    require_dtype(dtype_of(self).is_complex, op, f"expected a complex input, got {dtype_of(self)}")
    require_arg(normalization in FORWARD_NORM, op, f"normalization must be 0, 1 or 2, got {normalization}")
    fft_dims(op, dim, len(shape_of(self)))
    return like(self)


def _fft_c2c_kernel(self, dim, normalization, forward):
    dims = fft_dims("", dim, self.ndim)
    x = self.astype(np.complex128)
    if forward:
        return np.fft.fftn(x, axes=dims, norm=FORWARD_NORM[normalization])
    return np.fft.ifftn(x, axes=dims, norm=INVERSE_NORM[normalization])


defop("_fft_c2c(Tensor self, SymInt[] dim, int normalization, bool forward) -> Tensor",
      _fft_c2c_meta, _fft_c2c_kernel, tags=("complex_prim",),
      doc="A complex-to-complex transform over dim, forward (e^-i) or inverse (e^+i); normalization: 0 none, "
          "1 by 1/sqrt(n), 2 by 1/n.")


# --- torch.fft's functions: fft, ifft, rfft, irfft in 1, 2 and n dims

class _Transform:
    """One torch.fft function: its kind (c2c, r2c or c2r), direction, and how its arguments name dims."""

    def __init__(self, name: str, kind: str, forward: bool, form: str):
        self.name, self.kind, self.forward, self.form = name, kind, forward, form
        self.op = f"aten.{name}.default"

    def dims_and_sizes(self, shape, s, dim) -> tuple[list[int], list]:
        """torch's canonicalize_fft_shape_and_dim_args: the transformed dims and the signal size along each
        (None where the input's size stands; for c2r's last dim, the output length)."""
        op, rank = self.op, len(shape)
        named = [dim] if self.form == "1" else list(dim) if dim is not None else []
        # ATen wraps these dims without a 0-d tensor's allowance (maybe_wrap_dim with wrap_scalar=false)
        require_arg(rank > 0 or not named, op, f"Dimension specified as {named[0] if named else 0} but tensor has "
                                               "no dimensions")
        if self.form == "1":  # s is [n] or None here (see _define)
            dims, sizes = [canonical_dim(op, dim, rank)], list(s) if s is not None else [None]
        else:
            if dim is not None:
                dims = [canonical_dim(op, d, rank) for d in dim]
                require_arg(len(set(dims)) == len(dims), op, f"dims must be unique, got {list(dim)}")
                if s is not None:
                    require_arg(len(s) == len(dims), op, f"When given, dim and shape arguments must have the same "
                                                         f"length, got s={list(s)} and dim={list(dim)}")
            else:
                dims = list(range(rank - len(s), rank)) if s is not None else list(range(rank))
                require_arg(len(dims) <= rank and all(d >= 0 for d in dims), op,
                            f"Got shape with {len(s) if s is not None else 0} values but input tensor only has "
                            f"{rank} dimensions.")
            sizes = list(s) if s is not None else [None] * len(dims)
        # a c2c transform over no dims is the identity (fftn of a 0-d tensor); the one-sided ones need a last dim
        require_arg(len(dims) >= 1 or self.kind == "c2c", op,
                    f"{self.name.removeprefix('fft_')} must transform at least one axis")
        sizes = [None if size is None or (isinstance(size, int) and size == -1) else size for size in sizes]
        for size in sizes:
            require_arg(size is None or sym_le(1, size), op, f"Invalid number of data points ({size}) specified")
        return dims, sizes

    def norm_mode(self, norm) -> int:
        """ATen's fft_norm_mode for torch's norm string in this direction."""
        require_arg(norm in (None, "backward", "forward", "ortho"), self.op, f'Invalid normalization mode: "{norm}"')
        if norm == "ortho":
            return 1
        scaled = norm == "forward" if self.forward else norm in (None, "backward")
        return 2 if scaled else 0

    def input_dtype(self, dtype: dtypes.DType) -> dtypes.DType:
        """promote_tensor_fft: integers become the default float; complex input stays for c2c and c2r."""
        if dtype.is_integral or dtype.is_bool:
            dtype = dtypes.default_float_dtype()
        require_dtype(dtype in (dtypes.float32, dtypes.float64, dtypes.complex64, dtypes.complex128), self.op,
                      f"Unsupported dtype {dtype.name}", fix="cast the input to float32 or float64")
        require_dtype(self.kind != "r2c" or not dtype.is_complex, self.op,
                      f"{self.name.removeprefix('fft_')} expects a real input tensor, but got {dtype.name}")
        return dtype

    def plan(self, x, s, dim, norm):
        """(dims, the input's size along each before the primitive, c2r's output length or None, norm mode)."""
        shape = shape_of(x)
        dims, sizes = self.dims_and_sizes(shape, s, dim)
        mode = self.norm_mode(norm)
        # every transformed length, given or the input's own, must be at least 1 (an empty dim is refused too)
        lengths = [shape[d] if size is None else size for d, size in zip(dims, sizes)]
        if self.kind != "c2r":
            self.require_points(lengths)
            return dims, lengths, None, mode
        last = as_dim(2 * (shape[dims[-1]] - 1)) if sizes[-1] is None else sizes[-1]
        self.require_points([*lengths[:-1], last])
        return dims, [*lengths[:-1], as_dim(floor_div(last, 2) + 1)], last, mode

    def require_points(self, lengths) -> None:
        for length in lengths:
            require_arg(sym_le(1, length), self.op, f"Invalid number of data points ({length}) specified")

    def meta(self, self_, s=None, dim=None, norm=None):
        dtype = self.input_dtype(dtype_of(self_))
        dims, sizes, last, _ = self.plan(self_, s, dim, norm)
        shape = list(shape_of(self_))
        for d, size in zip(dims, sizes):
            shape[d] = size
        if self.kind == "c2r":
            shape[dims[-1]] = last
            return tensor(shape, dtypes.complex_to_real(dtype) if dtype.is_complex else dtype)
        if self.kind == "r2c":
            shape[dims[-1]] = as_dim(floor_div(shape[dims[-1]], 2) + 1)
        return tensor(shape, dtype if dtype.is_complex else dtypes.real_to_complex(dtype))

    def kernel(self, self_, s=None, dim=None, norm=None):
        self.meta(self_, s, dim, norm)
        dims, sizes, last, _ = self.plan(self_, s, dim, norm)
        norm = norm or "backward"
        if self.kind == "r2c":
            return np.fft.rfftn(self_.astype(np.float64), s=[int(v) for v in sizes], axes=dims, norm=norm)
        x = self_.astype(np.complex128)
        if self.kind == "c2r":
            return np.fft.irfftn(x, s=[*(int(v) for v in sizes[:-1]), int(last)], axes=dims, norm=norm)
        if not dims:
            return x.copy()
        transform = np.fft.fftn if self.forward else np.fft.ifftn
        return transform(x, s=[int(v) for v in sizes], axes=dims, norm=norm)

    def decomposition(self, self_, s=None, dim=None, norm=None):
        result = self.meta(self_, s, dim, norm)
        dims, sizes, last, mode = self.plan(self_, s, dim, norm)
        x = resized(self_, dims, sizes)
        if not dims:  # c2c over no dims: the input as complex
            return _cast(x, dtype_of(result))
        if self.kind == "r2c":
            x = _cast(x, dtypes.complex_to_real(dtype_of(result)))
            return aten._fft_r2c.default(x, dims, mode, True)
        if self.kind == "c2c" and self.forward and not dtype_of(x).is_complex:  # as torch: a two-sided r2c
            x = _cast(x, dtypes.complex_to_real(dtype_of(result)))
            return aten._fft_r2c.default(x, dims, mode, False)
        complex_dtype = dtype_of(result) if self.kind == "c2c" else dtypes.real_to_complex(dtype_of(result))
        x = _cast(x, complex_dtype)
        if self.kind == "c2r":
            return aten._fft_c2r.default(x, dims, mode, last)
        return aten._fft_c2c.default(x, dims, mode, self.forward)


def _cast(x, dtype: dtypes.DType):
    return x if dtype_of(x) is dtype else aten._to_copy.default(x, dtype=dtype)


def resized(x, dims, sizes):
    """ATen's _resize_fft_input: each dim cut to its size, or zero-padded at the end up to it."""
    shape = shape_of(x)
    for d, size in zip(dims, sizes):
        if sym_eq(shape[d], size):
            continue
        if sym_le(size, shape[d]):
            x = aten.slice.Tensor(x, d, 0, size)
        else:
            pad = [0, 0] * (len(shape) - 1 - d) + [0, as_dim(size - shape[d])]
            x = aten.constant_pad_nd.default(x, pad, 0)
    return x


_ONE = "(Tensor self, SymInt? n=None, int dim=-1, str? norm=None) -> Tensor"
_TWO = "(Tensor self, SymInt[1]? s=None, int[1] dim=[-2,-1], str? norm=None) -> Tensor"
_N = "(Tensor self, SymInt[1]? s=None, int[1]? dim=None, str? norm=None) -> Tensor"
TRANSFORMS = [_Transform(f"fft_{prefix}{suffix}", kind, forward, form)
              for prefix, kind, forward in (("", "c2c", True), ("i", "c2c", False), ("r", "r2c", True),
                                            ("ir", "c2r", False))
              for suffix, form in (("fft", "1"), ("fft2", "2"), ("fftn", "n"))]


def _define(transform: _Transform) -> None:
    signature = {"1": _ONE, "2": _TWO, "n": _N}[transform.form]

    def as_lists(fn):  # the 1-D functions take one n and one dim; the plan takes s as a list
        if transform.form != "1":
            return fn
        return lambda self, n=None, dim=-1, norm=None: fn(self, None if n is None else [n], dim, norm)
    defop(f"{transform.name}{signature}", as_lists(transform.meta), as_lists(transform.kernel), tags=("composite",),
          doc=f"torch.fft.{transform.name.removeprefix('fft_')}.")
    register_decomposition(transform.op)(as_lists(transform.decomposition))


for _transform in TRANSFORMS:
    _define(_transform)


# --- derivatives (torch's fft_r2c_backward, fft_c2r_backward, and c2c's inverse transform)

def _along(vector, dim: int, rank: int):
    """A 1-D tensor laid out along `dim` of a rank-`rank` tensor."""
    return aten.view.default(vector, [*[1] * dim, shape_of(vector)[0], *[1] * (rank - 1 - dim)])


def _bin_weights(bins, doubled_up_to, inside: float, dtype: dtypes.DType):
    """[bins] of 1, except `inside` at positions 1..doubled_up_to."""
    position = aten.arange.start_step(0, bins, 1, dtype=dtypes.int64)
    chosen = aten.logical_and.default(aten.ge.Scalar(position, 1), aten.le.Scalar(position, doubled_up_to))
    return aten.where.self(chosen, aten.full.default([], inside, dtype=dtype), aten.full.default([], 1, dtype=dtype))


def _real_part(value):
    return aten._to_copy.default(value, dtype=dtypes.complex_to_real(dtype_of(value)))


@register_vjp("aten._fft_r2c.default")
def _fft_r2c_vjp(grad, out, self, dim, normalization, onesided):
    """The real part of the inverse c2c transform of the gradient (zero-padded to the full length when one-sided),
    written with c2r: c2r(h) is the inverse transform of h's Hermitian extension, so h must be the Hermitian part of
    the padded gradient, (G[k] + conj(G[-k])) / 2. One-sided, that is the gradient with its bins 1..(n-1)/2 halved;
    two-sided, with conj(z) = 2 re(z) - z and c2r real-linear, it is c2r(G / 2) - c2r(G[-k] / 2) + c2r(re(G[-k]))."""
    rank = len(shape_of(self))
    dims = [canonical_dim("aten._fft_r2c.default", d, rank) for d in dim]
    last = dims[-1]
    length = shape_of(self)[last]
    real = dtypes.complex_to_real(dtype_of(grad))
    if onesided:
        weights = _bin_weights(shape_of(grad)[last], floor_div(length - 1, 2), 0.5, real)
        hermitian = aten.mul.Tensor(grad, _along(weights, last, rank))
    else:
        mirrored = grad
        for d in dims:  # G[-k]: bin 0 stays, the others reverse
            size = shape_of(grad)[d]
            mirrored = aten.cat.default([aten.unsqueeze.default(aten.select.int(mirrored, d, 0), d),
                                         aten.flip.default(aten.slice.Tensor(mirrored, d, 1, size), [d])], d)
        half = as_dim(floor_div(length, 2) + 1)

        def transform(spectrum):
            return aten._fft_c2r.default(aten.slice.Tensor(spectrum, last, 0, half), dims, normalization, length)
        result = aten.sub.Tensor(transform(aten.mul.Scalar(grad, 0.5)), transform(aten.mul.Scalar(mirrored, 0.5)))
        return aten.add.Tensor(result, transform(cast(_real_part(mirrored), dtype_of(grad))))
    return aten._fft_c2r.default(hermitian, dims, normalization, length)


@register_vjp("aten._fft_c2r.default")
def _fft_c2r_vjp(grad, out, self, dim, normalization, last_dim_size):
    """The one-sided r2c of the gradient, with the bins whose mirror images c2r fills in (1..n - (n/2 + 1))
    counted twice."""
    rank = len(shape_of(self))
    dims = [canonical_dim("aten._fft_c2r.default", d, rank) for d in dim]
    spectrum = aten._fft_r2c.default(grad, dims, normalization, True)
    bins = shape_of(spectrum)[dims[-1]]
    weights = _bin_weights(bins, as_dim(last_dim_size - bins), 2.0, dtype_of(grad))
    return cast(aten.mul.Tensor(spectrum, _along(weights, dims[-1], rank)), dtype_of(self))


@register_vjp("aten._fft_c2c.default")
def _fft_c2c_vjp(grad, out, self, dim, normalization, forward):
    """The transform the other way with the same scale (derivatives.yaml: _fft_c2c(grad, dim, normalization,
    !forward))."""
    return aten._fft_c2c.default(grad, dim, normalization, not forward)
