"""The C backend's fused LSTM step: a scan whose body is torch's LSTM cell (kiln/codegen/recurrent.py) runs each step
as one `lstm_cell` kernel, the gate math in the recurrent GEMM's epilogue, instead of a GEMM and two pointwise
kernels (three barriers of the team a step, and the gates' round trip through memory).

The epilogue needs all four gates of a hidden unit, which torch's layout puts H columns apart. So the compiler
packs the recurrent weight [4H, H] in *gate-interleaved* panels: a block of L = KILN_NR / 2 hidden units (a vector
register's lanes: 16 with AVX-512, 8 with AVX2) takes two panels, the first holding gates i and f of its units, the
second g and o (zero past H). A thread's unit of work is (row chunk, block): two register tiles, then the cell over
L units at a time. The epilogue computes each value in the same operations and float/double conversions as the
unfused kernels' expressions (render.py's addmm epilogue and pointwise rules), so the fused step gives the same bits
as the three kernels it replaces (tests/runtime/test_c_loops.py).
"""

from __future__ import annotations

import numpy as np

from kiln.codegen.c.ctext import RenderState, _chunking, buffer_name, dim_expr
from kiln.codegen.kernels import Kernel

FUSE = True  # benchmarks/loops.py turns it off to time the three kernels side by side
# The fused step pays where its saved barriers do: an LSTM of hidden 256, batch 1, on 2 threads took 0.84x the time of
# the three kernels (Intel Xeon model 167, AVX-512). A step of one thread is bound by streaming the recurrent weight
# from L2 either way (0.98-1.06x at hidden 256 and 512), and below 256 the fused epilogue cost more than the
# barriers it saved (1.06-1.4x at hidden 24-128): benchmarks/loops.py, docs/loops.md.
FUSE_MIN_HIDDEN = 256


def fuses(hidden: int) -> bool:
    """Whether an LSTM step of this hidden size runs as one fused kernel."""
    return FUSE and hidden >= FUSE_MIN_HIDDEN


def gate_panels(weight: np.ndarray, offset: int, hidden: int, nr: int) -> np.ndarray:
    """The recurrent weight W [4·hidden, hidden] (row-major from flat `offset`) as the GEMM's B = Wᵀ in
    gate-interleaved panels [2·blocks, hidden (k), nr]: column c of panel 2·b + half is gate 2·half + c // L of unit
    b·L + c % L (W's row (2·half + c // L)·hidden + b·L + c % L), L = nr / 2."""
    lanes = nr // 2
    flat = np.ascontiguousarray(weight, np.float32).reshape(-1)
    w = flat[offset:offset + 4 * hidden * hidden].reshape(4, hidden, hidden)  # [gate, unit, k]
    blocks = -(-hidden // lanes)
    packed = np.zeros((blocks, 2, hidden, 2, lanes), np.float32)  # [block, half, k, gate in half, lane]
    for b in range(blocks):
        units = min(lanes, hidden - b * lanes)
        for half in range(2):
            packed[b, half, :, :, :units] = w[2 * half:2 * half + 2, b * lanes:b * lanes + units, :].transpose(2, 0, 1)
    return packed.reshape(2 * blocks, hidden, nr)


def render_lstm_cell(kernel: Kernel, state: RenderState) -> list[str]:
    """One LSTM step: the team shares (row chunk, block of LANES hidden units) units; a unit runs register tiles of
    h against the block's two panels and applies the cell to each row of its units."""
    detail = kernel.detail
    h, c, x, bias = detail.h, detail.c, detail.x, detail.bias
    h_next, c_next = kernel.outputs
    hidden = detail.hidden

    def at(view, index: str) -> str:
        return f"{buffer_name(view.buffer)}[{dim_expr(view.offset)} + {index}]"

    def gate(g: int) -> str:  # the addmm epilogue (bias + tile, in double, rounded), then + x, as the unfused kernels
        product = f"(double){('tile', 'second')[g // 2]}[r * KILN_NR + {g % 2} * LANES + t]"
        acc = (f"(float)(INT64_C(1) * (double){at(bias, f'{g * hidden} + u')} + INT64_C(1) * {product})"
               if bias is not None else f"(float){product}")
        x_gate = at(x, f"i0 * {4 * hidden} + {g * hidden} + u")
        return f"(float)((double)({acc}) + (double)INT64_C(1) * (double){x_gate})"

    a = f"{buffer_name(h.buffer)} + {dim_expr(h.offset)} + row * K"
    lines = [
        # a unit of work is a block of LANES hidden units (two panels): `panels` counts blocks (N = 2 x hidden)
        f"const int64_t M = {dim_expr(detail.batch)}, N = INT64_C({2 * hidden}), K = INT64_C({hidden});",
        "enum { LANES = KILN_NR / 2 };",
        *_chunking("panels"),
        "float second[KILN_MR * KILN_NR] __attribute__((aligned(64)));",
        "#pragma omp for collapse(2) schedule(static)",
        "for (int64_t chunk = 0; chunk < chunks; ++chunk)",
        "for (int64_t j = 0; j < panels; ++j)", "{",
        f"    const float* first_panel = ctx->packed[{state.packed[kernel]}] + 2 * j * K * KILN_NR;  "
        "/* gates i, f */",
        "    const float* second_panel = first_panel + K * KILN_NR;  /* gates g, o */",
        "    const float* ahead = j + 1 < panels ? second_panel + K * KILN_NR : second_panel;",
        "    const int64_t row_end = (chunk + 1) * chunk_rows < M ? (chunk + 1) * chunk_rows : M;",
        # (a whole block in every panel when 16 divides hidden: a constant trip count, no masked iterations)
        "    const int64_t units = LANES;" if hidden % 16 == 0 else
        f"    const int64_t units = INT64_C({hidden}) - j * LANES < LANES ? INT64_C({hidden}) - j * LANES : LANES;",
        "    for (int64_t row = chunk * chunk_rows; row < row_end; row += KILN_MR)", "    {",
        "        const int rows = (int)(row_end - row < KILN_MR ? row_end - row : KILN_MR);",
        f"        kiln_ukernel(rows, K, {a}, K, INT64_C(1), first_panel, second_panel, tile);",
        f"        kiln_ukernel(rows, K, {a}, K, INT64_C(1), second_panel, ahead, second);",
        "        for (int r = 0; r < rows; ++r)",
        "            _Pragma(\"omp simd\") for (int64_t t = 0; t < units; ++t)", "            {",
        "                const int64_t i0 = row + r, u = j * LANES + t;",
        f"                const float in_gate = (float)kiln_sigmoidf((float)(double){gate(0)});",
        f"                const float forget = (float)kiln_sigmoidf((float)(double){gate(1)});",
        f"                const float cell = (float)kiln_tanhf((float)(double){gate(2)});",
        f"                const float out_gate = (float)kiln_sigmoidf((float)(double){gate(3)});",
        f"                const float c_next = (float)((double)((float)((double)forget * (double)"
        f"{at(c, f'i0 * {hidden} + u')})) + (double)INT64_C(1) * (double)((float)((double)in_gate * (double)cell)));",
        f"                {buffer_name(c_next)}[i0 * {hidden} + u] = c_next;",
        f"                {buffer_name(h_next)}[i0 * {hidden} + u] = (float)((double)out_gate * "
        "(double)((float)kiln_tanhf((float)(double)c_next)));",
        "            }", "    }", "}",
    ]
    return ["    " + line for line in lines]


__all__ = ["FUSE", "FUSE_MIN_HIDDEN", "fuses", "gate_panels", "render_lstm_cell"]
