"""The Triton renderer's sparse-weight kernels: linear layers on CSR, BSR and 2:4 semi-structured weights, and
convolutions on hybrid CSR or BSR weights (blocks over the im2col matrix [C_out, C_in * taps], as the C backend
stores them). CSR and BSR walk one block row's stored weights as a single flat run, so every block shape (1 x 1
included) shares one loop; a 2:4 weight is expanded tile by tile in registers for a dense `tl.dot`. Each kernel
applies its bias and fused epilogue as the dense GEMM does."""

from __future__ import annotations

import math

import sympy

from kiln.codegen.kernels import Kernel, contiguous_strides
from kiln.codegen.triton.render import (
    Exprs, KernelArgs, accumulator_type, blocked, py_dim, tiled, unravel,
)


def _accumulate(kernel: Kernel) -> str:
    return "tl.float64" if accumulator_type(kernel) == "tl.float64" else "tl.float32"


def _block_rows(rows: int) -> int:
    """The accumulator's rows for blocks of `rows` weight rows: one (CSR, 1 x C blocks: multiply and sum over the
    run), else a power of two of at least 16, the least `tl.dot` takes on a GPU (the padding rows load zeros)."""
    return 1 if rows == 1 else max(16, 1 << (rows - 1).bit_length())


def _walk(args: KernelArgs, kernel: Kernel, rows: int, width: int, activations: list[str]) -> list[str]:
    """Lines accumulating one block row `br` of a CSR / BSR weight into `acc` [padded rows, BN]: its weights (blocks
    of `rows` x `width`, row-major) are one run of values, taken BK at a time. `e` is a weight's place in the run,
    `k` its column of the whole weight (the activations' row); `activations` loads the [BK, BN] tile `x` at rows
    `k`, masked by `em`."""
    detail = kernel.detail
    parts = {name: args.buffer(buf) for name, buf in detail.components.items()}
    accumulate = _accumulate(kernel)
    padded = _block_rows(rows)
    lines = [f"r = tl.arange(0, {padded})",
             f"start = tl.load({parts['crow_indices']} + br).to(tl.int64) * {width}",
             f"end = tl.load({parts['crow_indices']} + br + 1).to(tl.int64) * {width}",
             f"acc = tl.zeros(({padded}, BN), {accumulate})",
             "for e0 in range(start, end, BK):",
             "    e = e0 + tl.arange(0, BK)",
             "    em = e < end"]
    if width == 1:
        lines += ["    j = e", f"    k = tl.load({parts['col_indices']} + j, mask=em, other=0).to(tl.int64)"]
    else:
        lines += [f"    j, kk = e // {width}, e % {width}",
                  f"    k = tl.load({parts['col_indices']} + j, mask=em, other=0).to(tl.int64) * {width} + kk"]
    lines += [f"    {line}" for line in activations]
    values = parts["values"]
    if rows == 1:  # the run's values are the row's weights in order
        lines += [f"    w = tl.load({values} + e, mask=em, other=0.0).to({accumulate})",
                  f"    acc += tl.sum(w[:, None] * x.to({accumulate}), axis=0)[None, :]"]
    else:
        place = f"j[None, :] * {rows * width} + r[:, None] * {width}" + (" + kk[None, :]" if width > 1 else "")
        lines += [f"    w = tl.load({values} + {place}, mask=(r[:, None] < {rows}) & em[None, :], other=0.0)",
                  f"    acc = tl.dot(w.to({accumulate}), x.to({accumulate}), acc, input_precision=\"ieee\")"]
    return lines


def _store(args: KernelArgs, kernel: Kernel, variables: list[str], mask: str, bias: str | None,
           block_dims: set[int] | None = None) -> list[str]:
    """The epilogue: `acc` (plus `bias`) through the kernel's fused expression into the contiguous output."""
    out = kernel.outputs[0]
    value = "acc" if bias is None else f"acc + ({bias}).to({_accumulate(kernel)})"
    epilogue = Exprs(args, variables, "mask", accumulator="acc_value", block_dims=block_dims).render(kernel.expr)
    flat = Exprs(args, variables, "mask").index(contiguous_strides(kernel.shape), 0)
    return [f"mask = {mask}", f"acc_value = ({value}).to({accumulator_type(kernel)})",
            f"tl.store({args.buffer(out)} + ({flat}), {epilogue}, mask=mask)"]


