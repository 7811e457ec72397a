"""Triton lowerings of resampling and pairwise distances: upsample_nearest2d / upsample_bilinear2d and
grid_sampler_2d (window kernels, one output element per lane, source positions computed with ATen's algebra in its
precision) and _cdist_forward / _pdist_forward (distance kernels, a p-norm per pair of rows accumulated in double).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import sympy

from kiln.codegen.kernels import Kernel
from kiln.codegen.triton.render import (
    TL_TYPES, Exprs, KernelArgs, blocked, literal, py_dim, signature, unravel, window_kernel,
)
from kiln.ir import dtypes

DISTANCE_PAIRS = 64    # pairs of rows per program
DISTANCE_COLUMNS = 32  # the most columns a step of the norm's loop reads per pair
# Non-finite or huge grid positions read as this (out of range) index, as the interpreter's `_to_index`.
FAR = 1099511627776.0  # 2^40


def window_or_sampling_kernel(name: str, kernel: Kernel) -> tuple[list[str], list[str]]:
    """The "window" kernel kind: upsampling and grid sampling here, pooling in render.py."""
    op = kernel.ops[0]
    if "upsample" in op:
        return upsample_kernel(name, kernel)
    if op == "aten.grid_sampler_2d.default":
        return grid_sample_kernel(name, kernel)
    return window_kernel(name, kernel)


def _real_type(dtype: dtypes.DType) -> str:
    return "tl.float64" if dtype == dtypes.float64 else "tl.float32"


def _start(kernel: Kernel, args: KernelArgs) -> tuple[list[str], Any]:
    """The lines placing each lane at its output element (i0.. over the kernel's shape), and the element count."""
    numel = sympy.Mul(*[sympy.sympify(d) for d in kernel.shape])
    return ["offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)",
            f"mask = offs < {args.size(numel)}", *unravel(kernel.shape, "offs", args)], numel


def _divide(a: str, b: str, real: str) -> str:
    """a / b rounded to nearest (Triton's float32 `/` may approximate on a GPU; float64's is exact)."""
    return f"tl.div_rn({a}, {b})" if real == "tl.float32" else f"(({a}) / ({b}))"


def _block_of(size: str) -> str:
    """A size (a literal or a scalar argument) as an int64 block, so that it converts and compares like one."""
    return f"(tl.zeros([BLOCK], tl.int64) + {size})"


def upsample_kernel(name: str, kernel: Kernel) -> tuple[list[str], list[str]]:
    """upsample_nearest2d / upsample_bilinear2d over (N, C, H, W), source positions as ATen computes them: nearest in
    float32 (floor(dst * in / out), or 1 / scale when given, halving when the size doubles); bilinear in float32 for
    float32 inputs (opmath), float64 otherwise. A dim whose size is unchanged is copied."""
    detail, op, out = kernel.detail, kernel.ops[0], kernel.outputs[0]
    x = detail.input
    args = KernelArgs()
    body, numel = _start(kernel, args)
    real = "tl.float32" if "nearest" in op else _real_type(x.buffer.dtype)
    for k in range(2):
        scale = detail.scales[k]
        given = scale is not None and scale > 0
        body += [f"in{k} = {_block_of(args.size(x.shape[2 + k]))}",
                 f"out{k} = {_block_of(args.size(kernel.shape[2 + k]))}", f"o{k} = i{2 + k}"]
        if "nearest" in op:
            ratio = (f"tl.full([BLOCK], {literal(float(np.float32(1.0 / scale)))}, tl.float32)" if given
                     else _divide(f"in{k}.to(tl.float32)", f"out{k}.to(tl.float32)", "tl.float32"))
            body += [f"lo{k} = tl.minimum(tl.floor(o{k}.to(tl.float32) * {ratio}).to(tl.int64), in{k} - 1)",
                     f"lo{k} = tl.where(out{k} == 2 * in{k}, o{k} >> 1, lo{k})",
                     f"lo{k} = tl.where(out{k} == in{k}, o{k}, lo{k})"]
            continue
        if detail.align_corners:
            # one output: ratio 0 (the denominator kept nonzero for the lanes tl.where discards)
            ratio = _divide(f"(in{k} - 1).to({real})", f"tl.maximum(out{k} - 1, 1).to({real})", real)
            body += [f"ratio{k} = tl.where(out{k} > 1, {ratio}, 0.0)",
                     f"src{k} = ratio{k} * o{k}.to({real})"]
        else:
            ratio = (f"tl.full([BLOCK], {literal(1.0 / scale)}, {real})" if given
                     else _divide(f"in{k}.to({real})", f"out{k}.to({real})", real))
            body += [f"src{k} = tl.maximum({ratio} * (o{k}.to({real}) + 0.5) - 0.5, 0.0)"]
        body += [f"lo{k} = tl.minimum(tl.floor(src{k}).to(tl.int64), in{k} - 1)",
                 f"hi{k} = tl.minimum(lo{k} + 1, in{k} - 1)",
                 f"wh{k} = tl.minimum(tl.maximum(src{k} - lo{k}.to({real}), 0.0), 1.0)",
                 f"same{k} = out{k} == in{k}",
                 f"lo{k} = tl.where(same{k}, o{k}, lo{k})", f"hi{k} = tl.where(same{k}, o{k}, hi{k})",
                 f"wh{k} = tl.where(same{k}, 0.0, wh{k})", f"wl{k} = 1.0 - wh{k}"]
    exprs = Exprs(args, [], "mask")

    def load(row: str, column: str) -> str:
        place = exprs.index(x.strides, x.offset, ["i0", "i1", row, column])
        return f"tl.load({args.buffer(x.buffer)} + ({place}), mask=mask, other=0)"

    if "nearest" in op:
        value = load("lo0", "lo1")
    else:
        body += [f"upper = {load('lo0', 'lo1')}.to({real}) * wl1 + {load('lo0', 'hi1')}.to({real}) * wh1",
                 f"lower = {load('hi0', 'lo1')}.to({real}) * wl1 + {load('hi0', 'hi1')}.to({real}) * wh1"]
        value = "upper * wl0 + lower * wh0"
    body.append(f"tl.store({args.buffer(out)} + offs, {Exprs.cast(value, out.dtype)}, mask=mask)")
    return blocked(name, args, body, numel)


def grid_sample_kernel(name: str, kernel: Kernel) -> tuple[list[str], list[str]]:
    """grid_sampler_2d per output element, op by op in the input's dtype as the interpreter (ATen's vectorized CPU
    algebra): unnormalize each grid coordinate, apply the padding mode (bicubic pads each of its 16 taps instead),
    then nearest (round half to even), bilinear or bicubic taps. A tap outside the input (or at a non-finite
    position) reads 0. Divisions round to nearest, and NaN passes through the clamps, as in numpy."""
    detail, out = kernel.detail, kernel.outputs[0]
    x, grid = detail.input, detail.grid
    align, padding, mode = detail.align_corners, detail.padding_mode, detail.interpolation
    args = KernelArgs()
    body, numel = _start(kernel, args)
    real = TL_TYPES[out.dtype]
    exprs = Exprs(args, [], "mask")
    body += [f"height = {_block_of(args.size(x.shape[2]))}", f"width = {_block_of(args.size(x.shape[3]))}"]
    for k, axis in enumerate("xy"):
        place = exprs.index(grid.strides, grid.offset, ["i0", "i2", "i3", str(k)])
        body.append(f"g{axis} = tl.load({args.buffer(grid.buffer)} + ({place}), mask=mask, other=0).to({real})")

    def unnormalize(g: str, size: str) -> str:
        if align:
            return f"({g} + 1.0) * (({size} - 1).to({real}) * 0.5)"
        return f"({g} + 1.0) * ({size}.to({real}) * 0.5) - 0.5"

    def pad(v: str, size: str) -> list[str]:
        clip = f"{v} = kiln_min(({size} - 1).to({real}), kiln_max({v}, tl.zeros_like({v})))"
        if padding == 0:
            return []
        if padding == 1:
            return [clip]
        low, span = ("0.0", f"(2 * ({size} - 1)).to({real})") if align else ("-0.5", f"(2 * {size}).to({real})")
        return [f"span = {span}", f"distance = tl.abs({v} - {low})",
                f"extra = distance - kiln_trunc({_divide('distance', 'tl.where(span > 0, span, 1.0)', real)}) * span",
                f"{v} = tl.where(span > 0, kiln_min(extra, span - extra) + {low}, 0.0)", clip]

    def index(v: str) -> str:
        return f"tl.where(({v} == {v}) & (tl.abs({v}) < {FAR}), {v}, -{FAR}).to(tl.int64)"

    def tap(row: str, column: str) -> list[str]:
        """Lines setting `sample` to x[n, c, row, column], or 0 outside the input."""
        inside = f"mask & ({row} >= 0) & ({row} < height) & ({column} >= 0) & ({column} < width)"
        place = exprs.index(x.strides, x.offset, ["i0", "i1", f"tl.where(inside, {row}, 0)",
                                                  f"tl.where(inside, {column}, 0)"])
        return [f"inside = {inside}",
                f"sample = tl.load({args.buffer(x.buffer)} + ({place}), mask=inside, other=0).to({real})"]

    body += [f"gx = {unnormalize('gx', 'width')}", f"gy = {unnormalize('gy', 'height')}"]
    if mode == 2:  # bicubic: ATen's coefficients with A = -0.75 (5A, 8A, 4A folded exactly)
        def near(t: str) -> str:
            return f"((1.25 * ({t}) - 2.25) * ({t})) * ({t}) + 1.0"

        def far(t: str) -> str:
            return f"((-0.75 * ({t}) + 3.75) * ({t}) - 6.0) * ({t}) + 3.0"
        body += ["x0 = tl.floor(gx)", "y0 = tl.floor(gy)", "tx = gx - x0", "ty = gy - y0"]
        for axis in "xy":
            t = f"t{axis}"
            body += [f"w{axis}0 = {far(f'{t} + 1.0')}", f"w{axis}1 = {near(t)}",
                     f"w{axis}2 = {near(f'1.0 - {t}')}", f"w{axis}3 = {far(f'2.0 - {t}')}"]
        for k in range(4):  # the taps' columns and rows, each padded on its own
            body += [f"cx{k} = x0 - 1.0 + {float(k)}", *pad(f"cx{k}", "width"), f"c{k} = {index(f'cx{k}')}",
                     f"cy{k} = y0 - 1.0 + {float(k)}", *pad(f"cy{k}", "height"), f"r{k} = {index(f'cy{k}')}"]
        body.append(f"value = tl.zeros([BLOCK], {real})")
        for i in range(4):
            body.append(f"row = tl.zeros([BLOCK], {real})")
            for j in range(4):
                body += [*tap(f"r{i}", f"c{j}"), f"row = row + sample * wx{j}"]
            body.append(f"value = value + row * wy{i}")
    else:
        body += [*pad("gx", "width"), *pad("gy", "height")]
        if mode == 1:
            body += [f"r = {index('kiln_round(gy)')}", f"c = {index('kiln_round(gx)')}", *tap("r", "c"),
                     "value = sample"]
        else:
            body += ["west = tl.floor(gx)", "north = tl.floor(gy)", "w = gx - west", "n = gy - north",
                     "e = 1.0 - w", "s = 1.0 - n", f"c = {index('west')}", f"r = {index('north')}",
                     *tap("r", "c"), "value = sample * (s * e)", *tap("r", "c + 1"), "value = value + sample * (s * w)",
                     *tap("r + 1", "c"), "value = value + sample * (n * e)",
                     *tap("r + 1", "c + 1"), "value = value + sample * (n * w)"]
    body.append(f"tl.store({args.buffer(out)} + offs, {Exprs.cast('value', out.dtype)}, mask=mask)")
    return blocked(name, args, body, numel)


def _power_function(name: str) -> list[str]:
    """`name`(base, exponent) = base ** exponent for float64 bases >= 0 (or NaN): libdevice's pow on a GPU,
    exp(exponent * log(base)) (0 at 0) under the interpreter, which has no libdevice."""
    return ["@triton.jit", f"def {name}(base, exponent: tl.constexpr):",
            "    power = exponent + tl.zeros_like(base)  # the exponent in the base's float64, unrounded",
            "    if INTERPRET:",
            "        return tl.where(base == 0, 0.0, tl.exp(power * tl.log(tl.where(base == 0, 1.0, base))))",
            "    else:", "        return libdevice.pow(base, power)", "", ""]


def _norm(p: float, nan_wins: bool, power: str) -> tuple[list[str], list[str], str]:
    """A p-norm of d = |u - v| (float64 tiles [pairs, columns]): its accumulators' set-up, one column step, and its
    value per pair. p = 0 counts differing coordinates; inf takes the largest difference, where a NaN wins when
    `nan_wins` (pdist's vectorized max) and is skipped otherwise (cdist's std::max loop); others sum d^p with the
    kernel's `power` function."""
    if math.isinf(p):
        setup = ["largest = tl.zeros([PAIRS, COLUMNS], tl.float64)", "nans = tl.zeros([PAIRS, COLUMNS], tl.int32)"]
        step = ["largest = tl.maximum(largest, tl.where(d == d, d, 0.0))"]
        value = "tl.max(largest, axis=1)"
        if nan_wins:
            step.append("nans += (d != d).to(tl.int32)")
            value = f"tl.where(tl.sum(nans, axis=1) > 0, float('nan'), {value})"
        return setup, step, value
    if p in (0.0, 1.0, 2.0):
        term = {0.0: "tl.where(d == d, (d != 0).to(tl.float64), d)", 1.0: "d", 2.0: "d * d"}[p]
        value = "tl.sqrt(tl.sum(total, axis=1))" if p == 2.0 else "tl.sum(total, axis=1)"
    else:
        term, value = f"{power}(d, {literal(p)})", f"{power}(tl.sum(total, axis=1), {literal(1 / p)})"
    return ["total = tl.zeros([PAIRS, COLUMNS], tl.float64)"], [f"total += {term}"], value


def _columns_loop(args: KernelArgs, columns: Any, u: str, v: str, setup: list[str], step: list[str]) -> list[str]:
    """The loop over the columns in COLUMNS steps: u and v (reads under `m`, at column tile `k`) as float64."""
    return [*setup, f"for start in range(0, {args.size(columns)}, COLUMNS):",
            "    k = start + tl.arange(0, COLUMNS)", f"    m = lanes[:, None] & (k[None, :] < {args.size(columns)})",
            f"    u = {u}.to(tl.float64)", f"    v = {v}.to(tl.float64)", "    d = tl.abs(u - v)",
            *[f"    {line}" for line in step]]


def distance_kernel(name: str, kernel: Kernel) -> tuple[list[str], list[str]]:
    """_cdist_forward / _pdist_forward: a lane per pair of rows, the norm over their columns in float64 tiles.
    Euclidean cdist takes ATen's matrix-product formula sqrt(max(|a|^2 + |b|^2 - 2ab, 0)) when compute_mode asks
    for it or, by default, when either side has more than 25 rows (decided at run time: the rows may be symbolic)."""
    detail, out = kernel.detail, kernel.outputs[0]
    p, columns = detail.p, detail.columns
    args = KernelArgs()
    exprs = Exprs(args, [], "m")
    result = args.buffer(out)
    if len(detail.sides) == 1:  # pdist: a program per (row i, block of rows j > i), pairs in row-major order
        x = detail.sides[0]
        n = args.size(detail.rows[0])
        body = ["i = tl.program_id(0).to(tl.int64)",
                "j = tl.program_id(1).to(tl.int64) * PAIRS + tl.arange(0, PAIRS)", f"lanes = (j > i) & (j < {n})"]
        u = exprs.load(x.buffer, exprs.index(x.strides, x.offset, ["i", "k[None, :]"]))
        v = exprs.load(x.buffer, exprs.index(x.strides, x.offset, ["j[:, None]", "k[None, :]"]))
        setup, step, value = _norm(p, nan_wins=True, power=f"{name}_power")
        body += [*_columns_loop(args, columns, u, v, setup, step), f"dist = {value}",
                 f"tl.store({result} + (i * {n} - i * (i + 1) // 2 + (j - i - 1)), "
                 f"{Exprs.cast('dist', out.dtype)}, mask=lanes)"]
        rows = py_dim(detail.rows[0])
        grid = f"({rows}, triton.cdiv({rows}, {DISTANCE_PAIRS}))"
        launch_if = f"{rows} > 1"
    else:  # cdist: a lane per output element [..., i, j]
        rank = len(kernel.shape)
        numel = sympy.Mul(*[sympy.sympify(d) for d in kernel.shape])
        body = ["offs = tl.program_id(0).to(tl.int64) * PAIRS + tl.arange(0, PAIRS)",
                f"lanes = offs < {args.size(numel)}", *unravel(kernel.shape, "offs", args)]
        batch = [f"i{k}[:, None]" for k in range(rank - 2)]
        x1, x2 = detail.sides
        u = exprs.load(x1.buffer, exprs.index(x1.strides, x1.offset, [*batch, f"i{rank - 2}[:, None]", "k[None, :]"]))
        v = exprs.load(x2.buffer, exprs.index(x2.strides, x2.offset, [*batch, f"i{rank - 1}[:, None]", "k[None, :]"]))
        setup, step, value = _norm(p, nan_wins=False, power=f"{name}_power")
        flag = None
        if p == 2.0 and detail.compute_mode != 2:
            rows1, rows2 = (sympy.sympify(r) for r in detail.rows)
            flag = sympy.Integer(1) if detail.compute_mode == 1 else \
                sympy.Min(sympy.Max(rows1 - 25, rows2 - 25, 0), 1)
            if flag == 0:
                flag = None
        if flag is not None:  # the matrix-product form (computed beside the direct one when the rows decide)
            product = ["squares_u = tl.zeros([PAIRS, COLUMNS], tl.float64)",
                       "squares_v = tl.zeros([PAIRS, COLUMNS], tl.float64)",
                       "products = tl.zeros([PAIRS, COLUMNS], tl.float64)"]
            product_step = ["squares_u += u * u", "squares_v += v * v", "products += u * v"]
            formula = ("(tl.sum(squares_u, axis=1) + tl.sum(squares_v, axis=1)) - 2.0 * tl.sum(products, axis=1)")
            if flag == 1:
                setup, step, value = product, product_step, None
            else:
                setup, step = setup + product, step + product_step
            body += [*_columns_loop(args, columns, u, v, setup, step), f"squared = {formula}",
                     "squared = tl.where((squared != squared) | (squared > 0), squared, 0.0)"]
            body.append("dist = tl.sqrt(squared)" if value is None else
                        f"dist = tl.where({args.size(flag)} > 0, tl.sqrt(squared), {value})")
        else:
            body += [*_columns_loop(args, columns, u, v, setup, step), f"dist = {value}"]
        body.append(f"tl.store({result} + offs, {Exprs.cast('dist', out.dtype)}, mask=lanes)")
        count = py_dim(numel)
        grid = f"(triton.cdiv({count}, {DISTANCE_PAIRS}),)"
        launch_if = f"{count} > 0"
    helper = _power_function(f"{name}_power") if p not in (0.0, 1.0, 2.0) and not math.isinf(p) else []
    source = [*helper, "@triton.jit", signature(name, args, ["PAIRS: tl.constexpr", "COLUMNS: tl.constexpr"]),
              *["    " + line for line in body]]
    launch = [f"if {launch_if}:", f"    {name}[{grid}]({', '.join(args.arguments())}, PAIRS={DISTANCE_PAIRS}, "
              f"COLUMNS=min(triton.next_power_of_2(max({py_dim(columns)}, 1)), {DISTANCE_COLUMNS}))"]
    return source, launch

