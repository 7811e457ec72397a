"""The C renderer's integer kernels (kiln_qgemm.h): quantized linear layers, direct and im2col convolutions, average
pools and weight-only layers; their per-thread scratch and the weight packing kiln_create does for them."""

from __future__ import annotations

import math
from typing import Any

import sympy

from kiln.codegen.c.ctext import (
    RenderState, _allocate, _chunking, _Exprs, _flat, _loops, _shared_units, buffer_name, c_type, dim_expr,
    identifier, literal,
)
from kiln.codegen.kernels import Buffer, Kernel, QConvDetail, QLinearDetail, QPoolDetail
from kiln.ir import dtypes


def _epilogue_columns(detail: QLinearDetail | QConvDetail, first_column: str, columns: str = "KILN_QNR") -> list[str]:
    """Per panel (`colsum`, `width` defined): its `columns` output channels' constants for kiln_qepilogue, zero past
    `width` so whole tile rows compute: zero point x column sum, x_scale x weight scale, bias."""
    def column(view: Any) -> str:  # a [N] operand at column n
        return f"{buffer_name(view.buffer)}[{dim_expr(view.offset)} + n * {dim_expr(view.strides[0])}]"
    bias = detail.bias
    # per token, the activations' scale and zero point multiply in per row (_token_epilogue)
    per_token = isinstance(detail, QLinearDetail) and detail.per_token
    zero, x_scale = ("1", "1.0f") if per_token else ("x_zero_point", "x_scale")
    return [
        f"int32_t zcol[{columns}] __attribute__((aligned(64)));",
        f"float scale[{columns}] __attribute__((aligned(64))), bias[{columns}] __attribute__((aligned(64)));",
        f"for (int64_t c = 0; c < {columns}; ++c)", "{",
        f"    const int64_t n = {first_column} + c;",
        f"    zcol[c] = {zero} * colsum[c];",
        f"    scale[c] = c < width ? {x_scale} * {column(detail.weight_scale)} : 0.0f;",
        f"    bias[c] = c < width ? {column(bias) if bias is not None else '0.0f'} : 0.0f;",
        "}",
    ]


# quant.QLINEAR_POST_OPS as kiln_qepilogue's post-op codes
_POST_OPS = {"none": "KILN_QPOST_NONE", "relu": "KILN_QPOST_RELU", "gelu": "KILN_QPOST_GELU",
             "gelu_tanh": "KILN_QPOST_GELU_TANH"}


def _output_form(detail: QLinearDetail | QConvDetail, out: Buffer) -> tuple[str, float, float, float]:
    """kiln_qepilogue's output kind, zero point and clamp [low, high] for an integer kernel's output."""
    kind = {dtypes.float32: "KILN_QOUT_F32", dtypes.uint8: "KILN_QOUT_U8", dtypes.int8: "KILN_QOUT_S8"}[out.dtype]
    if out.dtype == dtypes.float32:
        return kind, 0.0, 0.0, 0.0
    return kind, float(detail.output_zero_point), float(detail.quant_min), float(detail.quant_max)


def _epilogue(detail: QLinearDetail | QConvDetail, out: Buffer, row: str, target: str,
              residual: tuple[str, str] | None = None, columns: tuple[str, str] = ("zcol", "scale")) -> str:
    """kiln_qepilogue of tile row `row` into `target` (a pointer): the zero point's correction, scales, bias, the
    residual (a pointer to its first column's element, and the stride between columns), the post-op, and float32
    or requantized output (round half to even, the zero point, the clamp, as quantize_per_tensor does)."""
    kind, zero_point, low, high = _output_form(detail, out)
    bias = "bias" if detail.bias is not None else "NULL"
    extra, stride = residual or ("NULL", "0")
    return (f"kiln_qepilogue(tile + ({row}) * KILN_QNR, {columns[0]}, {columns[1]}, {bias}, 1, {extra}, {stride}, "
            f"{_POST_OPS[detail.post_op]}, {kind}, output_inverse_scale, {zero_point!r}f, {low!r}f, "
            f"{high!r}f, width, {target});")


def _qparams(detail: QLinearDetail | QConvDetail) -> list[str]:
    """x_scale, x_zero_point (int8 activations are read as uint8 with the sign bit flipped, x + 128: the zero point
    moves with them) and the output's inverse scale, as constants of the kernel."""
    scalars = _Exprs(0)
    if isinstance(detail, QLinearDetail) and detail.per_token:  # per row: read where each row's epilogue runs
        return [_output_inverse_scale(detail), "(void)output_inverse_scale;"]

    def qparam(value: Any) -> str:  # a number, or the .tensor overload's one-element tensor
        return literal(value) if isinstance(value, (int, float)) else scalars.render(value)
    return [f"const float x_scale = (float)({qparam(detail.x_scale)});",
            f"const int32_t x_zero_point = (int32_t)({qparam(detail.x_zero_point)})"
            f" + {128 if detail.signed else 0};",
            _output_inverse_scale(detail), "(void)output_inverse_scale;"]