def _linear_store(args: KernelArgs, kernel: Kernel, rows: str, features: str, mask: str) -> list[str]:
    """The epilogue of a linear layer's tile: `rows` index the activation rows (the output's leading dims,
    unravelled), `features` its last dim."""
    detail = kernel.detail
    leading = kernel.shape[:-1]
    variables = [*(f"i{position}" for position in range(len(leading))), features]
    lines = unravel(leading, rows, args)
    bias = Exprs(args, variables, "mask").render(detail.bias) if detail.bias is not None else None
    return lines + _store(args, kernel, variables, mask, bias)


def _transpose(name: str, kernel: Kernel) -> tuple[list[str], list[str]]:
    """xT [K, M] from the rows x [M, K]: a weight column's activations become one contiguous run."""
    detail = kernel.detail
    args = KernelArgs()
    M, K = args.size(detail.m), args.size(detail.k)
    x = detail.x
    read = Exprs(args, [], "mask").index([detail.k, 1], x.offset, ["m", "k"])
    body = ["offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)",
            f"mask = offs < {M} * {K}",
            f"m, k = offs // {K}, offs % {K}",
            f"tl.store({args.buffer(detail.xT)} + k * {M} + m, tl.load({args.buffer(x.buffer)} + ({read}), "
            "mask=mask), mask=mask)"]
    return blocked(name, args, body, sympy.sympify(detail.m) * sympy.sympify(detail.k))


def sparse_linear_kernel(name: str, kernel: Kernel) -> tuple[list[str], list[str]]:
    """linear on a sparse weight [N, K]. CSR and BSR: the activations are first transposed into xT [K, M]; one
    program per (block row, BN activation rows) walks the block row's stored weights, each loading a contiguous run
    of activations (`tl.dot` for blocks of several rows, multiply and sum for one). 2:4: one program per BM x BN
    output tile expands the kept values and their 2-bit positions into a dense weight tile per BK columns."""
    if kernel.detail.layout == "semi_structured":
        return _semi_structured_linear(name, kernel)
    detail = kernel.detail
    args = KernelArgs()
    rows, width = (int(d) for d in detail.block)
    M = args.size(detail.m)
    activations = [f"x = tl.load({args.buffer(detail.xT)} + k[:, None] * {M} + rm[None, :], "
                   f"mask=em[:, None] & (rm[None, :] < {M}), other=0.0)"]
    body = ["br, pid_n = tl.program_id(0).to(tl.int64), tl.program_id(1)",
            "rm = pid_n.to(tl.int64) * BN + tl.arange(0, BN)",
            *_walk(args, kernel, rows, width, activations),
            f"rn = br * {rows} + r",
            *_linear_store(args, kernel, "rm[None, :]", "rn[:, None]", f"(r[:, None] < {rows}) & (rm[None, :] < {M})")]
    grid = f"({py_dim(sympy.sympify(detail.n) // rows)}, triton.cdiv({py_dim(detail.m)}, META['BN']), 1)"
    transpose, transposed = _transpose(f"{name}_transpose", kernel)
    source, launch = tiled(name, kernel, args, body, grid)
    return [*transpose, "", "", *source], [*transposed, *launch]


