"""The Triton renderer's scatter and embedding_bag kernels (schedule kinds "scatter" and "bags").

Scatters keep the C backend's determinism: the iteration space's parallel dims spread over lanes and programs (each
lane owns the output elements it targets), and every lane walks the other dims in row-major order, so duplicate
indices combine in the reference interpreter's order. Embedding bags run one program per bag.
"""

from __future__ import annotations

from typing import Any

import sympy

from kiln.codegen.kernels import Kernel, ScatterIndex, contiguous_strides
from kiln.codegen.triton.render import (
    CHECKED_OPS, POINTWISE_BLOCK, TL_TYPES, Exprs, KernelArgs, blocked, compute_type, literal, py_dim, signature,
    unravel,
)
from kiln.ir import dtypes

LANE_BLOCK = 1024  # the most parallel lanes one scatter program walks its serial dims with
# The CHECKED_OPS entry a bad offsets tensor records: its error message states the rule, as the C backend's does.
BAG_OFFSETS = next(name for name in CHECKED_OPS if name.startswith("aten._embedding_bag.default offsets"))


def _numel(shape: list) -> Any:
    return sympy.Mul(*[sympy.sympify(d) for d in shape])


def _combine(reduce: str, dtype: dtypes.DType, old: str, value: str) -> str:
    """One scatter step on an output element, rounded to the output dtype at every step as ATen's CPU kernels
    accumulate in it: bool sums and maxima are `or`, products and minima `and`."""
    if reduce == "assign":
        return f"({value}).to({TL_TYPES[dtype]})"
    if dtype == dtypes.bool_:
        return f"(({old} != 0) {'|' if reduce in ('sum', 'mean', 'amax') else '&'} (({value}) != 0))"
    wide = TL_TYPES[compute_type(dtype)]
    a, b = f"{old}.to({wide})", f"({value}).to({wide})"
    step = {"sum": f"{a} + {b}", "mean": f"{a} + {b}", "prod": f"{a} * {b}", "amax": f"kiln_max({a}, {b})",
            "amin": f"kiln_min({a}, {b})"}[reduce]
    return Exprs.cast(step, dtype)


def _copy_kernel(name: str, kernel: Kernel) -> tuple[list[str], list[str]]:
    """The output starts as a copy of `self`."""
    args = KernelArgs()
    numel = _numel(kernel.shape)
    variables = [f"i{k}" for k in range(len(kernel.shape))]
    value = Exprs(args, variables, "mask").render(kernel.detail.input)
    body = ["offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)",
            f"mask = offs < {args.size(numel)}", *unravel(kernel.shape, "offs", args),
            f"tl.store({args.buffer(kernel.outputs[0])} + offs, {value}, mask=mask)"]
    return blocked(name, args, body, numel)