def _token_epilogue(detail: QLinearDetail, out: Buffer, row: str, target: str) -> list[str]:
    """The epilogue of tile row `row` (activation row `m`) of a per-token layer: its zero point's correction and its
    scale (float32, as the dequantized activations' product is formed in the reference) times the panel's column
    sums and weight scales, then kiln_qepilogue."""
    def element(view: Any) -> str:
        return f"{buffer_name(view.buffer)}[{dim_expr(view.offset)} + m]"
    return [
        "{",
        f"    const int64_t m = row + ({row});",
        f"    const float row_scale = (float){element(detail.x_scale)};",
        f"    const int32_t row_zero = (int32_t){element(detail.x_zero_point)} + {128 if detail.signed else 0};",
        "    int32_t zrow[KILN_QNR] __attribute__((aligned(64)));",
        "    float srow[KILN_QNR] __attribute__((aligned(64)));",
        "    for (int64_t c = 0; c < KILN_QNR; ++c) { zrow[c] = row_zero * zcol[c]; srow[c] = row_scale * scale[c]; }",
        f"    {_epilogue(detail, out, row, target, columns=('zrow', 'srow'))}",
        "}",
    ]


def _output_inverse_scale(detail: QLinearDetail | QConvDetail | QPoolDetail) -> str:
    """The kernel's constant 1 / output_scale, in float32 as quantize_per_tensor multiplies by it."""
    return f"const float output_inverse_scale = (float)(1.0 / {literal(float(detail.output_scale))});"


def _weight_panels(kernel: Kernel, state: RenderState, n: str, scratch: str) -> tuple[list[str], list[str]]:
    """(setup lines, per-panel lines) that define `panel` and `colsum` for panel j of the [n x K] weight at `w`:
    packed when the model is created, or (a weight that is an input) packed by the unit into its scratch."""
    narrow = int(kernel.detail.narrow)
    if kernel in state.packed:
        return ([f"const char* packed = (const char*)ctx->packed[{state.packed[kernel]}];"],
                [f"const void* panel = packed_group + j * kiln_qpanel_stride(K, {narrow});",
                 f"const int32_t* colsum = (const int32_t*)(packed_group + kiln_qpanel_bytes(K, {n}, {narrow}))"
                 " + j * KILN_QNR;"])
    weight = kernel.detail.weight
    return ([f"void* pack = (void*)({scratch});",
             f"int32_t* pack_sums = (int32_t*)((char*)pack + kiln_qpanel_bytes(K, KILN_QNR, {narrow}));",
             f"const int8_t* w = (const int8_t*){buffer_name(weight.buffer)} + {dim_expr(weight.offset)};"],
            [f"kiln_qpack_panel(K, {n}, j, w_group, pack, pack_sums, {narrow});",
             "const void* panel = pack; const int32_t* colsum = pack_sums;"])


def _flip(detail: QLinearDetail | QConvDetail) -> str:
    """The byte kiln_qgemm.h XORs into int8 activations to read them as uint8 (x + 128)."""
    return "0x80u" if detail.signed else "0u"


def _qlinear(kernel: Kernel, state: RenderState) -> list[str]:
    """quant.qlinear_pointwise on kiln_qgemm.h: the team shares (row chunk, panel) units, each running steps of
    KILN_QROWS rows (a register tile, or AMX tiles) down its rows against one weight panel. Consecutive units of a
    thread share their rows, which an AMX step copies once (kiln_qrow_block) where it cannot read them in place."""
    detail, out = kernel.detail, kernel.outputs[0]
    rows = detail.x
    scratch = "ctx->scratch + (size_t)omp_get_thread_num() * ctx->scratch_stride"
    narrow = int(detail.narrow)
    setup, per_panel = _weight_panels(kernel, state, "N", f"{scratch} + kiln_qrow_block_bytes(K, M, {narrow})")
    lines = [
        f"const int64_t M = {dim_expr(detail.m)}, N = {dim_expr(detail.n)}, K = {dim_expr(detail.k)};",
        *_chunking("panels", qnarrow=str(narrow)), *setup,
        "const char* packed_group = packed;" if kernel in state.packed else "const int8_t* w_group = w;",
        f"const uint8_t* x = (const uint8_t*)({buffer_name(rows.buffer)} + {dim_expr(rows.offset)});",
        f"kiln_qrow_block block = {{(uint8_t*)({scratch}), -1}};",
        *_qparams(detail),
        "kiln_qbegin();",
        # Static shares: each thread streams a contiguous run of panels and copies its rows once (the int8 MLP at
        # batch 32 took 0.93-0.95x the time of dynamic chunks' on an AMX Xeon; convolutions keep dynamic chunks)
        "#pragma omp for collapse(2) schedule(static)",
        "for (int64_t chunk = 0; chunk < chunks; ++chunk)",
        "for (int64_t j = 0; j < panels; ++j)", "{",
        "    const int64_t row_end = (chunk + 1) * chunk_rows < M ? (chunk + 1) * chunk_rows : M;",
        "    const int64_t width = N - j * KILN_QNR < KILN_QNR ? N - j * KILN_QNR : KILN_QNR;",
        *[f"    {line}" for line in per_panel],
        *[f"    {line}" for line in _epilogue_columns(detail, "j * KILN_QNR")],
        "    for (int64_t row = chunk * chunk_rows; row < row_end; row += KILN_QROWS)", "    {",
        "        const int rows = (int)(row_end - row < KILN_QROWS ? row_end - row : KILN_QROWS);",
        f"        kiln_qlinear_step(rows, row, chunk * chunk_rows, row_end, K, x, {_flip(detail)}, panel, tile, "
        f"{narrow}, &block);",
        "        for (int r = 0; r < rows; ++r)",
        *([f"        {line}" for line in _token_epilogue(detail, out, 'r',
                                                          f'{buffer_name(out)} + (row + r) * N + j * KILN_QNR')]
          if detail.per_token else
          [f"            {_epilogue(detail, out, 'r', f'{buffer_name(out)} + (row + r) * N + j * KILN_QNR')}"]),
        "    }", "}",
        "kiln_qend();",
    ]
    return ["    " + line for line in lines if line]


