"""Render a Schedule as one C11 + OpenMP source with the kiln C ABI (create / run / destroy, metadata, errors).

Pointwise ops are a table of rules (op name -> C expression over already-cast operands), like tinygrad's
cstyle renderer. Floating ops compute in double and round to the op's dtype after every op, so fused chains
give the same values as running the ops one by one. Convolutions render in conv.py and the integer kernels in
quantized.py; the C text they all write (types, literals, sizes, expressions, loops) is ctext.py's.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import pathlib
import re
from typing import Any, Callable, Sequence

import numpy as np
import sympy

from kiln.ir import dtypes
from kiln.ir.errors import UnsupportedError
from kiln.ir.symbolic import ValueRange, bound_expr
from kiln.codegen.c.build import get_cpu_capability
from kiln.codegen.c.packing import packed_weight, tile_sizes
from kiln.codegen.c.target import TARGET
from kiln.codegen.memory import MemoryPlan, kernel_reads
from kiln.codegen.kernels import (
    Apply, Buffer, Gather, Kernel, Load, MatmulDetail, Schedule, Tile, View, contiguous_strides, matrix_vector,
    same_dim,
)
from kiln.codegen.schedule import SORT_OPS
from kiln.codegen.c import quantized, recurrent
from kiln.codegen.c.pointwise import VECTOR_MATH_OPS
from kiln.codegen.c.conv import (
    conv_as_gemm, conv_epilogue, depthwise, depthwise_scratch, im2col_panel, pixel_rows, render_conv, whole_im2col,
)
from kiln.codegen.c.ctext import (
    HALF_NAMES, RenderState, _allocate, _chunking, _cstr, _Exprs, _flat, _loops, _shared_units, _tile_loop,
    _view_index, accumulator_dtype, accumulator_type, buffer_name, c_type, checked_index, compute_type,
    condition_expr, dim_expr, hoist_symbol_divisions, identifier, literal, phase_copy, store_result, symbol_name,
)

ABI_VERSION = 6
MAX_ALLOCATED_RANK = 8  # KILN_MAX_RANK: the dims of an output kiln_run allocates (kiln.h)
# Support code pasted into every model.c, so a package's source builds alone.
SUPPORT_LIBRARY = "\n".join((pathlib.Path(__file__).parent / name).read_text()
                            for name in ("kiln_math.h", "kiln_gemm.h", "kiln_threads.h", "kiln_arena.h"))
# The integer GEMM, pasted only into models with quantized linear layers.
QGEMM_LIBRARY = (pathlib.Path(__file__).parent / "kiln_qgemm.h").read_text()
# Sparse x dense products, pasted only into models with sparse linear layers.
SPARSE_LIBRARY = (pathlib.Path(__file__).parent / "kiln_sparse.h").read_text()

def _pointwise(kernel: Kernel, state: RenderState) -> list[str]:
    out = kernel.outputs[0]
    rank = len(kernel.shape)
    innermost = sympy.sympify(kernel.shape[-1]) if rank else None
    # (an index is hoisted out of the innermost loop only where that loop runs: ATen checks no index of an empty row)
    hoist = f"i{rank - 1}" if rank > 1 and innermost.is_Integer and int(innermost) > 0 else None
    exprs = _Exprs(rank, hoist_from=hoist)
    store = f"{buffer_name(out)}[{_flat(kernel.shape)}]"
    staged = _strided_leaves(kernel) if rank > 1 and _vector_math(kernel.expr) else []
    if 0 < len(staged) <= _MAX_STAGED:
        return _staged_pointwise(kernel, staged, store)
    value = exprs.render(kernel.expr)
    return _loops(kernel.shape, [f"{store} = {value};"], simd=True, hoisted=exprs.hoisted)


# A staged pointwise kernel copies its strided operands into the stack in tiles of this many rows by elements, for
# at most _MAX_STAGED operands (256 KB of stack in float64).
_STAGE_ROWS, _STAGE, _MAX_STAGED = 64, 64, 8


def _vector_math(node: Any) -> bool:
    """Whether an expression calls one of kiln_math.h's vectorizable float32 functions."""
    if not isinstance(node, Apply):
        return False
    return (node.op in VECTOR_MATH_OPS and node.dtype == dtypes.float32) or any(_vector_math(a) for a in node.args)


def _strided_leaves(kernel: Kernel) -> list[Any]:
    """The operands a pointwise kernel's innermost loop reads other than contiguously or as a broadcast: a
    transposed view (a stride along the row), a repeat (a modulo) or a checked gather."""
    rank, found = len(kernel.shape), []

    def visit(node: Any) -> None:
        if isinstance(node, Apply):
            for arg in node.args:
                visit(arg)
        elif node in found:  # (a node the tree reads twice is staged once)
            return
        elif isinstance(node, (Load, Tile)):
            modulo = isinstance(node, Tile) and node.sizes[rank - 1] is not None
            if modulo or sympy.sympify(node.strides[rank - 1]) not in (0, 1):
                found.append(node)
        elif isinstance(node, Gather):
            found.append(node)

    visit(kernel.expr)
    return found


def _staged_pointwise(kernel: Kernel, leaves: list[Any], store: str) -> list[str]:
    """A pointwise kernel whose vectorizable math reads strided operands (`_strided_leaves`): GCC 12 vectorizes
    no strided load, even with AVX-512's gathers, so such a loop ran scalar, GELU included (6 ns an element; a
    transpose before an activation is wav2vec2's feature encoder). The kernel goes in tiles of _STAGE_ROWS rows by
    _STAGE elements: plain loops copy the strided operands into stack buffers, each along the dim where it reads
    consecutive elements (down the rows for a transpose, so every cache line it loads serves _STAGE_ROWS rows), then
    the math runs vectorized over the buffers."""
    rank = len(kernel.shape)
    outer, inner = f"i{rank - 2}", f"i{rank - 1}"
    rows, row = dim_expr(kernel.shape[-2]), dim_expr(kernel.shape[-1])
    exprs = _Exprs(rank)
    copies, declarations, replaced = [], [], {}
    for k, leaf in enumerate(leaves):
        dtype = (leaf.table.buffer if isinstance(leaf, Gather) else leaf.buffer).dtype
        element = "uint8_t" if dtype == dtypes.bool_ else c_type(dtype)  # (a bool leaf renders as a 0/1 test)
        cast = "" if dtype in HALF_NAMES else f"({element})"  # (a half-precision leaf is its stored element)
        declarations.append(f"    {element} s{k}[{_STAGE_ROWS}][{_STAGE}] __attribute__((aligned(64)));")
        first_loop, second_loop = "for (int64_t r = 0; r < height; ++r)", "for (int64_t c = 0; c < count; ++c)"
        if isinstance(leaf, (Load, Tile)) and sympy.sympify(leaf.strides[rank - 2]) == 1:  # a transpose: down the rows
            first_loop, second_loop = second_loop, first_loop
        copies += [f"    {first_loop}", f"        {second_loop}", "        {",
                   f"            const int64_t {outer} = first + r, {inner} = c0 + c;",
                   f"            s{k}[r][c] = {cast}({exprs.render(leaf)});", "        }"]
        replaced[id(leaf)] = f"(s{k}[r][c] != 0)" if dtype == dtypes.bool_ else f"s{k}[r][c]"
    value = _Exprs(rank, replaced=replaced).render(kernel.expr)
    # (the loop over tiles of rows is the nest's last one: its variable, named for the dim, counts tiles)
    body = [
        f"const int64_t first = {outer} * {_STAGE_ROWS};",
        f"const int64_t height = {rows} - first < {_STAGE_ROWS} ? {rows} - first : {_STAGE_ROWS};",
        f"for (int64_t c0 = 0; c0 < {row}; c0 += {_STAGE})", "{",
        f"    const int64_t count = {row} - c0 < {_STAGE} ? {row} - c0 : {_STAGE};",
        *declarations, *copies,
        "    for (int64_t r = 0; r < height; ++r)",
        "        _Pragma(\"omp simd\") for (int64_t c = 0; c < count; ++c)", "        {",
        f"            const int64_t {outer} = first + r, {inner} = c0 + c;",
        f"            {store} = {value};", "        }", "}",
    ]
    tiles = -sympy.floor(-sympy.sympify(kernel.shape[-2]) / _STAGE_ROWS)
    return _loops([*kernel.shape[:-2], tiles], body, share_all=True)


def _gemm_operands_f32(kernel: Kernel) -> bool:
    """A float32 product (whatever the epilogue writes: a half-precision model rounds it to float16 there)."""
    return kernel.detail.a[0].dtype == kernel.detail.b[0].dtype == accumulator_dtype(kernel) == dtypes.float32


def _matrix_vector(kernel: Kernel) -> bool:
    return kernel.kind == "matmul" and matrix_vector(kernel.shape, kernel.detail, accumulator_dtype(kernel))


def _gemv_f32(kernel: Kernel, state: RenderState) -> list[str]:
    """`matrix_vector`'s kernel (kiln_gemv4): the team shares (batch, block of 4 rows) units; each block's sums go
    through the fused epilogue as the GEMM's tiles do. A gathered A (`a_gather`) is `_gathered_gemv`."""
    detail = kernel.detail
    if detail.a_gather is not None:
        return _gathered_gemv(kernel, state)
    rank = len(kernel.shape)
    exprs = _Exprs(rank)
    a_buf, a_strides, a_offset = detail.a
    b_buf, b_strides, b_offset = detail.b
    batch = kernel.shape[0] if rank == 3 else 1
    a_row = f"{buffer_name(a_buf)} + {exprs.index(a_strides, a_offset, ['bi', 'row', '0'])}"
    lines = [f"const int64_t M = {dim_expr(kernel.shape[-2])}, K = {dim_expr(detail.k)}, BATCH = {dim_expr(batch)};",
             *_gemv_loop(kernel, a_row)]
    return ["    " + line for line in lines]


def _gemv_loop(kernel: Kernel, a_row: str) -> list[str]:
    """The team's (batch entry, block of 4 rows) units of dot products, A's rows starting at `a_row` (over bi, row)."""
    detail, out = kernel.detail, kernel.outputs[0]
    rank = len(kernel.shape)
    exprs = _Exprs(rank)
    b_buf, b_strides, b_offset = detail.b
    value = "(double)sums[r]"
    if detail.bias is not None:
        value = _addmm_value(detail, exprs.render(detail.bias), value)
    index = ["bi", "row + r", "0"] if rank == 3 else ["row + r", "0"]
    store = store_result([f"const int64_t i{k} = {v};" for k, v in enumerate(index)],
                         f"{buffer_name(out)}[{_flat(kernel.shape)}]", value, exprs.render(kernel.expr),
                         accumulator_type(kernel))
    return [
        "#pragma omp for collapse(2) schedule(static)",
        "for (int64_t bi = 0; bi < BATCH; ++bi)",
        "for (int64_t block = 0; block < (M + 3) / 4; ++block)", "{",
        "    const int64_t row = block * 4;",
        "    const int rows = (int)(M - row < 4 ? M - row : 4);",
        "    float sums[4];",
        f"    kiln_gemv4(rows, K, {a_row}, {dim_expr(detail.a[1][-2])}, "
        f"{buffer_name(b_buf)} + {exprs.index(b_strides, b_offset, ['bi', '0', '0'])}, {dim_expr(b_strides[-2])}, "
        "sums);",
        "    for (int r = 0; r < rows; ++r)", "    {", *[f"        {line}" for line in store], "    }", "}",
    ]


# Register tiles of a group's entries multiplied per packed panel of its matrix: the panel is packed once per chunk.
_GROUP_ROW_TILES = 8


def _gathered_ints(kernel: Kernel) -> Any:
    """int64 slots of a gathered-A bmm's scratch: each entry's checked matrix index and its place in the grouped
    order, the groups' starts and cursors."""
    return 2 * sympy.sympify(kernel.shape[0]) + 2 * sympy.sympify(kernel.detail.a_gather.size[0]) + 1


def _gathered_table_packs(kernel: Kernel) -> bool:
    """A gathered-A bmm whose table is a constant weight of static, contiguous matrices (an expert weight
    parameter): the compiler packs each matrix's transpose into KILN_NR-wide panels (packing.packed_weight)."""
    a_buf, a_strides, a_offset = kernel.detail.a
    sizes = [sympy.sympify(d) for d in (*kernel.shape[1:], kernel.detail.k, kernel.detail.a_gather.size[0],
                                        kernel.detail.a_gather.stride[0], *a_strides[1:], a_offset)]
    if a_buf.kind != "weight" or not all(d.is_Integer for d in sizes):
        return False
    rows, k = int(kernel.shape[1]), int(kernel.detail.k)
    return int(a_strides[1]) == k and int(kernel.detail.a_gather.stride[0]) == rows * k


def _gathered_gemv(kernel: Kernel, state: RenderState) -> list[str]:
    """A bmm whose A batch entry bi is matrix `index[bi]` of a table (MatmulDetail.a_gather: Hugging Face's batched
    mixture of experts), with one output column. Each thread checks the indices into its scratch. A table the
    compiler packed (`_gathered_table_packs`) is read as linear layers: the entries are grouped by matrix
    (kiln_group_entries), and each group's entries' columns, up to _GROUP_ROW_TILES register tiles of them copied
    together as rows, multiply the matrix's KILN_NR-wide panels, each result scattered to its entry; the team
    shares (row chunk, panel) units. So a matrix is read once per row chunk, not once per entry (decoding reads it
    once per token either way). Otherwise each entry takes dot products with its matrix where it lies."""
    detail, out = kernel.detail, kernel.outputs[0]
    exprs = _Exprs(3)
    gather = detail.a_gather
    a_buf, a_strides, a_offset = detail.a
    b_buf, b_strides, b_offset = detail.b
    matrix, lda = dim_expr(gather.stride[0]), dim_expr(a_strides[1])
    checked = checked_index(_Exprs(3, variables=["bi", "0", "0"]).render(gather.index[0]), gather.size[0], 0,
                            gather.op, wrap=True)
    ints = dim_expr(_gathered_ints(kernel))
    lines = [
        f"const int64_t M = {dim_expr(kernel.shape[1])}, K = {dim_expr(detail.k)}, "
        f"BATCH = {dim_expr(kernel.shape[0])}, GROUPS = {dim_expr(gather.size[0])};",
        "unsigned char* own = ctx->scratch + (size_t)omp_get_thread_num() * ctx->scratch_stride;",
        "int64_t* which = (int64_t*)own;  /* each entry's matrix, checked */",
        f"for (int64_t bi = 0; bi < BATCH; ++bi) which[bi] = {checked};",
    ]
    slot = state.packed.get(kernel)
    if slot is None:
        table = f"{buffer_name(a_buf)} + {exprs.index(a_strides, a_offset, ['0', '0', '0'])}"
        return ["    " + line for line in lines + _gemv_loop(kernel, f"{table} + which[bi] * {matrix} + row * {lda}")]
    store = store_result(["const int64_t i0 = order[first + row + r], i1 = j * KILN_NR + c, i2 = 0;"],
                         f"{buffer_name(out)}[{_flat(kernel.shape)}]", "(double)tile[r * KILN_NR + c]",
                         exprs.render(kernel.expr), accumulator_type(kernel))  # (a bmm: no addmm bias)
    chunk_groups = "(start[g + 1] - start[g] + XR - 1) / XR"
    lines += [
        "int64_t* start = which + BATCH, * cursor = start + GROUPS + 1, * order = cursor + GROUPS;",
        f"float* rows_of = (float*)(own + ({ints} * 8 + 63) / 64 * 64);  /* a row chunk's columns, as rows */",
        f"const int64_t XR = {_GROUP_ROW_TILES} * KILN_MR, panels = kiln_panels(M);",
        "kiln_group_entries(BATCH, GROUPS, which, start, cursor, order);",
        "int64_t row_chunks = 0;",
        f"for (int64_t g = 0; g < GROUPS; ++g) row_chunks += {chunk_groups};",
        "int64_t copied = -1;  /* the row chunk in rows_of */",
        "float tile[KILN_MR * KILN_NR] __attribute__((aligned(64)));",
        "#pragma omp for schedule(dynamic, 1)",
        "for (int64_t unit = 0; unit < row_chunks * panels; ++unit)", "{",
        "    const int64_t j = unit % panels, chunk = unit / panels;",
        "    int64_t q = chunk, g = 0;",
        f"    while (q >= {chunk_groups}) {{ q -= {chunk_groups}; ++g; }}",
        "    const int64_t first = start[g] + q * XR;",
        "    const int64_t count = start[g + 1] - first < XR ? start[g + 1] - first : XR;",
        "    if (copied != chunk)", "    {",
        "        for (int64_t e = 0; e < count; ++e)", "        {",
        f"            const float* column = {buffer_name(b_buf)} + {dim_expr(b_offset)} + order[first + e] * "
        f"{dim_expr(b_strides[0])};",
        f"            for (int64_t k = 0; k < K; ++k) rows_of[e * K + k] = column[k * {dim_expr(b_strides[1])}];",
        "        }",
        "        copied = chunk;", "    }",
        f"    const float* panel = ctx->packed[{slot}] + (g * panels + j) * K * KILN_NR;  /* packed by the compiler */",
        "    const float* ahead = j + 1 < panels ? panel + K * KILN_NR : panel;  /* prefetched meanwhile */",
        "    const int64_t width = M - j * KILN_NR < KILN_NR ? M - j * KILN_NR : KILN_NR;",
        "    for (int64_t row = 0; row < count; row += KILN_MR)", "    {",
        "        const int rows = (int)(count - row < KILN_MR ? count - row : KILN_MR);",
        "        kiln_ukernel(rows, K, rows_of + row * K, K, 1, panel, ahead, tile);",
        "        for (int r = 0; r < rows; ++r)",
        "            _Pragma(\"omp simd\") for (int64_t c = 0; c < width; ++c)", "            {",
        *[f"                {line}" for line in store], "            }", "    }", "}",
    ]
    return ["    " + line for line in lines]


def _gemm_f32(kernel: Kernel, state: RenderState) -> list[str]:
    """float32 GEMM on the packed micro-kernels (kiln_gemm.h): the team shares (batch, row chunk, B panel) units;
    each unit runs register tiles down its rows and applies the fused epilogue from the tile."""
    if _matrix_vector(kernel):
        return _gemv_f32(kernel, state)
    assert kernel.detail.a_gather is None, "a gathered A is only scheduled for a matrix-vector kernel"
    detail, out = kernel.detail, kernel.outputs[0]
    rank = len(kernel.shape)
    exprs = _Exprs(rank)
    a_buf, a_strides, a_offset = detail.a
    b_buf, b_strides, b_offset = detail.b
    batch = kernel.shape[0] if rank == 3 else 1
    a_base = exprs.index(a_strides, a_offset, ["bi", "0", "0"])
    b_base = exprs.index(b_strides, b_offset, ["bi", "0", "0"])
    lines = [
        f"const int64_t M = {dim_expr(kernel.shape[-2])}, N = {dim_expr(kernel.shape[-1])}, "
        f"K = {dim_expr(detail.k)}, BATCH = {dim_expr(batch)};",
        *_chunking("BATCH * panels"),
    ]
    slot = state.packed.get(kernel)
    if slot is None:
        lines.append("float* pack = (float*)(ctx->scratch + (size_t)omp_get_thread_num() * ctx->scratch_stride);")
    a_sm, a_sk = dim_expr(a_strides[1]), dim_expr(a_strides[2])
    ukernel = f"kiln_ukernel(rows, K, a + row * {a_sm}, {a_sm}, {a_sk}, panel, ahead, tile);"
    if _packs_a(kernel, state.packed):
        # Each thread copies A (the activations) into micro-kernel row blocks once, then every B panel it takes
        # reads them as one contiguous stream instead of KILN_MR strided rows.
        lines += ["float* apack = (float*)(ctx->scratch + (size_t)omp_get_thread_num() * ctx->scratch_stride);",
                  f"const int pack_a = panels >= 2 * (int64_t)omp_get_num_threads() && "
                  f"row_blocks * KILN_MR * K <= {_PACKED_A_LIMIT};",
                  f"if (pack_a) kiln_pack_a(M, K, {buffer_name(a_buf)} + "
                  f"{exprs.index(a_strides, a_offset, ['0'] * 3)}, {a_sm}, {a_sk}, apack);"]
        ukernel = (f"if (pack_a) kiln_ukernel(rows, K, apack + row * K, 1, KILN_MR, panel, ahead, tile); "
                   f"else {ukernel}")
    lines += ["#pragma omp for collapse(3) schedule(static)",
              "for (int64_t bi = 0; bi < BATCH; ++bi)",
              "for (int64_t chunk = 0; chunk < chunks; ++chunk)",
              "for (int64_t j = 0; j < panels; ++j)", "{",
              f"    const float* a = {buffer_name(a_buf)} + {a_base};"]
    if slot is None:
        lines += [f"    kiln_pack_b_panel(K, N, j * KILN_NR, {buffer_name(b_buf)} + {b_base}, "
                  f"{dim_expr(b_strides[1])}, {dim_expr(b_strides[2])}, pack);",
                  "    const float* panel = pack, * ahead = pack;"]
    else:
        lines += [f"    const float* panel = ctx->packed[{slot}] + j * K * KILN_NR;  /* packed at create */",
                  "    const float* ahead = j + 1 < panels ? panel + K * KILN_NR : panel;  /* prefetched meanwhile */"]
    index = ["bi", "row + r", "j * KILN_NR + c"] if rank == 3 else ["row + r", "j * KILN_NR + c"]
    value = "(double)tile[r * KILN_NR + c]"
    if detail.bias is not None:
        value = _addmm_value(detail, exprs.render(detail.bias), value)
    lines += _tile_loop(ukernel, [f"const int64_t i{k} = {v};" for k, v in enumerate(index)],
                        f"{buffer_name(out)}[{_flat(kernel.shape)}]", value, exprs.render(kernel.expr),
                        accumulator_type(kernel))
    lines.append("}")
    return ["    " + line for line in lines]