def _semi_structured_linear(name: str, kernel: Kernel) -> tuple[list[str], list[str]]:
    """2:4: row n keeps values [n, K/2] (two per group of four columns) and metadata [n, K/8] (a byte per two
    groups, the low nibble first; a nibble holds the kept positions in bits 0-1 and 2-3)."""
    detail = kernel.detail
    args = KernelArgs()
    accumulate = _accumulate(kernel)
    values, metadata = (args.buffer(detail.components[part]) for part in ("values", "metadata"))
    M, N, K = args.size(detail.m), args.size(detail.n), int(detail.k)
    x = detail.x
    x_index = Exprs(args, [], "mask").index([detail.k, 1], x.offset, ["rm[:, None]", "rk[None, :]"])
    tile = f"(rk[:, None] < {K}) & (rn[None, :] < {N})"
    body = ["pid_m, pid_n = tl.program_id(0), tl.program_id(1)",
            "rm = pid_m.to(tl.int64) * BM + tl.arange(0, BM)",
            "rn = pid_n.to(tl.int64) * BN + tl.arange(0, BN)",
            f"acc = tl.zeros((BM, BN), {accumulate})",
            f"for k0 in range(0, {K}, BK):",
            "    rk = k0 + tl.arange(0, BK)",
            f"    x = tl.load({args.buffer(x.buffer)} + ({x_index}), mask=(rm[:, None] < {M}) & (rk[None, :] < {K}), "
            "other=0.0)",
            f"    kept = rn[None, :] * {K // 2} + (rk // 4 * 2)[:, None]  # each column's group's first value",
            f"    first = tl.load({values} + kept, mask={tile}, other=0.0)",
            f"    second = tl.load({values} + kept + 1, mask={tile}, other=0.0)",
            f"    byte = tl.load({metadata} + rn[None, :] * {K // 8} + (rk // 8)[:, None], mask={tile}, other=0)",
            "    nibble = (byte.to(tl.int32) >> ((rk // 4) % 2 * 4).to(tl.int32)[:, None]) & 15",
            "    position = (rk % 4).to(tl.int32)[:, None]",
            "    w = tl.where(position == (nibble & 3), first, tl.where(position == (nibble >> 2), second, 0.0))",
            f"    acc = tl.dot(x.to({accumulate}), w.to({accumulate}), acc, input_precision=\"ieee\")",
            *_linear_store(args, kernel, "rm[:, None]", "rn[None, :]", f"(rm[:, None] < {M}) & (rn[None, :] < {N})")]
    grid = f"(triton.cdiv({py_dim(detail.m)}, META['BM']), triton.cdiv({py_dim(detail.n)}, META['BN']), 1)"
    return tiled(name, kernel, args, body, grid)


def sparse_conv_kernel(name: str, kernel: Kernel) -> tuple[list[str], list[str]]:
    """convolution on a hybrid CSR / BSR weight (blocks of R output x C input channels, all their taps) as block
    rows of the im2col matrix: one program per (block row, BN output pixels, image) walks the block row's stored
    weights, gathering each one's im2col rows from the input (zeros in the padding)."""
    detail = kernel.detail
    x, bias = detail.input, detail.bias
    args = KernelArgs()
    n = len(kernel.shape) - 2
    rows, columns = (int(d) for d in detail.block)
    taps = [int(d) for d in detail.weight_shape[2:]]
    tap_count = math.prod(taps)
    pixels = sympy.Mul(*[sympy.sympify(d) for d in kernel.shape[2:]])
    N = args.size(pixels)
    exprs = Exprs(args, [], "mask")
    gather = [f"ci, t = k // {tap_count}, k % {tap_count}"]
    rest = "t"
    for d in range(n - 1, -1, -1):  # the tap's offsets
        gather.append(f"tap{d} = {rest} % {taps[d]}" if d else f"tap{d} = {rest}")
        rest = f"({rest} // {taps[d]})"
    inside = ["em[:, None]", f"(p[None, :] < {N})"]
    for d in range(n):
        stride, padding, dilation = int(detail.stride[d]), int(detail.padding[d]), int(detail.dilation[d])
        gather.append(f"q{d} = o{d}[None, :] * {stride} - {padding} + tap{d}[:, None] * {dilation}")
        inside.append(f"(q{d} >= 0) & (q{d} < {args.size(x.shape[2 + d])})")
    x_index = exprs.index(x.strides, x.offset, ["bi", "ci[:, None]", *(f"q{d}" for d in range(n))])
    gather.append(f"x = tl.load({args.buffer(x.buffer)} + ({x_index}), mask={' & '.join(inside)}, other=0.0)")
    body = ["br, pid_n, bi = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2).to(tl.int64)",
            "p = pid_n.to(tl.int64) * BN + tl.arange(0, BN)",
            *unravel(kernel.shape[2:], "p", args, prefix="o"),
            *_walk(args, kernel, rows, columns * tap_count, gather),
            f"co = br * {rows} + r"]
    variables = ["bi", "co[:, None]", *(f"o{d}[None, :]" for d in range(n))]
    read = None
    if bias is not None:
        place = exprs.index(bias.strides, bias.offset, ["co[:, None]"])
        read = f"tl.load({args.buffer(bias.buffer)} + ({place}), mask=r[:, None] < {rows}, other=0)"
    body += _store(args, kernel, variables, f"(r[:, None] < {rows}) & (p[None, :] < {N})", read,
                   block_dims=set(range(1, len(variables))))  # (bi is one image)
    grid = (f"({int(detail.weight_shape[0]) // rows}, triton.cdiv({py_dim(pixels)}, META['BN']), "
            f"{py_dim(kernel.shape[0])})")
    return tiled(name, kernel, args, body, grid)