# Above this many rows a weight-only layer dequantizes each panel to float once and runs the float32 micro-kernel
# (GPT-2 small at 128 tokens: converting in registers took 1.3x the float32 time, the float panels ~1x); at or below,
# its weights convert in registers (memory-bound decoding reads a quarter / an eighth of float32's bytes).
_WEIGHT_ONLY_FLOAT_ROWS = 16


def _wpanel_bytes(kernel: Kernel) -> Any:
    """An upper bound of kiln_wpanel_bytes for a weight-only kernel (int8 bytes, 32 columns), a multiple of 64."""
    k = sympy.sympify(kernel.detail.k)
    return 64 * sympy.ceiling((k * 32 + 64 + k / int(kernel.detail.group_size) * 2 * 32 * 4) / 64)


def _wlinear(kernel: Kernel, state: RenderState) -> list[str]:
    """quant.linear_weight_only (kiln_qgemm.h's weight-only micro-kernel): the team shares (row chunk, panel) units;
    each tile of float sums gets the bias and is stored."""
    detail, out = kernel.detail, kernel.outputs[0]
    rows, bits, group_size = detail.x, int(detail.bits), int(detail.group_size)
    if kernel in state.packed:
        panel = [f"const unsigned char* panel = (const unsigned char*)ctx->packed[{state.packed[kernel]}] + "
                 f"(size_t)j * kiln_wpanel_bytes(K, {group_size}, {bits});"]
    else:  # weights that are inputs: each unit packs its panel into scratch
        zero_points = detail.zero_points
        zeros = f"{_view_start(zero_points)}, {zero_points.buffer.dtype.itemsize}" if zero_points else "NULL, 0"
        panel = ["unsigned char* panel = (unsigned char*)(ctx->scratch + (size_t)omp_get_thread_num() * "
                 "ctx->scratch_stride);  /* below the float panel */",
                 f"kiln_wpack_panel(K, N, {group_size}, {bits}, j, (const int8_t*){_view_start(detail.weight)}, 0, "
                 f"(const float*){_view_start(detail.scales)}, {zeros}, panel);"]
    value = "tile[r * KILN_WNR + c]"
    if detail.bias is not None:
        bias = detail.bias
        value += f" + {buffer_name(bias.buffer)}[{dim_expr(bias.offset)} + n * {dim_expr(bias.strides[0])}]"
    lines = [
        f"const int64_t M = {dim_expr(detail.m)}, N = {dim_expr(detail.n)}, K = {dim_expr(detail.k)};",
        # Few rows (decoding) take the weights in registers; many (prefill, batches) dequantize panels to float.
        f"const int many_rows = M > {_WEIGHT_ONLY_FLOAT_ROWS};",
        "const int64_t mr = many_rows ? KILN_MR : KILN_WMR;",
        "const int64_t panels = kiln_wpanels(N), row_blocks = (M + mr - 1) / mr;",
        "const int64_t units = panels, wanted = 4 * (int64_t)omp_get_num_threads();",
        "int64_t chunks = units >= wanted || units == 0 ? 1 : (wanted + units - 1) / units;",
        "if (chunks > row_blocks) chunks = row_blocks;",
        "if (chunks < 1) chunks = 1;",
        "const int64_t chunk_rows = (row_blocks + chunks - 1) / chunks * mr;",
        "float tile[KILN_WMR * KILN_WNR] __attribute__((aligned(64)));",
        "float ftile[KILN_MR * KILN_NR] __attribute__((aligned(64)));",
        "float* floats = (float*)(ctx->scratch + (size_t)omp_get_thread_num() * ctx->scratch_stride + "
        f"{dim_expr(_wpanel_bytes(kernel))});  /* after a panel packed per call */",
        f"const float* x = {_view_start(rows)};",
        "#pragma omp for collapse(2) schedule(static)",
        "for (int64_t chunk = 0; chunk < chunks; ++chunk)",
        "for (int64_t j = 0; j < panels; ++j)", "{",
        *[f"    {line}" for line in panel],
        "    const int64_t row_end = (chunk + 1) * chunk_rows < M ? (chunk + 1) * chunk_rows : M;",
        "    const int64_t width = N - j * KILN_WNR < KILN_WNR ? N - j * KILN_WNR : KILN_WNR;",
        # Many rows: dequantize the panel once (the reference's values) and run the float32 micro-kernel on it.
        "    if (many_rows)", "    {",
        f"        kiln_wpanel_to_float(K, {group_size}, {bits}, panel, floats);",
        "        for (int64_t row = chunk * chunk_rows; row < row_end; row += KILN_MR)", "        {",
        "            const int rows = (int)(row_end - row < KILN_MR ? row_end - row : KILN_MR);",
        "            kiln_ukernel(rows, K, x + row * K, K, 1, floats, floats, ftile);",
        "            for (int r = 0; r < rows; ++r)",
        "                _Pragma(\"omp simd\") for (int64_t c = 0; c < width; ++c)", "                {",
        "                    const int64_t n = j * KILN_WNR + c;",
        f"                    {buffer_name(out)}[(row + r) * N + n] = "
        f"{value.replace('tile[r * KILN_WNR + c]', 'ftile[r * KILN_NR + c]')};",
        "                }", "        }",
        "        continue;", "    }",
        "    for (int64_t row = chunk * chunk_rows; row < row_end; row += KILN_WMR)", "    {",
        "        const int rows = (int)(row_end - row < KILN_WMR ? row_end - row : KILN_WMR);",
        f"        kiln_wukernel(rows, K, {group_size}, {bits}, {int(detail.zero_points is not None)}, x + row * K, "
        "K, panel, tile);",
        "        for (int r = 0; r < rows; ++r)",
        "            _Pragma(\"omp simd\") for (int64_t c = 0; c < width; ++c)", "            {",
        "                const int64_t n = j * KILN_WNR + c;",
        f"                {buffer_name(out)}[(row + r) * N + n] = {value};",
        "            }", "    }", "}",
    ]
    return ["    " + line for line in lines]