def _attention(kernel: Kernel, state: RenderState) -> list[str]:
    """Fused attention (matched by kiln/codegen/attention.py): the team shares (batch, block of KILN_MR queries)
    units. A thread packs Kᵀ and V of each batch entry it reaches into panels once, computes its block's score rows (the
    scores GEMM's epilogue applied: scale, mask) into `scores`, takes each row's float32 softmax there as the rows
    kernel does (torch's safe softmax: a row that is all -inf gives zeros), and multiplies by V with the output
    GEMM's epilogue. Scratch per thread: the panels and one block of score rows (render._scratch_bytes)."""
    detail, out = kernel.detail, kernel.outputs[0]
    exprs = _Exprs(3)
    q_buf, q_strides, q_offset = detail.q
    k_buf, k_strides, k_offset = detail.k
    v_buf, v_strides, v_offset = detail.v
    base = ["bi", "0", "0"]
    lines = [
        f"const int64_t BATCH = {dim_expr(kernel.shape[0])}, M = {dim_expr(kernel.shape[1])}, "
        f"L = {dim_expr(detail.keys)}, D = {dim_expr(detail.dim)}, DV = {dim_expr(kernel.shape[2])};",
        "const int64_t key_panels = kiln_panels(L), value_panels = kiln_panels(DV), padded = key_panels * KILN_NR;",
        "const int64_t row_blocks = (M + KILN_MR - 1) / KILN_MR;",
        "float tile[KILN_MR * KILN_NR] __attribute__((aligned(64)));",
        "float* keys = (float*)(ctx->scratch + (size_t)omp_get_thread_num() * ctx->scratch_stride);",
        "float* values = keys + key_panels * D * KILN_NR;",
        "float* scores = values + value_panels * L * KILN_NR;",
        "int64_t packed_batch = -1;  /* the batch entry whose K and V are in `keys` and `values` */",
        "#pragma omp for collapse(2) schedule(static)",
        "for (int64_t bi = 0; bi < BATCH; ++bi)",
        "for (int64_t block = 0; block < row_blocks; ++block)", "{",
        "    if (packed_batch != bi)", "    {",
        f"        kiln_pack_b(D, L, {buffer_name(k_buf)} + {exprs.index(k_strides, k_offset, base)}, "
        f"{dim_expr(k_strides[1])}, {dim_expr(k_strides[2])}, keys);",
        f"        kiln_pack_b(L, DV, {buffer_name(v_buf)} + {exprs.index(v_strides, v_offset, base)}, "
        f"{dim_expr(v_strides[1])}, {dim_expr(v_strides[2])}, values);",
        "        packed_batch = bi;", "    }",
        "    const int64_t row = block * KILN_MR;",
        "    const int rows = (int)(M - row < KILN_MR ? M - row : KILN_MR);",
        f"    const float* a = {buffer_name(q_buf)} + {exprs.index(q_strides, q_offset, base)} + "
        f"row * {dim_expr(q_strides[1])};",
        "    for (int64_t j = 0; j < key_panels; ++j)", "    {",
        f"        kiln_ukernel(rows, D, a, {dim_expr(q_strides[1])}, {dim_expr(q_strides[2])}, keys + j * D * KILN_NR, "
        "keys + j * D * KILN_NR, tile);",
        "        const int64_t width = L - j * KILN_NR < KILN_NR ? L - j * KILN_NR : KILN_NR;",
        "        for (int r = 0; r < rows; ++r)",
        "            _Pragma(\"omp simd\") for (int64_t c = 0; c < width; ++c)", "            {",
        "                const int64_t i0 = bi, i1 = row + r, i2 = j * KILN_NR + c;",
        "                const float acc_value = tile[r * KILN_NR + c];",
        f"                scores[r * padded + i2] = {exprs.render(detail.scores)};",
        "            }", "    }",
        "    for (int r = 0; r < rows; ++r)  /* each score row's softmax, in place: the rows kernel's body */", "    {",
        "        float* x = scores + r * padded;",
    ]
    if detail.safe:  # amax(row) == -inf (no NaN in the row): where(..., 0, softmax) gives zeros
        lines += ["        float m = -INFINITY; int nan = 0;",
                  "        _Pragma(\"omp simd reduction(max:m) reduction(|:nan)\") for (int64_t k = 0; k < L; ++k) "
                  "{ nan |= x[k] != x[k]; m = x[k] > m ? x[k] : m; }",
                  "        if (m == -INFINITY && !nan) { for (int64_t k = 0; k < L; ++k) x[k] = 0.0f; continue; }"]
    # The softmax runs over the whole padded row, its padding at -inf (exp gives 0): a row's last partial vector of
    # exps otherwise ran as a scalar loop, the attention's largest cost at short or odd lengths (31 keys: 15 of 31).
    lines += [
        "        for (int64_t k = L; k < padded; ++k) x[k] = -INFINITY;",
        "#define X(k) x[k]", "#define Y0 x", "#define YS 1",
        "        { const int64_t L = padded; " + ROW_BODIES_F32["aten._softmax.default"] + " }",
        "#undef X", "#undef Y0", "#undef YS",
        "    }",
        "    for (int64_t j = 0; j < value_panels; ++j)", "    {",
        "        const float* panel = values + j * L * KILN_NR;",
        "        kiln_ukernel(rows, L, scores, padded, 1, panel, panel, tile);",
        "        const int64_t width = DV - j * KILN_NR < KILN_NR ? DV - j * KILN_NR : KILN_NR;",
        "        for (int r = 0; r < rows; ++r)",
        "            _Pragma(\"omp simd\") for (int64_t c = 0; c < width; ++c)", "            {",
        "                const int64_t i0 = bi, i1 = row + r, i2 = j * KILN_NR + c;",
        "                const float acc_value = tile[r * KILN_NR + c];",
        f"                {buffer_name(out)}[{_flat(kernel.shape)}] = {exprs.render(kernel.expr)};",
        "            }", "    }", "}",
    ]
    return ["    " + line for line in lines]


def _attention_scratch(kernel: Kernel) -> Any:
    """Bytes of `_attention`'s per-thread scratch, sized for the widest panels and tallest tiles of any ISA."""
    def padded(n: Any) -> Any:
        return -32 * sympy.floor(-sympy.sympify(n) / 32)
    keys, dim, value_dim = kernel.detail.keys, sympy.sympify(kernel.detail.dim), kernel.shape[2]
    return 4 * (padded(keys) * dim + padded(value_dim) * sympy.sympify(keys) + _MAX_MR * padded(keys))


_MAX_MR = 12  # the largest KILN_MR of kiln_gemm.h (AVX-512): packed A blocks are sized for it
_MAX_NR = 32  # and the largest KILN_NR
_PACKED_A_LIMIT = 1 << 20  # floats of A a thread packs at most (4 MB of per-thread scratch)


def _packs_a(kernel: Kernel, packed: dict) -> bool:
    """A 2-D float32 GEMM on prepacked weights with enough rows for packing A to pay (at least two register tiles):
    its A is packed per thread at run time."""
    return kernel.kind == "matmul" and kernel in packed and len(kernel.shape) == 2 and \
        not (sympy.sympify(kernel.shape[0]).is_Integer and int(kernel.shape[0]) < 2 * _MAX_MR)


def _addmm_value(detail: MatmulDetail, bias: str, product: str, integer: bool = False) -> str:
    """addmm's `beta * bias + alpha * product`, as ATen computes it: a zero alpha skips the product and a zero beta
    the bias (their NaN and infinities do not reach the result). `integer`: in uint64_t, wrapping (the product is
    one too)."""
    number = "(uint64_t)(int64_t)" if integer else "(double)"
    terms = ([f"{number}{literal(detail.beta)} * {number}{bias}"] if detail.beta != 0 else []) + \
        ([f"{number}{literal(detail.alpha)} * {product}"] if detail.alpha != 0 else [])
    return " + ".join(terms) or "0"


def _matmul(kernel: Kernel, state: RenderState) -> list[str]:
    if _gemm_operands_f32(kernel):
        return _gemm_f32(kernel, state)
    detail, out = kernel.detail, kernel.outputs[0]
    rank = len(kernel.shape)
    exprs = _Exprs(rank)
    a_buf, a_strides, a_offset = detail.a
    b_buf, b_strides, b_offset = detail.b
    batch = "i0" if rank == 3 else "0"
    row, col = f"i{rank - 2}", f"i{rank - 1}"
    a_index = exprs.index(a_strides, a_offset, [batch, row, "k"])
    b_index = exprs.index(b_strides, b_offset, [batch, "k", col])
    accumulated = accumulator_dtype(kernel)  # (not the output's: a fused comparison writes bool)
    result_type, integer = c_type(accumulated), not accumulated.is_floating_point
    value = "acc"
    if detail.bias is not None:
        value = _addmm_value(detail, exprs.render(detail.bias), value, integer)
    a_name, b_name, k_size = buffer_name(a_buf), buffer_name(b_buf), dim_expr(detail.k)
    if integer:
        # Integer products and sums wrap as ATen's do in the operands' type: computed modulo 2^64 (unsigned, where C
        # defines overflow), whose low bits are the narrower type's wrapped result.
        body = [
            "uint64_t acc = 0;",
            f"for (int64_t k = 0; k < {k_size}; ++k)",
            f"    acc += (uint64_t)(int64_t){a_name}[{a_index}] * (uint64_t)(int64_t){b_name}[{b_index}];",
        ]
    elif sympy.sympify(a_strides[2]) == 1 and sympy.sympify(b_strides[1]) == 1:
        # Both operands run contiguously along k: eight independent double partial sums let the compiler
        # vectorize the dot product without reassociating a single float chain.
        a_row, b_col = exprs.index(a_strides, a_offset, [batch, row, "0"]), exprs.index(b_strides, b_offset,
                                                                                          [batch, "0", col])
        body = [
            f"const {c_type(a_buf.dtype)}* restrict pa = {a_name} + {a_row};",
            f"const {c_type(b_buf.dtype)}* restrict pb = {b_name} + {b_col};",
            "double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};",
            "int64_t k = 0;",
            f"for (; k + 8 <= {k_size}; k += 8)",
            "    for (int lane = 0; lane < 8; ++lane) part[lane] += (double)pa[k + lane] * (double)pb[k + lane];",
            "double acc = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));",
            f"for (; k < {k_size}; ++k) acc += (double)pa[k] * (double)pb[k];",
        ]
    else:
        body = [
            "double acc = 0.0;  /* double accumulation: matches the reference within float32 tolerance */",
            f"for (int64_t k = 0; k < {k_size}; ++k)",
            f"    acc += (double){a_name}[{a_index}] * (double){b_name}[{b_index}];",
        ]
    body += [
        f"const {result_type} acc_value = ({result_type})({value});",
        f"{buffer_name(out)}[{_flat(kernel.shape)}] = {exprs.render(kernel.expr)};",
    ]
    return _loops(kernel.shape, body)


ROW_BODIES: dict[str, str] = {
    "aten.sum.dim_IntList": "double acc = 0.0; _Pragma(\"omp simd reduction(+:acc)\") "
                            "for (int64_t k = 0; k < L; ++k) acc += X(k); Y0[0] = acc;",
    "aten.mean.dim": "double acc = 0.0; _Pragma(\"omp simd reduction(+:acc)\") "
                     "for (int64_t k = 0; k < L; ++k) acc += X(k); Y0[0] = acc / (double)L;",
    # max ignoring NaN plus a NaN flag, both vectorizable reductions; a NaN anywhere makes the result NaN.
    "aten.amax.default": "double m = -INFINITY; int nan = 0; _Pragma(\"omp simd reduction(max:m) reduction(|:nan)\") "
                         "for (int64_t k = 0; k < L; ++k) { const double v = X(k); nan |= v != v; "
                         "m = v > m ? v : m; } Y0[0] = nan ? NAN : m;",
    "aten.mean.default": "double acc = 0.0; _Pragma(\"omp simd reduction(+:acc)\") "
                         "for (int64_t k = 0; k < L; ++k) acc += X(k); Y0[0] = acc / (double)L;",
    "aten.amin.default": "double m = INFINITY; int nan = 0; _Pragma(\"omp simd reduction(min:m) reduction(|:nan)\") "
                         "for (int64_t k = 0; k < L; ++k) { const double v = X(k); nan |= v != v; "
                         "m = v < m ? v : m; } Y0[0] = nan ? NAN : m;",
    # float products round in the input dtype after every step (they overflow where ATen's do), in order.
    "aten.prod.dim_int": "__typeof__(Y0[0]) acc = 1; for (int64_t k = 0; k < L; ++k) acc *= X(k); Y0[0] = acc;",
    **dict.fromkeys(("aten.any.dim", "aten.any.dims", "aten.any.default"),
                    "int any = 0; _Pragma(\"omp simd reduction(|:any)\") for (int64_t k = 0; k < L; ++k) "
                    "any |= X(k) != 0; Y0[0] = any != 0;"),
    # First occurrence wins; a NaN counts as the extremum, so the scan stops at the first one.
    **{op: f"double best = L > 0 ? (double)X(0) : 0.0; int64_t at = 0; "
           f"for (int64_t k = 1; k < L && best == best; ++k) {{ const double v = X(k); "
           f"if (v {cmp} best || v != v) {{ best = v; at = k; }} }} {store}"
       for op, cmp, store in (("aten.argmax.default", ">", "Y0[0] = at;"), ("aten.argmin.default", "<", "Y0[0] = at;"),
                              ("aten.max.dim", ">", "Y0[0] = best; Y1[0] = at;"),
                              ("aten.min.dim", "<", "Y0[0] = best; Y1[0] = at;"))},
    # Two passes in double; the divisor is max(L - correction, 0), so 0 gives inf or nan like ATen.
    "aten.var.correction": "double mean = 0.0; _Pragma(\"omp simd reduction(+:mean)\") "
                           "for (int64_t k = 0; k < L; ++k) mean += X(k); mean /= (double)L; double ss = 0.0; "
                           "_Pragma(\"omp simd reduction(+:ss)\") for (int64_t k = 0; k < L; ++k) "
                           "{ const double d = (double)X(k) - mean; ss += d * d; } "
                           "const double divisor = (double)L - CORR; Y0[0] = ss / (divisor > 0.0 ? divisor : 0.0);",
    "aten._softmax.default": "double m = -INFINITY; for (int64_t k = 0; k < L; ++k) m = kiln_max(m, (double)X(k)); "
                             "double s = 0.0; for (int64_t k = 0; k < L; ++k) s += exp((double)X(k) - m); "
                             "for (int64_t k = 0; k < L; ++k) Y0[(k) * YS] = exp((double)X(k) - m) / s;",
    "aten._log_softmax.default": "double m = -INFINITY; for (int64_t k = 0; k < L; ++k) "
                                 "m = kiln_max(m, (double)X(k)); double s = 0.0; for (int64_t k = 0; k < L; ++k) "
                                 "s += exp((double)X(k) - m); double ls = log(s); "
                                 "for (int64_t k = 0; k < L; ++k) Y0[(k) * YS] = ((double)X(k) - m) - ls;",
    # The first pass copies the row into the output (same dtype), so a fused producer is evaluated once.
    "aten.native_layer_norm.default": "double mean = 0.0; _Pragma(\"omp simd reduction(+:mean)\") "
                                      "for (int64_t k = 0; k < L; ++k) "
                                      "{ Y0[(k) * YS] = X(k); mean += Y0[(k) * YS]; } "
                                      "mean /= (double)L; double var = 0.0; "
                                      "_Pragma(\"omp simd reduction(+:var)\") for (int64_t k = 0; k < L; ++k) "
                                      "{ double d = Y0[(k) * YS] - mean; var += d * d; } var /= (double)L; "
                                      "double rstd = 1.0 / sqrt(var + EPS); _Pragma(\"omp simd\") "
                                      "for (int64_t k = 0; k < L; ++k) "
                                      "Y0[(k) * YS] = ((double)Y0[(k) * YS] - mean) * rstd * W(k) + B(k); "
                                      "Y1[0] = mean; Y2[0] = rstd;",
}
# W, B by channel; ATen's group norm computes x * alpha + (bias - mean * alpha), alpha = rstd * weight
ROW_BODIES["aten.native_group_norm.default"] = ROW_BODIES["aten.native_layer_norm.default"].replace(
    "((double)Y0[(k) * YS] - mean) * rstd * W(k) + B(k)",
    "(double)Y0[(k) * YS] * (rstd * W(k)) + (B(k) - mean * (rstd * W(k)))")
ROW_BODIES["aten.prod.default"] = ROW_BODIES["aten.prod.dim_int"]
ROW_BODIES["aten.var.dim"] = ROW_BODIES["aten.var.correction"]


# Over integers and bools, in the input's own type (row_t): exact where double would round int64s above 2^53. Sums and
# products wrap in uint64, as ATen's int64 accumulation wraps (signed overflow would be undefined in C).
INTEGER_ROW_BODIES: dict[str, str] = {
    **{op: f"row_t best = L > 0 ? (row_t)X(0) : 0; int64_t at = 0; for (int64_t k = 1; k < L; ++k) "
           f"{{ const row_t v = (row_t)X(k); if (v {cmp} best) {{ best = v; at = k; }} }} {store}"
       for op, cmp, store in (("aten.argmax.default", ">", "Y0[0] = at;"), ("aten.argmin.default", "<", "Y0[0] = at;"),
                              ("aten.max.dim", ">", "Y0[0] = best; Y1[0] = at;"),
                              ("aten.min.dim", "<", "Y0[0] = best; Y1[0] = at;"))},
    **{op: f"row_t m = L > 0 ? (row_t)X(0) : 0; _Pragma(\"omp simd reduction({which}:m)\") "
           f"for (int64_t k = 1; k < L; ++k) {{ const row_t v = (row_t)X(k); m = v {cmp} m ? v : m; }} Y0[0] = m;"
       for op, which, cmp in (("aten.amax.default", "max", ">"), ("aten.amin.default", "min", "<"))},
    "aten.sum.dim_IntList": "uint64_t acc = 0; _Pragma(\"omp simd reduction(+:acc)\") "
                            "for (int64_t k = 0; k < L; ++k) acc += (uint64_t)(int64_t)(row_t)X(k); "
                            "Y0[0] = (__typeof__(Y0[0]))acc;",
    **dict.fromkeys(("aten.prod.dim_int", "aten.prod.default"),
                    "uint64_t acc = 1; for (int64_t k = 0; k < L; ++k) acc *= (uint64_t)(int64_t)(row_t)X(k); "
                    "Y0[0] = (__typeof__(Y0[0]))acc;"),
}


# float32 softmax: one vectorized exp per element (kept in the output), float max, double sum.
ROW_BODIES_F32: dict[str, str] = {
    # The first pass copies the row into the output, so a fused producer is evaluated once per element.
    "aten._softmax.default": "float m = -INFINITY; _Pragma(\"omp simd reduction(max:m)\") "
                             "for (int64_t k = 0; k < L; ++k) { const float v = X(k); Y0[(k) * YS] = v; "
                             "m = v > m ? v : m; } "
                             "double s = 0.0; _Pragma(\"omp simd reduction(+:s)\") for (int64_t k = 0; k < L; ++k) "
                             "{ const float e = kiln_expf(Y0[(k) * YS] - m); Y0[(k) * YS] = e; s += e; } "
                             "const float inv = (float)(1.0 / s); _Pragma(\"omp simd\") "
                             "for (int64_t k = 0; k < L; ++k) Y0[(k) * YS] *= inv;",
    "aten._log_softmax.default": "float m = -INFINITY; _Pragma(\"omp simd reduction(max:m)\") "
                                 "for (int64_t k = 0; k < L; ++k) { const float v = X(k); Y0[(k) * YS] = v; "
                                 "m = v > m ? v : m; } "
                                 "double s = 0.0; _Pragma(\"omp simd reduction(+:s)\") "
                                 "for (int64_t k = 0; k < L; ++k) s += kiln_expf(Y0[(k) * YS] - m); "
                                 "const double ls = log(s); _Pragma(\"omp simd\") for (int64_t k = 0; k < L; ++k) "
                                 "Y0[(k) * YS] = (float)(((double)Y0[(k) * YS] - m) - ls);",
}