def scatter_kernel(name: str, kernel: Kernel) -> tuple[list[str], list[str]]:
    """index_put / scatter / scatter_add / scatter_reduce: copy `self` into the output, then one program per block
    of the space's parallel dims walks its serial dims one position at a time (a barrier between steps, so a lane
    shared by several threads reads what the last step wrote). Each target index is checked at run time. mean
    counts each output element's contributions, then divides in a pass over the output."""
    detail, out, op = kernel.detail, kernel.outputs[0], kernel.ops[-1]
    space, reduce, dtype = detail.space, detail.reduce, out.dtype
    # in place (a state's update, schedule.in_place_scatter) the output is the input's storage: nothing to copy
    sources, launches = ([], []) if detail.in_place else _copy_kernel(f"{name}_copy", kernel)
    if any(sympy.sympify(d) == 0 for d in space):  # no indices: only the copy (ATen then skips its checks, so the
        return sources, launches  # index's rank may differ from self's, and the scatter's coordinates would not exist)
    args = KernelArgs()
    target = args.buffer(out)
    parallel = [k for k, shared in enumerate(detail.parallel) if shared]
    serial = [k for k, shared in enumerate(detail.parallel) if not shared]
    lanes, steps = _numel([space[k] for k in parallel]), _numel([space[k] for k in serial])
    exprs = Exprs(args, [f"i{k}" for k in range(len(space))], "mask", block_dims=set(parallel))
    head = ["offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)",
            f"mask = offs < {args.size(lanes)}", *unravel([space[k] for k in parallel], "offs", args, prefix="p"),
            *[f"i{k} = p{j}" for j, k in enumerate(parallel)]]
    walk = ["step = position + tl.zeros([1], tl.int64)", *unravel([space[k] for k in serial], "step", args, "s"),
            *[f"i{k} = s{j}" for j, k in enumerate(serial)]]
    coords, targeted = [], []
    for d, where in enumerate(detail.targets):
        if isinstance(where, ScatterIndex):  # an out-of-range target is -1: recorded, and its write skipped
            walk.append(f"j{d} = {exprs.checked(where.index, where.size, d, op, where.wrap, skip=True)}")
            coords.append(f"j{d}")
            targeted.append(f"(j{d} >= 0)")
        else:
            coords.append(f"i{where}")
    active = " & ".join(["mask", *([] if detail.mask is None else [f"({exprs.render(detail.mask)} != 0)"]),
                         *targeted])
    walk += [f"at = {exprs.index(contiguous_strides(kernel.shape), 0, coords)} + tl.zeros([BLOCK], tl.int64)",
             f"active = {active}"]

    def serially(lines: list[str]) -> list[str]:
        return [f"for position in range(0, {args.size(steps)}):",
                *[f"    {line}" for line in walk + lines + ["tl.debug_barrier()"]]]

    body = list(head)
    if reduce != "assign" and not detail.include_self:  # targeted self elements start from the identity
        identity = f"tl.full([BLOCK], {literal(detail.identity)}, {TL_TYPES[dtype]})"
        body += serially([f"tl.store({target} + at, {identity}, mask=active)"])
    step = [f"old = tl.load({target} + at, mask=active, other=0)",
            f"tl.store({target} + at, {_combine(reduce, dtype, 'old', exprs.render(detail.value))}, mask=active)"]
    extra = ["BLOCK: tl.constexpr"]
    if reduce == "mean":
        step.append("tl.store(counts + at, tl.load(counts + at, mask=active, other=0) + 1, mask=active)")
        extra.insert(0, "counts")
    body += serially(step)
    counts = f"{name}_counts"
    call = ", ".join([*args.arguments(), *([counts] if reduce == "mean" else [])])
    sources += ["", "", "@triton.jit", signature(name, args, extra), *[f"    {line}" for line in body]]
    guard = f"if {py_dim(lanes)} > 0 and {py_dim(steps)} > 0:"
    launch = [guard]
    if reduce == "mean":
        launch.append(f"    {counts} = torch.zeros(({py_dim(_numel(kernel.shape))},), dtype=torch.int64, "
                      "device=device)")
    launch.append(f"    {name}[(triton.cdiv({py_dim(lanes)}, {LANE_BLOCK}),)]({call}, "
                  f"BLOCK=min(triton.next_power_of_2({py_dim(lanes)}), {LANE_BLOCK}))")
    if reduce == "mean":
        mean_source, mean_launch = _mean_kernel(f"{name}_mean", kernel, counts)
        sources += ["", "", *mean_source]
        launch += [f"    {line}" for line in mean_launch]
    return sources, launches + launch