def _view_start(view: Any) -> str:
    """A pointer to a view's first element."""
    return f"({buffer_name(view.buffer)} + {dim_expr(view.offset)})"


# Below this many input channels per group, a direct convolution folds the kernel's columns into the channels
# (kiln_qgemm.h): an RGB stem's 3 channels would pad each tap's k-step to 4, and take 3x the taps.
_FOLD_BELOW_CHANNELS = 16


def _qconv_direct(kernel: Kernel, packed: dict) -> bool:
    """Whether a build with direct convolutions convolves this quant.qconv2d_pointwise directly where its ISA takes the
    layer (kiln_qgemm.h's kiln_qdirect_takes): its weights are packed at create."""
    return kernel.kind == "qconv" and kernel in packed


def _direct_shape(kernel: Kernel) -> tuple[int, int, int, int]:
    """(fold_kw, channels, KH taps x KW' taps, KW') of a direct convolution: fold_kw is KW where the columns fold
    into the channels (1 where they do not), channels and taps those of its steps."""
    _, channels, kh, kw = (int(d) for d in kernel.detail.weight.shape)
    if channels < _FOLD_BELOW_CHANNELS:
        return kw, channels * kw, kh, 1
    return 1, channels, kh * kw, kw


def _qconv(kernel: Kernel, state: RenderState) -> list[str]:
    """quant.qconv2d_pointwise: direct steps where the model's ISA takes the layer (kiln_qdirect_takes: AMX, AVX-512
    VNNI, AVX2 for 7-bit activations) and its weights are packed at create (`_qconv_direct`), else im2col rows through
    the GEMM steps."""
    if _qconv_direct(kernel, state.packed):
        return ["#if KILN_QDIRECT", f"    if (kiln_qdirect_takes({int(kernel.detail.narrow)}))", "    {",
                *["    " + line for line in _qconv_direct_lines(kernel, state)], "    }", "    else", "#endif",
                "    {", *["    " + line for line in _qconv_im2col(kernel, state)], "    }"]
    return _qconv_im2col(kernel, state)