def _sort_body(kernel: Kernel) -> str:
    """sort / topk of one row: a stable bottom-up merge sort of (value, index) pairs in this thread's scratch
    (`_scratch_bytes`: two int64 and two value arrays of L), then the first K written out. NaN orders as the
    largest value (last ascending, first descending) and equal values keep their input order, as the interpreter's
    stable argsort. `AFTER(r, l)`: the right run's value r must come before the left run's l."""
    value_type = c_type(kernel.outputs[0].dtype)
    floating = kernel.outputs[0].dtype.is_floating_point
    if kernel.detail.descending:
        after = "((r) > (l) || ((r) != (r) && (l) == (l)))" if floating else "((r) > (l))"
    else:
        after = "((r) < (l) || ((l) != (l) && (r) == (r)))" if floating else "((r) < (l))"
    dim = kernel.detail.dim
    return (f"const int64_t K = {dim_expr(kernel.outputs[0].shape[dim])}; "
            "int64_t* ai = (int64_t*)(ctx->scratch + (size_t)omp_get_thread_num() * ctx->scratch_stride); "
            f"int64_t* bi = ai + L; {value_type}* av = ({value_type}*)(bi + L); {value_type}* bv = av + L;"
            f"\n#define AFTER(r, l) {after}\n"
            "for (int64_t k = 0; k < L; ++k) { av[k] = X(k); ai[k] = k; } "
            "for (int64_t w = 1; w < L; w *= 2) { "
            "for (int64_t lo = 0; lo < L; lo += 2 * w) { "
            "const int64_t mid = lo + w < L ? lo + w : L, hi = lo + 2 * w < L ? lo + 2 * w : L; "
            "int64_t p = lo, q = mid, o = lo; "
            "while (p < mid && q < hi) { if (AFTER(av[q], av[p])) { bv[o] = av[q]; bi[o++] = ai[q++]; } "
            "else { bv[o] = av[p]; bi[o++] = ai[p++]; } } "
            "while (p < mid) { bv[o] = av[p]; bi[o++] = ai[p++]; } "
            "while (q < hi) { bv[o] = av[q]; bi[o++] = ai[q++]; } } "
            f"{value_type}* tv = av; av = bv; bv = tv; int64_t* ti = ai; ai = bi; bi = ti; }} "
            "for (int64_t k = 0; k < K; ++k) { Y0[k * YS] = av[k]; Y1[k * YS] = ai[k]; }\n#undef AFTER")


# Row ops whose first output has the input's layout along the row (written whole, not one value per row).
WHOLE_ROW_OPS = {"aten._softmax.default", "aten._log_softmax.default", "aten.native_layer_norm.default",
                 "aten.cumsum.default", "aten.native_group_norm.default"} | SORT_OPS
NORM_OPS = ("aten.native_layer_norm.default", "aten.native_group_norm.default")


def _row_body(kernel: Kernel, op: str) -> str:
    """The C statements computing one row: X(k) reads it, Y0.. are the outputs."""
    out_dtype = kernel.outputs[0].dtype
    if op in SORT_OPS:
        return _sort_body(kernel)
    if op == "aten.cumsum.default":  # sequential, in ATen's accumulator type
        acc = "double" if out_dtype.is_floating_point else "int64_t"
        return (f"{acc} s = 0; for (int64_t k = 0; k < L; ++k) {{ s += ({acc})X(k); "
                f"Y0[k * YS] = ({c_type(out_dtype)})s; }}")
    if out_dtype == dtypes.float32 and op in ROW_BODIES_F32:
        return ROW_BODIES_F32[op]
    operand = kernel.detail.input_dtype
    if operand is not None and not operand.is_floating_point and op in INTEGER_ROW_BODIES:
        return f"typedef {c_type(operand)} row_t; " + INTEGER_ROW_BODIES[op]
    return ROW_BODIES[op]


def _rows(kernel: Kernel, state: RenderState) -> list[str]:
    detail = kernel.detail
    source = detail.input
    # One row per index of the other dims; the row runs along `dim` (the last dim for layer norm).
    dim = detail.dim
    outer = [d for k, d in enumerate(kernel.shape) if k != dim]
    length = kernel.shape[dim]
    op = kernel.ops[-1]  # the row op; any before it are a fused producer's
    # sort/topk outputs have K (not L) along the row: index them by their own shape
    full_strides = contiguous_strides(kernel.outputs[0].shape if op in SORT_OPS else kernel.shape)
    exprs = _Exprs(len(outer))
    out_base = exprs.index([s for k, s in enumerate(full_strides) if k != dim], 0)
    row = _flat(outer) if outer else "0"
    length_line = f"const int64_t L = {dim_expr(length)};"
    body = [f"const int64_t row = {row};",
            f"const int64_t YS = {dim_expr(full_strides[dim])};  /* output stride along the row */"]
    tiled = _transposed_rows(kernel)
    if source is None:  # a fused pointwise producer, evaluated at (outer index, k)
        variables = [f"i{k}" for k in range(len(outer))]
        variables.insert(dim, "(k)")
        body.append(f"#define X(k) ({_Exprs(len(kernel.shape), variables=variables).render(detail.input_expr)})")
    elif tiled:
        body.append("#define X(k) stage[tile_row * L + (k)]")
    else:
        base = exprs.index([s for k, s in enumerate(source.strides) if k != dim], source.offset)
        body += [f"const int64_t base = {base};",
                 f"#define X(k) {buffer_name(source.buffer)}[base + (k) * {dim_expr(source.strides[dim])}]"]
    for n, out in enumerate(kernel.outputs):
        whole = op in SORT_OPS or (n == 0 and op in WHOLE_ROW_OPS)
        body.append(f"{c_type(out.dtype)}* Y{n} = {buffer_name(out)} + {out_base if whole else 'row'};")
    if op in NORM_OPS:
        # group norm: row position k of group i1 is channel i1 * C/G + k / HxW
        channel = (f"(i1 * {dim_expr(detail.per_group)} + (k) / {dim_expr(detail.hxw)})"
                   if op == "aten.native_group_norm.default" else "(k)")
        for macro, view, default in (("W", detail.weight, "1.0"), ("B", detail.bias, "0.0")):
            body.append(f"#define {macro}(k) ((double)" + (
                f"{buffer_name(view.buffer)}[{dim_expr(view.offset)} + {channel} * {dim_expr(view.strides[0])}])"
                if view is not None else f"{default})"))
        body.append(f"const double EPS = {literal(float(detail.eps))};")
    for constant, value in detail.constants.items():
        body.append(f"const double {constant} = {literal(float(value))};")
    if _shared_extremum(kernel):
        return ["    {", *[f"        {line}" for line in [length_line, *body, *_shared_extremum_body(op)]], "    }"]
    body += [_row_body(kernel, op), "(void)YS;", "#undef X"]
    if op in NORM_OPS:
        body += ["#undef W", "#undef B"]
    if not tiled:
        return _loops(outer, [length_line, *body], share_all=True)
    # A tile of _ROW_TILE rows (along the last outer dim, where the input is contiguous) is copied into scratch first,
    # each of the rows' elements together; the rows then read the scratch. (The tile loop's variable, named for the
    # dim, counts tiles; each row redefines it as its own index.)
    last, step = f"i{len(outer) - 1}", dim_expr(source.strides[dim])
    first_base = exprs.index([s for k, s in enumerate(source.strides) if k != dim], source.offset)
    tile = [
        length_line,
        "float* stage = (float*)(ctx->scratch + (size_t)omp_get_thread_num() * ctx->scratch_stride);",
        f"const int64_t first = {last} * {_ROW_TILE};",
        f"const int64_t height = {dim_expr(outer[-1])} - first < {_ROW_TILE} ? {dim_expr(outer[-1])} - first : "
        f"{_ROW_TILE};",
        "{", f"    const int64_t {last} = first, base = {first_base};",
        "    for (int64_t k = 0; k < L; ++k)",
        "        for (int64_t tile_row = 0; tile_row < height; ++tile_row)",
        f"            stage[tile_row * L + k] = {buffer_name(source.buffer)}[base + tile_row + k * {step}];", "}",
        "for (int64_t tile_row = 0; tile_row < height; ++tile_row)", "{",
        f"    const int64_t {last} = first + tile_row;",
        *[f"    {line}" for line in body], "}",
    ]
    return _loops([*outer[:-1], -sympy.floor(-sympy.sympify(outer[-1]) / _ROW_TILE)], tile, share_all=True)


# Rows of a transposed input (a layer norm over the channels of a channels-first tensor: wav2vec2's feature encoder)
# are copied into scratch this many at a time.
_ROW_TILE = 16


def _transposed_rows(kernel: Kernel) -> bool:
    """A float32 rows kernel reading its rows across the input's layout: strided along the row, contiguous from one
    row to the next. Row by row, every element was a scalar load from another cache line (3.3 ns an element); a tile
    of rows reads each line once."""
    detail, dim = kernel.detail, kernel.detail.dim
    source, outer = detail.input, [k for k in range(len(kernel.shape)) if k != detail.dim]
    if source is None or not outer or kernel.ops[-1] in SORT_OPS or _shared_extremum(kernel):
        return False
    return (source.buffer.dtype == dtypes.float32 and sympy.sympify(source.strides[dim]) not in (0, 1)
            and sympy.sympify(source.strides[outer[-1]]) == 1)


def _shared_extremum(kernel: Kernel) -> bool:
    """Whether a kernel is a whole tensor's float amin or amax (the activations' range that dynamic quantization's
    choose_qparams takes), which the team shares: one row would run on one thread."""
    return (kernel.kind == "rows" and kernel.ops[-1] in ("aten.amin.default", "aten.amax.default")
            and len(kernel.shape) == 1 and kernel.outputs[0].dtype.is_floating_point)


def _shared_extremum_body(op: str) -> list[str]:
    """Each thread's share of the row into its scratch (the extremum and a NaN flag), then one thread combines them:
    the same result as one pass, since min and max do not depend on the order."""
    reduce, start, better = ("max", "-INFINITY", ">") if op == "aten.amax.default" else ("min", "INFINITY", "<")
    return [
        "const int T = omp_get_num_threads();",
        "#pragma omp for schedule(static)",
        "for (int t = 0; t < T; ++t)", "{",
        "    double* share = (double*)(ctx->scratch + (size_t)omp_get_thread_num() * ctx->scratch_stride);",
        f"    double m = {start}; int nan = 0;",
        f"    _Pragma(\"omp simd reduction({reduce}:m) reduction(|:nan)\")",
        "    for (int64_t k = L * t / T; k < L * (t + 1) / T; ++k)",
        f"    {{ const double v = X(k); nan |= v != v; m = v {better} m ? v : m; }}",
        "    share[0] = m; share[1] = nan;", "}",
        "#pragma omp single", "{",
        f"    double m = {start}; int nan = 0;",
        "    for (int t = 0; t < T; ++t)", "    {",
        "        const double* share = (const double*)(ctx->scratch + (size_t)t * ctx->scratch_stride);",
        f"        nan |= share[1] != 0.0; m = share[0] {better} m ? share[0] : m;", "    }",
        "    Y0[0] = nan ? NAN : m;", "}",
        "(void)row; (void)YS;", "#undef X",
    ]


def _window(kernel: Kernel, state: RenderState) -> list[str]:
    """max_pool (values and ATen's flat in-plane indices), average and adaptive average pooling over trailing
    dims, and nearest / bilinear upsampling."""
    detail, op = kernel.detail, kernel.ops[0]
    if "upsample" in op:
        return _upsample(kernel)
    if op == "aten.grid_sampler_2d.default":
        return _grid_sample(kernel)
    x, n = detail.input, detail.n
    if _max_pool_values_only(kernel):
        return _max_pool_values(kernel)
    rank = len(kernel.shape)
    lead = [f"i{k}" for k in range(rank - n)]
    sizes = [dim_expr(d) for d in x.shape[rank - n:]]
    outs = [dim_expr(d) for d in kernel.shape[rank - n:]]
    positions = [f"p{k}" for k in range(n)]
    load = f"(double){buffer_name(x.buffer)}[{_view_index(x, lead + positions)}]"
    flat = _flat(kernel.shape)
    body: list[str] = []
    closing = []
    if "max_pool" in op:
        plane_start = "0"
        for k in range(n):
            s, p, d = int(detail.stride[k]), int(detail.padding[k]), int(detail.dilation[k])
            body.append(f"int64_t s{k} = i{rank - n + k} * {s} - {p}; while (s{k} < 0) s{k} += {d};")
            plane_start = f"({plane_start}) * {sizes[k]} + s{k}"
        body += ["double best = -INFINITY;", f"int64_t best_index = {plane_start};"]
        plane = "0"
        for k in range(n):
            s, p, d = int(detail.stride[k]), int(detail.padding[k]), int(detail.dilation[k])
            body += [f"for (int64_t r{k} = 0; r{k} < {int(detail.kernel[k])}; ++r{k})", "{",
                     f"const int64_t p{k} = i{rank - n + k} * {s} - {p} + r{k} * {d};",
                     f"if (p{k} < 0 || p{k} >= {sizes[k]}) continue;"]
            plane = f"({plane}) * {sizes[k]} + p{k}"
            closing.append("}")
        body += [f"const double v = {load};",
                 f"if (v > best || isnan(v)) {{ best = v; best_index = {plane}; }}", *closing,
                 f"{buffer_name(kernel.outputs[0])}[{flat}] = ({c_type(kernel.outputs[0].dtype)})best;"]
        if len(kernel.outputs) > 1:
            body.append(f"{buffer_name(kernel.outputs[1])}[{flat}] = best_index;")
    elif op.startswith("aten.avg_pool"):
        # ATen's divisor: the window cut at input + padding, or (count_include_pad=False) at the input alone.
        divisor = []
        for k in range(n):
            s, p, size = int(detail.stride[k]), int(detail.padding[k]), sizes[k]
            body += [f"const int64_t s{k} = i{rank - n + k} * {s} - {p};",
                     f"const int64_t e{k} = s{k} + {int(detail.kernel[k])} < {size} + {p} ? "
                     f"s{k} + {int(detail.kernel[k])} : {size} + {p};",
                     f"const int64_t lo{k} = s{k} > 0 ? s{k} : 0, hi{k} = e{k} < {size} ? e{k} : {size};"]
            divisor.append(f"(e{k} - s{k})" if detail.count_include_pad else f"(hi{k} - lo{k})")
        if detail.divisor_override is not None:
            divisor = [str(int(detail.divisor_override))]
        body += ["double acc = 0.0;", f"const int64_t divisor = {' * '.join(divisor)};"]
        for k in range(n):
            body += [*_summing(k, n), f"for (int64_t p{k} = lo{k}; p{k} < hi{k}; ++p{k})", "{"]
            closing.append("}")
        body += [f"acc += {load};", *closing,
                 f"{buffer_name(kernel.outputs[0])}[{flat}] = ({c_type(kernel.outputs[0].dtype)})"
                 "(divisor > 0 ? acc / (double)divisor : 0.0);"]
    else:
        count = []
        for k in range(n):
            o = f"i{rank - n + k}"
            body += [f"const int64_t s{k} = ({o} * {sizes[k]}) / {outs[k]};",
                     f"const int64_t e{k} = (({o} + 1) * {sizes[k]} + {outs[k]} - 1) / {outs[k]};"]
            count.append(f"(e{k} - s{k})")
        body.append("double acc = 0.0;")
        for k in range(n):
            body += [*_summing(k, n), f"for (int64_t p{k} = s{k}; p{k} < e{k}; ++p{k})", "{"]
            closing.append("}")
        body += [f"acc += {load};", *closing,
                 f"{buffer_name(kernel.outputs[0])}[{flat}] = ({c_type(kernel.outputs[0].dtype)})"
                 f"(acc / (double)({' * '.join(count)}));"]
    return _loops(kernel.shape, body)


def _summing(k: int, n: int) -> list[str]:
    """The pragma before window loop `k` of an average pool: the innermost one sums its row of the window in vector
    lanes. A double sum in one chain waited on each add's latency: EfficientNet-B0's squeeze-and-excitation pools
    (a whole 112x112 plane per output) took 0.64 of its 6.7 ms."""
    return ['_Pragma("omp simd reduction(+:acc)")'] if k == n - 1 else []


def _max_pool_values_only(kernel: Kernel) -> bool:
    return ("max_pool" in kernel.ops[0] and len(kernel.outputs) == 1
            and kernel.detail.input.buffer.dtype in (dtypes.float32, dtypes.float64, dtypes.uint8, dtypes.int8))


def _max_pool_by_rows(kernel: Kernel) -> bool:
    """Whether `_max_pool_values` works by output rows (with padding, and for integers) rather than one output at a
    time."""
    return any(int(p) for p in kernel.detail.padding[:kernel.detail.n]) or \
        not kernel.outputs[0].dtype.is_floating_point


def _max_pool_values(kernel: Kernel) -> list[str]:
    """max_pool whose indices nothing reads, ATen's tap order and NaN rule (`v > best || v != v`).

    Without padding, one output at a time: the compiler proves every tap inside the input and vectorizes the
    window across outputs. With padding, those per-tap checks keep it scalar (ResNet-18's stem max_pool: 5.1 ms at
    one thread), so it works by output rows: the window's tap rows are copied with the padding as the identity,
    split into their column-stride phases, and one vectorized pass over the row's columns reads every tap
    contiguously (the stem pool, 64 x 112 x 112, 3x3 stride 2, one thread on the Xeon: 0.54 ms with a strided
    load-compare-store pass over the output row per tap, 0.19 ms now; onnxruntime's NCHWc pool 0.14 ms). Rows cost
    more than single outputs on short rows without padding (2x2 pools over 32 columns: 13 -> 61 us)."""
    detail, out = kernel.detail, kernel.outputs[0]
    x, n = detail.input, detail.n
    rank = len(kernel.shape)
    lead = [f"i{k}" for k in range(rank - 1)]
    sizes = [dim_expr(d) for d in x.shape[rank - n:]]
    stride, padding, dilation = ([int(v) for v in values[:n]] for values in (detail.stride, detail.padding,
                                                                              detail.dilation))
    real = c_type(out.dtype)
    # the identity of max: -inf, or an integer type's least value (int8/uint8 pools of quantized programs)
    lowest = "-INFINITY" if out.dtype.is_floating_point else str(int(np.iinfo(out.dtype.numpy).min))

    def taps(dims: range) -> tuple[list[str], list[str]]:
        """Loops over the window taps of `dims`, skipping the ones outside the input (padding, ceil_mode)."""
        lines = []
        for k in dims:
            outside = f"p{k} >= {sizes[k]}" if not padding[k] else f"p{k} < 0 || p{k} >= {sizes[k]}"
            lines += [f"for (int64_t r{k} = 0; r{k} < {int(detail.kernel[k])}; ++r{k})", "{",
                      f"const int64_t p{k} = i{rank - n + k} * {stride[k]} - {padding[k]} + r{k} * {dilation[k]};",
                      f"if ({outside}) continue;"]
        return lines, ["}"] * len(dims)

    if not _max_pool_by_rows(kernel):  # integers: GCC vectorizes only the row form well
        loops, closing = taps(range(n))
        body = [f"{real} best = {lowest};", *loops]
        load = f"{buffer_name(x.buffer)}[{_view_index(x, lead[:rank - n] + [f'p{k}' for k in range(n)])}]"
        body += [f"const {real} v = {load};", "best = (v > best || v != v) ? v : best;", *closing,
                 f"{buffer_name(out)}[{_flat(kernel.shape)}] = best;"]
        # simd: inside a collapsed `omp for` GCC otherwise compiles short rows (4 columns) to branches on the
        # data, which mispredict on every other tap (1 ms instead of 70 us for CNN-b16's last pool)
        return _loops(kernel.shape, body, simd=True)
    # The row form. Each tap row of the window (one per combination of the leading dims' taps) is copied into the
    # thread's scratch split into its column-stride phases, with the identity where a tap lies outside the input
    # (padding, ceil_mode, a leading tap outside): output column c's tap r then reads phase (r * dilation) % stride
    # at c + (r * dilation) / stride, contiguous in c and with no range checks, so one vectorized pass over the
    # columns keeps each best in a register across all the taps, in ATen's order. The identity never replaces a
    # best (`v > best` fails, and it is no NaN), so reading it is the same as skipping the tap.
    last, columns = n - 1, dim_expr(kernel.shape[-1])
    step, taps_last, spread = stride[last], int(detail.kernel[last]), dilation[last]
    lead_taps = list(itertools.product(*[range(int(detail.kernel[k])) for k in range(last)]))
    row_start = _Exprs(rank).index(contiguous_strides(kernel.shape), 0, lead + ["0"])
    body = [f"{real}* restrict phases = ({real}*)(ctx->scratch + (size_t)omp_get_thread_num() * "
            "ctx->scratch_stride);",
            f"const int64_t span = {dim_expr(_phase_span(kernel))};"]

    def element(m: str) -> str:  # the input column of phase q's element m
        return f"({m} * {step} + q - {padding[last]})"

    for row, combination in enumerate(lead_taps):
        positions = [f"(i{rank - n + k} * {stride[k]} - {padding[k]} + {r * dilation[k]})"
                     for k, r in enumerate(combination)]
        inside = " && ".join([f"{q} >= 0 && {q} < {sizes[k]}" for k, q in enumerate(positions)] or ["1"])
        load = f"{buffer_name(x.buffer)}[{_view_index(x, lead[:rank - n] + positions + [element('m')])}]"
        copy = phase_copy(f"{real}* restrict row = phases + ({row} * {step} + q) * span;", inside, element,
                          sizes[last], load, lowest)
        body += [f"for (int64_t q = 0; q < {step}; ++q)", "{", *[f"    {line}" for line in copy], "}"]
    reads = [f"phases + ({row * step + r * spread % step}) * span + {r * spread // step}"
             for row in range(len(lead_taps)) for r in range(taps_last)]
    body += [f"{real}* restrict out_row = {buffer_name(out)} + {row_start};",
             f"_Pragma(\"omp simd\") for (int64_t c = 0; c < {columns}; ++c)", "{",
             f"    {real} best = {lowest}, v;",
             *[f"    v = ({read})[c]; best = (v > best || v != v) ? v : best;" for read in reads],
             "    out_row[c] = best;", "}"]
    return _loops(kernel.shape[:-1], body, share_all=True)


