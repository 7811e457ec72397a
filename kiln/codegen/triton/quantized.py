"""The Triton renderer's integer kernels: quantized linear layers and convolutions (int8 `tl.dot` into int32 sums,
then the float epilogue and requantization the C backend's kiln_qepilogue does), weight-only linear layers (int8 /
int4-valued weights dequantized in registers as the reference does) and quantized adaptive average pools."""

from __future__ import annotations

from typing import Any

import numpy as np
import sympy

from kiln.codegen.kernels import Kernel, QConvDetail, QLinearDetail, QPoolDetail
from kiln.codegen.triton.render import (
    POINTWISE_RULES, TL_TYPES, Exprs, KernelArgs, blocked, py_dim, tiled, unravel,
)
from kiln.ir import dtypes

# int8 `tl.dot` takes signed bytes: uint8 activations are read shifted by this (x - 128), and their zero point moves
# with them, so the sums stay exact.
_UINT8_SHIFT = 128


def _float32(value: float) -> str:
    """A Python float rounded to float32 first, as ATen casts a double scalar for float32 math."""
    return repr(float(np.float32(value)))


def _qparams(args: KernelArgs, detail: QLinearDetail | QConvDetail) -> list[str]:
    """`x_scale` (float32) and `x_zero` (int32: the zero point in the shifted bytes the dot product reads) of an
    integer layer's activations: numbers, the .tensor overloads' one-element tensors, or per token [BM, 1]
    columns."""
    exprs = Exprs(args, [], "mask")
    scale, zero_point = detail.x_scale, detail.x_zero_point
    shift = 0 if detail.signed else _UINT8_SHIFT
    if isinstance(detail, QLinearDetail) and detail.per_token:  # a column of one per tile row (rm)
        def rows(view: Any) -> str:
            return (f"tl.load({args.buffer(view.buffer)} + ({exprs.index([1], view.offset, ['rm'])}), "
                    f"mask=rm < {args.size(detail.m)}, other=0)[:, None]")
        return [f"x_scale = {rows(scale)}.to(tl.float32)", f"x_zero = {rows(zero_point)}.to(tl.int32) - {shift}"]
    scale = _float32(scale) if isinstance(scale, (int, float)) else f"{exprs.render(scale)}.to(tl.float32)"
    zero = f"tl.full([1], {int(zero_point) - shift}, tl.int32)" if isinstance(zero_point, (int, float)) else \
        f"{exprs.render(zero_point)}.to(tl.int32) - {shift}"
    return [f"x_scale = {scale}", f"x_zero = {zero}"]


def _signed_bytes(value: str, detail: QLinearDetail | QConvDetail) -> str:
    """Activation bytes as the int8 operand of `tl.dot`."""
    return value if detail.signed else f"({value}.to(tl.int32) - {_UINT8_SHIFT}).to(tl.int8)"


def _requantized(detail: QLinearDetail | QConvDetail | QPoolDetail, value: str, dtype: dtypes.DType) -> list[str]:
    """Lines setting `result` to float32 `value` requantized as quantize_per_tensor does: times the float32 inverse
    scale, rounded half to even, plus the zero point, clamped, converted to the output's integer type."""
    inverse = _float32(1.0 / float(detail.output_scale))
    zero_point, low, high = float(detail.output_zero_point), float(detail.quant_min), float(detail.quant_max)
    return [f"rounded = kiln_round({value} * {inverse})",
            f"clamped = tl.minimum(tl.maximum(rounded + {zero_point!r}, {low!r}), {high!r})",
            f"result = clamped.to(tl.int32).to({TL_TYPES[dtype]})"]


def _post_op(post_op: str) -> list[str]:
    """Lines applying the fused activation to `value`, as the float pointwise kernels render relu and gelu."""
    if post_op == "relu":
        return [f"value = {POINTWISE_RULES['aten.relu.default'][1](['value'])}"]
    if post_op in ("gelu", "gelu_tanh"):
        approximate = repr("tanh" if post_op == "gelu_tanh" else "none")
        return [f"value = {POINTWISE_RULES['aten.gelu.default'][1](['value', approximate])}"]
    return []


def _epilogue(detail: QLinearDetail | QConvDetail, out_dtype: dtypes.DType, channel_scale: str, bias: str | None,
              residual: str | None) -> list[str]:
    """Lines from the corrected int32 sums `acc` to `result`, in kiln_qepilogue's order of float32 operations:
    times x_scale x the channel's weight scale, plus the bias, plus the residual, the post-op, then float32 out or
    requantized."""
    lines = [f"value = acc.to(tl.float32) * (x_scale * {channel_scale})"]
    if bias is not None:
        lines.append(f"value = value + {bias}")
    if residual is not None:
        lines.append(f"value = value + {residual}")
    lines += _post_op(detail.post_op)
    if out_dtype == dtypes.float32:
        return [*lines, "result = value"]
    return [*lines, *_requantized(detail, "value", out_dtype)]