def _qconv_direct_lines(kernel: Kernel, state: RenderState) -> list[str]:
    """quant.qconv2d_pointwise convolved directly (kiln_qgemm.h, KILN_QDIRECT): the team shares (image, group, band
    of output rows) units. A unit copies its band's input rows into channel-quad layout once, then for every panel of
    32 output channels runs steps of KILN_QNR pixels along each output row over every tap, and each channel's row of
    the step through the epilogue into the NCHW output."""
    detail, out = kernel.detail, kernel.outputs[0]
    x, weight = detail.x, detail.weight
    n, channels, height, width = x.shape
    out_channels, _, kh, kw = weight.shape
    (sh, sw), (ph, pw), (dh, dw) = detail.stride, detail.padding, detail.dilation
    fold, step_channels, taps, step_kw = _direct_shape(kernel)
    # a folded layer's steps see one column tap, stride 1: the copy applied the columns' stride and dilation
    step_sw, step_dw = (1, 1) if fold > 1 else (sw, dw)
    x_type = c_type(x.buffer.dtype)
    target = f"{buffer_name(out)} + ((b * COUT + co) * OH + oh) * OW + column"
    residual = "NULL"
    if detail.other is not None:
        other = detail.other
        residual = f"{buffer_name(other.buffer)} + {dim_expr(other.offset)} + ((b * COUT + co) * OH + oh) * OW + column"
    kind, zero_point, low, high = _output_form(detail, out)
    lines = [
        f"const int64_t NB = {dim_expr(n)}, C = {dim_expr(channels)}, H = {dim_expr(height)}, "
        f"W = {dim_expr(width)}, COUT = {dim_expr(out_channels)}, G = {int(detail.groups)};",
        f"const int64_t OH = {dim_expr(out.shape[2])}, OW = {dim_expr(out.shape[3])};",
        f"const int64_t KH = {dim_expr(kh)}, CG = C / G, COG = COUT / G, taps = {taps}, channels = {step_channels};",
        "const int64_t steps = kiln_qdirect_ksteps(channels), panels = kiln_qdirect_panels(COG);",
        "const int64_t quads = kiln_qdirect_kbytes(channels) / 4;",
        f"const int64_t cols = (OW + 31) / 32 * 32 + ({step_kw} - 1) * {step_dw} / {step_sw};",
        # bands of output rows: enough units to keep the team busy on few images
        "int64_t bands = (4 * (int64_t)omp_get_num_threads() + NB * G - 1) / (NB * G);",
        "if (bands > OH) bands = OH;",
        "if (bands < 1) bands = 1;",
        "int64_t band = (OH + bands - 1) / bands;",
        # and few enough rows that a band's copy stays within _DIRECT_BAND_BYTES (one output row's at least)
        f"const int64_t row_bytes = steps * kiln_qdirect_kbytes(channels) * {step_sw} * cols;",
        f"int64_t most = ({_DIRECT_BAND_BYTES} / row_bytes - (KH - 1) * {dh} - 1) / {sh} + 1;",
        "if (most < 1) most = 1;",
        "if (band > most) { band = most; bands = (OH + band - 1) / band; }",
        "int32_t tile[32 * KILN_QNR] __attribute__((aligned(64)));",
        "uint8_t* input = (uint8_t*)(ctx->scratch + (size_t)omp_get_thread_num() * ctx->scratch_stride);",
        f"const char* packed = (const char*)ctx->packed[{state.packed[kernel]}];",
        f"const {x_type}* x = {buffer_name(x.buffer)} + {dim_expr(x.offset)};",
        *_qparams(detail),
        f"const uint8_t flip = {_flip(detail)};",
        f"const uint8_t pad = (uint8_t)((uint8_t)({x_type})(x_zero_point - {128 if detail.signed else 0}) ^ flip);",
        "kiln_qbegin_direct(kiln_qdirect_kbytes(channels));",
        _shared_units(3, "NB * G * bands"),
        "for (int64_t b = 0; b < NB; ++b)",
        "for (int64_t g = 0; g < G; ++g)",
        "for (int64_t part = 0; part < bands; ++part)", "{",
        "    const int64_t oh0 = part * band, oh1 = oh0 + band < OH ? oh0 + band : OH;",
        "    if (oh0 >= oh1) continue;",
        f"    const int64_t rows = (oh1 - oh0 - 1) * {sh} + (KH - 1) * {dh} + 1;",
        f"    kiln_qdirect_input((const uint8_t*)(x + (b * C + g * CG) * H * W), CG, H, W, oh0 * {sh} - {ph}, rows, "
        f"{sw}, {dw}, {pw}, {fold}, cols, pad, flip, input);",
        "    const char* packed_group = packed + g * kiln_qdirect_weight_bytes(COG, channels, taps);",
        "    const int32_t* sums = (const int32_t*)(packed_group + panels * taps * steps * 2048);",
        "    for (int64_t j = 0; j < panels; ++j)", "    {",
        "        const int64_t width = COG - j * 32 < 32 ? COG - j * 32 : 32;",
        "        const int32_t* colsum = sums + j * 32;",
        *[f"        {line}" for line in _epilogue_columns(detail, "g * COG + j * 32", "32")],
        "        const int8_t* panel = (const int8_t*)packed_group + j * taps * steps * 2048;",
        "        for (int64_t oh = oh0; oh < oh1; ++oh)",
        "            for (int64_t column = 0; column < OW; column += KILN_QNR)", "            {",
        "                const int pixels = (int)(OW - column < KILN_QNR ? OW - column : KILN_QNR);",
        f"                kiln_qdirect_step((int)width, pixels, panel, taps, {step_kw}, steps, quads, "
        f"{int(detail.narrow)}, input, rows, cols, {step_sw}, {dh}, {step_dw}, (oh - oh0) * {sh}, column, tile);",
        "                for (int64_t r = 0; r < width; ++r)", "                {",
        "                    const int64_t co = g * COG + j * 32 + r;",
        f"                    kiln_qdirect_epilogue(tile + r * KILN_QNR, zcol[r], scale[r], "
        f"{'bias + r' if detail.bias is not None else 'NULL'}, {residual}, {_POST_OPS[detail.post_op]}, "
        f"{kind}, output_inverse_scale, {zero_point!r}f, {low!r}f, {high!r}f, pixels, {target});",
        "                }", "            }", "    }", "}",
        "kiln_qend();",
    ]
    return ["    " + line for line in lines if line]