def _phase_span(kernel: Kernel) -> Any:
    """Elements per column-stride phase of a tap row in `_max_pool_values`'s row form: output column c's last tap
    reads element c + (taps - 1) * dilation // stride of its phase."""
    detail = kernel.detail
    last = detail.n - 1
    step, spread, taps_last = int(detail.stride[last]), int(detail.dilation[last]), int(detail.kernel[last])
    return sympy.sympify(kernel.shape[-1]) + (taps_last - 1) * spread // step


def _max_pool_scratch(kernel: Kernel) -> Any:
    """Scratch of `_max_pool_values`'s row form: every tap row of a window, split into its column-stride phases."""
    if not _max_pool_by_rows(kernel):
        return None  # one output at a time
    detail = kernel.detail
    rows = math.prod(int(detail.kernel[k]) for k in range(detail.n - 1))
    return rows * int(detail.stride[detail.n - 1]) * _phase_span(kernel) * kernel.outputs[0].dtype.itemsize


def _upsample(kernel: Kernel) -> list[str]:
    """upsample_nearest2d / upsample_bilinear2d over (N, C, H, W), computing source positions as ATen does:
    in float32 for float32 inputs (opmath), a dim whose size is unchanged is copied."""
    detail, op, out = kernel.detail, kernel.ops[0], kernel.outputs[0]
    x = detail.input
    real = "float" if x.buffer.dtype == dtypes.float32 else "double"
    body = []
    for k in range(2):
        size, target, scale = dim_expr(x.shape[2 + k]), dim_expr(kernel.shape[2 + k]), detail.scales[k]
        given = scale is not None and scale > 0
        body.append(f"const int64_t in{k} = {size}, out{k} = {target}, o{k} = i{2 + k};")
        if "nearest" in op:
            ratio = f"(float){literal(float(np.float32(1.0 / scale)))}" if given else f"(float)in{k} / (float)out{k}"
            body += [f"int64_t lo{k} = o{k};",
                     f"if (out{k} == 2 * in{k}) lo{k} = o{k} >> 1;",
                     f"else if (out{k} != in{k}) {{ lo{k} = (int64_t)floorf((float)o{k} * ({ratio})); "
                     f"if (lo{k} > in{k} - 1) lo{k} = in{k} - 1; }}"]
            continue
        if detail.align_corners:
            source = (f"const {real} ratio{k} = out{k} > 1 ? ({real})(in{k} - 1) / ({real})(out{k} - 1) : ({real})0; "
                      f"const {real} src{k} = ratio{k} * ({real})o{k};")
        else:
            # one rounding, as ATen's FMA-contracted kernels compute it (kiln.ir.ops.nn.area_pixel_sources)
            ratio = f"({real}){literal(1.0 / scale)}" if given else f"({real})in{k} / ({real})out{k}"
            fma = "fmaf" if real == "float" else "fma"
            source = (f"const {real} ratio{k} = {ratio}; {real} src{k} = {fma}(ratio{k}, ({real})o{k} + ({real})0.5, "
                      f"-({real})0.5); if (src{k} < 0) src{k} = 0;")
        body += [f"int64_t lo{k} = o{k}, hi{k} = o{k}; {real} wl{k} = 1, wh{k} = 0;",
                 f"if (out{k} != in{k})", "{", f"    {source}",
                 f"    lo{k} = (int64_t)floor(src{k}); if (lo{k} > in{k} - 1) lo{k} = in{k} - 1;",
                 f"    {real} w = src{k} - ({real})lo{k}; wh{k} = w < 0 ? 0 : w > 1 ? 1 : w; wl{k} = 1 - wh{k};",
                 f"    hi{k} = lo{k} + 1 < in{k} - 1 ? lo{k} + 1 : in{k} - 1;", "}"]

    def load(row: str, column: str) -> str:
        return f"(({real}){buffer_name(x.buffer)}[{_view_index(x, ['i0', 'i1', row, column])}])"

    target = f"{buffer_name(out)}[{_flat(kernel.shape)}]"
    if "nearest" in op:
        body.append(f"{target} = {buffer_name(x.buffer)}[{_view_index(x, ['i0', 'i1', 'lo0', 'lo1'])}];")
    else:
        body += [f"const {real} upper = {load('lo0', 'lo1')} * wl1 + {load('lo0', 'hi1')} * wh1;",
                 f"const {real} lower = {load('hi0', 'lo1')} * wl1 + {load('hi0', 'hi1')} * wh1;",
                 f"{target} = ({c_type(out.dtype)})(upper * wl0 + lower * wh0);"]
    return _loops(kernel.shape, body)


def _grid_sample(kernel: Kernel) -> list[str]:
    """grid_sampler_2d per output element, in the input's own dtype op by op (the registry's kernel follows ATen's
    vectorized CPU algebra there; C11 contracts no FMA): unnormalize each grid coordinate, apply the padding mode
    (bicubic pads each of its 16 taps instead), then nearest (round half to even), bilinear or bicubic taps. A tap
    outside the input (or at a non-finite position) reads 0."""
    detail, out = kernel.detail, kernel.outputs[0]
    x, grid, T = detail.input, detail.grid, c_type(out.dtype)
    align, padding, mode = detail.align_corners, detail.padding_mode, detail.interpolation
    height, width = dim_expr(x.shape[2]), dim_expr(x.shape[3])

    def unnormalize(g: str, size: str) -> str:
        if align:
            return f"({g} + ({T})1) * ({T})((double)({size} - 1) / 2.0)"
        return f"({g} + ({T})1) * ({T})((double){size} / 2.0) - ({T})0.5"

    def pad(v: str, size: str) -> list[str]:
        clip = f"{v} = kiln_min(({T})({size} - 1), kiln_max({v}, ({T})0));"
        if padding == 0:
            return []
        if padding == 1:
            return [clip]
        low, span = ("0", f"2 * ({size} - 1)") if align else ("-0.5", f"2 * {size}")
        return ["{", f"    const {T} low = ({T}){low}, span = ({T})({span});",
                f"    if (span <= 0) {v} = 0;",
                f"    else {{ const {T} d = ({T})fabs({v} - low); const {T} extra = d - ({T})trunc(d / span) * span; "
                f"{v} = kiln_min(extra, span - extra) + low; }}", "}", clip]

    def tap(row: str, col: str) -> str:  # x[n, c, row, col], or 0 outside
        load = f"{buffer_name(x.buffer)}[{_view_index(x, ['i0', 'i1', f'({row})', f'({col})'])}]"
        return f"(({row}) >= 0 && ({row}) < {height} && ({col}) >= 0 && ({col}) < {width} ? {load} : ({T})0)"

    def index(v: str) -> str:  # non-finite or huge positions: out of range
        return f"({v} == {v} && fabs((double){v}) < 1099511627776.0 ? (int64_t){v} : -INT64_C(1099511627776))"

    g = [f"{buffer_name(grid.buffer)}[{_view_index(grid, ['i0', 'i2', 'i3', str(k)])}]" for k in (0, 1)]
    body = [f"{T} gx = {unnormalize(g[0], width)}, gy = {unnormalize(g[1], height)};"]
    if mode == 2:  # bicubic: ATen's coefficients with A = -0.75, each tap padded on its own
        near = f"((({T})-0.75 + 2) * t - (({T})-0.75 + 3)) * t * t + 1"
        far = f"((({T})-0.75 * t - 5 * ({T})-0.75) * t + 8 * ({T})-0.75) * t - 4 * ({T})-0.75"
        body += [f"const {T} x0 = ({T})floor(gx), y0 = ({T})floor(gy), tx = gx - x0, ty = gy - y0;",
                 f"{T} wx[4], wy[4];"]
        for axis in ("x", "y"):
            for k, (form, arg) in enumerate(((far, f"t{axis} + 1"), (near, f"t{axis}"), (near, f"1 - t{axis}"),
                                             (far, f"2 - t{axis}"))):
                body.append(f"{{ const {T} t = {arg}; w{axis}[{k}] = {form}; }}")
        body += [f"{T} value = 0;", "for (int i = 0; i < 4; ++i)", "{", f"    {T} row = 0;",
                 "    for (int j = 0; j < 4; ++j)", "    {",
                 f"        {T} cx = x0 - 1 + j, cy = y0 - 1 + i;",
                 *[f"        {line}" for line in pad("cx", width) + pad("cy", height)],
                 f"        const int64_t r = {index('cy')}, c = {index('cx')};",
                 f"        row = row + {tap('r', 'c')} * wx[j];", "    }", "    value = value + row * wy[i];", "}"]
    else:
        body += [*pad("gx", width), *pad("gy", height)]
        if mode == 1:
            body += [f"const int64_t r = {index(f'({T})rint(gy)')}, c = {index(f'({T})rint(gx)')};",
                     f"const {T} value = {tap('r', 'c')};"]
        else:
            body += [f"const {T} west = ({T})floor(gx), north = ({T})floor(gy);",
                     f"const {T} w = gx - west, n = gy - north, e = ({T})1 - w, s = ({T})1 - n;",
                     f"const int64_t c = {index('west')}, r = {index('north')};",
                     f"{T} value = {tap('r', 'c')} * (s * e);", f"value = value + {tap('r', 'c + 1')} * (s * w);",
                     f"value = value + {tap('r + 1', 'c')} * (n * e);",
                     f"value = value + {tap('r + 1', 'c + 1')} * (n * w);"]
    body.append(f"{buffer_name(out)}[{_flat(kernel.shape)}] = value;")
    return _loops(kernel.shape, body)


def _pad(kernel: Kernel, state: RenderState) -> list[str]:
    """constant_pad_nd: the input at (index - left pad) where that lies inside it, else the fill value;
    reflection / replication pads mirror that position about the input's edges or clamp it to them."""
    detail, out = kernel.detail, kernel.outputs[0]
    x, before = detail.input, detail.before
    positions, inside = [], []
    for k, (size, out_size, pad) in enumerate(zip(x.shape, kernel.shape, before)):
        if sympy.sympify(pad) == 0 and sympy.expand(sympy.sympify(size) - sympy.sympify(out_size)) == 0:
            positions.append(f"i{k}")
            continue
        if detail.mode != "constant":  # mirror (reflect) or clamp (replicate) into the input
            q, last = f"(i{k} - {dim_expr(pad)})", f"({dim_expr(size)} - 1)"
            low, high = (f"-{q}", f"2 * {last} - {q}") if detail.mode == "reflect" else ("0", last)
            positions.append(f"({q} < 0 ? {low} : {q} > {last} ? {high} : {q})")
            continue
        positions.append(f"(i{k} - {dim_expr(pad)})")
        inside.append(f"i{k} - {dim_expr(pad)} >= 0 && i{k} - {dim_expr(pad)} < {dim_expr(size)}")
    value = f"({c_type(out.dtype)}){literal(detail.value)}"
    load = f"{buffer_name(x.buffer)}[{_view_index(x, positions)}]"
    element = f"({' && '.join(inside)}) ? {load} : {value}" if inside else load
    return _loops(kernel.shape, [f"{buffer_name(out)}[{_flat(kernel.shape)}] = {element};"])


def _bind(kernel: Kernel, state: RenderState) -> list[str]:
    """A data-dependent size read while running: `item()`'s element, or how many elements are nonzero. The run
    calls this kernel on one thread, between parallel regions, and checks and allocates what the size decides
    before the next kernel (kiln_run's kiln_bound)."""
    detail = kernel.detail
    slot = state.symbol_slots[detail.symbol]
    if not detail.count:
        value = f"{buffer_name(detail.source.buffer)}[{dim_expr(detail.source.offset)}]"
        return [f"    ((kiln_ctx*)ctx)->sym[{slot}] = (int64_t){value};"]
    return ["    int64_t count = 0;",
            *_nonzero_walk(detail.source, ["count += 1;"]), f"    ((kiln_ctx*)ctx)->sym[{slot}] = count;"]


def _nonzero(kernel: Kernel, state: RenderState) -> list[str]:
    """nonzero: the coordinates of each nonzero element in row-major order, one row each (its bind kernel counted
    them and sized the result)."""
    source, out = kernel.detail.source, buffer_name(kernel.outputs[0])
    rank = len(source.shape)
    return ["    int64_t row = 0;", *_nonzero_walk(source, [
        *(f"{out}[row * {rank} + {k}] = i{k};" for k in range(rank)), "row += 1;"])]


def _nonzero_walk(view: View, body: list[str]) -> list[str]:
    """One thread's loop nest over a view running `body` at each nonzero element (NaN is nonzero, as in ATen)."""
    rank = len(view.shape)
    lines = [f"{'    ' * (k + 1)}for (int64_t i{k} = 0; i{k} < {dim_expr(d)}; ++i{k})"
             for k, d in enumerate(view.shape)]
    indent = "    " * (rank + 1)
    element = f"{buffer_name(view.buffer)}[{_view_index(view, [f'i{k}' for k in range(rank)])}]"
    return [*lines, f"{indent}if ({element} != 0)", f"{indent}{{", *(f"{indent}    {line}" for line in body),
            f"{indent}}}"]


def _cat(kernel: Kernel, state: RenderState) -> list[str]:
    """One loop nest per input, each writing its slab of the output along `dim`."""
    out, dim = kernel.outputs[0], kernel.detail.dim
    rank = len(kernel.shape)
    strides = contiguous_strides(kernel.shape)
    lines = []
    for load, shape, start in kernel.detail.parts:
        variables = [f"i{k}" if k != dim else f"(i{k} + {dim_expr(start)})" for k in range(rank)]
        target = _Exprs(rank).index(strides, 0, variables)
        value = _Exprs(rank).render(load)
        lines += _loops(shape, [f"{buffer_name(out)}[{target}] = {value};"], simd=True)
    return lines


def _combine(reduce: str, dtype: dtypes.DType, old: str, value: str) -> str:
    """One scatter step on an output element: bool sums and maxima are `or`, products and minima `and`; numbers
    combine in double (exactly rounded for float32) and round to the output dtype at every step, as ATen's CPU
    kernels accumulate in the output dtype."""
    if reduce == "assign":
        return value
    if dtype == dtypes.bool_:
        return f"({old} {'||' if reduce in ('sum', 'mean', 'amax') else '&&'} {value})"
    wide = compute_type(dtype)
    step = {"sum": "({a} + {b})", "mean": "({a} + {b})", "prod": "({a} * {b})", "amax": "kiln_max({a}, {b})",
            "amin": "kiln_min({a}, {b})"}[reduce]
    return f"(({c_type(dtype)}){step.format(a=f'({wide}){old}', b=f'({wide})({value})')})"


def _scatter(kernel: Kernel, state: RenderState) -> list[str]:
    """index_put / scatter / scatter_add / scatter_reduce: copy `self` into the output, then walk the iteration
    space: the team shares its parallel dims, each of which owns the output elements it targets (see
    schedule_scatter), and every thread walks the other dims serially, so duplicates combine in a fixed order.
    Each target index is checked (an out-of-range one fails the run instead of writing outside the output)."""
    detail, out, op = kernel.detail, kernel.outputs[0], kernel.ops[-1]
    space, reduce, dtype = detail.space, detail.reduce, out.dtype
    exprs, target = _Exprs(len(kernel.shape)), f"{buffer_name(out)}"
    lines = [] if detail.in_place else _loops(
        kernel.shape, [f"{target}[{_flat(kernel.shape)}] = {exprs.render(detail.input)};"], simd=True)
    if any(isinstance(d, int) and d == 0 for d in space):  # no indices: only the copy (ATen then skips its checks,
        return lines  # so the index's rank may differ from self's, and the scatter's coordinates would not exist)
    exprs = _Exprs(len(space))
    checks, coords, counted = [], [], None
    for d, where in enumerate(detail.targets):
        if isinstance(where, int):
            coords.append(f"i{where}")
            continue
        checks.append(f"const int64_t j{d} = kiln_target((int64_t)({exprs.render(where.index)}), "
                      f"{dim_expr(where.size)}, {int(where.wrap)}, {d}, {_cstr(op)}, ctx);")
        coords.append(f"j{d}")
        counted = where
    strides = contiguous_strides(kernel.shape)
    in_range = " && ".join(f"{c} >= 0" for c in coords if c.startswith("j")) or "1"
    # an element whose target is out of range writes nothing (`at` is -1); the run then fails
    place = [*checks, f"const int64_t at = {in_range} ? {exprs.index(strides, 0, coords)} : -1;"]
    if detail.mask is not None:
        place.insert(0, f"if (!{exprs.render(detail.mask)}) continue;")
    parallel = [k for k, shared in enumerate(detail.parallel) if shared]
    serial = [k for k, shared in enumerate(detail.parallel) if not shared]

    def nest(body: list[str], before: list[str] = (), after: list[str] = ()) -> list[str]:
        head = [f"#pragma omp for collapse({len(parallel)}) schedule(static)" if parallel else "#pragma omp single"]
        head += [f"for (int64_t i{k} = 0; i{k} < {dim_expr(space[k])}; ++i{k})" for k in parallel]
        inner = [f"for (int64_t i{k} = 0; i{k} < {dim_expr(space[k])}; ++i{k})" for k in serial]
        return ["    " + line for line in [*head, "{", *[f"    {b}" for b in before], *[f"    {x}" for x in inner],
                                              "    {", *[f"        {b}" for b in body], "    }",
                                              *[f"    {a}" for a in after], "}"]]

    if reduce != "assign" and not detail.include_self:  # targeted self elements start from the identity
        lines += nest([*place, f"if (at >= 0) {target}[at] = ({c_type(dtype)}){literal(detail.identity)};"])
    step = [*place, f"if (at >= 0) {target}[at] = "
                    f"{_combine(reduce, dtype, f'{target}[at]', exprs.render(detail.value))};"]
    if reduce != "mean":
        lines += nest(step)
        return lines
    # mean: count each output element's contributions along the scattered dim in per-thread scratch, then divide
    # (floor division for integers) by the count, plus one for the self element when it takes part.
    size, d = dim_expr(counted.size), counted.dim
    line = list(coords)
    line[d] = "j"
    divisor = f"(counts[j] + {1 if detail.include_self else 0})"
    quotient = (f"(double){target}[at] / (double){divisor}" if dtype.is_floating_point
                else f"kiln_floordiv((int64_t){target}[at], {divisor})")
    before = ["int64_t* counts = (int64_t*)(ctx->scratch + (size_t)omp_get_thread_num() * ctx->scratch_stride);",
              f"for (int64_t j = 0; j < {size}; ++j) counts[j] = 0;"]
    after = [f"for (int64_t j = 0; j < {size}; ++j)", "{", "    if (!counts[j]) continue;",
             f"    const int64_t at = {exprs.index(strides, 0, line)};",
             f"    {target}[at] = ({c_type(dtype)})({quotient});", "}"]
    lines += nest([*step, f"if (at >= 0) counts[j{d}] += 1;"], before, after)
    return lines