def _mean_kernel(name: str, kernel: Kernel, counts: str) -> tuple[list[str], list[str]]:
    """scatter_reduce mean: each output element that took contributions is divided by their count, plus one for
    the self element when it takes part (floor division for integers)."""
    out = kernel.outputs[0]
    args = KernelArgs()
    target, numel = args.buffer(out), _numel(kernel.shape)
    divisor = f"tl.maximum(count + {1 if kernel.detail.include_self else 0}, 1)"  # untouched elements keep theirs
    if out.dtype.is_floating_point:
        wide = TL_TYPES[compute_type(out.dtype)]
        quotient = Exprs.cast(f"value.to({wide}) / {divisor}.to({wide})", out.dtype)
        divide = [f"result = {quotient}"]
    else:  # Triton's integer division truncates; step down where the remainder is negative
        divide = ["total = value.to(tl.int64)", f"quotient = total // {divisor}",
                  f"quotient = tl.where(total - quotient * {divisor} < 0, quotient - 1, quotient)",
                  f"result = quotient.to({TL_TYPES[out.dtype]})"]
    body = ["offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)",
            f"mask = offs < {args.size(numel)}",
            "count = tl.load(counts + offs, mask=mask, other=0)",
            f"value = tl.load({target} + offs, mask=mask, other=0)", *divide,
            f"tl.store({target} + offs, result, mask=mask & (count > 0))"]
    source = ["@triton.jit", signature(name, args, ["counts", "BLOCK: tl.constexpr"]),
              *[f"    {line}" for line in body]]
    launch = [f"{name}[(triton.cdiv({py_dim(numel)}, {POINTWISE_BLOCK}),)]"
              f"({', '.join([*args.arguments(), counts])}, BLOCK={POINTWISE_BLOCK})"]
    return source, launch