def _qconv_im2col(kernel: Kernel, state: RenderState) -> list[str]:
    """quant.qconv2d_pointwise: the team shares (image, group, block of KILN_QPB output pixels) units. A unit
    gathers its pixels' receptive fields into uint8 rows (im2col; padding reads the zero point, the quantized 0.0),
    then runs them against every weight panel of its group, storing each tile into the NCHW output."""
    detail, out = kernel.detail, kernel.outputs[0]
    x, weight = detail.x, detail.weight
    n, channels, height, width = x.shape
    out_channels, _, kh, kw = weight.shape
    (sh, sw), (ph, pw), (dh, dw) = detail.stride, detail.padding, detail.dilation
    scratch = "ctx->scratch + (size_t)omp_get_thread_num() * ctx->scratch_stride"
    setup, per_panel = _weight_panels(kernel, state, "COG", f"{scratch} + kiln_qcols_bytes(K)")
    residual = None
    if detail.other is not None:  # the residual's element of the row's pixel in the panel's first channel
        other = detail.other
        residual = (f"{buffer_name(other.buffer)} + {dim_expr(other.offset)} + (b * COUT + g * COG + j * KILN_QNR) * P"
                    " + p0 + row + r", "P")
    x_type = c_type(x.buffer.dtype)
    lines = [
        f"const int64_t NB = {dim_expr(n)}, C = {dim_expr(channels)}, H = {dim_expr(height)}, "
        f"W = {dim_expr(width)}, COUT = {dim_expr(out_channels)}, G = {int(detail.groups)};",
        f"const int64_t OH = {dim_expr(out.shape[2])}, OW = {dim_expr(out.shape[3])}, P = OH * OW;",
        f"const int64_t KH = {dim_expr(kh)}, KW = {dim_expr(kw)}, CG = C / G, COG = COUT / G, K = CG * KH * KW;",
        # im2col rows padded to whole k-groups: the micro-kernel then never takes its partial-group path
        f"const int64_t KP = kiln_qgroups(K, {int(detail.narrow)}) * kiln_qk({int(detail.narrow)});",
        "const int64_t blocks = (P + KILN_QPB - 1) / KILN_QPB, panels = kiln_qpanels(COG);",
        "int32_t tile[KILN_QROWS * KILN_QNR] __attribute__((aligned(64)));",
        f"{c_type(out.dtype)} staged[KILN_QPB * KILN_QNR] __attribute__((aligned(64)));",
        # AMX tiles load bytes as they are: there the gather flips int8 into uint8, elsewhere the micro-kernel does
        f"const uint8_t cols_flip = KILN_QCOLS_FLIP ? {_flip(detail)} : 0u, step_flip = {_flip(detail)} ^ cols_flip;",
        f"uint8_t* cols = (uint8_t*)({scratch});",
        *setup,
        f"const {x_type}* x = {buffer_name(x.buffer)} + {dim_expr(x.offset)};",
        *_qparams(detail),
        f"const uint8_t pad = (uint8_t)((uint8_t)({x_type})(x_zero_point - {128 if detail.signed else 0}) "
        "^ cols_flip);",
        "kiln_qbegin();",
        _shared_units(3, "NB * G * blocks"),
        "for (int64_t b = 0; b < NB; ++b)",
        "for (int64_t g = 0; g < G; ++g)",
        "for (int64_t block = 0; block < blocks; ++block)", "{",
        "    const int64_t p0 = block * KILN_QPB, count = P - p0 < KILN_QPB ? P - p0 : KILN_QPB;",
        "    for (int64_t i = 0; i < count; ++i)", "    {",
        "        const int64_t oh = (p0 + i) / OW, ow = (p0 + i) % OW;",
        f"        const int64_t top = oh * {sh} - {ph}, left = ow * {sw} - {pw};",
        "        uint8_t* row = cols + i * KP;",
        "        for (int64_t k = K; k < KP; ++k) row[k] = 0;  /* against the packed weights' zero padding */",
        "        const " + x_type + "* image = x + (b * C + g * CG) * H * W;",
        # Pixels whose window lies inside the image (most of them) copy without bounds checks.
        f"        if (top >= 0 && top + (KH - 1) * {dh} < H && left >= 0 && left + (KW - 1) * {dw} < W)", "        {",
        "            for (int64_t ci = 0; ci < CG; ++ci)",
        "                for (int64_t ki = 0; ki < KH; ++ki)", "                {",
        f"                    const {x_type}* line = image + (ci * H + top + ki * {dh}) * W + left;",
        "                    uint8_t* to = row + (ci * KH + ki) * KW;",
        f"                    for (int64_t kj = 0; kj < KW; ++kj) to[kj] = (uint8_t)line[kj * {dw}] ^ cols_flip;",
        "                }",
        "            continue;", "        }",
        "        for (int64_t ci = 0; ci < CG; ++ci)",
        "            for (int64_t ki = 0; ki < KH; ++ki)", "            {",
        f"                const int64_t ih = top + ki * {dh};",
        "                const int inside = ih >= 0 && ih < H;",
        "                const " + x_type + "* line = image + (ci * H + (inside ? ih : 0)) * W;",
        "                for (int64_t kj = 0; kj < KW; ++kj)", "                {",
        f"                    const int64_t iw = left + kj * {dw};",
        "                    row[(ci * KH + ki) * KW + kj] = inside && iw >= 0 && iw < W ? "
        "(uint8_t)((uint8_t)line[iw] ^ cols_flip) : pad;",
        "                }", "            }", "    }",
        f"    const char* packed_group = packed + g * kiln_qpacked_bytes(K, COG, {int(detail.narrow)});"
        if kernel in state.packed else "    const int8_t* w_group = w + g * COG * K;",
        "    for (int64_t j = 0; j < panels; ++j)", "    {",
        "        const int64_t width = COG - j * KILN_QNR < KILN_QNR ? COG - j * KILN_QNR : KILN_QNR;",
        *[f"        {line}" for line in per_panel],
        *[f"        {line}" for line in _epilogue_columns(detail, "g * COG + j * KILN_QNR")],
        "        for (int64_t row = 0; row < count; row += KILN_QROWS)", "        {",
        "            const int rows = (int)(count - row < KILN_QROWS ? count - row : KILN_QROWS);",
        f"            kiln_qcols_step(rows, KP, cols + row * KP, step_flip, panel, tile, {int(detail.narrow)});",
        # The epilogue runs along the tile's columns (vectorized) into `staged`, the block's pixels channels-last;
        # the copy out runs along its rows, which are consecutive pixels of one channel in NCHW (storing from the
        # first loop would write each pixel's channels P elements apart: twice as slow on the 3-channel stem;
        # SSE2 16x16 byte transposes for this copy measured within 3% of it, so it stays plain).
        "            for (int r = 0; r < rows; ++r)",
        f"                {_epilogue(detail, out, 'r', 'staged + (row + r) * KILN_QNR', residual)}",
        "        }",
        f"        {c_type(out.dtype)}* to = {buffer_name(out)} + (b * COUT + g * COG + j * KILN_QNR) * P + p0;",
        "        for (int64_t c = 0; c < width; ++c)",
        "            for (int64_t r = 0; r < count; ++r) to[c * P + r] = staged[r * KILN_QNR + c];",
        "    }", "}",
        "kiln_qend();",
    ]
    return ["    " + line for line in lines if line]