def _norm_lines(p: float, a: str, b: str, columns: str, nan_max: bool) -> list[str]:
    """C that sets `double dist` to the p-norm of |a(k) - b(k)| over k < columns, in double as the reference:
    p = 0 counts differing coordinates, inf takes the largest difference (`nan_max`: a NaN difference wins, as
    pdist's vectorized max; else it is skipped, as cdist's std::max loop), other p use pow."""
    diff = f"const double d = fabs((double){a} - (double){b});"
    if math.isinf(p):
        step = "if (d != d) m = d; else if (d > m && m == m) m = d;" if nan_max else "if (d > m) m = d;"
        return ["double m = 0.0;", f"for (int64_t k = 0; k < {columns}; ++k) {{ {diff} {step} }}", "double dist = m;"]
    term = {0.0: "(d != d ? d : ceil(d) < 1.0 ? ceil(d) : 1.0)", 1.0: "d", 2.0: "d * d"}.get(p, f"pow(d, {p!r})")
    finish = "s" if p in (0.0, 1.0) else "sqrt(s)" if p == 2.0 else f"pow(s, {1 / p!r})"
    return ["double s = 0.0;", f"for (int64_t k = 0; k < {columns}; ++k) {{ {diff} s += {term}; }}",
            f"double dist = {finish};"]


def _distance(kernel: Kernel, state: RenderState) -> list[str]:
    """_cdist_forward / _pdist_forward: one p-norm per pair of rows, accumulated in double. Euclidean cdist takes
    ATen's matrix-product formula sqrt(max(|a|^2 + |b|^2 - 2ab, 0)) when compute_mode asks for it or, by default,
    when either side has more than 25 rows (decided at run time: the rows may be symbolic)."""
    detail, out = kernel.detail, kernel.outputs[0]
    columns, p = dim_expr(detail.columns), detail.p
    target = buffer_name(out)
    if len(detail.sides) == 1:  # pdist: pairs i < j of one matrix, in row-major order of the pairs
        x = detail.sides[0]
        exprs = _Exprs(2)
        a, b = (f"{buffer_name(x.buffer)}[{exprs.index(x.strides, x.offset, [row, 'k'])}]" for row in ("i", "j"))
        n = dim_expr(detail.rows[0])
        body = _norm_lines(p, a, b, columns, nan_max=True)
        return ["    #pragma omp for schedule(dynamic, 1)", f"    for (int64_t i = 0; i < {n}; ++i)",
                f"        for (int64_t j = i + 1; j < {n}; ++j)", "        {",
                *[f"            {line}" for line in body],
                f"            {target}[i * {n} - i * (i + 1) / 2 + (j - i - 1)] = ({c_type(out.dtype)})dist;",
                "        }"]
    rank = len(kernel.shape)
    exprs = _Exprs(rank)
    batch = [f"i{k}" for k in range(rank - 2)]
    x1, x2 = detail.sides
    a = f"{buffer_name(x1.buffer)}[{exprs.index(x1.strides, x1.offset, [*batch, f'i{rank - 2}', 'k'])}]"
    b = f"{buffer_name(x2.buffer)}[{exprs.index(x2.strides, x2.offset, [*batch, f'i{rank - 1}', 'k'])}]"
    body = _norm_lines(p, a, b, columns, nan_max=False)
    if p == 2.0 and detail.compute_mode != 2:
        rows1, rows2 = (dim_expr(r) for r in detail.rows)
        product = "1" if detail.compute_mode == 1 else f"({rows1} > 25 || {rows2} > 25)"
        body = ["double dist;", f"if ({product})", "{",
                "    double aa = 0.0, bb = 0.0, ab = 0.0;",
                f"    for (int64_t k = 0; k < {columns}; ++k) {{ const double u = (double){a}, v = (double){b}; "
                "aa += u * u; bb += v * v; ab += u * v; }",
                "    const double squared = aa + bb - 2.0 * ab;",
                "    dist = sqrt(squared != squared || squared > 0.0 ? squared : 0.0);", "}", "else", "{",
                *[f"    {line}" for line in body[:-1]], f"    {body[-1].replace('double dist', 'dist')}", "}"]
    return _loops(kernel.shape, [*body, f"{target}[{_flat(kernel.shape)}] = ({c_type(out.dtype)})dist;"])


def _bags(kernel: Kernel, state: RenderState) -> list[str]:
    """_embedding_bag: the team shares the bags; each bag walks its indices in order, in double (as the reference),
    per column. Bag b runs from offsets[b] to offsets[b + 1] (the last one to the end of the indices); offsets that
    do not start at 0, decrease or pass the end, and indices outside the weight, fail the run."""
    detail, (out, offset2bag, bag_size, max_indices) = kernel.detail, kernel.outputs
    weight, indices, offsets, psw = detail.weight, detail.indices, detail.offsets, detail.per_sample_weights
    mode, pad, op = detail.mode, detail.padding_idx, kernel.ops[-1]

    def at(view: Any, *variables: str) -> str:
        return f"{buffer_name(view.buffer)}[{_Exprs(len(variables)).index(view.strides, view.offset, list(variables))}]"

    count, bags, dim = dim_expr(indices.shape[0]), dim_expr(kernel.shape[0]), dim_expr(kernel.shape[1])
    noff = dim_expr(offsets.shape[0])
    row = checked_index(at(indices, "i"), weight.shape[0], 0, op, wrap=False)
    skip = f"if (r == INT64_C({pad})) continue; " if pad >= 0 else ""
    scale = f" * (double){at(psw, 'i')}" if psw is not None else ""
    last = f" || (b == {bags} - 1 && end != {count})" if detail.include_last_offset else ""
    body = [f"int64_t start = (int64_t){at(offsets, 'b')}, end = b + 1 < {noff} ? (int64_t){at(offsets, '(b + 1)')} "
            f": {count};",
            f"if ((b == 0 && start != 0) || start < 0 || start > end || end > {count}{last})",
            "{", f"    kiln_index_error((b == 0 && start != 0) || start < 0 ? start : end, {count} + 1, 0, "
            f"{_cstr(op + ' offsets (they must start at 0, not decrease and end within the indices)')}, ctx);",
            "    start = end = 0;", "}",
            "int64_t size = 0;",
            f"for (int64_t i = start; i < end; ++i) {{ const int64_t r = {row}; (void)r; "
            + (f"{buffer_name(offset2bag)}[i] = b; " if sympy.sympify(offset2bag.numel) != 0 else "")
            + f"{skip}size += 1; }}",
            f"{buffer_name(bag_size)}[b] = {'size' if mode != 0 else '0'};"]
    if mode != 2:
        body.append(f"{buffer_name(max_indices)}[b] = {'size' if mode == 1 else '0'};")
    column = [f"for (int64_t c = 0; c < {dim}; ++c)", "{"]
    walk = f"for (int64_t i = start; i < end; ++i) {{ const int64_t r = {row}; {skip}"
    value = f"(double){at(weight, 'r', 'c')}"
    if mode == 2:  # max as ATen scans: the bag's first row, then each strictly greater one (a NaN only if first)
        column += ["    double m = 0.0;", "    int64_t kept = -1;",
                   f"    {walk}const double v = {value}; if (kept < 0 || v > m) {{ m = v; kept = i; }} }}",
                   f"    {buffer_name(out)}[b * {dim} + c] = ({c_type(out.dtype)})(size ? m : 0.0);",
                   f"    {buffer_name(max_indices)}[b * {dim} + c] = size ? "
                   f"({c_type(max_indices.dtype)}){at(indices, 'kept')} : 0;", "}"]
    else:
        divide = " / (double)(size > 0 ? size : 1)" if mode == 1 else ""
        column += ["    double s = 0.0;",
                   f"    {walk}s += {value}{scale}; }}",
                   f"    {buffer_name(out)}[b * {dim} + c] = ({c_type(out.dtype)})(s{divide});", "}"]
    lines = ["    #pragma omp for schedule(static)", f"    for (int64_t b = 0; b < {bags}; ++b)", "    {",
             *[f"        {line}" for line in body + column], "    }"]
    return lines


_SPARSE_FEATURES = 16  # output features per unit of a CSR or 2:4 layer: the epilogue stores them contiguously
_24_FEW = 4  # KILN_24_FEW (kiln_sparse.h): the most activation rows 2:4 reads untransposed
_24P_ROWS = 64  # KILN_24P_ROWS (kiln_sparse.h): weight rows per unit of the 2:4 pair kernel
# KILN_24P_GROUPS, KILN_24P_SPAN, KILN_24P_PLANE, KILN_24P_KEPT (kiln_sparse.h)
_24P_GROUPS, _24P_SPAN, _24P_PLANE, _24P_KEPT = 8, 32, 64, 16


def _sparse_linear(kernel: Kernel, state: RenderState) -> list[str]:
    """linear with a sparse weight (kiln_sparse.h). CSR and BSR: the team first transposes the activations into
    xT [K, M] in 32 x 32 tiles (one row needs none), then shares (group of output features, chunk of KILN_SMB
    activation rows) units in dynamic chunks (rows hold different numbers of weights). 2:4 reads the rows as they
    are: a few at a time, or more through the pair kernel, whose equal units the threads split evenly. A unit's tile
    goes through the bias and the fused epilogue into the output, its features contiguous (vectorized, as the dense
    GEMM's tiles are)."""
    detail, out = kernel.detail, kernel.outputs[0]
    offsets = _sparse_offsets(kernel)
    parts = _sparse_parts(kernel, state)
    layout, (block_rows, block_cols) = detail.layout, detail.block
    rows = detail.x
    group = block_rows if layout == "sparse_bsr" else _SPARSE_FEATURES
    if layout == "semi_structured":
        compute = [f"kiln_24_rows(K, width, {parts['values']} + n0 * (K / 2), {parts['metadata']} + n0 * (K / 8), "
                   f"mb, tile, x + m0 * K);"]
    elif layout == "sparse_csr":
        crow = parts["crow_indices"]
        compute = [f"for (int r = 0; r < width; ++r) kiln_csr_row({crow}[n0 + r], {crow}[n0 + r + 1], "
                   f"{parts['col_indices']}, {parts['values']}, xT + m0, ldx, mb, tile + r * KILN_SMB);"]
        if _uses_sell(kernel):
            sell = f"(const char*)ctx->packed[{state.packed[kernel]}] + {offsets[None]}"
            compute = ["if (M == 1)",
                       f"    for (int s = 0; s < (width + 7) / 8; ++s) kiln_sell_slice({sell}, N, n0 / 8 + s, xT, "
                       "tile + 8 * s * KILN_SMB);",
                       f"else {compute[0]}"]
    else:
        crow = parts["crow_indices"]
        compute = [f"kiln_bsr_row({crow}[unit], {crow}[unit + 1], {parts['col_indices']}, {parts['values']}, "
                   f"R, C, xT + m0, ldx, mb, tile);"]
    exprs = _Exprs(len(kernel.shape))
    # the output index of tile element (r, m): the last is the feature; the leading dims unflatten the activation row
    leading = kernel.shape[:-1]
    index_lines, rest = [], "(m0 + m)"
    for position in range(len(leading) - 1, -1, -1):
        size = dim_expr(leading[position])
        index_lines.insert(0, f"const int64_t i{position} = {rest} % ({size});" if position else
                           f"const int64_t i0 = {rest};")
        rest = f"({rest} / ({size}))"
    result_type = accumulator_type(kernel)

    def epilogue(features: int) -> list[str]:
        """A unit's by_row [KILN_SMB x features] through the bias and the fused epilogue into the output."""
        value = f"(double)by_row[m * {features} + r]"
        if detail.bias is not None:
            value = f"{value} + (double){exprs.render(detail.bias)}"
        return [
            "for (int m = 0; m < mb; ++m)",
            "    _Pragma(\"omp simd\") for (int r = 0; r < width; ++r)", "    {",
            *[f"        {line}" for line in index_lines],
            f"        const int64_t i{len(leading)} = n0 + r;",
            f"        const {result_type} acc_value = ({result_type})({value});",
            f"        {buffer_name(out)}[(m0 + m) * N + n0 + r] = {exprs.render(kernel.expr)};",
            "    }"]

    x = f"{buffer_name(rows.buffer)} + {dim_expr(rows.offset)}"
    lines = [
        f"const int64_t M = {dim_expr(detail.m)}, N = {dim_expr(detail.n)}, K = {dim_expr(detail.k)};",
        f"const int R = {block_rows}, C = {block_cols}; (void)C; (void)R;",
        f"const int64_t units = (N + {group} - 1) / {group}, chunks = (M + KILN_SMB - 1) / KILN_SMB;",
        f"const float* x = {x};",
    ]
    if layout != "semi_structured":  # (2:4 reads the rows as they are)
        x_transposed = buffer_name(detail.xT)
        lines += [
            "const int64_t ldx = M > 1 ? (M + 15) / 16 * 16 : 1;  /* whole vectors of rows (kiln_sv): zeros past M */",
            "if (M > 1)", "{",
            "    #pragma omp for collapse(2) schedule(static)",
            "    for (int64_t k0 = 0; k0 < K; k0 += 32)",
            "    for (int64_t r0 = 0; r0 < ldx; r0 += 32)",
            "    {",
            "        const int64_t k_end = k0 + 32 < K ? k0 + 32 : K, r_end = r0 + 32 < ldx ? r0 + 32 : ldx;",
            "        for (int64_t r = r0; r < r_end; ++r)",
            f"            for (int64_t k = k0; k < k_end; ++k) {x_transposed}[k * ldx + r] = "
            "r < M ? x[r * K + k] : 0.0f;",
            "    }",
            "}",
            f"const float* xT = M > 1 ? {x_transposed} : x;",
        ]
    pairs = _uses_24_pairs(kernel)
    if pairs:
        # Several activation rows. The units are equal work (a 2:4 row keeps half its weights), so each thread takes
        # an even, contiguous share of the (chunk, unit) items and lays out the pair planes it reads itself, from
        # the rows: no barrier between spans, and no planes read from another core's cache.
        stream = f"(const char*)ctx->packed[{state.packed[kernel]}] + {offsets[None]}"
        lines += [
            "if (M > KILN_24_FEW)", "{",
            "    const int64_t blocks = kiln_24p_blocks(K), pair_units = (N + KILN_24P_ROWS - 1) / KILN_24P_ROWS;",
            "    const int64_t items = chunks * pair_units;",
            "    const int team = omp_get_num_threads();",
            "    #pragma omp for schedule(static)",
            "    for (int t = 0; t < team; ++t)", "    {",
            "        float* planes = (float*)(ctx->scratch + (size_t)omp_get_thread_num() * ctx->scratch_stride);",
            "        float* kept = planes + kiln_24p_plane_floats(K);  /* the share's sums between spans */",
            "        float by_row[KILN_SMB * KILN_24P_ROWS] __attribute__((aligned(64))), "
            "unit_sums[KILN_24P_ROWS * KILN_24P_PLANE] __attribute__((aligned(64)));",
            "        const int64_t first = items * t / team, last = items * (t + 1) / team;",
            "        for (int64_t chunk = first / pair_units; first < last && chunk * pair_units < last; ++chunk)",
            "        {",
            "            const int64_t m0 = chunk * KILN_SMB, item0 = chunk * pair_units;  /* the chunk's units: */",
            "            const int64_t u0 = (first > item0 ? first : item0) - item0;",
            "            const int64_t u1 = (last < item0 + pair_units ? last : item0 + pair_units) - item0;",
            "            const int mb = (int)(M - m0 < KILN_SMB ? M - m0 : KILN_SMB), rows = kiln_24p_rows(mb);",
            "            const int halves = rows > 16 ? 2 : 1;  /* of the planes: 16 rows each */",
            # with several spans, the sums of at most KILN_24P_KEPT units wait at a time (the planes are laid out
            # again for each such batch of units)
            "            const int64_t batch = blocks > KILN_24P_SPAN ? KILN_24P_KEPT : u1 - u0;",
            "            for (int64_t v0 = u0; v0 < u1; v0 += batch)",
            "            for (int64_t b0 = 0; b0 < blocks; b0 += KILN_24P_SPAN)", "            {",
            "                const int64_t b1 = b0 + KILN_24P_SPAN < blocks ? b0 + KILN_24P_SPAN : blocks;",
            "                for (int64_t g = b0 * KILN_24P_GROUPS; g < b1 * KILN_24P_GROUPS; g += 4)",
            "                    kiln_24p_planes(K, g, x + m0 * K, mb, halves,",
            "                                    planes + (g - b0 * KILN_24P_GROUPS) * KILN_24P_GROUP);",
            "                for (int64_t unit = v0; unit < u1 && unit < v0 + batch; ++unit)", "                {",
            "                    float* sums = blocks > KILN_24P_SPAN ? "
            "kept + (unit - v0) * KILN_24P_ROWS * KILN_24P_PLANE : unit_sums;",
            f"                    kiln_24p_unit(b0, b1, {stream} + unit * kiln_24p_unit_bytes(K), planes, rows, sums);",
            "                    if (b1 < blocks) continue;",
            "                    kiln_24p_finish(sums, rows, by_row);",
            "                    const int64_t n0 = unit * KILN_24P_ROWS;",
            "                    const int width = (int)(N - n0 < KILN_24P_ROWS ? N - n0 : KILN_24P_ROWS);",
            *[f"                    {line}" for line in epilogue(_24P_ROWS)],
            "                }",
            "            }", "        }", "    }", "}", "else", "{"]
    body = [
        f"float tile[{group} * KILN_SMB] __attribute__((aligned(64))), by_row[KILN_SMB * {group}] "
        "__attribute__((aligned(64)));",
        _shared_units(2, "units * chunks"),
        "for (int64_t unit = 0; unit < units; ++unit)",
        "for (int64_t chunk = 0; chunk < chunks; ++chunk)", "{",
        f"    const int64_t n0 = unit * {group}, m0 = chunk * KILN_SMB;",
        f"    const int width = (int)(N - n0 < {group} ? N - n0 : {group});",
        "    const int mb = (int)(M - m0 < KILN_SMB ? M - m0 : KILN_SMB);",
        *[f"    {line}" for line in compute],
        "    for (int r = 0; r < width; ++r)  /* features become the contiguous dim, as the output's */",
        f"        for (int m = 0; m < mb; ++m) by_row[m * {group} + r] = tile[r * KILN_SMB + m];",
        *[f"    {line}" for line in epilogue(group)], "}"]
    lines += [f"    {line}" for line in body] + ["}"] if pairs else body
    return ["    " + line for line in lines]


def _sparse_conv(kernel: Kernel, state: RenderState) -> list[str]:
    """convolution with a BSR weight (hybrid: blocks of R output x C input channels with all their taps; CSR is
    R = C = 1) as BSR x im2col [C_in * taps, pixels]: a block's columns are its input channels' taps, so
    kiln_bsr_row runs it with C * taps columns. A unit is (image, KILN_NR-pixel panel, chunk of block rows): it packs
    its im2col panel as the dense implicit GEMM does, runs the chunk's block rows against it, and sends each tile
    through the bias and the fused epilogue. With few pixels (`whole_im2col`) a unit is (image, chunk of block
    rows) against every panel of the image, packed once per thread and image, so each block row's weights are read
    from memory once (panel by panel, 512 channels at 7 x 7 ran at 0.36x dense with 20% zero blocks)."""
    detail = kernel.detail
    parts = _sparse_parts(kernel, state)
    block_rows, block_cols = detail.block
    shape = detail.weight_shape
    taps = math.prod(int(d) for d in shape[2:])
    positions, packing = im2col_panel(kernel, shape, state)
    indices, target, epilogue, flat = conv_epilogue(kernel, "ib * R + r")
    value = "(double)tile[r * KILN_SMB + c]"
    if detail.bias is not None:
        value = f"{value} + (double){buffer_name(detail.bias.buffer)}[{_view_index(detail.bias, ['i1'])}]"
    result_type = accumulator_type(kernel)
    pixels = " * ".join(dim_expr(d) for d in kernel.shape[2:])
    whole = whole_im2col(kernel)
    block_row = [
        f"kiln_bsr_row({parts['crow_indices']}[ib], {parts['crow_indices']}[ib + 1], {parts['col_indices']}, "
        f"{parts['values']}, R, CT, panel, KILN_NR, (int)width, tile);",
        "for (int r = 0; r < R; ++r)",
        "    _Pragma(\"omp simd\") for (int64_t c = 0; c < width; ++c)", "    {",
        *[f"        {line}" for line in indices],
        f"        const {result_type} acc_value = ({result_type})({value});",
        f"        {target} = {epilogue};",
        "    }"]
    lines = [
        f"const int64_t BATCH = {dim_expr(kernel.shape[0])}, M = {int(shape[0])}, N = {pixels}, "
        f"K = {int(shape[1]) * taps};",
        f"const int R = {block_rows}, CT = {block_cols * taps};  /* a block: R rows x CT im2col rows */",
        "const int64_t panels = kiln_panels(N), block_rows = M / R;",
        f"const int64_t units = BATCH{'' if whole else ' * panels'}, wanted = 4 * (int64_t)omp_get_num_threads();",
        "/* few units: split the channels */",
        "int64_t chunks = units >= wanted || units == 0 ? 1 : (wanted + units - 1) / units;",
        "if (chunks > block_rows) chunks = block_rows;",
        "const int64_t chunk_blocks = (block_rows + chunks - 1) / chunks;",
        "float* pack = (float*)(ctx->scratch + (size_t)omp_get_thread_num() * ctx->scratch_stride);",
        f"float tile[{block_rows} * KILN_SMB] __attribute__((aligned(64)));",
        "const int64_t cin0 = 0; (void)K;",
    ]
    chunk_range = ["const int64_t ib_begin = chunk * chunk_blocks, ib_end = ib_begin + chunk_blocks < block_rows ? "
                   "ib_begin + chunk_blocks : block_rows;"]
    width = "const int64_t width = N - j * KILN_NR < KILN_NR ? N - j * KILN_NR : KILN_NR;"
    if not whole:
        lines += [_shared_units(3, "units * chunks"),
                  "for (int64_t bi = 0; bi < BATCH; ++bi)",
                  "for (int64_t j = 0; j < panels; ++j)",
                  "for (int64_t chunk = 0; chunk < chunks; ++chunk)", "{",
                  "    float* panel = pack;",
                  *["    " + line for line in positions + packing + chunk_range],
                  "    " + width,
                  "    for (int64_t ib = ib_begin; ib < ib_end; ++ib)", "    {",
                  *["        " + line for line in block_row], "    }", "}"]
        return ["    " + line for line in lines]
    lines += ["int64_t packed_image = -1;  /* the image whose im2col panels are in `pack` */",
              "#pragma omp for collapse(2) schedule(static)",
              "for (int64_t bi = 0; bi < BATCH; ++bi)",
              "for (int64_t chunk = 0; chunk < chunks; ++chunk)", "{",
              "    if (packed_image != bi)", "    {",
              "        packed_image = bi;",
              "        for (int64_t j = 0; j < panels; ++j)", "        {",
              "            float* panel = pack + j * K * KILN_NR;",
              *["            " + line for line in positions + packing],
              "        }", "    }",
              *["    " + line for line in chunk_range],
              "    for (int64_t ib = ib_begin; ib < ib_end; ++ib)",
              "    for (int64_t j = 0; j < panels; ++j)", "    {",
              "        const float* panel = pack + j * K * KILN_NR;",
              *(["        " + line for line in positions] if not flat else []),
              "        " + width,
              *["        " + line for line in block_row], "    }", "}"]
    return ["    " + line for line in lines]