def _vector(args: KernelArgs, view: Any, variable: str, mask: str) -> str:
    """A read of a per-channel view ([N]: scales, bias) at `variable`."""
    index = Exprs(args, [], mask).index(view.strides[:1], view.offset, [variable])
    return f"tl.load({args.buffer(view.buffer)} + ({index}), mask={mask}, other=0)"


def qlinear_kernel(name: str, kernel: Kernel) -> tuple[list[str], list[str]]:
    """quant.qlinear_pointwise: X [M, K] (bytes) x W [N, K]^T (int8) in BM x BN tiles of int8 `tl.dot` into int32,
    each column's weight sum taking the activations' zero point out, then the float epilogue."""
    detail, out = kernel.detail, kernel.outputs[0]
    args = KernelArgs()
    rows, weight = detail.x, detail.weight
    M, N, K = args.size(detail.m), args.size(detail.n), args.size(detail.k)
    exprs = Exprs(args, [], "mask")
    x_index = exprs.index([detail.k, 1], rows.offset, ["rm[:, None]", "rk[None, :]"])
    w_index = exprs.index([detail.k, 1], weight.offset, ["rn[None, :]", "rk[:, None]"])
    bias = detail.bias
    body = ["pid_m, pid_n = tl.program_id(0), tl.program_id(1)",
            "rm = pid_m.to(tl.int64) * BM + tl.arange(0, BM)",
            "rn = pid_n.to(tl.int64) * BN + tl.arange(0, BN)",
            *_qparams(args, detail),
            "acc = tl.zeros((BM, BN), tl.int32)",
            "weight_sums = tl.zeros((BN,), tl.int32)",
            f"for k0 in range(0, {K}, BK):",
            "    rk = k0 + tl.arange(0, BK)",
            f"    x = tl.load({args.buffer(rows.buffer)} + ({x_index}), mask=(rm[:, None] < {M}) & "
            f"(rk[None, :] < {K}), other=0)",
            f"    w = tl.load({args.buffer(weight.buffer)} + ({w_index}), mask=(rk[:, None] < {K}) & "
            f"(rn[None, :] < {N}), other=0)",
            f"    acc = tl.dot({_signed_bytes('x', detail)}, w, acc)",
            "    weight_sums += tl.sum(w.to(tl.int32), axis=0)",
            "acc = acc - x_zero * weight_sums[None, :]",
            f"in_range = rn < {N}",
            *_epilogue(detail, out.dtype, f"{_vector(args, detail.weight_scale, 'rn', 'in_range')}[None, :]",
                       None if bias is None else f"{_vector(args, bias, 'rn', 'in_range')}[None, :]", None),
            f"tl.store({args.buffer(out)} + rm[:, None] * {N} + rn[None, :], result, "
            f"mask=(rm[:, None] < {M}) & (rn[None, :] < {N}))"]
    grid = f"(triton.cdiv({py_dim(detail.m)}, META['BM']), triton.cdiv({py_dim(detail.n)}, META['BN']))"
    return tiled(name, kernel, args, body, grid)