def _qpool(kernel: Kernel, state: RenderState) -> list[str]:
    """quant.qadaptive_avg_pool2d: each output's window (ATen's adaptive bounds) summed in int32, its mean
    dequantized in double, then requantized as quantize_per_tensor does (round half to even, the zero point, the
    clamp). The reference dequantizes each value to float32 before averaging, so the two means differ by float32
    rounding: at most one step apart after requantization."""
    detail, out = kernel.detail, kernel.outputs[0]
    x = detail.x
    height, width = (dim_expr(d) for d in x.shape[2:])
    oh, ow = (dim_expr(d) for d in kernel.shape[2:])
    body = [
        f"const int64_t h0 = (i2 * {height}) / {oh}, h1 = ((i2 + 1) * {height} + {oh} - 1) / {oh};",
        f"const int64_t w0 = (i3 * {width}) / {ow}, w1 = ((i3 + 1) * {width} + {ow} - 1) / {ow};",
        f"const {c_type(x.buffer.dtype)}* plane = {buffer_name(x.buffer)} + {dim_expr(x.offset)} + "
        f"(i0 * {dim_expr(x.shape[1])} + i1) * {height} * {width};",
        "int32_t sum = 0;",
        "for (int64_t h = h0; h < h1; ++h)",
        "    for (int64_t w = w0; w < w1; ++w) sum += plane[h * " + width + " + w];",
        "const int64_t count = (h1 - h0) * (w1 - w0);",
        f"const float mean = (float)({literal(float(detail.x_scale))} * "
        f"(double)(sum - count * (int64_t){int(detail.x_zero_point)}) / (double)count);",
        _output_inverse_scale(detail),
        f"{buffer_name(out)}[{_flat(kernel.shape)}] = ({c_type(out.dtype)})kiln_requantize(mean, "
        f"output_inverse_scale, {float(detail.output_zero_point)!r}f, {float(detail.quant_min)!r}f, "
        f"{float(detail.quant_max)!r}f);",
    ]
    return _loops(kernel.shape, body)


# A direct convolution's band of input rows (kiln_qdirect_input) stays within this many bytes, or one output row's.
_DIRECT_BAND_BYTES = 1 << 20