def bags_kernel(name: str, kernel: Kernel) -> tuple[list[str], list[str]]:
    """_embedding_bag: one program per bag. Bag b runs from offsets[b] to offsets[b + 1] (the last one to the end of
    the indices); a first pass over its indices (in blocks) checks them, writes offset2bag and counts the rows that
    are not padding_idx; then each block of columns walks the bag's rows in order, in double as the C backend. max
    starts from the bag's first row and takes each strictly greater one, as ATen (a NaN only where it comes first),
    naming its row. Offsets that do not start at 0, decrease or pass
    the end, and indices outside the weight, fail the run."""
    detail, (out, offset2bag, bag_size, max_indices) = kernel.detail, kernel.outputs
    weight, indices, offsets, psw = detail.weight, detail.indices, detail.offsets, detail.per_sample_weights
    mode, pad, op = detail.mode, detail.padding_idx, kernel.ops[-1]
    args = KernelArgs()
    args.checks_indices = True
    exprs = Exprs(args, [], "cm")

    def read(view: Any, *variables: str, mask: str = "") -> str:
        place = exprs.index(view.strides, view.offset, list(variables))
        return f"tl.load({args.buffer(view.buffer)} + ({place}){f', mask={mask}, other=0' if mask else ''})"

    count, bags = args.size(indices.shape[0]), args.size(kernel.shape[0])
    columns, rows, noff = args.size(kernel.shape[1]), args.size(weight.shape[0]), args.size(offsets.shape[0])
    last = f" | ((b == {bags} - 1) & (end != {count}))" if detail.include_last_offset else ""
    checked_op = CHECKED_OPS.index(op)

    def row(index: str, mask: str) -> str:
        return f"kiln_index({index}, {rows}, {mask}, err, {checked_op}, 0, False, False)"

    kept = f" & (r != {pad})" if pad >= 0 else ""
    body = ["b = tl.program_id(0).to(tl.int64)", "zero = tl.zeros([1], tl.int64)",
            f"start = {read(offsets, 'b')}.to(tl.int64)",
            f"following = tl.minimum(b + 1, {noff} - 1)",
            f"end = tl.where(b + 1 < {noff}, {read(offsets, 'following')}.to(tl.int64), {count})",
            "early = ((b == 0) & (start != 0)) | (start < 0)",
            f"bad = zero + (early | (start > end) | (end > {count}){last}).to(tl.int64) != 0",
            f"tl.store(err + zero, zero + {1 + CHECKED_OPS.index(BAG_OFFSETS)}, mask=bad)",
            "tl.store(err + 1 + zero, zero + tl.where(early, start, end), mask=bad)",
            "tl.store(err + 2 + zero, zero, mask=bad)",
            f"tl.store(err + 3 + zero, zero + {count} + 1, mask=bad)",
            "failed = tl.max(bad.to(tl.int32), axis=0) != 0",
            "start = tl.where(failed, 0, start)", "end = tl.where(failed, 0, end)",
            "sizes = tl.zeros([BLOCK], tl.int64)",
            "for first in range(start, end, BLOCK):",
            "    k = first + tl.arange(0, BLOCK)", "    km = k < end",
            f"    r = {row(read(indices, 'k', mask='km'), 'km')}",
            f"    sizes += (km{kept}).to(tl.int64)"]
    if sympy.sympify(offset2bag.numel) != 0:  # empty on ATen's fused float sum path
        body.insert(-1, f"    tl.store({args.buffer(offset2bag)} + k, (b + tl.zeros_like(k)).to("
                        f"{TL_TYPES[offset2bag.dtype]}), mask=km)")
    body += ["size = tl.sum(sizes, axis=0)", "filled = (tl.zeros([BLOCK], tl.int64) + size) > 0",
             f"tl.store({args.buffer(bag_size)} + b, ({'size' if mode != 0 else 'size * 0'}).to("
             f"{TL_TYPES[bag_size.dtype]}))"]
    if mode != 2:
        body.append(f"tl.store({args.buffer(max_indices)} + b, ({'size' if mode == 1 else 'size * 0'}).to("
                    f"{TL_TYPES[max_indices.dtype]}))")
    walk = ["    for i in range(start, end):",
            f"        r = {row(read(indices, 'i'), 'cm')}",
            f"        taken = cm{kept}",
            f"        v = {read(weight, 'r', 'c', mask='taken')}.to(tl.float64)"]
    place = f"b * {columns} + c"
    body += [f"for c0 in range(0, {columns}, BLOCK):", "    c = c0 + tl.arange(0, BLOCK)", f"    cm = c < {columns}"]
    if mode == 2:
        # as ATen scans: the bag's first row, then each strictly greater one (a NaN only where it comes first)
        body += ["    best = tl.zeros([BLOCK], tl.float64)", "    found = tl.zeros([BLOCK], tl.int64) - 1", *walk,
                 "        update = taken & ((found < 0) | (v > best))",
                 "        best = tl.where(update, v, best)", "        found = tl.where(update, i, found)",
                 "    found = tl.maximum(found, 0)",
                 f"    tl.store({args.buffer(out)} + {place}, "
                 f"{Exprs.cast('tl.where(filled, best, 0.0)', out.dtype)}, mask=cm)",
                 f"    named = {read(indices, 'found', mask='cm & filled')}",
                 f"    tl.store({args.buffer(max_indices)} + {place}, "
                 f"tl.where(filled, named, 0).to({TL_TYPES[max_indices.dtype]}), mask=cm)"]
    else:
        scale = f" * {read(psw, 'i')}.to(tl.float64)" if psw is not None else ""
        total = "total / tl.maximum(size, 1).to(tl.float64)" if mode == 1 else "total"
        body += ["    total = tl.zeros([BLOCK], tl.float64)", *walk,
                 f"        total += tl.where(taken, v{scale}, 0.0)",
                 f"    tl.store({args.buffer(out)} + {place}, {Exprs.cast(total, out.dtype)}, mask=cm)"]
    source = ["@triton.jit", signature(name, args, ["BLOCK: tl.constexpr"]), *[f"    {line}" for line in body]]
    launch = [f"if {py_dim(kernel.shape[0])} > 0:",
              f"    {name}[({py_dim(kernel.shape[0])},)]({', '.join(args.arguments())}, "
              f"BLOCK=min(max(triton.next_power_of_2({py_dim(kernel.shape[1])}), 16), {POINTWISE_BLOCK}))"]
    return source, launch