def qconv_kernel(name: str, kernel: Kernel) -> tuple[list[str], list[str]]:
    """quant.qconv2d_pointwise as an implicit GEMM per (image, group): W [C_out/g, K] x im2col [K, pixels] in
    BM x BN tiles of int8 `tl.dot`, the im2col tile gathered from NCHW bytes (the zero point in the padding, so it
    dequantizes to the reference's zeros), then the float epilogue with the optional float residual."""
    detail, out = kernel.detail, kernel.outputs[0]
    x, weight, bias, other = detail.x, detail.weight, detail.bias, detail.other
    args = KernelArgs()
    groups = int(detail.groups)
    batch, _, height, width = x.shape
    out_channels, group_channels, kh, kw = weight.shape
    taps = sympy.sympify(kh) * sympy.sympify(kw)
    cog = sympy.sympify(out_channels) / groups
    M, K = args.size(cog), args.size(detail.k)
    pixels = sympy.sympify(kernel.shape[2]) * sympy.sympify(kernel.shape[3])
    P = args.size(pixels)
    (sh, sw), (ph, pw), (dh, dw) = ([int(v) for v in values] for values in (detail.stride, detail.padding,
                                                                             detail.dilation))
    exprs = Exprs(args, [], "mask")
    channel = f"(g * {M} + co)"
    x_index = exprs.index(x.strides, x.offset, ["image", f"(g * {args.size(group_channels)} + ci[:, None])", "ih",
                                                "iw"])
    w_index = exprs.index([detail.k, 1], weight.offset, [f"(g * {M} + co[:, None])", "k[None, :]"])
    flat = f"(image * {args.size(out_channels)} + {channel}[:, None]) * {P} + p[None, :]"
    residual = None
    if other is not None:
        residual = (f"tl.load({args.buffer(other.buffer)} + {args.size(other.offset)} + {flat}, mask=mask, other=0)"
                    if sympy.sympify(other.offset) != 0 else
                    f"tl.load({args.buffer(other.buffer)} + {flat}, mask=mask, other=0)")
    inside = (f"(k[:, None] < {K}) & (p[None, :] < {P}) & (ih >= 0) & (ih < {args.size(height)}) & (iw >= 0) & "
              f"(iw < {args.size(width)})")
    body = ["pid_m, pid_n, unit = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)",
            f"image, g = unit // {groups}, unit % {groups}",
            "co = pid_m.to(tl.int64) * BM + tl.arange(0, BM)",
            "p = pid_n.to(tl.int64) * BN + tl.arange(0, BN)",
            *unravel(kernel.shape[2:], "p", args, prefix="o"),
            *_qparams(args, detail),
            "acc = tl.zeros((BM, BN), tl.int32)",
            "weight_sums = tl.zeros((BM,), tl.int32)",
            f"for k0 in range(0, {K}, BK):",
            "    k = k0 + tl.arange(0, BK)",
            f"    ci, tap = k // {args.size(taps)}, k % {args.size(taps)}",
            f"    ih = o0[None, :] * {sh} - {ph} + (tap // {args.size(kw)})[:, None] * {dh}",
            f"    iw = o1[None, :] * {sw} - {pw} + (tap % {args.size(kw)})[:, None] * {dw}",
            f"    inside = {inside}",
            f"    patch = tl.load({args.buffer(x.buffer)} + ({x_index}), mask=inside, other=0)",
            # the padding holds the zero point (shifted like the bytes): it adds nothing after the correction below
            f"    patch = tl.where(inside, {_signed_bytes('patch', detail)}, x_zero.to(tl.int8))",
            f"    w = tl.load({args.buffer(weight.buffer)} + ({w_index}), mask=(co[:, None] < {M}) & "
            f"(k[None, :] < {K}), other=0)",
            "    acc = tl.dot(w, patch, acc)",
            "    weight_sums += tl.sum(w.to(tl.int32), axis=1)",
            "acc = acc - x_zero * weight_sums[:, None]",
            f"in_range = co < {M}",
            f"mask = (co[:, None] < {M}) & (p[None, :] < {P})",
            *_epilogue(detail, out.dtype, f"{_vector(args, detail.weight_scale, channel, 'in_range')}[:, None]",
                       None if bias is None else f"{_vector(args, bias, channel, 'in_range')}[:, None]", residual),
            f"tl.store({args.buffer(out)} + {flat}, result, mask=mask)"]
    grid = (f"(triton.cdiv({py_dim(cog)}, META['BM']), triton.cdiv({py_dim(pixels)}, META['BN']), "
            f"{py_dim(batch)} * {groups})")
    return tiled(name, kernel, args, body, grid)