def _direct_input_bytes(kernel: Kernel) -> Any:
    """An upper bound of kiln_qdirect_input's bytes for a direct convolution: a band of every output row, or as
    many as _DIRECT_BAND_BYTES holds (one output row's at least)."""
    detail = kernel.detail
    fold, channels, _, step_kw = _direct_shape(kernel)
    kh = int(detail.weight.shape[2])
    (sh, sw), (dh, dw) = detail.stride, detail.dilation
    phases, step_dw = (1, 1) if fold > 1 else (int(sw), int(dw))
    padded = -4 * (-channels // 4) if channels <= 64 else -64 * (-channels // 64)
    rows = (sympy.sympify(kernel.shape[2]) - 1) * int(sh) + (kh - 1) * int(dh) + 1
    cols = -32 * sympy.floor(-sympy.sympify(kernel.shape[3]) / 32) + (step_kw - 1) * step_dw // phases
    row_bytes = padded * phases * cols
    return sympy.Min(rows * row_bytes, sympy.Max(_DIRECT_BAND_BYTES, ((kh - 1) * int(dh) + 1) * row_bytes))


def _qweight_shape(kernel: Kernel) -> tuple[int, int, int]:
    """(groups, output columns per group, K) of an integer kernel's int8 weight."""
    weight = kernel.detail.weight
    groups = int(kernel.detail.groups) if kernel.kind == "qconv" else 1
    return groups, int(weight.shape[0]) // groups, math.prod(int(d) for d in weight.shape[1:])



def scratch_bytes(kernel: Kernel, packed: dict) -> Any:
    """Per-thread scratch an integer kernel needs. Sizes hold at every capability, since model.c builds at any
    (kiln_qgemm.h): K padded to whole k-quads, or (AMX) to whole 64-byte k-blocks."""
    if kernel.kind == "qpool":
        return None
    if kernel.kind == "wlinear":  # a float panel, after a packed one (room for it whether or not it is used)
        k = sympy.sympify(kernel.detail.k)
        return _wpanel_bytes(kernel) + k * 32 * 4

    def rounded(size: Any, step: int) -> Any:  # up to a multiple of step, as dim_expr renders it
        return -step * sympy.floor(-sympy.sympify(size) / step)
    k = sympy.sympify(kernel.detail.k)
    quads, blocks = rounded(k, 4), rounded(k, 64)
    # a convolution's im2col rows (KILN_QPB: 48 rows of quads, or 64 of blocks), or a linear layer's copy of one
    # chunk of rows (kiln_qrow_block_bytes): AMX's, M in whole 32-row steps, at most 256 KB or one step; AVX2's int16
    # rows K rounded to 16 apart, at most 512 KB or one step of 6
    if kernel.kind == "qconv":
        rows = sympy.Max(48 * quads, 64 * blocks)
        if _qconv_direct(kernel, packed):  # or (AMX, directly) a band of input rows in B-tile layout
            rows = sympy.Max(rows, _direct_input_bytes(kernel))
    else:
        m, wide_row = sympy.sympify(kernel.detail.m), 2 * rounded(k, 16)
        rows = sympy.Max(sympy.Min(rounded(m, 32) * blocks, sympy.Max(32 * blocks, 256 * 1024)),
                         rounded(sympy.Min(m * wide_row, sympy.Max(6 * wide_row, 512 * 1024)), 64))
    # one weight panel (int16 pairs, or blocks) and its column sums when the weight is an input
    panel = sympy.Max(quads * 32 * 2, blocks * 32) + 32 * 4 if kernel not in packed else 0
    return rows + panel  # (rows: a multiple of 64 bytes either way)


def packed_bytes(kernel: Kernel) -> int:
    """Bytes of an integer kernel's weights packed at create."""
    if kernel.kind == "wlinear":  # int8 bytes (int4 takes half), then the groups' scales and offsets, at 32 columns
        n, k = -(-int(kernel.detail.n) // 32) * 32, int(kernel.detail.k)
        return n * k + n // 32 * 64 + n * (k // int(kernel.detail.group_size)) * 8
    if kernel.kind not in ("qlinear", "qconv"):
        return 0
    # int16 pairs or AMX's 64-byte k-blocks (the largest layouts kiln_qgemm.h packs), column sums
    groups, rows, k = _qweight_shape(kernel)
    n = -(-rows // 32) * 32
    per_group = n * max(-(-k // 2) * 4, -(-k // 64) * 64) + n * 4
    if kernel.kind == "qconv":  # or (direct) 32 x 64 bytes per panel, tap and k-step of channels
        _, channels, taps, _ = _direct_shape(kernel)
        steps = 1 if channels <= 64 else -(-channels // 64)
        per_group = max(per_group, n // 32 * taps * steps * 2048 + n * 4)
    return groups * per_group


def pack_lines(kernel: Kernel, packed: dict, slot: int, weight_offsets: dict[str, int], nibbles: set[str]) -> list[str]:
    """kiln_create's lines packing an integer kernel's weights into packed slot `slot` (`nibbles`: the int4 weights
    the package stores two per byte)."""
    if kernel.kind == "wlinear":
        detail = kernel.detail
        k, n, bits, group_size = int(detail.k), int(detail.n), int(detail.bits), int(detail.group_size)

        def start(view: Any, ctype: str) -> str:
            return f"({ctype}*)(m->weights + {weight_offsets[view.buffer.weight_key]}) + {int(view.offset)}"
        zero_points = detail.zero_points
        zero_points = (f"{start(zero_points, 'const ' + c_type(zero_points.buffer.dtype))}, "
                       f"{zero_points.buffer.dtype.itemsize}") if zero_points else "NULL, 0"
        return [f"    /* {kernel.name}: int{bits} W [{n} x {k}], groups of {group_size} */",
                *_allocate(slot, f"kiln_wpanels({n}) * kiln_wpanel_bytes({k}, {group_size}, {bits})"),
                f"    kiln_wpack({k}, {n}, {group_size}, {bits}, {start(detail.weight, 'const int8_t')}, "
                f"{int(detail.weight.buffer.weight_key in nibbles)}, "
                f"{start(detail.scales, 'const float')}, {zero_points}, (unsigned char*)m->packed[{slot}]);"]
    weight = kernel.detail.weight
    groups, n, k = _qweight_shape(kernel)
    narrow = int(kernel.detail.narrow)
    source = f"(const int8_t*)(m->weights + {weight_offsets[weight.buffer.weight_key]}) + {int(weight.offset)}"
    panels = [*_allocate(slot, f"{groups} * kiln_qpacked_bytes({k}, {n}, {narrow})"),
              f"    for (int64_t g = 0; g < {groups}; ++g)",
              f"        kiln_qpack_b({k}, {n}, {source} + g * {n * k}, "
              f"(char*)m->packed[{slot}] + g * kiln_qpacked_bytes({k}, {n}, {narrow}), {narrow});"]
    if _qconv_direct(kernel, packed):  # direct convolutions read weights per tap
        fold, channels, taps, _ = _direct_shape(kernel)
        _, _, kh, kw = (int(d) for d in weight.shape)
        size = f"kiln_qdirect_weight_bytes({n}, {channels}, {taps})"
        panels = ["#if KILN_QDIRECT", f"    if (kiln_qdirect_takes({narrow}))", "    {",
                  *_allocate(slot, f"{groups} * {size}"),
                  f"    for (int64_t g = 0; g < {groups}; ++g)",
                  f"        kiln_qpack_direct({n}, {int(weight.shape[1])}, {kh}, {kw}, {int(fold > 1)}, "
                  f"{source} + g * {n * k}, (char*)m->packed[{slot}] + g * {size});",
                  "    }", "    else", "#endif", "    {", *panels, "    }"]
    name = identifier(weight.buffer.weight_key)
    return [f"    /* {kernel.name}: int8 W [{groups} x {n} x {k}] of {name} */", *panels]


# The integer kernel kinds (kiln/codegen/schedule.py), rendered here.
RENDERERS = {"qlinear": _qlinear, "qconv": _qconv, "wlinear": _wlinear, "qpool": _qpool}