def _sparse_parts(kernel: Kernel, state: RenderState) -> dict[str, str]:
    """C expressions of a sparse weight's components in its packed block (copied there at create)."""
    offsets = _sparse_offsets(kernel)
    return {name: f"((const {c_type(buf.dtype)}*)((const char*)ctx->packed[{state.packed[kernel]}] + {offsets[name]}))"
            for name, buf in kernel.detail.components.items()}


KERNEL_RENDERERS: dict[str, Callable[[Kernel, RenderState], list[str]]] = {
    "pointwise": _pointwise, "matmul": _matmul, "attention": _attention, "rows": _rows, "conv": render_conv,
    "window": _window, "cat": _cat, "pad": _pad, "scatter": _scatter, "distance": _distance, "bags": _bags,
    "sparse_linear": _sparse_linear, "sparse_conv": _sparse_conv, **quantized.RENDERERS,
    "lstm_cell": recurrent.render_lstm_cell, "bind": _bind, "nonzero": _nonzero,
}

PRELUDE = """\
#define _POSIX_C_SOURCE 200809L  /* clock_gettime (kiln_threads.h) in ISO C mode */
#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KILN_ABI_VERSION {abi}
#define KILN_MAX_RANK {max_rank}
/* An output whose size the run reads from values (kiln.h): kiln_run allocates it and says its shape. */
typedef struct {{ void* data; int64_t shape[KILN_MAX_RANK]; }} kiln_allocated_output;
#define KILN_WORK_PER_THREAD 6.0e5  /* below this many operations per thread, fewer threads are faster */
#define kiln_max(a, b) ((a) != (a) ? (a) : (b) != (b) ? (b) : (a) > (b) ? (a) : (b))
#define kiln_min(a, b) ((a) != (a) ? (a) : (b) != (b) ? (b) : (a) < (b) ? (a) : (b))
/* max/min against a bound that is never NaN (a clamp's literal bound), as ATen's clamp and relu compute them
   (x < lo ? lo : x): NaN passes through, and -0.0 against a bound of 0.0 stays -0.0, where kiln_max gives the
   bound. One compare and one select, which GCC vectorizes as such; kiln_max's nested selects become byte-wide
   masks moved through integer registers (ReLU6 after a depthwise convolution over 32 channels at 112x112: 148 us
   with them, 137 with these) */
#define kiln_max_bound(a, bound) ((a) < (bound) ? (bound) : (a))
#define kiln_min_bound(a, bound) ((a) > (bound) ? (bound) : (a))
#define kiln_relu(x) ((x) < 0 ? 0 : (x))
/* v where keep, else +0.0, by masking its bits: GCC vectorizes `keep ? v : 0.0f` with v a load into a masked
   load, which ran a depthwise convolution 8x slower than this plain load and AND */
static inline float kiln_keep_or_zero(float v, int keep) {{
    union {{ float f; int32_t i; }} bits = {{ v }};
    bits.i &= -keep;
    return bits.f;
}}
static inline double kiln_gelu(double x) {{ return 0.5 * x * (1.0 + erf(x * 0.70710678118654752440)); }}
static inline double kiln_gelu_tanh(double x) {{
    return 0.5 * x * (1.0 + tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x)));
}}
static inline double kiln_where_double(bool c, double a, double b) {{ return c ? a : b; }}
static inline int64_t kiln_where_int64(bool c, int64_t a, int64_t b) {{ return c ? a : b; }}
static inline int32_t kiln_where_int32(bool c, int32_t a, int32_t b) {{ return c ? a : b; }}
static inline int16_t kiln_where_int16(bool c, int16_t a, int16_t b) {{ return c ? a : b; }}
static inline int8_t kiln_where_int8(bool c, int8_t a, int8_t b) {{ return c ? a : b; }}
static inline uint8_t kiln_where_uint8(bool c, uint8_t a, uint8_t b) {{ return c ? a : b; }}
static inline bool kiln_where_bool(bool c, bool a, bool b) {{ return c ? a : b; }}
static inline int64_t kiln_floordiv(int64_t a, int64_t b) {{
    int64_t q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}}

/* Per-call state: symbol values, buffer addresses, the model's packed weight panels, per-thread scratch. */
typedef struct {{
    int64_t sym[{nsym}];
    void* buf[{nbuf}];
    float* const* packed;
    unsigned char* scratch;
    size_t scratch_stride;
    int64_t* index_error;  /* [flag, index, dim, size] of the first out-of-range index a kernel met */
    const char** index_error_op;  /* the op that met it */
}} kiln_ctx;
static __attribute__((noinline, cold)) int64_t kiln_index_error(int64_t i, int64_t n, int dim, const char* op,
                                                                const kiln_ctx* ctx) {{
    #pragma omp critical(kiln_index_error)
    if (!ctx->index_error[0]) {{
        ctx->index_error[1] = i; ctx->index_error[2] = dim; ctx->index_error[3] = n; ctx->index_error_op[0] = op;
        ctx->index_error[0] = 1;
    }}
    return 0;  /* a safe position: the run fails once the kernels finish */
}}
static inline int64_t kiln_index(int64_t i, int64_t n, int dim, const char* op, const kiln_ctx* ctx) {{
    return i >= 0 && i < n ? i : kiln_index_error(i, n, dim, op, ctx);
}}
static inline int64_t kiln_index_wrap(int64_t i, int64_t n, int dim, const char* op, const kiln_ctx* ctx) {{
    int64_t j = i < 0 ? i + n : i;  /* index.Tensor, index_put: negative indices count from the end */
    return j >= 0 && j < n ? j : kiln_index_error(i, n, dim, op, ctx);
}}
/* A scatter's target index: -1 where it is out of range (recorded as kiln_index records it), so the write is skipped
   rather than made at a safe position: a state the scatter updates in place keeps its other elements, as ATen's
   in-place kernels leave them. */
static inline int64_t kiln_target(int64_t i, int64_t n, int wrap, int dim, const char* op, const kiln_ctx* ctx) {{
    int64_t j = wrap && i < 0 ? i + n : i;
    if (j >= 0 && j < n) return j;
    kiln_index_error(i, n, dim, op, ctx);
    return -1;
}}
"""


