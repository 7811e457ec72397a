"""Triton lowerings of sort and topk (row kernels): each element's place in its row is its rank, counted exactly.

A stable sort puts element i at the number of elements that come before it: those strictly ahead in the order
(NaN the largest, as ATen's), and the equal ones at smaller indices. Counting them over the row in BLOCK x BLOCK
tiles is O(L^2) per row but needs no scratch, works for rows of any length, and gives the interpreter's stable
order exactly; topk keeps the ranks below k.
"""

from __future__ import annotations

import sympy

from kiln.codegen.kernels import Kernel, contiguous_strides
from kiln.codegen.schedule import SORT_OPS
from kiln.codegen.triton.render import TL_TYPES, Exprs, KernelArgs, py_dim, rows_kernel, signature, unravel
from kiln.ir import dtypes

# Lanes per program, and row elements each compares itself with per step: a BLOCK x BLOCK tile of comparisons.
# Triton's interpreter runs a step as numpy calls, so it takes far larger tiles (as GEMM_CONFIGS does).
SORT_BLOCK = 64
INTERPRETER_SORT_BLOCK = 1024


def rows_or_sort_kernel(name: str, kernel: Kernel) -> tuple[list[str], list[str]]:
    """The "rows" kernel kind: sort / topk here, every other row op in render.py."""
    if kernel.ops[-1] in SORT_OPS:
        return sort_kernel(name, kernel)
    return rows_kernel(name, kernel)


def _ahead(descending: bool) -> str:
    """Whether value b (a later row position's tile) comes strictly before value a in the order."""
    if descending:
        return "(b > a) | ((b != b) & (a == a))"
    return "(b < a) | ((a != a) & (b == b))"


def sort_kernel(name: str, kernel: Kernel) -> tuple[list[str], list[str]]:
    """sort / topk: a program per (row, block of BLOCK row positions) ranks its block against the whole row and
    writes each element whose rank is below K (the row length for sort) to that place, with its index."""
    detail = kernel.detail
    dim = detail.dim
    args = KernelArgs()
    outer = [d for k, d in enumerate(kernel.shape) if k != dim]
    length = args.size(kernel.shape[dim])
    values_out, indices_out = kernel.outputs
    kept = args.size(values_out.shape[dim])

    def row_values(position: str, mask: str) -> str:
        """The row's values at `position` (a block), however the row is read: a view or a fused producer."""
        variables = [f"o{k}" for k in range(len(outer))]
        variables.insert(dim, position)
        exprs = Exprs(args, variables, mask, block_dims={dim})
        if detail.input is None:
            return exprs.render(detail.input_expr)
        view = detail.input
        return exprs.load(view.buffer, exprs.index(view.strides, view.offset), exprs.scalar(view.strides))

    value_dtype = detail.input_expr.dtype if detail.input is None else detail.input.buffer.dtype
    value_type = TL_TYPES[value_dtype]
    # a scalar read (a row broadcast along its dim) or a constant becomes a full block
    body = ["row = tl.program_id(0).to(tl.int64)", *unravel(outer, "row", args, prefix="o"),
            "ki = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)", f"mi = ki < {length}",
            f"vi = tl.where(mi, {row_values('ki', 'mi')}, tl.zeros([BLOCK], {value_type}))",
            "a = vi[:, None]", "rank = tl.zeros([BLOCK], tl.int64)",
            f"for start in range(0, {length}, BLOCK):",
            "    kj = start + tl.arange(0, BLOCK)", f"    mj = kj < {length}",
            f"    b = tl.where(mj, {row_values('kj', 'mj')}, tl.zeros([BLOCK], {value_type}))[None, :]",
            "    tie = (b == a) | ((a != a) & (b != b))",
            f"    before = mj[None, :] & (({_ahead(detail.descending)}) | (tie & (kj[None, :] < ki[:, None])))",
            "    rank += tl.sum(before.to(tl.int64), axis=1)",
            f"keep = mi & (rank < {kept})"]
    variables = [f"o{k}" for k in range(len(outer))]
    variables.insert(dim, "rank")
    place = Exprs(args, variables, "keep").index(contiguous_strides(values_out.shape), 0)
    body += [f"tl.store({args.buffer(values_out)} + ({place}), {Exprs.cast('vi', values_out.dtype)}, mask=keep)",
             f"tl.store({args.buffer(indices_out)} + ({place}), {Exprs.cast('ki', dtypes.int64)}, mask=keep)"]
    source = ["@triton.jit", signature(name, args, ["BLOCK: tl.constexpr"]), *["    " + line for line in body]]
    rows = py_dim(sympy.Mul(*[sympy.sympify(d) for d in outer]))
    row_length = py_dim(kernel.shape[dim])
    block = f"{name}_block"
    launch = [f"if {rows} > 0 and {row_length} > 0:",
              f"    {block} = min(triton.next_power_of_2({row_length}), "
              f"{INTERPRETER_SORT_BLOCK} if INTERPRET else {SORT_BLOCK})",
              f"    {name}[({rows}, triton.cdiv({row_length}, {block}))]({', '.join(args.arguments())}, BLOCK={block})"]
    return source, launch