def wlinear_kernel(name: str, kernel: Kernel) -> tuple[list[str], list[str]]:
    """quant.linear_weight_only: float32 X [M, K] x W^T in BM x BN tiles of float32 `tl.dot`, each weight tile
    dequantized in registers as the reference does ((w - zero point) x its group's scale, one float32 rounding),
    then the bias."""
    detail, out = kernel.detail, kernel.outputs[0]
    args = KernelArgs()
    rows, weight, scales, zero_points, bias = detail.x, detail.weight, detail.scales, detail.zero_points, detail.bias
    M, N, K = args.size(detail.m), args.size(detail.n), args.size(detail.k)
    group_size = int(detail.group_size)
    groups = args.size(sympy.floor(sympy.sympify(detail.k) / group_size))
    exprs = Exprs(args, [], "mask")
    x_index = exprs.index([detail.k, 1], rows.offset, ["rm[:, None]", "rk[None, :]"])
    w_index = exprs.index([detail.k, 1], weight.offset, ["rn[None, :]", "rk[:, None]"])
    group = f"rn[None, :] * {groups} + (rk // {group_size})[:, None]"  # each weight's (row, group) position
    tile_mask = f"(rk[:, None] < {K}) & (rn[None, :] < {N})"
    dequantize = [f"    scale = tl.load({args.buffer(scales.buffer)} + ({exprs.index([1], scales.offset, [group])}), "
                  f"mask={tile_mask}, other=0)"]
    if zero_points is not None:  # subtracted in the zero points' integer type, as the reference's aten.sub
        wide = TL_TYPES[zero_points.buffer.dtype]
        zero_index = exprs.index([1], zero_points.offset, [group])
        dequantize += [f"    zero = tl.load({args.buffer(zero_points.buffer)} + ({zero_index}), mask={tile_mask}, "
                       "other=0)",
                       f"    w_float = (w.to({wide}) - zero.to({wide})).to(tl.float32) * scale"]
    else:
        dequantize.append("    w_float = w.to(tl.float32) * scale")
    body = ["pid_m, pid_n = tl.program_id(0), tl.program_id(1)",
            "rm = pid_m.to(tl.int64) * BM + tl.arange(0, BM)",
            "rn = pid_n.to(tl.int64) * BN + tl.arange(0, BN)",
            "acc = tl.zeros((BM, BN), tl.float32)",
            f"for k0 in range(0, {K}, BK):",
            "    rk = k0 + tl.arange(0, BK)",
            f"    x = tl.load({args.buffer(rows.buffer)} + ({x_index}), mask=(rm[:, None] < {M}) & "
            f"(rk[None, :] < {K}), other=0.0)",
            f"    w = tl.load({args.buffer(weight.buffer)} + ({w_index}), mask={tile_mask}, other=0)",
            *dequantize,
            "    acc = tl.dot(x, w_float, acc, input_precision=\"ieee\")"]
    if bias is not None:
        body.append(f"acc = acc + {_vector(args, bias, 'rn', f'rn < {N}')}[None, :]")
    body.append(f"tl.store({args.buffer(out)} + rm[:, None] * {N} + rn[None, :], acc, "
                f"mask=(rm[:, None] < {M}) & (rn[None, :] < {N}))")
    grid = f"(triton.cdiv({py_dim(detail.m)}, META['BM']), triton.cdiv({py_dim(detail.n)}, META['BN']))"
    return tiled(name, kernel, args, body, grid)


def _longest_window(size: Any, out: int) -> Any:
    """The most input positions one of ATen's adaptive windows spans (an upper bound for a symbolic size)."""
    size = sympy.sympify(size)
    if size.is_Integer:
        return max(-((-(i + 1) * int(size)) // out) - (i * int(size)) // out for i in range(out))
    return sympy.floor((size + out - 1) / out) + 1


def qpool_kernel(name: str, kernel: Kernel) -> tuple[list[str], list[str]]:
    """quant.qadaptive_avg_pool2d: one output element per lane, as the reference computes it: each value
    dequantized in float32, each window column's mean, then the mean of those, in float64 (the sums are exact there),
    rounded to float32 and requantized."""
    detail, out = kernel.detail, kernel.outputs[0]
    x = detail.x
    args = KernelArgs()
    _, channels, height, width = x.shape
    out_h, out_w = (int(d) for d in kernel.shape[2:])
    H, W = args.size(height), args.size(width)
    numel = sympy.Mul(*[sympy.sympify(d) for d in kernel.shape])
    start = f"{args.size(x.offset)} + " if sympy.sympify(x.offset) != 0 else ""
    scale, zero_point = _float32(float(detail.x_scale)), float(int(detail.x_zero_point))
    body = ["offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)",
            f"mask = offs < {args.size(numel)}",
            *unravel(kernel.shape, "offs", args),
            f"h0, h1 = (i2 * {H}) // {out_h}, ((i2 + 1) * {H} + {out_h - 1}) // {out_h}",
            f"w0, w1 = (i3 * {W}) // {out_w}, ((i3 + 1) * {W} + {out_w - 1}) // {out_w}",
            f"plane = {start}(i0 * {args.size(channels)} + i1) * {H} * {W}",
            "total = tl.zeros([BLOCK], tl.float64)",
            f"for dw in range(0, {args.size(_longest_window(width, out_w))}):",
            "    column = tl.zeros([BLOCK], tl.float64)",
            f"    for dh in range(0, {args.size(_longest_window(height, out_h))}):",
            "        inside = mask & (h0 + dh < h1) & (w0 + dw < w1)",
            f"        q = tl.load({args.buffer(x.buffer)} + plane + (h0 + dh) * {W} + w0 + dw, mask=inside, other=0)",
            f"        value = (q.to(tl.float32) - {zero_point!r}) * {scale}",
            "        column += tl.where(inside, value.to(tl.float64), 0.0)",
            "    total += tl.where(w0 + dw < w1, column / (h1 - h0).to(tl.float64), 0.0)",
            "mean = (total / (w1 - w0).to(tl.float64)).to(tl.float32)",
            *_requantized(detail, "mean", out.dtype),
            f"tl.store({args.buffer(out)} + offs, result, mask=mask)"]
    return blocked(name, args, body, numel)