class KernelBodies:
    """Kernels that differ only in which buffers and packed panels they use (the same layer repeated N times)
    share one C function; each kernel becomes a one-line wrapper passing its own. The C compiler then compiles
    each distinct body once, which is most of a large model's build time."""

    def __init__(self, schedule: Schedule):
        self.schedule = schedule
        self.types = {buffer_name(buf): ("const " if buf.kind in ("input", "weight") else "") + c_type(buf.dtype)
                      for buf in schedule.buffers}
        self.slots = {buffer_name(buf): f"ctx->buf[{buf.index}]" for buf in schedule.buffers}
        self.pattern = re.compile(r"\b(?:" + "|".join(map(re.escape, sorted(self.types, key=len, reverse=True)))
                                  + r")\b|ctx->packed\[\d+\]") if self.types else re.compile(r"ctx->packed\[\d+\]")
        self.shared: dict[tuple[str, tuple[str, ...]], str] = {}  # (canonical body, parameters) -> function name
        self.definitions: list[list[str]] = []

    def kernel_function(self, number: int | str, kernel: Kernel, state: RenderState) -> list[str]:
        name = f"kernel_{number}_{identifier(kernel.name)}"
        if kernel.kind == "loop":
            return self.loop_function(name, kernel, state)
        body = KERNEL_RENDERERS[kernel.kind](kernel, state)
        parameters: dict[str, str] = {}  # what the body uses (buffer or packed panel) -> its parameter name

        def canonical(match: re.Match) -> str:
            return parameters.setdefault(match.group(0), f"buf_arg{len(parameters)}")
        divisions, text = hoist_symbol_divisions(self.pattern.sub(canonical, "\n".join(body)))
        declared = [f"const float* restrict {p}" if used.startswith("ctx->packed") else
                    f"{self.types[used]}* restrict {p}" for used, p in parameters.items()]
        # The same text over buffers of other dtypes (a cast of int32 or of float32 values) is another function.
        key = ("\n".join([*divisions, text]), tuple(declared))
        shared = self.shared.get(key)
        if shared is None:
            shared = self.shared[key] = f"kernel_body_{len(self.shared)}"
            self.definitions.append([f"KILN_BODY void {shared}({', '.join(['const kiln_ctx* ctx', *declared])})",
                                     "{", *symbol_prologue(self.schedule), *divisions, text, "}", ""])
        arguments = [used if used.startswith("ctx->packed") else f"({self.types[used]}*){self.slots[used]}"
                     for used in parameters]
        return [f"/* {kernel.kind}: {', '.join(dict.fromkeys(kernel.ops))} */",
                f"static void {name}(const kiln_ctx* ctx) {{ {shared}({', '.join(['ctx', *arguments])}); }}"]

    def loop_function(self, name: str, kernel: Kernel, state: RenderState) -> list[str]:
        """A loop kernel (kiln.scan, kiln.map, kiln.while_loop): its regions' kernels, then a function every thread
        of the team runs, stepping through the loop. Each step one thread points the windows at the step's slices
        and carry slots (the `single`'s barrier publishes them); the regions' kernels then share their loops as
        top-level kernels do, so the whole loop stays inside the run's one parallel region."""
        lines: list[str] = []
        detail = kernel.detail
        prefix = name[len("kernel_"):]

        def calls(kernels: list[Kernel], region: str) -> list[str]:
            found = []
            for index, inner in enumerate(kernels):
                lines.extend(self.kernel_function(f"{prefix}_{region}{index}", inner, state))
                found.append(f"kernel_{prefix}_{region}{index}_{identifier(inner.name)}(ctx);")
            return found

        cond_calls, body_calls = calls(detail.cond or [], "c"), calls(detail.body, "")
        step, last = sympy.Symbol("step"), sympy.Symbol("last")  # the loop's counter, and its final value
        i = symbol_name(step)

        def address(buf: Buffer, elements: Any = 0) -> str:
            base = f"(unsigned char*)loop->buf[{buf.index}]"
            return base if same_dim(elements, 0) else \
                f"{base} + (size_t)({dim_expr(sympy.expand(elements))}) * sizeof({c_type(buf.dtype)})"

        def copy(carry: Any, source: str) -> str:
            size = f"(size_t)({dim_expr(carry.final.numel)}) * sizeof({c_type(carry.final.dtype)})"
            return f"memcpy(loop->buf[{carry.final.index}], {source}, {size});"

        def single(statements: list[str], depth: str) -> list[str]:
            return [f"{depth}#pragma omp single", f"{depth}{{", *(f"{depth}    {line}" for line in statements),
                    f"{depth}}}"] if statements else []

        reads, writes, lasts = [], [], []
        for w in [*detail.slices, *detail.stacked]:
            reads.append(f"loop->buf[{w.window.index}] = {address(w.source, w.offset + step * w.window.numel)};")
        for carry in detail.carries:
            if carry.stacked is not None:  # step t reads the stacked output's slice t - 1
                w = carry.stacked
                reads.append(f"loop->buf[{carry.read.index}] = {i} == 0 ? "
                             f"{address(carry.init.buffer, carry.init.offset)} : "
                             f"{address(w.source, w.offset + (step - 1) * w.window.numel)};")
                lasts.append(copy(carry, address(w.source, w.offset + last * w.window.numel)))
                continue
            first, second = (f"loop->buf[{slot.index}]" for slot in carry.slots)
            reads.append(f"loop->buf[{carry.read.index}] = {i} == 0 ? "
                         f"{address(carry.init.buffer, carry.init.offset)} : {i} % 2 ? {first} : {second};")
            ending = f"{i} == trips - 1 ? loop->buf[{carry.final.index}] : " if detail.cond is None else ""
            writes.append(f"loop->buf[{carry.write.index}] = {ending}{i} % 2 ? {second} : {first};")
        # the kind comment `kiln inspect` lists, after the step's kernels above it
        lines += [f"/* loop: {', '.join(kernel.ops)} */",
                  f"/* each step runs the {_count(len(cond_calls) + len(body_calls), 'kernel')} above */",
                  f"static void {name}(const kiln_ctx* ctx)", "{",
                  "    kiln_ctx* loop = (kiln_ctx*)ctx;  /* the call's context: the loop moves its windows */",
                  *symbol_prologue(self.schedule)]
        if detail.cond is not None:  # while: the cond kernels decide each step; the last carries read are the results
            predicate = detail.predicate
            test = f"((const bool*)loop->buf[{predicate.buffer.index}])[{dim_expr(predicate.offset)}]"
            lines += [f"    for (int64_t {i} = 0;; ++{i})", "    {", *single(reads, "        "),
                      *(f"        {call}" for call in cond_calls),
                      "        #pragma omp barrier",
                      f"        if (!{test})", "        {",
                      *single([copy(c, f"loop->buf[{c.read.index}]") for c in detail.carries], "            "),
                      "            return;", "        }", *single(writes, "        "),
                      *(f"        {call}" for call in body_calls), "    }", "}"]
            return lines
        lines.append(f"    const int64_t trips = {dim_expr(kernel.shape[0])};")
        finals = [copy(c, address(c.init.buffer, c.init.offset)) for c in detail.carries]
        if finals:  # zero steps: the final carries are the initial ones
            lines += ["    if (trips == 0)", "    {", *single(finals, "        "), "        return;", "    }"]
        lines += [f"    for (int64_t {i} = 0; {i} < trips; ++{i})", "    {", *single(reads + writes, "        "),
                  *(f"        {call}" for call in body_calls), "    }"]
        if lasts:
            lines += [f"    const int64_t {symbol_name(last)} = trips - 1;", *single(lasts, "    ")]
        return lines + ["}"]


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _scratch_bytes(kernel: Kernel, packed: dict) -> Any:
    """Per-thread scratch a kernel needs (one packed KILN_NR-wide panel of B or of im2col), or None."""
    if kernel.kind == "matmul" and kernel.detail.a_gather is not None:  # indices, then a row chunk's columns
        columns = sympy.sympify(kernel.detail.k) * _GROUP_ROW_TILES * _MAX_MR * 4 if kernel in packed else 0
        return (_gathered_ints(kernel) * 8 + 63) // 64 * 64 + columns
    if kernel.kind == "matmul" and _gemm_operands_f32(kernel) and kernel not in packed and \
            not _matrix_vector(kernel):
        return sympy.sympify(kernel.detail.k) * _MAX_NR * 4
    if _packs_a(kernel, packed):  # A in row blocks, when it fits the limit (kiln_run checks it too)
        rows = -_MAX_MR * sympy.floor(-sympy.sympify(kernel.shape[0]) / _MAX_MR)
        return sympy.Min(rows * sympy.sympify(kernel.detail.k), _PACKED_A_LIMIT) * 4
    if kernel.kind == "attention":
        return _attention_scratch(kernel)
    if _uses_24_pairs(kernel):  # a span's pair planes, then a batch of units' sums between spans (kiln_sparse.h)
        groups, units = -(-int(kernel.detail.k) // 4), -(-int(kernel.detail.n) // _24P_ROWS)
        blocks = -(-groups // _24P_GROUPS)
        sums = min(units, _24P_KEPT) * _24P_ROWS * _24P_PLANE if blocks > _24P_SPAN else 0
        return sympy.Integer((min(blocks, _24P_SPAN) * _24P_GROUPS * 6 * _24P_PLANE + sums) * 4)
    if kernel.kind in quantized.RENDERERS:
        return quantized.scratch_bytes(kernel, packed)
    if pixel_rows(kernel, packed):
        pixels = sympy.Mul(*[sympy.sympify(d) for d in kernel.shape[2:]])  # an image's im2col in row blocks,
        return (-_MAX_MR * sympy.floor(-pixels / _MAX_MR) * sympy.Mul(  # then the tiles' channels
            *[sympy.sympify(d) for d in kernel.detail.weight.shape[1:]]) + _MAX_NR * pixels) * 4
    if depthwise(kernel):  # one padded input plane, one output plane of sums
        return depthwise_scratch(kernel)
    if kernel.kind == "conv" and conv_as_gemm(kernel):  # one im2col panel, or a whole image's (`whole_im2col`)
        panels = -sympy.floor(-sympy.Mul(*[sympy.sympify(d) for d in kernel.shape[2:]]) / 32) \
            if whole_im2col(kernel) else 1
        return sympy.Mul(*[sympy.sympify(d) for d in kernel.detail.weight.shape[1:]]) * 32 * 4 * panels
    if kernel.kind == "sparse_conv":  # one im2col panel, or a whole image's (`whole_im2col`)
        panels = -sympy.floor(-sympy.Mul(*[sympy.sympify(d) for d in kernel.shape[2:]]) / 32) \
            if whole_im2col(kernel) else 1
        return sympy.Mul(*[sympy.sympify(d) for d in kernel.detail.weight_shape[1:]]) * 32 * 4 * panels
    if kernel.kind == "window" and _max_pool_values_only(kernel):
        return _max_pool_scratch(kernel)
    if _shared_extremum(kernel):  # each thread's share: its extremum and NaN flag
        return sympy.Integer(16)
    if kernel.kind == "rows" and kernel.ops[-1] in SORT_OPS:  # two int64 and two value arrays of the row length
        return sympy.sympify(kernel.shape[kernel.detail.dim]) * 32
    if kernel.kind == "rows" and _transposed_rows(kernel):  # a tile of rows
        return sympy.sympify(kernel.shape[kernel.detail.dim]) * _ROW_TILE * 4
    if kernel.kind == "scatter" and kernel.detail.reduce == "mean":  # an int64 count per element of a line
        scattered = next(t for t in kernel.detail.targets if not isinstance(t, int))
        return sympy.sympify(scattered.size) * 8
    return None


def _work_expr(schedule: Schedule) -> str:
    """The run's operation count, which sizes its team before any kernel runs: a data-dependent size counts as 1
    (its value is not known yet; a mixture of experts' token counts each cover a part of the batch)."""
    total = sympy.Add(*[TARGET.work(kernel) for kernel in schedule.kernels]) if schedule.kernels else 0
    total = sympy.sympify(total).xreplace({s: sympy.Integer(1) for s in schedule.unbacked})
    return f"(double){dim_expr(sympy.expand(total))}"


def _allocate_while_running(buf: Buffer, at_bind: dict[int, list[str]], bound_after: dict[Any, int]) -> list[str]:
    """kiln_run's line for a buffer sized by a data-dependent size (NULL until then), and the lines that allocate
    it, added to what kiln_bound runs once the last of its sizes is read. A buffer whose element count needs none
    (an empty dim beside one: [u0, 0]) is allocated by kiln_run itself."""
    slot = f"ctx->buf[{buf.index}]"
    allocate = f"    {slot} = malloc((size_t)({dim_expr(buf.numel)}) * sizeof({c_type(buf.dtype)}) + 1);"
    after = _last_binding(buf.numel, bound_after)
    if after is None:
        return [allocate, f"    if (!{slot}) status = 2;"]
    at_bind[after] += [allocate, f"    if (!{slot}) goto out_of_memory;"]
    return [f"    {slot} = NULL;  /* {buf.name}: allocated once its data-dependent size is known */"]


def _hand_over(allocated: list[Buffer], schedule: Schedule) -> list[str]:
    """kiln_run's last lines for the outputs it allocated: each to the caller's kiln_allocated_output with its
    shape after a run that succeeded, freed after one that failed. The shape is the output's, not its buffer's: an
    output may be a view of the buffer in another shape (`x[mask].reshape(...)`)."""
    if not allocated:
        return []
    handed = [f"    {line}" for line in symbol_prologue(schedule, len(schedule.symbols))]
    for buf in allocated:
        target = f"((kiln_allocated_output*)outputs[{buf.io_index}])"
        shape = schedule.outputs[buf.io_index][1]
        handed += [f"        {target}->data = ctx->buf[{buf.index}];",
                   *(f"        {target}->shape[{k}] = {dim_expr(d)};" for k, d in enumerate(shape))]
    return ["    if (status == 0)", "    {", *handed, "    }", "    else", "    {",
            *(f"        free(ctx->buf[{buf.index}]);" for buf in allocated), "    }"]


def symbol_prologue(schedule: Schedule, first: int = 0) -> list[str]:
    """A function's first lines: each symbol's value for this run, from the context (a data-dependent size's is 0
    until its bind kernel has run); from symbol `first` on (kiln_run has the caller's as locals already)."""
    every = [*schedule.symbols, *schedule.unbacked]
    return [f"    const int64_t {symbol_name(symbol)} = ctx->sym[{index}]; (void){symbol_name(symbol)};"
            for index, symbol in enumerate(every) if index >= first]


def _binding_kernels(schedule: Schedule) -> dict[Any, int]:
    """Each data-dependent size's bind kernel (an index into the top-level kernels)."""
    return {kernel.detail.symbol: index for index, kernel in enumerate(schedule.kernels) if kernel.kind == "bind"}


def _last_binding(expr: Any, bound_after: dict[Any, int]) -> int | None:
    """The kernel after which every data-dependent size in `expr` is known (None: it has none)."""
    kernels = [bound_after[s] for s in sympy.sympify(expr).free_symbols if s in bound_after]
    return max(kernels) if kernels else None


def _outside(name: str, allowed: ValueRange | None) -> str:
    """A C test that the value `name` lies outside `allowed` ('' where every value is inside)."""
    tests = []
    if allowed is not None and allowed.lower != -math.inf:
        tests.append(f"{name} < INT64_C({int(allowed.lower)})")
    if allowed is not None and allowed.upper != math.inf:
        tests.append(f"{name} > INT64_C({int(allowed.upper)})")
    return " || ".join(tests)


def _range_text(allowed: ValueRange | None) -> str:
    def end(value: Any, infinite: str) -> str:
        return infinite if value in (math.inf, -math.inf) else str(int(value))
    return "[-inf, inf]" if allowed is None else f"[{end(allowed.lower, '-inf')}, {end(allowed.upper, 'inf')}]"


def runtime_memory(schedule: Schedule) -> dict[str, Any]:
    """Memory the C runtime needs besides the temporaries' arena: per-thread scratch (the largest of these
    sizes, allocated once per call for each thread) and the weight panels packed when the model is created."""
    packed = _prepacked(schedule)
    needs = {_scratch_bytes(kernel, packed) for kernel in schedule.all_kernels()} - {None}
    panel_bytes = sum(_packed_bytes(kernel) for kernel in packed if not _packed_at_compile_time(kernel))
    return {"scratch_bytes_per_thread": sorted(needs, key=str), "packed_weight_bytes": panel_bytes}


def _conv_weight_shape(kernel: Kernel) -> tuple[int, int, int]:
    """(groups, rows per group, K) of a convolution's weight matrix [C_out/g, C_in/g * taps] per group."""
    weight = kernel.detail.weight
    groups = int(kernel.detail.groups)
    return groups, int(weight.shape[0]) // groups, math.prod(int(d) for d in weight.shape[1:])


def _packed_bytes(kernel: Kernel) -> int:
    """Bytes of a static operand packed at create: a GEMM's B in zero-padded KILN_NR-wide panels, or a
    convolution's weights in zero-padded KILN_MR-row blocks per group."""
    if kernel.kind in SPARSE_KERNELS:
        return _sparse_offsets(kernel)[None]
    if kernel.kind == "conv":
        groups, rows, k = _conv_weight_shape(kernel)
        return -(-groups * -(-rows // _MAX_MR) * _MAX_MR * k * 4 // 64) * 64  # aligned_alloc wants a multiple of 64
    if kernel.kind in quantized.RENDERERS:
        return quantized.packed_bytes(kernel)
    return (int(kernel.shape[-1]) + 31) // 32 * 32 * int(kernel.detail.k) * 4


SPARSE_KERNELS = ("sparse_linear", "sparse_conv")  # kernels reading a sparse weight's components


def _sparse_offsets(kernel: Kernel) -> dict[str | None, int]:
    """Where each component of a sparse weight lies in its packed block (64-byte aligned); None: the block's size."""
    offsets: dict[str | None, int] = {}
    size = 0
    for name, buf in kernel.detail.components.items():
        offsets[name] = size
        size += -(-int(buf.numel) * buf.dtype.itemsize // 64) * 64
    offsets[None] = max(size, 64)
    return offsets


def _uses_24_pairs(kernel: Kernel) -> bool:
    """A 2:4 linear layer that may see more than KILN_24_FEW activation rows also keeps its weight as the pair
    stream kiln_24p_unit reads (kiln_sparse.h)."""
    if kernel.kind != "sparse_linear" or kernel.detail.layout != "semi_structured":
        return False
    rows = sympy.sympify(kernel.detail.m)
    return not (rows.is_Integer and int(rows) <= _24_FEW)


def _uses_sell(kernel: Kernel) -> bool:
    """A CSR linear layer that may see one activation row also keeps its weight as SELL-8 (kiln_sparse.h)."""
    if kernel.kind != "sparse_linear":
        return False
    rows = sympy.sympify(kernel.detail.m)
    return kernel.detail.layout == "sparse_csr" and not (rows.is_Integer and int(rows) > 1)


def _prepacked(schedule: Schedule) -> dict:
    """Static weights packed once, when the model is created: float32 GEMMs' B operands (into panels), float32
    convolutions' weights (into row blocks) and fused LSTM steps' recurrent weights (gate-interleaved panels)."""
    packed = {}
    for kernel in schedule.all_kernels():
        if kernel.kind == "lstm_cell":  # the scheduler fuses only cells with a static constant weight
            packed[kernel] = len(packed)
            continue
        if kernel.kind in SPARSE_KERNELS:  # copied out of the mapped weights file: streamed from anonymous memory,
            packed[kernel] = len(packed)    # a layer at batch 1 ran 3.7x faster (2:4, Zen 3)
            continue
        if kernel.kind in ("qlinear", "qconv", "wlinear"):
            scales = [kernel.detail.scales, kernel.detail.zero_points] if kernel.kind == "wlinear" else []
            constants = [view for view in (kernel.detail.weight, *scales) if view is not None]
            if all(view.buffer.kind == "weight" and all(sympy.sympify(d).is_Integer for d in [*view.shape, view.offset])
                   for view in constants):
                packed[kernel] = len(packed)
            continue
        if kernel.kind == "conv" and conv_as_gemm(kernel) and not depthwise(kernel):  # a stencil reads its taps
            weight = kernel.detail.weight
            if weight.buffer.kind == "weight" and all(sympy.sympify(d).is_Integer for d in
                                                      [*weight.shape, weight.offset]):
                packed[kernel] = len(packed)
            continue
        if kernel.kind == "matmul" and kernel.detail.a_gather is not None:
            if _gathered_table_packs(kernel):
                packed[kernel] = len(packed)
            continue
        if kernel.kind != "matmul" or len(kernel.shape) != 2 or not _gemm_operands_f32(kernel) or \
                _matrix_vector(kernel):
            continue
        b_buf, b_strides, b_offset = kernel.detail.b
        static = [kernel.detail.k, kernel.shape[-1], *b_strides, b_offset]
        if b_buf.kind == "weight" and all(sympy.sympify(d).is_Integer for d in static):
            packed[kernel] = len(packed)
    return packed


def int4_weights(schedule: Schedule) -> set[str]:
    """Weights that only int4 weight-only kernels read, whole: the weights file stores them two values per byte
    (kiln_wvalue unpacks them when the kernels pack their panels at create)."""
    readers: dict[str, list[Kernel]] = {}
    for kernel in schedule.all_kernels():
        if kernel.kind == "loop":  # its body's kernels are counted one by one
            continue
        for buf in kernel_reads(kernel):
            if buf.kind == "weight":
                readers.setdefault(buf.weight_key, []).append(kernel)
    return {key for key, kernels in readers.items()
            if all(kernel.kind == "wlinear" and int(kernel.detail.bits) == 4
                   and kernel.detail.weight.buffer.weight_key == key
                   and sympy.sympify(kernel.detail.weight.offset) == 0
                   for kernel in kernels)}


def _packed_at_compile_time(kernel: Kernel) -> bool:
    """Whether a kernel with a packed operand (render._prepacked) reads it from weights.bin, packed by the compiler
    (packing.py: the float32 GEMMs and convolutions), rather than packing it when the model is created."""
    return kernel.kind in ("matmul", "conv", "lstm_cell")


def compile_time_packs(schedule: Schedule, capability: str) -> dict[Kernel, Any]:
    """The kernels whose packed operand the compiler writes into weights.bin, and how (packing.PackedWeight)."""
    return {kernel: packed_weight(kernel, capability) for kernel in _prepacked(schedule)
            if _packed_at_compile_time(kernel)}


def weights_read_unpacked(schedule: Schedule, capability: str) -> set[str]:
    """The weights some kernel reads as they are; a weight read only through compile-time packs is not."""
    packs = compile_time_packs(schedule, capability)
    needed = set()
    for kernel in schedule.all_kernels():
        if kernel.kind == "loop":  # its body's kernels are counted one by one
            continue
        skipped = packs[kernel].source if kernel in packs else None
        needed |= {buf.weight_key for buf in kernel_reads(kernel) if buf.kind == "weight" and buf.weight_key != skipped}
    return needed


def _pack_weights(schedule: Schedule, packed: dict, weight_offsets: dict[str, int]) -> list[str]:
    nibbles = int4_weights(schedule)
    capability = get_cpu_capability()
    lines = []
    for kernel, slot in packed.items():
        if _packed_at_compile_time(kernel):
            name = packed_weight(kernel, capability).name
            lines.append(f"    m->packed[{slot}] = (float*)(m->weights + {weight_offsets[name]});  "
                         f"/* {kernel.name}: packed by the compiler */")
            continue
        if kernel.kind in SPARSE_KERNELS:
            offsets, components = _sparse_offsets(kernel), kernel.detail.components
            size = f"{offsets[None]}"
            if _uses_sell(kernel):  # CSR's form for one activation row, after the components (int32, as written)
                crow = f"(const int32_t*)(m->weights + {weight_offsets[components['crow_indices'].weight_key]})"
                size = f"{offsets[None]} + kiln_sell_bytes({int(kernel.detail.n)}, {crow})"
            if _uses_24_pairs(kernel):  # the pair stream, after the components
                size = f"{offsets[None]} + kiln_24p_bytes({int(kernel.detail.n)}, {int(kernel.detail.k)})"
            lines += [f"    /* {kernel.name}: sparse weight components */", *_allocate(slot, size)]
            for name, buf in components.items():
                lines.append(f"    memcpy((char*)m->packed[{slot}] + {offsets[name]}, m->weights + "
                             f"{weight_offsets[buf.weight_key]}, {int(buf.numel) * buf.dtype.itemsize});")
            parts = {name: f"(const {c_type(buf.dtype)}*)((char*)m->packed[{slot}] + {offsets[name]})"
                     for name, buf in components.items()}
            if _uses_sell(kernel):
                lines.append(f"    kiln_sell_pack({int(kernel.detail.n)}, {crow}, {parts['col_indices']}, "
                             f"{parts['values']}, (char*)m->packed[{slot}] + {offsets[None]});")
            if _uses_24_pairs(kernel):
                lines.append(f"    kiln_24p_pack({int(kernel.detail.n)}, {int(kernel.detail.k)}, {parts['values']}, "
                             f"{parts['metadata']}, (char*)m->packed[{slot}] + {offsets[None]});")
            continue
        if kernel.kind in quantized.RENDERERS:
            lines += quantized.pack_lines(kernel, packed, slot, weight_offsets, nibbles)
            continue
        if kernel.kind == "conv":
            weight = kernel.detail.weight
            groups, rows, k = _conv_weight_shape(kernel)
            source = f"(const float*)(m->weights + {weight_offsets[weight.buffer.weight_key]}) + {int(weight.offset)}"
            lines += [f"    /* {kernel.name}: weights [{groups} x {rows} x {k}] of "
                      f"{identifier(weight.buffer.weight_key)} in KILN_MR-row blocks */",
                      *_allocate(slot, f"(size_t){_packed_bytes(kernel)}"),
                      f"    for (int64_t g = 0; g < {groups}; ++g)",
                      f"        kiln_pack_a({rows}, {k}, {source} + g * {rows * k}, {k}, 1, "
                      f"m->packed[{slot}] + g * (({rows} + KILN_MR - 1) / KILN_MR) * KILN_MR * {k});"]
            continue
        b_buf, b_strides, b_offset = kernel.detail.b
        k, n = int(kernel.detail.k), int(kernel.shape[-1])
        source = f"(const float*)(m->weights + {weight_offsets[b_buf.weight_key]}) + {int(b_offset)}"
        lines += [f"    /* {kernel.name}: B [{k} x {n}] of {identifier(b_buf.weight_key)} */",
                  *_allocate(slot, f"(size_t){_packed_bytes(kernel)}"),
                  f"    kiln_pack_b({k}, {n}, {source}, {int(b_strides[1])}, {int(b_strides[2])}, m->packed[{slot}]);"]
    return lines


def stamp_build_id(source: str) -> tuple[str, str]:
    """Append `kiln_build_id()`, a hash of `source`, and return (stamped source, id). The manifest records the id,
    so a loader can check that the library it is about to run was built from this package's code."""
    build_id = hashlib.sha256(source.encode()).hexdigest()[:32]
    function = f'const char* kiln_build_id(void) {{ return "{build_id}"; }}'
    return f"{source}\n#if KILN_GROUP(0)\n{function}\n#endif\n", build_id


# Models whose kernel bodies take more source than this build in parallel parts (below it, a second compiler
# process parsing the same headers costs more than the half of the bodies it takes over).
_PARTED_BODY_CHARS = 12_000
_BUILD_GROUPS = 4  # the groups a large model's bodies are dealt into; a builder compiles them in 1, 2 or 4 parts


def _grouped_bodies(definitions: list[list[str]], runtime_chars: int) -> list[str]:
    """The kernel bodies, each in a build group: the C compiler's time goes mostly into them, so a large model
    builds as several parts in parallel (`build.build_library`: one compiler process per part, parts taking the
    groups g with g % KILN_PARTS == KILN_PART, then one link). Built whole (no KILN_PARTS), every group compiles,
    and the file stays one standalone translation unit. Groups are balanced by source length; group 0 also holds
    the wrappers and the runtime (`runtime_chars` of straight-line code, which GCC optimizes about 8x faster per
    character than loop nests: a 6-layer encoder's 66 KB took 0.46 s, its 25 KB of bodies 1.3 s)."""
    texts = ["\n".join(definition) for definition in definitions]
    total = sum(map(len, texts))
    count = _BUILD_GROUPS if total > _PARTED_BODY_CHARS else 1
    loads = [0] * count
    loads[0] = runtime_chars // 8
    group_of = [0] * len(texts)
    for index in sorted(range(len(texts)), key=lambda i: -len(texts[i])):
        group_of[index] = min(range(count), key=loads.__getitem__)
        loads[group_of[index]] += len(texts[index])
    lines = [f"#define KILN_GROUPS {count}",
             "#ifdef KILN_PART  /* one of KILN_PARTS compiler runs: the groups g with g % KILN_PARTS == KILN_PART */",
             "#define KILN_GROUP(g) ((g) % KILN_PARTS == KILN_PART)",
             "#define KILN_BODY __attribute__((visibility(\"hidden\")))",
             "#else",
             "#define KILN_GROUP(g) 1",
             "#define KILN_BODY static",
             "#endif"]
    lines += [definition[0] + ";" for definition in definitions]  # every part declares every body
    for group in range(count):
        lines += [f"#if KILN_GROUP({group})",
                  *[text for text, g in zip(texts, group_of) if g == group], "#endif"]
    return lines


def render(schedule: Schedule, weight_offsets: dict[str, int], memory: MemoryPlan,
           ranges: dict | None = None, asserts: Sequence[Any] = ()) -> str:
    """The complete C source of a compiled program. `weight_offsets` places weights in the weights blob, `memory`
    places temporaries in the per-call arena; it holds only within `ranges`, so kiln_run refuses symbols outside,
    and outside the program's runtime assertions (`asserts`, conditions on the symbols)."""
    out: list[str] = ["/* Generated by kiln: a compiled ATen program. Do not edit. */"]
    every_symbol = [*schedule.symbols, *schedule.unbacked]
    out.append(PRELUDE.format(abi=ABI_VERSION, max_rank=MAX_ALLOCATED_RANK, nsym=max(1, len(every_symbol)),
                              nbuf=max(1, len(schedule.buffers))))
    out.append(SUPPORT_LIBRARY)
    kernels = schedule.all_kernels()
    if any(kernel.kind in quantized.RENDERERS for kernel in kernels):
        out.append(QGEMM_LIBRARY)
    if any(kernel.kind in SPARSE_KERNELS for kernel in kernels):
        out.append(SPARSE_LIBRARY)
    state = RenderState(packed=_prepacked(schedule), symbol_slots={s: k for k, s in enumerate(every_symbol)})
    state.scratch = [need for kernel in kernels if (need := _scratch_bytes(kernel, state.packed)) is not None]
    names, wrappers = [], []
    bodies = KernelBodies(schedule)
    for number, kernel in enumerate(schedule.kernels):
        wrappers += bodies.kernel_function(number, kernel, state)
        names.append(f"kernel_{number}_{identifier(kernel.name)}")
    bodies_at = len(out)  # the bodies go here, grouped once the rest's size is known
    out += ["#if KILN_GROUP(0)  /* everything else: the first group */", *wrappers, ""]
    nin, nout, nsym = len(schedule.inputs), len(schedule.outputs), len(schedule.symbols)
    npacked = len(state.packed)
    nkernels = len(schedule.kernels)
    nstate = len(schedule.state)
    out.append("struct kiln_model {\n    const unsigned char* weights;\n    unsigned char* owned;\n"
               f"    void* state[{max(1, nstate)}];  /* the buffers the program mutates, as the last run left them */\n"
               f"    void* next_state[{max(1, nstate)}];  /* where a run writes their new values (then swapped in) */\n"
               f"    int num_threads;\n    float* packed[{max(1, npacked)}];\n"
               f"    unsigned char packed_owned[{max(1, npacked)}];\n    char error[512];\n"
               f"    int profiling;\n    int64_t profiled_runs;\n    double kernel_seconds[{max(1, nkernels)}];\n"
               "    kiln_team team;  /* the team size on a busy machine (kiln_threads.h) */\n"
               "    kiln_arena arena;  /* the temporaries' memory, kept between runs (kiln_arena.h) */\n};")
    out.append(f"static const char* const KERNEL_NAMES[] = {{{', '.join(map(_cstr, names)) or '0'}}};")
    out.append(f"static void (*const KERNELS[])(const kiln_ctx*) = {{{', '.join(names) or '0'}}};")
    out.append("typedef struct kiln_model kiln_model;")
    allocated = schedule.allocated_outputs()
    for buf in allocated:
        if len(buf.shape) > MAX_ALLOCATED_RANK:
            raise UnsupportedError(f"output {buf.name} has {len(buf.shape)} dims and a data-dependent size; the C ABI "
                                   f"allocates such outputs with at most {MAX_ALLOCATED_RANK} dims")
    out.append(f"static const unsigned char OUTPUT_ALLOCATED[] = "
               f"{{{', '.join('1' if buf in allocated else '0' for buf, _ in schedule.outputs) or '0'}}};")
    for table, names_ in (("INPUT_NAMES", schedule.input_names), ("OUTPUT_NAMES", schedule.output_names),
                          ("SYMBOL_NAMES", [str(s) for s in schedule.symbols]),
                          ("STATE_NAMES", [buf.weight_key for buf, _ in schedule.state])):
        out.append(f"static const char* const {table}[] = {{{', '.join(map(_cstr, names_)) or '0'}}};")
    state_bytes = [int(buf.numel) * buf.dtype.itemsize for buf, _ in schedule.state]
    out.append(f"static const size_t STATE_BYTES[] = {{{', '.join(map(str, state_bytes)) or '0'}}};")
    # a state with a next value is swapped after a run; one a scatter updates in place has none
    out.append(f"static const unsigned char STATE_SWAPPED[] = "
               f"{{{', '.join('0' if new is None else '1' for _, new in schedule.state) or '0'}}};")
    out.append(f"static const size_t STATE_OFFSETS[] = "
               f"{{{', '.join(str(weight_offsets[buf.weight_key]) for buf, _ in schedule.state) or '0'}}};")
    pack_lines = "\n".join(_pack_weights(schedule, state.packed, weight_offsets))
    # the integer kernels' AMX tiles need the OS's leave first (kiln_qgemm.h)
    amx_request = ("#if KILN_QAMX\n    if (kiln_amx_request() != 0) { free(m); return NULL; }\n#endif\n"
                   if QGEMM_LIBRARY in out else "")
    if any(_packed_at_compile_time(kernel) for kernel in state.packed):
        capability = get_cpu_capability()
        mr, nr = tile_sizes(capability)
        out.append(f"#if KILN_MR != {mr} || KILN_NR != {nr}\n#error \"weights.bin holds this model's weights "
                   f"packed for {mr} x {nr} register tiles ({capability}): build model.c with the flags of the "
                   f"package's cpu_capability\"\n#endif")
    out.append(f"""
int kiln_abi_version(void) {{ return KILN_ABI_VERSION; }}
int kiln_num_inputs(void) {{ return {nin}; }}
int kiln_num_outputs(void) {{ return {nout}; }}
int kiln_num_symbols(void) {{ return {nsym}; }}
const char* kiln_input_name(int i) {{ return i >= 0 && i < {nin} ? INPUT_NAMES[i] : NULL; }}
const char* kiln_output_name(int i) {{ return i >= 0 && i < {nout} ? OUTPUT_NAMES[i] : NULL; }}
int kiln_output_allocated(int i) {{ return i >= 0 && i < {nout} ? OUTPUT_ALLOCATED[i] : 0; }}
void kiln_free(void* data) {{ free(data); }}
const char* kiln_symbol_name(int i) {{ return i >= 0 && i < {nsym} ? SYMBOL_NAMES[i] : NULL; }}
const char* kiln_error(const kiln_model* m) {{ return m ? m->error : "no model"; }}
void kiln_set_num_threads(kiln_model* m, int n) {{ if (m) m->num_threads = n > 0 ? n : 0; }}
int kiln_last_run_threads(const kiln_model* m)
{{
    return m ? __atomic_load_n(&m->team.last_threads, __ATOMIC_RELAXED) : 0;
}}
int kiln_num_kernels(void) {{ return {nkernels}; }}
const char* kiln_kernel_name(int i) {{ return i >= 0 && i < {nkernels} ? KERNEL_NAMES[i] : NULL; }}
void kiln_set_profiling(kiln_model* m, int on)
{{
    if (!m) return;
    m->profiling = on != 0;
    m->profiled_runs = 0;
    memset(m->kernel_seconds, 0, sizeof m->kernel_seconds);
}}
double kiln_kernel_seconds(const kiln_model* m, int i)
{{
    return m && i >= 0 && i < {nkernels} ? m->kernel_seconds[i] : 0.0;
}}
int64_t kiln_profiled_runs(const kiln_model* m) {{ return m ? m->profiled_runs : 0; }}
int kiln_num_states(void) {{ return {nstate}; }}
const char* kiln_state_name(int i) {{ return i >= 0 && i < {nstate} ? STATE_NAMES[i] : NULL; }}
size_t kiln_state_nbytes(int i) {{ return i >= 0 && i < {nstate} ? STATE_BYTES[i] : 0; }}
/* The state buffer's current values (contiguous, its manifest dtype and shape): read or write them between runs. */
void* kiln_state_data(kiln_model* m, int i) {{ return m && i >= 0 && i < {nstate} ? m->state[i] : NULL; }}
/* Every state buffer back to its value in weights.bin (the exported program's). */
void kiln_reset_state(kiln_model* m)
{{
    if (!m) return;
    for (int i = 0; i < {nstate}; ++i) memcpy(m->state[i], m->weights + STATE_OFFSETS[i], STATE_BYTES[i]);
}}

void kiln_destroy(kiln_model* m)
{{
    if (!m) return;
    for (int i = 0; i < {npacked}; ++i) if (m->packed_owned[i]) free(m->packed[i]);
    for (int i = 0; i < {nstate}; ++i) {{ free(m->state[i]); free(m->next_state[i]); }}
    free(m->owned);
    free(m->arena.memory);
    free(m);
}}

/* `weights` must stay alive (e.g. an mmap of weights.bin) until kiln_destroy. */
kiln_model* kiln_create(const void* weights, size_t size)
{{
    (void)size;
    kiln_model* m = (kiln_model*)calloc(1, sizeof(kiln_model));
    if (!m) return NULL;
    m->weights = (const unsigned char*)weights;
    kiln_team_init(&m->team);
    for (int i = 0; i < {nstate}; ++i)
    {{
        m->state[i] = aligned_alloc(64, (STATE_BYTES[i] + 64) / 64 * 64);
        m->next_state[i] = STATE_SWAPPED[i] ? aligned_alloc(64, (STATE_BYTES[i] + 64) / 64 * 64) : NULL;
        if (!m->state[i] || (STATE_SWAPPED[i] && !m->next_state[i])) {{ kiln_destroy(m); return NULL; }}
    }}
    kiln_reset_state(m);
{amx_request}{pack_lines}
    return m;
}}

kiln_model* kiln_create_from_file(const char* path)
{{
    FILE* f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END); long size = ftell(f); fseek(f, 0, SEEK_SET);
    unsigned char* data = (unsigned char*)aligned_alloc(64, ((size_t)size + 64) / 64 * 64);
    if (!data || fread(data, 1, (size_t)size, f) != (size_t)size) {{ fclose(f); free(data); return NULL; }}
    fclose(f);
    kiln_model* m = kiln_create(data, (size_t)size);
    if (m) m->owned = data; else free(data);
    return m;
}}
""")
    run = ["static void kiln_run_kernel(kiln_model* m, const kiln_ctx* ctx, int i, int profiling)", "{",
           "    if (!profiling) { KERNELS[i](ctx); return; }",
           "    double start = omp_get_wtime();", "    KERNELS[i](ctx);",
           "    if (omp_get_thread_num() == 0) m->kernel_seconds[i] += omp_get_wtime() - start;", "}", "",
           "/* Run once. symbols: one value per kiln_symbol_name (bound from the input shapes); inputs and",
           "   outputs: contiguous arrays in signature order, outputs allocated by the caller. 0 on success.",
           "   Every kernel runs inside one OpenMP parallel region; kernels share their loops across the team. */",
           "int kiln_run(kiln_model* m, const int64_t* symbols, const void* const* inputs, void* const* outputs)",
           "{", "    kiln_ctx ctx_storage; kiln_ctx* ctx = &ctx_storage;", "    int status = 0;",
           "    ctx->packed = m->packed; ctx->scratch = NULL; ctx->scratch_stride = 0;",
           "    int64_t index_error[4] = {0, 0, 0, 0}; ctx->index_error = index_error;",
           "    const char* index_error_op = \"\"; ctx->index_error_op = &index_error_op;"]
    for index, symbol in enumerate(schedule.symbols):
        sym = symbol_name(symbol)
        run.append(f"    const int64_t {sym} = symbols[{index}]; ctx->sym[{index}] = {sym};")
        given = (ranges or {}).get(symbol) or ValueRange(0, math.inf)
        allowed = ValueRange(max(0, given.lower), given.upper)  # a size, whatever the range says
        run.append(f"    if ({_outside(sym, allowed)}) {{ snprintf(m->error, sizeof m->error, \"symbol %s = %lld is "
                   f"outside its range {_range_text(allowed)}\", SYMBOL_NAMES[{index}], (long long){sym}); "
                   "return 1; }")
    for index, symbol in enumerate(schedule.unbacked, len(schedule.symbols)):
        run.append(f"    ctx->sym[{index}] = 0;  /* {symbol}: read while running (a bind kernel) */")
    # What a data-dependent size decides (checks, allocations) happens once its bind kernel has run: at_bind[k]
    # holds the lines kiln_bound runs after top-level kernel k.
    bound_after = _binding_kernels(schedule)
    at_bind: dict[int, list[str]] = {k: [] for k in set(bound_after.values())}
    for symbol in schedule.unbacked:
        allowed = (ranges or {}).get(symbol)
        test = _outside(symbol_name(symbol), allowed)
        if test:
            at_bind[bound_after[symbol]].append(
                f"    if ({test}) {{ snprintf(m->error, sizeof m->error, \"the data-dependent size {symbol} = %lld "
                f"(a value the program read while running) is outside its range {_range_text(allowed)}\", "
                f"(long long){symbol_name(symbol)}); return 1; }}")
    for guard in asserts:
        if not guard.expr.free_symbols <= set(every_symbol):
            raise UnsupportedError(f"the runtime assertion {guard.expr} uses a symbol the compiled model cannot bind")
        after = _last_binding(guard.expr, bound_after)
        broken = "these input sizes break" if after is None else "the values the program read while running break"
        (run if after is None else at_bind[after]).append(
            f"    if (!{condition_expr(guard.expr)}) {{ snprintf(m->error, sizeof m->error, "
            f"{_cstr('the program assumes ' + str(guard.expr) + ', which ' + broken)}); return 1; }}")
    for size, bound, message in dict.fromkeys(state.size_limits):
        if bound_expr(size, ranges or {}).upper < bound:
            continue
        after = _last_binding(size, bound_after)
        (run if after is None else at_bind[after]).append(
            f"    if ({dim_expr(size)} >= INT64_C({bound})) {{ snprintf(m->error, sizeof m->error, "
            f"{_cstr(message)}); return 1; }}")
    temps = []
    for buf in schedule.buffers:
        slot = f"ctx->buf[{buf.index}]"
        if buf.kind == "input":
            run.append(f"    {slot} = (void*)inputs[{buf.io_index}];")
        elif buf.kind == "output" and buf in allocated:  # the caller's kiln_allocated_output gets it
            run.append(f"    ((kiln_allocated_output*)outputs[{buf.io_index}])->data = NULL;")
            run += _allocate_while_running(buf, at_bind, bound_after)
        elif buf.kind == "output":
            run.append(f"    {slot} = outputs[{buf.io_index}];")
        elif buf.kind in ("state", "next_state"):
            slot_of = next(k for k, pair in enumerate(schedule.state) if any(buf is b for b in pair))
            run.append(f"    {slot} = m->{buf.kind}[{slot_of}];  /* {schedule.state[slot_of][0].weight_key} */")
        elif buf.kind == "weight":  # (a weight read only packed by the compiler is not in weights.bin as it is)
            address = f"m->weights + {weight_offsets[buf.weight_key]}" if buf.weight_key in weight_offsets else "NULL"
            run.append(f"    {slot} = (void*)({address});")
        elif buf.kind == "temp" and buf.inside is None and buf in memory.dynamic:
            run += _allocate_while_running(buf, at_bind, bound_after)
        elif buf.kind == "temp" and buf.inside is None:  # windows get their addresses from their loops
            temps.append(buf)
    # One arena per call for every temporary, at offsets from the static memory plan (kiln/codegen/memory.py).
    # Sanitizer builds give each temporary its own allocation instead, so ASan sees an overrun of any one.
    arena_bytes = dim_expr(memory.arena_bytes)
    run += ["#if defined(__SANITIZE_ADDRESS__) || defined(KILN_SEPARATE_BUFFERS)",
            "    unsigned char* arena = NULL;"]
    for buf in temps:
        size = f"(size_t)({dim_expr(buf.numel)}) * sizeof({c_type(buf.dtype)}) + 1"
        run += [f"    ctx->buf[{buf.index}] = malloc({size});",
                f"    if (!ctx->buf[{buf.index}]) status = 2;"]
    run += ["#else", "    int arena_kept;  /* the model's arena, kept between runs (kiln_arena.h) */",
            f"    unsigned char* arena = kiln_arena_take(&m->arena, (size_t)({arena_bytes}) + 64, &arena_kept);",
            "    if (!arena) status = 2;"]
    for buf in temps:
        run.append(f"    ctx->buf[{buf.index}] = arena + {dim_expr(memory.offset_of(buf))};  /* {buf.name} */")
    run.append("#endif")
    for buf in schedule.buffers:  # a cat's parts written in place: inside the cat's result (schedule.place_cat_part)
        if buf.inside is not None:
            home, offset = buf.home()
            after = _last_binding(sympy.Add(home.numel, offset), bound_after)
            (run if after is None else at_bind[after]).append(
                f"    ctx->buf[{buf.index}] = (unsigned char*)ctx->buf[{home.index}] + "
                f"({dim_expr(offset)}) * {buf.dtype.itemsize};  /* {buf.name} in {home.name} */")
    # Small runs stay on fewer threads: each extra thread costs a wake-up and a barrier per kernel, which
    # outweighs the work it takes over below ~0.6 MFLOP per thread (measured on the zoo models).
    run += ["    const int max_threads = m->num_threads > 0 ? m->num_threads : omp_get_max_threads();",
            f"    const double work = {_work_expr(schedule)};  /* ~flops of this run at these sizes */",
            "    int threads = (int)(work / KILN_WORK_PER_THREAD);",
            "    threads = threads < 1 ? 1 : threads > max_threads ? max_threads : threads;",
            "    const int wanted_threads = threads;",
            "    const int64_t run_start_ns = kiln_clock_ns(CLOCK_MONOTONIC);",
            "    threads = kiln_team_size(&m->team, threads, run_start_ns);",
            "    int64_t team_cpu_ns = 0, team_wall_ns = 0;  /* the parallel regions' CPU and wall time */"]
    if state.scratch:
        run.append("    size_t scratch = 0;  /* per thread: the most any kernel needs, 64-byte aligned */")
        for need in state.scratch:
            after = _last_binding(need, bound_after)
            if after is None:
                run.append(f"    if ((size_t)({dim_expr(need)}) > scratch) scratch = (size_t)({dim_expr(need)});")
            else:  # a kernel sized by a data-dependent size: the scratch grows, between kernels, if it needs more
                at_bind[after].append(f"    if (!kiln_scratch_at_least(ctx, (size_t)({dim_expr(need)}), threads)) "
                                      "goto out_of_memory;")
        run += ["    ctx->scratch_stride = (scratch + 63) / 64 * 64;",
                "    ctx->scratch = (unsigned char*)aligned_alloc(64, ctx->scratch_stride * (size_t)threads + 64);",
                "    if (!ctx->scratch) status = 2;"]
    run.append("    if (status) { snprintf(m->error, sizeof m->error, \"out of memory\"); goto done; }")
    # A one-thread run enters no parallel region: its kernels' worksharing constructs are orphaned, so their
    # barriers cost nothing. (A team of one, `parallel if(0)`, still makes a futex syscall at every barrier in
    # libgomp: 0.3 us a kernel, a third of an LSTM step at hidden size 24.) On a busy machine a descheduled worker
    # makes every barrier cost a scheduler time slice, so small runs stay on one thread. Likewise a loop kernel
    # whose steps are too small to share (a barrier per kernel per step) runs alone, between parallel regions.
    # The kernels run from a table, so no kernel's code is inlined into one huge parallel region (which the C
    # compiler optimized as a whole: a third of a 6-layer encoder's build time).
    count = len(names)
    run += ["    const int profiling = m->profiling;",
            f"    unsigned char serial[{max(1, count)}] = {{0}};  /* kernels run by this thread alone */",
            "    int team_threads = 1;  /* the team size OpenMP gave the parallel regions */"]
    for index, kernel in enumerate(schedule.kernels):
        if kernel.kind in ("bind", "nonzero"):  # one thread's walk; a size read decides what later kernels
            run.append(f"    serial[{index}] = 1;")  # allocate, so kiln_bound runs right after it
        if kernel.kind == "loop":
            # one step's work: a step's few kernels each end on a barrier (~1-2 us on 2 cores), which pays off from
            # ~1e5 operations a step (an LSTM step of hidden 256, 5e5, ran 1.6x faster on 2 threads; of hidden 24,
            # 5e3, 3.9x slower)
            run.append(f"    serial[{index}] = (double)({dim_expr(sympy.expand(TARGET.work(kernel)))}) < "
                       "KILN_WORK_PER_THREAD / 4;")
    run += [f"    for (int first = 0, end = 1; first < {count}; first = end, end = first + 1)", "    {",
            "        if (threads > 1 && !serial[first])", "        {",
            f"            while (end < {count} && !serial[end]) ++end;",
            "            const int64_t region_start = kiln_clock_ns(CLOCK_MONOTONIC);",
            "            #pragma omp parallel num_threads(threads)", "            {",
            "                const int64_t cpu_start = kiln_clock_ns(CLOCK_THREAD_CPUTIME_ID);",
            "                for (int i = first; i < end; ++i) kiln_run_kernel(m, ctx, i, profiling);",
            "                const int64_t cpu_used = kiln_clock_ns(CLOCK_THREAD_CPUTIME_ID) - cpu_start;",
            "                #pragma omp atomic", "                team_cpu_ns += cpu_used;",
            "                #pragma omp master", "                team_threads = omp_get_num_threads();",
            "            }",
            "            team_wall_ns += kiln_clock_ns(CLOCK_MONOTONIC) - region_start;", "        }",
            "        else kiln_run_kernel(m, ctx, first, profiling);",
            *(["        if (binds[first] && (status = kiln_bound(m, ctx, first, threads)) != 0) goto done;"]
              if at_bind else []), "    }",
            "    kiln_team_record(&m->team, team_threads, wanted_threads, team_cpu_ns, team_wall_ns, run_start_ns,",
            "                     kiln_clock_ns(CLOCK_MONOTONIC));",
            "    if (index_error[0]) { snprintf(m->error, sizeof m->error, \"%s: index %lld is out of "
            "bounds for dimension %lld with size %lld\", index_error_op, (long long)index_error[1], "
            "(long long)index_error[2], (long long)index_error[3]); status = 3; }",
            "    if (profiling) m->profiled_runs += 1;",
            *(["    if (!status)  /* the new state replaces the old only after a successful run */",
               f"        for (int i = 0; i < {nstate}; ++i) if (STATE_SWAPPED[i])", "        {",
               "            void* old = m->state[i]; m->state[i] = m->next_state[i]; m->next_state[i] = old;",
               "        }"] if nstate else []),
            "done:", "    free(ctx->scratch);",
            *(f"    free(ctx->buf[{buf.index}]);" for buf in memory.dynamic),
            *_hand_over(allocated, schedule),
            "#if defined(__SANITIZE_ADDRESS__) || defined(KILN_SEPARATE_BUFFERS)"]
    run += [f"    free(ctx->buf[{buf.index}]);" for buf in temps]
    run += ["#else", "    kiln_arena_give(&m->arena, arena, arena_kept);", "#endif"]
    run += ["    return status;", "}", "#endif  /* KILN_GROUP(0) */", ""]
    if at_bind:  # the kernels that bind a data-dependent size, and what each size decides
        binds = ", ".join("1" if index in at_bind else "0" for index in range(count))
        hook = ["/* Per-thread scratch of at least `need` bytes, its contents dropped: 0 when out of memory. */",
                "static int kiln_scratch_at_least(kiln_ctx* ctx, size_t need, int threads)", "{",
                "    if (need <= ctx->scratch_stride) return 1;", "    free(ctx->scratch);",
                "    ctx->scratch_stride = (need + 63) / 64 * 64;",
                "    ctx->scratch = (unsigned char*)aligned_alloc(64, ctx->scratch_stride * (size_t)threads + 64);",
                "    return ctx->scratch != NULL;", "}", "",
                "/* After top-level kernel `kernel` read a data-dependent size: check it and the program's assumptions",
                "   about it, then allocate what it sizes. 0, or kiln_run's status. */",
                "static int kiln_bound(kiln_model* m, kiln_ctx* ctx, int kernel, int threads)", "{",
                *symbol_prologue(schedule), "    (void)threads;", "    switch (kernel)", "    {"]
        for index in sorted(at_bind):
            hook += [f"    case {index}:", "    {", *(f"    {line}" for line in at_bind[index]), "        break;",
                     "    }"]
        hook += ["    }", "    return 0;", "out_of_memory:",
                 "    snprintf(m->error, sizeof m->error, \"out of memory\");", "    return 2;", "}", "",
                 f"static const unsigned char binds[{count}] = {{{binds}}};", ""]
        start = run.index("static void kiln_run_kernel(kiln_model* m, const kiln_ctx* ctx, int i, int profiling)")
        run[start:start] = hook
    rest = out[bodies_at:] + run
    return "\n".join(out[:bodies_at] + _grouped_bodies(bodies.definitions, sum(map(len, rest))) + rest)

