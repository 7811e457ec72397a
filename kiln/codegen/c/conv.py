"""Convolutions in C: float32 ones as implicit GEMMs on kiln_gemm.h's micro-kernels, depthwise ones as stencils, the
others (float64, integer without quantization, transposed) as direct loops with a double accumulator.

An implicit GEMM runs per (image, group) in one of three shapes: output channels as the rows (the weights packed by
the compiler into KILN_MR-row blocks) against KILN_NR-pixel im2col panels packed per unit; the same with a small
image's whole im2col packed once (`whole_im2col`); or, for few pixels and many channels, pixels as the rows
(`pixel_rows`, packing.conv_weight_layout "panels"). Every epilogue is the kernel's fused expression (bias, batch
norm, activation, residual), indexed by flat pixel where its operands allow. docs/c-backend.md gives the measurements
behind each choice. A depthwise convolution (one input channel per group) is no GEMM worth the packing: it runs
as a vectorized stencil over each plane (`_conv_depthwise`). The integer convolutions render in quantized.py, the
sparse ones in render.py.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import sympy

from kiln.codegen.c.build import get_cpu_capability
from kiln.codegen.c.ctext import (
    RenderState, _chunking, _Exprs, _flat, _loops, _tile_loop, _view_index, accumulator_dtype, accumulator_type,
    buffer_name, dim_expr, phase_copy,
)
from kiln.codegen.c.packing import conv_weight_layout
from kiln.codegen.kernels import Accumulator, Apply, Constant, Gather, Iota, Kernel, Load, Tile, same_dim
from kiln.ir import dtypes


def conv_as_gemm(kernel: Kernel) -> bool:
    detail = kernel.detail
    x, w = detail.input, detail.weight
    return (x.buffer.dtype == w.buffer.dtype == accumulator_dtype(kernel) == dtypes.float32 and w.is_contiguous
            and not detail.transposed
            and all(sympy.sympify(d).is_Integer for d in w.shape[2:]))  # im2col unrolls the taps


_WHOLE_IM2COL_PIXELS = 128  # output pixels per image up to which a conv packs its whole im2col matrix at once


def whole_im2col(kernel: Kernel) -> bool:
    """A float32 convolution with few output pixels per image (ResNet's last stages: 7x7 = 49): each thread packs the
    image's whole im2col matrix (a few panels) once and runs every panel against one weight row block while that
    block is in cache. Panel by panel, the weights (9 MB in ResNet-18's last stage) streamed from memory once per
    panel: 67 GFLOP/s at one thread where the 14x14 stage got 103."""
    pixels = sympy.Mul(*[sympy.sympify(d) for d in kernel.shape[2:]])
    return pixels.is_Integer and int(pixels) <= _WHOLE_IM2COL_PIXELS


# A plane's in-plane offsets are int32 below this many elements (room for taps just outside the plane).
_NARROW_PLANE = 2**30


def im2col_panel(kernel: Kernel, weight_shape: list, state: RenderState,
                 rows: bool = False) -> tuple[list[str], list[str]]:
    """Lines computing one KILN_NR-pixel panel's output positions (`out{k}[c]`, `inside[c]`), and lines packing its
    im2col rows [C_in/g * taps][KILN_NR] of image `bi`, channels from `cin0`, into `panel` (zeros in the padding).
    The caller defines `j` (the panel), `N` (pixels) and the weight shape's channels and taps. With `rows`, the
    same for one KILN_MR-pixel row block of the pixels-as-rows orientation (`conv_weight_layout` "panels"): block
    `b` of `M` pixels, packed [C_in/g * taps][KILN_MR] into `panel`. A dynamic plane is indexed as a small one,
    under a size limit kiln_run checks (`state.size_limits`)."""
    lanes, block, pixel_count = ("KILN_MR", "b", "M") if rows else ("KILN_NR", "j", "N")
    detail = kernel.detail
    x = detail.input
    n = len(kernel.shape) - 2
    taps = [dim_expr(d) for d in weight_shape[2:]]
    out_sizes = [dim_expr(d) for d in kernel.shape[2:]]
    cig = dim_expr(weight_shape[1])
    # Each pixel column's output position, once per panel (the epilogue reuses it).
    # In-plane offsets are int32 (one vector gather per 16 columns, and row copies) when the input plane is small;
    # the tap table is then int32 arithmetic, which vectorizes (in int64 it took a third of an RGB stem's time). A
    # dynamic plane (an audio model's length, an image size) is indexed so too, under a limit kiln_run checks: in
    # int64, wav2vec2's feature encoder gathered every im2col element with a scalar load.
    plane_elements = sympy.sympify(sum((sympy.sympify(d) - 1) * sympy.sympify(stride)
                                       for d, stride in zip(x.shape[2:], x.strides[2:])))
    narrow = not plane_elements.is_Integer or int(plane_elements) < _NARROW_PLANE
    if not plane_elements.is_Integer:
        state.size_limits.append((plane_elements, _NARROW_PLANE, f"a convolution's input plane reaches offset "
                                  f"{plane_elements}: 2**30 or more, past the 32-bit offsets of the compiled code"))
    offset_type = "int32_t" if narrow else "int64_t"
    positions = [*[f"{offset_type} base{k}[{lanes}];" for k in range(n)],
                 *[f"int64_t out{k}[{lanes}];" for k in range(n)],
                 f"int32_t inside[{lanes}];",  # int32, not bool: GCC vectorizes the tap table only then
                 f"for (int c = 0; c < {lanes}; ++c)", "{", f"    int64_t p = {block} * {lanes} + c;",
                 f"    inside[c] = p < {pixel_count};"]
    for k in reversed(range(n)):
        stride, padding = int(detail.stride[k]), int(detail.padding[k])
        positions.append(f"    out{k}[c] = p % {out_sizes[k]}; p /= {out_sizes[k]};")
        positions.append(f"    base{k}[c] = ({offset_type})(out{k}[c] * {stride} - {padding});")
    positions.append("}")
    tap_count = math.prod(int(d) for d in weight_shape[2:])
    # The tap table: for each kernel tap and pixel column, the input's in-plane offset, or -1 in the padding.
    # It depends on the spatial position only, so every input channel reuses it, and the copy loop below is a
    # masked gather the compiler vectorizes.
    def narrowed(size: Any) -> str:  # a size as an int in the int32 table (int64 would widen it)
        size = sympy.sympify(size)
        if not narrow:
            return dim_expr(size)
        return str(int(size)) if size.is_Integer else f"(int32_t){dim_expr(size)}"
    plane_offset = " + ".join(f"q{k} * {narrowed(x.strides[2 + k])}" for k in range(n))
    # bitwise, not short-circuit: GCC vectorizes the table only without branches
    inside = " & ".join(["inside[c]"] + [f"(q{k} >= 0) & (q{k} < {narrowed(x.shape[2 + k])})" for k in range(n)])
    tap_index = "0"
    for k in range(n):
        tap_index = f"({tap_index}) * {taps[k]} + r{k}"
    # Consecutive tap rows are copied with (masked) vector loads when the input has at least
    # KILN_ROW_COPY_MIN_CHANNELS channels per group, which share each panel's check (kiln_gemm.h: 1 with AVX2 and
    # AVX-512, whose checks are vector code; 8 in portable C, where an RGB stem's check cost more than it saved).
    row_copies = narrow and sympy.sympify(weight_shape[1]).is_Integer
    packing = [f"{'int32_t' if narrow else 'int64_t'} source[{tap_count}][{lanes}];"]
    depth = ""
    for k in range(n):
        packing.append(f"{depth}for (int64_t r{k} = 0; r{k} < {taps[k]}; ++r{k})")
    packing += [f"{depth}    _Pragma(\"omp simd\") for (int c = 0; c < {lanes}; ++c)", f"{depth}    {{",
                *[f"{depth}        const {offset_type} q{k} = base{k}[c] + ({offset_type})r{k} * "
                  f"{int(detail.dilation[k])};" for k in range(n)],
                f"{depth}        source[{tap_index}][c] = ({inside}) ? {plane_offset} : -1;",
                f"{depth}    }}",
    ]
    row = f"panel + (ci * {tap_count} + t) * {lanes}"  # where tap t of input channel ci goes
    steps: list[str] = []
    if not narrow:
        copy = [f"for (int c = 0; c < {lanes}; ++c) ({row})[c] = source[t][c] >= 0 ? plane[source[t][c]] : 0.0f;"]
    elif rows:  # each k-row of a row block a masked copy (step 1) or a gather of KILN_MR lanes
        steps = [f"for (int t = 0; t < {tap_count}; ++t) step[t] = kiln_row_step_lanes(source[t], KILN_MR, 1, "
                 "&start[t], &valid[t]);"]
        copy = [f"kiln_block_row(plane, step[t], start[t], valid[t], source[t], {row});"]
    elif row_copies:
        steps = [f"for (int t = 0; t < {tap_count}; ++t) step[t] = {cig} >= KILN_ROW_COPY_MIN_CHANNELS ? "
                 "kiln_row_step(source[t], &start[t], &valid[t]) : 0;"]
        # Rows of consecutive elements (stride 1) are masked vector loads (or plain loads where the whole row lies
        # inside the input's buffer), rows of every other element (stride 2) loads and shuffles; the others gather.
        copy = [f"if (step[t] == 1) kiln_masked_row(plane, start[t], valid[t], -plane_at, plane_end, {row});",
                f"else if (step[t] == 2) kiln_every_other_row(plane, start[t], valid[t], -plane_at, plane_end, {row});",
                f"else kiln_gather_row(plane, source[t], {row});"]
    else:
        copy = [f"kiln_gather_row(plane, source[t], {row});"]
    step_arrays = f"int32_t start[{tap_count}]; uint32_t valid[{tap_count}]; int step[{tap_count}];"
    bounds = row_copies and not rows  # kiln_masked_row and kiln_every_other_row read the input buffer's bounds
    packing += [
        *([step_arrays, *steps] if steps else []),
        f"for (int64_t ci = 0; ci < {cig}; ++ci)", "{",
        f"    const int64_t plane_at = {_view_index(x, ['bi', '(cin0 + ci)', *['0'] * n])};",
        f"    const float* plane = {buffer_name(x.buffer)} + plane_at;",
        *([f"    const int64_t plane_end = (int64_t)({dim_expr(x.buffer.numel)}) - plane_at;"] if bounds else []),
        f"    for (int t = 0; t < {tap_count}; ++t)", "    {", *[f"        {line}" for line in copy], "    }",
        "}"]
    return positions, packing


def _conv_gemm_f32(kernel: Kernel, state: RenderState) -> list[str]:
    """float32 convolution as an implicit GEMM per (image, group): weights [Cout/g, Cin/g * taps] x im2col
    [Cin/g * taps, pixels]. Each unit packs one KILN_NR-pixel panel of the im2col matrix (zeros for padding)
    and runs register tiles down its output channels; the epilogue (bias, batch norm, relu, residual) is fused.
    With few pixels (`whole_im2col`) a unit is one row block of output channels instead, against every panel."""
    if pixel_rows(kernel, state.packed):
        return _conv_pixel_rows(kernel, state)
    detail = kernel.detail
    w, bias = detail.weight, detail.bias
    groups = int(detail.groups)
    taps = [dim_expr(d) for d in w.shape[2:]]
    out_sizes = [dim_expr(d) for d in kernel.shape[2:]]
    cig = dim_expr(w.shape[1])
    whole = whole_im2col(kernel)
    lines = [
        f"const int64_t GROUPS = {groups}, BATCH = {dim_expr(kernel.shape[0])};",
        f"const int64_t M = {dim_expr(sympy.sympify(kernel.shape[1]) / groups)}, "
        f"N = {' * '.join(out_sizes)}, K = {cig} * {' * '.join(taps)};",
        *_chunking("BATCH * GROUPS * panels"),
        "float* pack = (float*)(ctx->scratch + (size_t)omp_get_thread_num() * ctx->scratch_stride);",
    ]
    positions, packing = im2col_panel(kernel, w.shape, state)
    value = "(double)tile[r * KILN_NR + c]"
    if bias is not None:
        value = f"{value} + (double){buffer_name(bias.buffer)}[{_view_index(bias, ['i1'])}]"
    indices, target, epilogue, flat = conv_epilogue(kernel, "g * M + row + r")
    if kernel in state.packed:  # weights packed at create: KILN_MR-row blocks, read as one stream
        a_line = (f"const float* a = ctx->packed[{state.packed[kernel]}] "
                  "+ g * ((M + KILN_MR - 1) / KILN_MR) * KILN_MR * K;")
        ukernel = "kiln_ukernel(rows, K, a + row * K, 1, KILN_MR, panel, panel, tile);"
    else:
        a_line = f"const float* a = {buffer_name(w.buffer)} + {dim_expr(w.offset)} + g * M * K;"
        ukernel = "kiln_ukernel(rows, K, a + row * K, K, 1, panel, panel, tile);"
    tiles = _tile_loop(ukernel, indices, target, value, epilogue, accumulator_type(kernel))
    if not whole:
        lines += ["#pragma omp for collapse(4) schedule(static)",
                  "for (int64_t bi = 0; bi < BATCH; ++bi)",
                  "for (int64_t g = 0; g < GROUPS; ++g)",
                  "for (int64_t chunk = 0; chunk < chunks; ++chunk)",
                  "for (int64_t j = 0; j < panels; ++j)", "{",
                  f"    const int64_t cin0 = g * {cig};",
                  "    float* panel = pack;",
                  *["    " + line for line in positions + packing],
                  "    " + a_line, *tiles, "}"]
        return ["    " + line for line in lines]
    # Whole im2col: a unit is (image, group, row block); a thread packs an image's panels when it reaches a unit
    # of a new image, then runs every panel against the unit's weight rows.
    lines += ["int64_t packed_image = -1;  /* bi * GROUPS + g of the im2col in `pack` */",
              "#pragma omp for collapse(3) schedule(static)",
              "for (int64_t bi = 0; bi < BATCH; ++bi)",
              "for (int64_t g = 0; g < GROUPS; ++g)",
              "for (int64_t chunk = 0; chunk < row_blocks; ++chunk)", "{",
              "    const int64_t cin0 = g * " + cig + ", chunk_rows = KILN_MR;  /* a chunk is one row block */",
              "    if (packed_image != bi * GROUPS + g)", "    {",
              "        packed_image = bi * GROUPS + g;",
              "        for (int64_t j = 0; j < panels; ++j)", "        {",
              "            float* panel = pack + j * K * KILN_NR;",
              *["            " + line for line in positions + packing],
              "        }", "    }",
              "    " + a_line,
              "    for (int64_t j = 0; j < panels; ++j)", "    {",
              "        const float* panel = pack + j * K * KILN_NR;",
              *(["        " + line for line in positions] if not flat else []),
              *["    " + line for line in tiles], "    }", "}"]
    return ["    " + line for line in lines]


def pixel_rows(kernel: Kernel, packed: dict) -> bool:
    """Whether a convolution runs with its output pixels as the GEMM's rows: its weights are packed by the compiler
    (render._prepacked) into B panels (packing.conv_weight_layout)."""
    return (kernel.kind == "conv" and kernel in packed
            and conv_weight_layout(kernel, get_cpu_capability()) == "panels")


def _conv_pixel_rows(kernel: Kernel, state: RenderState) -> list[str]:
    """float32 convolution with its output pixels as the GEMM's rows (packing.conv_weight_layout "panels"): a thread
    packs an image's im2col (its chunk of it) into KILN_MR-pixel row blocks once, then runs them against each B panel
    of KILN_NR output channels its units name, the next panel prefetched meanwhile. Each tile's channels are copied
    out as runs of pixels (`by_channel`), and the epilogue runs once per channel over the chunk's pixels."""
    detail = kernel.detail
    w, bias = detail.weight, detail.bias
    groups = int(detail.groups)
    taps = [dim_expr(d) for d in w.shape[2:]]
    cig = dim_expr(w.shape[1])
    positions, packing = im2col_panel(kernel, w.shape, state, rows=True)
    indices, target, epilogue, _ = conv_epilogue(kernel, "g * N + j * KILN_NR + c", pixel="pixel")
    value = "(double)by_channel[c * M + pixel]"
    if bias is not None:
        value = f"{value} + (double){buffer_name(bias.buffer)}[{_view_index(bias, ['i1'])}]"
    result_type = accumulator_type(kernel)
    lines = [
        f"const int64_t GROUPS = {groups}, BATCH = {dim_expr(kernel.shape[0])};",
        f"const int64_t M = {' * '.join(dim_expr(d) for d in kernel.shape[2:])}, "
        f"N = {dim_expr(sympy.sympify(kernel.shape[1]) / groups)}, K = {cig} * {' * '.join(taps)};",
        *_chunking("BATCH * GROUPS * panels"),
        "float* pack = (float*)(ctx->scratch + (size_t)omp_get_thread_num() * ctx->scratch_stride);",
        "float* by_channel = pack + (M + KILN_MR - 1) / KILN_MR * KILN_MR * K;  /* [KILN_NR][M]: tiles by channel */",
        "int64_t packed_unit = -1;  /* (bi * GROUPS + g) * chunks + chunk: whose row blocks `pack` holds */",
        "#pragma omp for collapse(4) schedule(static)",
        "for (int64_t bi = 0; bi < BATCH; ++bi)",
        "for (int64_t g = 0; g < GROUPS; ++g)",
        "for (int64_t chunk = 0; chunk < chunks; ++chunk)",
        "for (int64_t j = 0; j < panels; ++j)", "{",
        f"    const int64_t cin0 = g * {cig};",
        "    const int64_t row_end = (chunk + 1) * chunk_rows < M ? (chunk + 1) * chunk_rows : M;",
        "    if (packed_unit != (bi * GROUPS + g) * chunks + chunk)", "    {",
        "        packed_unit = (bi * GROUPS + g) * chunks + chunk;",
        "        for (int64_t b = chunk * chunk_rows / KILN_MR; b * KILN_MR < row_end; ++b)", "        {",
        "            float* panel = pack + b * K * KILN_MR;",
        *["            " + line for line in positions + packing],
        "        }", "    }",
        f"    const float* weights = ctx->packed[{state.packed[kernel]}] + (g * panels + j) * K * KILN_NR;",
        "    const float* ahead = j + 1 < panels ? weights + K * KILN_NR : weights;  /* prefetched meanwhile */",
        "    const int64_t width = N - j * KILN_NR < KILN_NR ? N - j * KILN_NR : KILN_NR;",
        "    for (int64_t row = chunk * chunk_rows; row < row_end; row += KILN_MR)", "    {",
        "        const int rows = (int)(row_end - row < KILN_MR ? row_end - row : KILN_MR);",
        "        kiln_ukernel(rows, K, pack + row * K, 1, KILN_MR, weights, ahead, tile);",
        "        for (int64_t c = 0; c < width; ++c)",
        "            for (int r = 0; r < rows; ++r) by_channel[c * M + row + r] = tile[r * KILN_NR + c];", "    }",
        # One pass per channel over the chunk's pixels: read down the tile's columns, the epilogue was scalar code
        # (GCC vectorizes no stride-32 load) with a remainder of 4 in every 12 rows, whose clamps branched on the
        # data (MobileNetV2's 96 -> 576 1x1 convolution at 14x14 spent 0.65 of its 0.77 ms there).
        "    for (int64_t c = 0; c < width; ++c)",
        "        _Pragma(\"omp simd\") for (int64_t pixel = chunk * chunk_rows; pixel < row_end; ++pixel)", "        {",
        *[f"            {line}" for line in indices],
        f"            const {result_type} acc_value = ({result_type})({value});",
        f"            {target} = {epilogue};",
        "        }", "}",
    ]
    return ["    " + line for line in lines]


def conv_epilogue(kernel: Kernel, channel: str, pixel: str | None = None) -> tuple[list[str], str, str, bool]:
    """A convolution tile's epilogue at (image `bi`, channel `channel`, panel `j`'s pixel column `c`), or at the flat
    output pixel `pixel`: the lines defining its indices, the output element, the fused expression, and whether it
    indexes by flat pixel (else it reads the panel's `out{k}[c]` positions, or divides `pixel` into them)."""
    out = kernel.outputs[0]
    flat_epilogue = _flatten_spatial(kernel.expr, kernel.shape)
    if flat_epilogue is not None:
        # Every operand is contiguous over the spatial dims (or constant across them): index the epilogue by
        # (image, channel, pixel) so its loads and the store run contiguously along the panel's columns.
        flat_shape = [kernel.shape[0], kernel.shape[1], sympy.Mul(*[sympy.sympify(d) for d in kernel.shape[2:]])]
        return ([f"const int64_t i0 = bi, i1 = {channel}, i2 = {pixel or 'j * KILN_NR + c'};"],
                f"{buffer_name(out)}[{_flat(flat_shape)}]", _Exprs(3).render(flat_epilogue), True)
    spatial = len(kernel.shape) - 2
    if pixel is None:
        positions = [f"const int64_t i{2 + k} = out{k}[c];" for k in range(spatial)]
    else:
        positions = [f"int64_t p = {pixel};"]
        for k in reversed(range(spatial)):
            size = dim_expr(kernel.shape[2 + k])
            positions.append(f"const int64_t i{2 + k} = p % {size}; p /= {size};")
    indices = [f"const int64_t i0 = bi, i1 = {channel};", *positions]
    return (indices, f"{buffer_name(out)}[{_flat(kernel.shape)}]", _Exprs(len(kernel.shape)).render(kernel.expr),
            False)


def _flatten_spatial(expr: Any, shape: list) -> Any:
    """The epilogue over (batch, channel, flat pixel) when every Load can be indexed that way, else None."""
    sizes = [sympy.sympify(d) for d in shape[2:]]
    if isinstance(expr, (Accumulator, Constant)):
        return expr
    if isinstance(expr, Load):
        spatial = [sympy.sympify(t) for t in expr.strides[2:]]
        contiguous = all(sympy.expand(spatial[k] - spatial[k + 1] * sizes[k + 1]) == 0 for k in range(len(sizes) - 1))
        if not (contiguous or all(t == 0 for t in spatial)):
            return None
        return Load(expr.buffer, [expr.strides[0], expr.strides[1], spatial[-1]], expr.offset)
    if isinstance(expr, Apply):
        args = []
        for arg in expr.args:
            if isinstance(arg, (Accumulator, Constant, Load, Apply, Gather, Iota, Tile)):
                arg = _flatten_spatial(arg, shape)
                if arg is None:
                    return None
            args.append(arg)
        return dataclasses.replace(expr, args=args)
    return None


def depthwise(kernel: Kernel) -> bool:
    """A float32 1-d or 2-d convolution with one input channel per group (MobileNet's, EfficientNet's and ConvNeXt's
    depthwise convolutions). As an implicit GEMM each group is a one-row product over a handful of taps, packed per
    panel: ConvNeXt's 7x7 over 96 channels at 56x56 ran 5.8x slower than onnxruntime. `_conv_depthwise` and
    `_conv_depthwise_flat` run it as a stencil instead."""
    if kernel.kind != "conv" or not conv_as_gemm(kernel) or len(kernel.shape) not in (3, 4):
        return False
    detail = kernel.detail
    n = len(kernel.shape) - 2
    static = [*detail.stride[:n], *detail.padding[:n], *detail.dilation[:n]]
    return (int(detail.groups) > 1 and same_dim(detail.weight.shape[1], 1)
            and all(sympy.sympify(v).is_Integer for v in static))


_DEPTHWISE_ROWS = 6  # output rows one pass of a depthwise convolution computes, sharing the input rows they read
_DEPTHWISE_LANES = 16  # the widest KILN_LANES: the plane's slack for a pass's last vector of columns
_DEPTHWISE_FUSED_WIDTH = 48  # rows at least this wide take the epilogue in the stencil's pass (`_conv_depthwise`)


def _depthwise_plane(kernel: Kernel) -> tuple[Any, int, Any, Any]:
    """The padded input plane a depthwise unit fills (`_conv_depthwise`): the input rows its outputs read (2-d, from
    -padding on), each split into its column-stride phases of `span` elements (output column c's tap t reads element
    c + (t * dilation) // stride of phase (t * dilation) % stride): rows, phases, span, and the floats it takes with
    the slack a vector of columns past the last row reads."""
    detail = kernel.detail
    n = len(kernel.shape) - 2
    taps = [int(d) for d in detail.weight.shape[2:]]
    stride, dilation = [int(v) for v in detail.stride[:n]], [int(v) for v in detail.dilation[:n]]
    outs = [sympy.sympify(d) for d in kernel.shape[2:]]
    rows = (outs[0] - 1) * stride[0] + (taps[0] - 1) * dilation[0] + 1 if n == 2 else sympy.Integer(1)
    span = outs[-1] + (taps[-1] - 1) * dilation[-1] // stride[-1]
    return rows, stride[-1], span, rows * stride[-1] * span + _DEPTHWISE_LANES


# Markers at the top of each form's C (tests tell the forms apart by them)
ROWS_MARK, FLAT_MARK = "depthwise convolution: rows of a padded plane", "depthwise convolution: flat pixels"
# Which output images take the flat form: a 3x3 (or smaller) kernel's narrower than FLAT_DEPTHWISE_WIDTH, any
# kernel's at most FLAT_DEPTHWISE_NARROW wide. The flat form loads once per tap and output vector; the rows' form
# shares each input load between six output rows, which pays once rows fill their vectors and taps are many.
# Measured at stride 1 (Xeon, one thread, conv + ReLU, ms, rows / flat): 3x3 over 960 channels at 7x7 0.073 /
# 0.027, over 144 at 56x56 0.33 / 0.21 (2 threads: 0.121 / 0.115), over 32 at 112x112 (2 threads) 0.107 / 0.110;
# 7x7 over 768 at 7x7 0.186 / 0.108, over 384 at 14x14 0.121 / 0.251; 5x5 over 240 at 28x28 0.157 / 0.190.
FLAT_DEPTHWISE_WIDTH, FLAT_DEPTHWISE_NARROW, FLAT_DEPTHWISE_TAPS = 64, 8, 9
# Strided, the flat form also copies the stride's phase planes; it takes output images at most this wide (3x3 at
# stride 2, 2 threads, microseconds, rows / flat: 960 channels to 4x4 87 / 48, 576 to 7x7 105 / 61, 192 to 14x14
# 84 / 48, 96 to 56x56 181 / 194; 5x5 over 672 channels to 7x7, one thread, ms: 0.117 / 0.059). At 28x28 its fused
# epilogue decides: with Hugging Face's (0, 1) padding, 144 channels from 56x56, 2 threads, rows / flat, ReLU6
# 62 / 48, SiLU 84-88 / 76; 240 channels ReLU6 133-154 / 81-83; one thread SiLU over 240 channels 274 / 295.
FLAT_DEPTHWISE_STRIDED_WIDTH = 28


def _flat_depthwise(kernel: Kernel) -> bool:
    """A 2-d depthwise convolution with narrow output images (a known width, see FLAT_DEPTHWISE_WIDTH) that
    `_conv_depthwise_flat` runs over the flattened output image, since a row of 7 or 14 columns fills half a vector
    or less: at stride 1 one whose output keeps the input's size (padding 'same') and whose input images are
    contiguous (it reads them in place); strided, one of known sizes whose every stride phase of an input row fits
    an output row (`_FlatPhases`)."""
    detail = kernel.detail
    x, width = detail.input, sympy.sympify(kernel.shape[-1])
    if len(kernel.shape) != 4 or not width.is_Integer:
        return False
    taps = math.prod(int(d) for d in detail.weight.shape[2:])
    if not (int(width) <= FLAT_DEPTHWISE_NARROW or (taps <= FLAT_DEPTHWISE_TAPS and int(width) < FLAT_DEPTHWISE_WIDTH)):
        return False
    if not _strided(kernel):
        return (all(same_dim(kernel.shape[2 + k], x.shape[2 + k]) for k in range(2))
                and same_dim(x.strides[3], 1) and same_dim(x.strides[2], x.shape[3]))
    sizes = [sympy.sympify(d) for d in [*kernel.shape[2:], *x.shape[2:]]]
    return (int(width) <= FLAT_DEPTHWISE_STRIDED_WIDTH and all(d.is_Integer for d in sizes)
            and _FlatPhases(kernel).fits)


def _strided(kernel: Kernel) -> bool:
    """Whether a 2-d convolution steps by more than one in a spatial dim."""
    return any(int(v) != 1 for v in kernel.detail.stride[:2])


class _FlatPhases:
    """A strided `_conv_depthwise_flat`'s input: each (row phase ry, column phase rx) of the stride, the input's
    elements (stride_y * a + ry, stride_x * b + rx), copied to a plane with the output's row pitch, so output pixel p
    = (y, x) reads tap (i, j) at p + fy * Wo + fx of its phase plane, with (fy, ry) = divmod(i * dilation -
    padding, stride) and likewise (fx, rx). Each plane sits in a region of `region` floats, its element (0, 0) at
    `first`, with room for every tap's reads of every pixel; `rows` of it are copied."""

    def __init__(self, kernel: Kernel):
        detail = kernel.detail
        self.stride = [int(v) for v in detail.stride[:2]]
        dilation, padding = [int(v) for v in detail.dilation[:2]], [int(v) for v in detail.padding[:2]]
        taps = [int(d) for d in detail.weight.shape[2:]]
        self.out = [int(d) for d in kernel.shape[2:]]
        self.size = [int(d) for d in detail.input.shape[2:]]
        # per tap: its weight's index, (ry, fy) and (rx, fx)
        self.taps = [(i * taps[1] + j, divmod(i * dilation[0] - padding[0], self.stride[0])[::-1],
                      divmod(j * dilation[1] - padding[1], self.stride[1])[::-1])
                     for i in range(taps[0]) for j in range(taps[1])]
        # a phase's rows and columns: the input's elements at that remainder
        self.phase_rows = [-(-(self.size[0] - r) // self.stride[0]) for r in range(self.stride[0])]
        self.phase_columns = [-(-(self.size[1] - r) // self.stride[1]) for r in range(self.stride[1])]
        self.fits = max(self.phase_columns) <= self.out[1]  # a phase row within the output's row pitch
        fy = [t[1][1] for t in self.taps]
        reach = max(abs(t[2][1]) for t in self.taps)
        self.first = max(0, -min(fy)) * self.out[1] + reach
        self.rows = [max(0, min(rows, self.out[0] + max(fy))) for rows in self.phase_rows]
        self.region = self.first + (self.out[0] + max(0, max(fy))) * self.out[1] + reach + 1


def _flat_reach(kernel: Kernel) -> tuple[Any, Any]:
    """How far a stride-1 `_conv_depthwise_flat`'s taps read before an image's first element and past its last."""
    detail = kernel.detail
    taps = [int(d) for d in detail.weight.shape[2:]]
    dilation, padding = [int(v) for v in detail.dilation[:2]], [int(v) for v in detail.padding[:2]]
    width = sympy.sympify(kernel.shape[3])
    before = padding[0] * width + padding[1]
    after = ((taps[0] - 1) * dilation[0] - padding[0]) * width + (taps[1] - 1) * dilation[1] - padding[1]
    return before, after


def depthwise_scratch(kernel: Kernel) -> Any:
    """Bytes of a depthwise convolution's per-thread scratch: `_conv_depthwise`'s padded input plane and plane of
    sums, or `_conv_depthwise_flat`'s row and column tables, then one image between zeros (stride 1) or the
    planes of the stride's phases."""
    pixels = sympy.Mul(*[sympy.sympify(d) for d in kernel.shape[2:]])
    if _flat_depthwise(kernel):
        if not _strided(kernel):
            return (3 * pixels + sum(_flat_reach(kernel))) * 4
        phases = _FlatPhases(kernel)
        return (2 * pixels + math.prod(phases.stride) * phases.region) * 4
    *_, plane = _depthwise_plane(kernel)
    return (plane + pixels) * 4


def _conv_depthwise_flat(kernel: Kernel) -> list[str]:
    """A depthwise convolution of narrow images over each output image as one flat loop of pixels.

    At stride 1 ('same' padding), output pixel p = (y, x) reads tap (i, j) at p + (i * dilation - padding) * W +
    j * dilation - padding of its input image: one contiguous vector load per tap, straight from the input. A tap
    that falls in the padding (a row above or below the image, or a column that crosses into the neighbouring row)
    reads a neighbouring element, which kiln_keep_or_zero replaces by zero by the pixel's row and column (tables
    filled once per thread). The loads stay unconditional: as masked loads (a select) they ran 8x slower. An image
    whose reads would leave its buffer (the first and last in memory) is copied between zeros first. Strided, the
    unit first copies each phase of the stride to a plane of the output's row pitch (`_FlatPhases`), and each tap
    reads one of those the same way. So a 7x7 image takes 4 vectors where rows of 7 take 7 half-empty ones, and the
    bias and the fused epilogue run in the same loop."""
    detail = kernel.detail
    x, taps = detail.input, [int(d) for d in detail.weight.shape[2:]]
    height, width = (dim_expr(d) for d in kernel.shape[2:])
    strided = _strided(kernel)
    start = _view_index(x, ["bi", "g", "0", "0"])
    reads = []
    if strided:
        phases = _FlatPhases(kernel)
        rows_out, columns_out = phases.out
        for index, (ry, fy), (rx, fx) in phases.taps:
            inside = ([f"y >= {-fy}"] if fy < 0 else []) + \
                     ([f"y < {phases.phase_rows[ry] - fy}"] if rows_out - 1 + fy >= phases.phase_rows[ry] else []) + \
                     ([f"x >= {-fx}"] if fx < 0 else []) + \
                     ([f"x < {phases.phase_columns[rx] - fx}"]
                      if columns_out - 1 + fx >= phases.phase_columns[rx] else [])
            reads.append(_depthwise_tap(index, f"phase{ry}_{rx}[pixel + ({fy}) * W + ({fx})]", inside))
        used = sorted({(ry, rx) for _, (ry, _), (rx, _) in phases.taps})
        element = ["bi", "g", f"({phases.stride[0]} * a + ry)", f"({phases.stride[1]} * b + rx)"]
        source = f"{buffer_name(x.buffer)}[{_view_index(x, element)}]"
        prepare = ["float* restrict phases = (float*)(columns + H * W);  /* the planes of the stride's phases */"]
        unit = []
        for ry, rx in used:
            plane = f"phases + {(ry * phases.stride[1] + rx) * phases.region} + {phases.first}"
            unit += [f"float* restrict phase{ry}_{rx} = {plane};",
                     f"for (int64_t a = 0; a < {phases.rows[ry]}; ++a)", "{",
                     f"    const int64_t ry = {ry}, rx = {rx};",
                     f"    _Pragma(\"omp simd\") for (int64_t b = 0; b < {phases.phase_columns[rx]}; ++b) "
                     f"phase{ry}_{rx}[a * W + b] = {source};", "}"]
    else:
        dilation, padding = [int(v) for v in detail.dilation[:2]], [int(v) for v in detail.padding[:2]]
        for i in range(taps[0]):
            for j in range(taps[1]):
                dy, dx = i * dilation[0] - padding[0], j * dilation[1] - padding[1]
                inside = ([f"y >= {-dy}"] if dy < 0 else [f"y < h - {dy}"] if dy > 0 else []) + \
                         ([f"x >= {-dx}"] if dx < 0 else [f"x < w - {dx}"] if dx > 0 else [])
                reads.append(_depthwise_tap(i * taps[1] + j, f"image[pixel + ({dy}) * W + ({dx})]", inside))
        before, after = (dim_expr(v) for v in _flat_reach(kernel))
        prepare = [f"const int64_t BEFORE = {before}, AFTER = {after};",
                   "const int32_t h = (int32_t)H, w = (int32_t)W;",
                   "float* restrict padded = (float*)(columns + H * W);  /* an image between zeros */"]
        unit = [f"const int64_t start = {start};",
                f"const float* image = {buffer_name(x.buffer)} + start;",
                f"if (start < BEFORE || start + H * W + AFTER > {dim_expr(x.buffer.numel)})", "{",
                "    for (int64_t m = 0; m < BEFORE + H * W + AFTER; ++m) "
                "padded[m] = m >= BEFORE && m < BEFORE + H * W ? image[m - BEFORE] : 0.0f;",
                "    image = padded + BEFORE;", "}"]
    body = ["_Pragma(\"omp simd\") for (int64_t pixel = 0; pixel < H * W; ++pixel)", "{",
            "    const int32_t y = rows[pixel], x = columns[pixel];",
            "    float a = 0.0f;",
            *[f"    {line}" for line in reads + _depthwise_finish(kernel)("a")], "}"]
    lines = [f"/* {FLAT_MARK} */", _depthwise_counts(kernel),
             f"const int64_t H = {height}, W = {width};  /* the output's */",
             "int32_t* restrict rows = (int32_t*)(ctx->scratch + (size_t)omp_get_thread_num() * ctx->scratch_stride);",
             "int32_t* restrict columns = rows + H * W;",
             *prepare,
             "for (int64_t y = 0; y < H; ++y) for (int64_t m = 0; m < W; ++m) "
             "{ rows[y * W + m] = (int32_t)y; columns[y * W + m] = (int32_t)m; }",
             *_depthwise_units(kernel, unit, body)]
    return ["    " + line for line in lines]


def _conv_depthwise(kernel: Kernel) -> list[str]:
    """A depthwise convolution as a stencil over each (image, group)'s input plane.

    The unit copies the plane into the thread's scratch with zeros for the padding, each row split into its
    column-stride phases (`_depthwise_plane`), so every tap of an output row reads a contiguous run with no range
    checks. For each of the group's output channels, one pass computes _DEPTHWISE_ROWS output rows a vector of
    KILN_LANES columns at a time: each input row they share is loaded once for all of them, the taps' weights stay in
    registers, and each output sums its taps in ATen's order with fused multiply-adds (KILN_FMAF). The vector's
    columns past the row read the plane's slack. Rows of _DEPTHWISE_FUSED_WIDTH columns or more then take the
    bias and the fused epilogue straight into the output; narrower ones are stored by kiln_store_lanes into a plane
    of sums laid out as the output, and the bias and epilogue run over that plane as one flat vectorized loop.
    Narrow images (see FLAT_DEPTHWISE_WIDTH) take `_conv_depthwise_flat` instead."""
    detail = kernel.detail
    x, w = detail.input, detail.weight
    n = len(kernel.shape) - 2
    taps = [int(d) for d in w.shape[2:]]
    stride, padding, dilation = ([int(v) for v in values[:n]] for values in (detail.stride, detail.padding,
                                                                              detail.dilation))
    rows, phases, span, plane_floats = _depthwise_plane(kernel)
    ins = [dim_expr(d) for d in x.shape[2:]]
    outs = [dim_expr(d) for d in kernel.shape[2:]]
    width = outs[-1]

    def column(m: str) -> str:  # the input column of phase q's element m
        return f"({m} * {phases} + q - {padding[-1]})"
    source_rows = ["(p0 - " + str(padding[0]) + ")"] if n == 2 else []
    load = f"{buffer_name(x.buffer)}[{_view_index(x, ['bi', 'g', *source_rows, column('m')])}]"
    inside = f"p0 - {padding[0]} >= 0 && p0 - {padding[0]} < {ins[0]}" if n == 2 else "1"
    copy = phase_copy(f"float* restrict row = plane + (p0 * {phases} + q) * span;", inside, column, ins[-1], load,
                      "0.0f")
    fill = ["for (int64_t p0 = 0; p0 < rows; ++p0)", f"for (int64_t q = 0; q < {phases}; ++q)", "{",
            *[f"    {line}" for line in copy], "}"]

    finish = _depthwise_finish(kernel)
    # Rows of 48 columns or more take the bias and epilogue in the pass (their last, partial vector is a small part
    # of the row); narrower ones store sums and run them in one loop over the plane, where the per-row loops over
    # a partial vector cost more than the plane's round trip (Xeon, one thread: 7x7 over 384 channels at 14x14,
    # 0.121 ms through the plane, 0.170 in the pass; 3x3 over 32 channels at 112x112, 0.315 and 0.220)
    fused = sympy.sympify(kernel.shape[-1]).is_Integer and int(kernel.shape[-1]) >= _DEPTHWISE_FUSED_WIDTH

    def output_pass(count: int) -> list[str]:
        """Output rows [ob, ob + count) (2-d; a 1-d row is one), KILN_LANES columns at a time."""
        span_rows = (count - 1) * stride[0] + (taps[0] - 1) * dilation[0] + 1 if n == 2 else 1
        pointers: dict[str, str] = {}  # name -> its definition, each input phase row the pass reads
        reads = []
        for j in range(span_rows):
            for t in range(taps[-1]):
                q, offset = (t * dilation[-1]) % phases, (t * dilation[-1]) // phases
                users = [(r, int(np.ravel_multi_index((tb, t), taps)) if n == 2 else t)
                         for r in range(count) for tb in (range(taps[0]) if n == 2 else [0])
                         if n == 1 or r * stride[0] + tb * dilation[0] == j]
                if not users:
                    continue
                name = f"in{j}_{q}"
                row = f"(ob * {stride[0]} + {j})" if n == 2 else "0"
                pointers.setdefault(name, f"const float* restrict {name} = plane + ({row} * {phases} + {q}) * span "
                                          "+ c0;")
                reads.append(f"{{ const float v = {name}[c + {offset}]; "
                             + " ".join(f"a{r} = KILN_FMAF(w{index}, v, a{r});" for r, index in users) + " }")
        accumulators = ", ".join(f"a{r} = 0.0f" for r in range(count))
        return ["for (int64_t c0 = 0; c0 < " + width + "; c0 += KILN_LANES)", "{",
                *[f"    {line}" for line in pointers.values()],
                "    _Pragma(\"omp simd\") for (int64_t c = 0; c < KILN_LANES; ++c)", "    {",
                f"        float {accumulators};", *[f"        {line}" for line in reads],
                *[f"        block[{r}][c] = a{r};" for r in range(count)], "    }",
                f"    const int lanes = (int)({width} - c0 < KILN_LANES ? {width} - c0 : KILN_LANES);",
                *(stored_finish(count) if fused else
                  [f"    kiln_store_lanes(sums + (ob + {r}) * {width} + c0, block[{r}], lanes);"
                   for r in range(count)]), "}"]

    def stored_finish(count: int) -> list[str]:
        """Each of the pass's rows' columns through the bias and the epilogue, into the output."""
        return [f"    for (int r = 0; r < {count}; ++r)", "    {",
                f"        const int64_t row_start = (ob + r) * {width} + c0;",
                "        _Pragma(\"omp simd\") for (int64_t c = 0; c < lanes; ++c)", "        {",
                "            const int64_t pixel = row_start + c;",
                *[f"            {line}" for line in finish("block[r][c]")], "        }", "    }"]

    if n == 2:
        compute = ["int64_t ob = 0;",
                   f"for (; ob + {_DEPTHWISE_ROWS} <= {outs[0]}; ob += {_DEPTHWISE_ROWS})", "{",
                   *[f"    {line}" for line in output_pass(_DEPTHWISE_ROWS)], "}"]
        height = sympy.sympify(kernel.shape[2])
        if height.is_Integer:  # the rows left over, in one pass
            if int(height) % _DEPTHWISE_ROWS:
                compute += ["{", *[f"    {line}" for line in output_pass(int(height) % _DEPTHWISE_ROWS)], "}"]
        else:
            compute += [f"for (; ob < {outs[0]}; ++ob)", "{", *[f"    {line}" for line in output_pass(1)], "}"]
    else:
        compute = ["const int64_t ob = 0;", *output_pass(1)]
    if not fused:
        compute += [f"_Pragma(\"omp simd\") for (int64_t pixel = 0; pixel < {' * '.join(outs)}; ++pixel)", "{",
                    *[f"    {line}" for line in finish("sums[pixel]")], "}"]
    lines = [f"/* {ROWS_MARK} */", _depthwise_counts(kernel),
             f"const int64_t rows = {dim_expr(rows)}, span = {dim_expr(span)};",
             "float* restrict plane = (float*)(ctx->scratch + (size_t)omp_get_thread_num() * ctx->scratch_stride);",
             f"float* restrict sums = plane + {dim_expr(plane_floats)};  /* the output plane's sums */",
             f"float block[{_DEPTHWISE_ROWS}][KILN_LANES] __attribute__((aligned(64)));",
             # the slack the last rows' vectors read past the plane: zeros, not whatever the scratch held before
             # (reinterpreted integers are denormals, and a multiply-add of one takes a microcode assist: a 7x7
             # image's depthwise convolution ran 3x slower on them)
             f"for (int m = 0; m < {_DEPTHWISE_LANES}; ++m) plane[rows * {phases} * span + m] = 0.0f;",
             *_depthwise_units(kernel, fill, compute)]
    return ["    " + line for line in lines]


def _depthwise_finish(kernel: Kernel) -> Any:
    """A function from a C sum of output pixel `pixel`'s taps (channel oc) to the lines adding the bias and storing
    it through the fused epilogue."""
    bias = kernel.detail.bias
    indices, target, epilogue, _ = conv_epilogue(kernel, "oc", pixel="pixel")
    value_bias = f" + (double){buffer_name(bias.buffer)}[{_view_index(bias, ['i1'])}]" if bias is not None else ""
    result_type = accumulator_type(kernel)
    return lambda total: [*indices, f"const {result_type} acc_value = ({result_type})((double){total}{value_bias});",
                          f"{target} = {epilogue};"]


def _depthwise_tap(index: int, load: str, inside: list[str]) -> str:
    """A tap's multiply-add into `a`; `inside` (C conditions) false zeroes the loaded element (kiln_keep_or_zero)."""
    value = f"kiln_keep_or_zero({load}, {' && '.join(inside)})" if inside else load
    return f"a = KILN_FMAF(w{index}, {value}, a);"


def _depthwise_counts(kernel: Kernel) -> str:
    """C defining a depthwise convolution's BATCH, GROUPS and MULTIPLIER (output channels per group)."""
    groups = int(kernel.detail.groups)
    multiplier = dim_expr(sympy.sympify(kernel.shape[1]) / groups)
    return f"const int64_t BATCH = {dim_expr(kernel.shape[0])}, GROUPS = {groups}, MULTIPLIER = {multiplier};"


def _depthwise_units(kernel: Kernel, unit: list[str], body: list[str]) -> list[str]:
    """The team's loop over a depthwise convolution's (image bi, group g) units: `unit` once per unit, then for each
    of the group's output channels oc its taps' weights w0, w1, ... in registers and `body`."""
    w = kernel.detail.weight
    taps = math.prod(int(d) for d in w.shape[2:])
    return ["#pragma omp for collapse(2) schedule(static)",
            "for (int64_t bi = 0; bi < BATCH; ++bi)",
            "for (int64_t g = 0; g < GROUPS; ++g)", "{",
            *[f"    {line}" for line in unit],
            "    for (int64_t j = 0; j < MULTIPLIER; ++j)", "    {",
            "        const int64_t oc = g * MULTIPLIER + j;",
            f"        const float* restrict tap_weights = {buffer_name(w.buffer)} + {dim_expr(w.offset)} "
            f"+ oc * {taps};",
            *[f"        const float w{index} = tap_weights[{index}];" for index in range(taps)],
            *[f"        {line}" for line in body], "    }", "}"]


def render_conv(kernel: Kernel, state: RenderState) -> list[str]:
    """Direct convolution, one output element per iteration, double accumulator, fused epilogue."""
    if depthwise(kernel):
        return _conv_depthwise_flat(kernel) if _flat_depthwise(kernel) else _conv_depthwise(kernel)
    if conv_as_gemm(kernel):
        return _conv_gemm_f32(kernel, state)
    if kernel.detail.transposed:
        return _conv_transposed(kernel)
    detail = kernel.detail
    x, w = detail.input, detail.weight
    n = len(kernel.shape) - 2
    groups = detail.groups
    cig = dim_expr(w.shape[1])
    body = ["double acc = 0.0;  /* double accumulation: matches the reference within float32 tolerance */",
            f"const int64_t cin0 = (i1 / {dim_expr(sympy.sympify(kernel.shape[1]) / groups)}) * {cig};"]
    # The kernel taps whose input position lies inside the input (padding contributes zero): r in [lo, hi).
    for k in range(n):
        stride, dilation = int(detail.stride[k]), int(detail.dilation[k])
        padding = dim_expr(detail.padding[k])  # symbolic for padding='same' with a symbolic kernel size
        size, taps = dim_expr(x.shape[2 + k]), dim_expr(w.shape[2 + k])
        body += [f"const int64_t base{k} = i{2 + k} * {stride} - {padding};",
                 f"const int64_t lo{k} = base{k} >= 0 ? 0 : (-base{k} + {dilation - 1}) / {dilation};",
                 f"int64_t hi{k} = ({size} - base{k} + {dilation - 1}) / {dilation}; "
                 f"if (hi{k} > {taps}) hi{k} = {taps};"]
    body += [f"for (int64_t c = 0; c < {cig}; ++c)", "{"]
    depth = "    "
    positions = []
    for k in range(n):
        dilation = int(detail.dilation[k])
        body += [f"{depth}for (int64_t r{k} = lo{k}; r{k} < hi{k}; ++r{k})", f"{depth}{{",
                 f"{depth}    const int64_t p{k} = base{k} + r{k} * {dilation};"]
        depth += "    "
        positions.append(f"p{k}")
    x_index = _view_index(x, ["i0", "(cin0 + c)", *positions])
    w_index = _view_index(w, ["i1", "c", *[f"r{k}" for k in range(n)]])
    return _loops(kernel.shape, body + _multiply_accumulate(kernel, depth, x_index, w_index))


def _multiply_accumulate(kernel: Kernel, depth: str, x_index: str, w_index: str) -> list[str]:
    """The innermost line of a direct convolution's tap loops, closing them, then bias and the epilogue."""
    detail, out = kernel.detail, kernel.outputs[0]
    x, w, bias = detail.input, detail.weight, detail.bias
    lines = [f"{depth}acc += (double){buffer_name(x.buffer)}[{x_index}] * (double){buffer_name(w.buffer)}[{w_index}];"]
    while len(depth) > 4:  # the tap loops; then the input-channel loop at the top level
        depth = depth[:-4]
        lines.append(f"{depth}}}")
    lines.append("}")
    if bias is not None:
        lines.append(f"acc += (double){buffer_name(bias.buffer)}[{_view_index(bias, ['i1'])}];")
    result_type = accumulator_type(kernel)
    return lines + [f"const {result_type} acc_value = ({result_type})acc;",
                    f"{buffer_name(out)}[{_flat(kernel.shape)}] = {_Exprs(len(kernel.shape)).render(kernel.expr)};"]


def _conv_transposed(kernel: Kernel) -> list[str]:
    """Transposed convolution as a gather per output element: input position i contributes through tap r where
    o = i * stride - padding + r * dilation, i.e. i = (o + padding - r * dilation) / stride when that divides
    exactly and lies inside the input. Weights are [C_in, C_out / groups, taps...]; double accumulator."""
    detail = kernel.detail
    x, w = detail.input, detail.weight
    n = len(kernel.shape) - 2
    groups = int(detail.groups)
    cout_per_group = dim_expr(w.shape[1])
    cin_per_group = dim_expr(sympy.sympify(x.shape[1]) / groups)
    body = ["double acc = 0.0;  /* double accumulation: matches the reference within float32 tolerance */",
            f"const int64_t g = i1 / {cout_per_group}, co = i1 % {cout_per_group};",
            f"for (int64_t c = g * {cin_per_group}; c < (g + 1) * {cin_per_group}; ++c)", "{"]
    depth = "    "
    for k in range(n):
        stride, padding, dilation = int(detail.stride[k]), int(detail.padding[k]), int(detail.dilation[k])
        body += [f"{depth}for (int64_t r{k} = 0; r{k} < {dim_expr(w.shape[2 + k])}; ++r{k})", f"{depth}{{",
                 f"{depth}    const int64_t q{k} = i{2 + k} + {padding} - r{k} * {dilation};",
                 f"{depth}    if (q{k} < 0 || q{k} % {stride} != 0 || q{k} / {stride} >= {dim_expr(x.shape[2 + k])}) "
                 "continue;",
                 f"{depth}    const int64_t p{k} = q{k} / {stride};"]
        depth += "    "
    x_index = _view_index(x, ["i0", "c", *[f"p{k}" for k in range(n)]])
    w_index = _view_index(w, ["c", "co", *[f"r{k}" for k in range(n)]])
    return _loops(kernel.shape, body + _multiply_accumulate(kernel, depth, x_index, w_index))
