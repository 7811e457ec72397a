"""The Triton rendering of the fused "attention" kernel (kiln/codegen/attention.py) as flash attention: one program per
(batch entry, block of BM queries) walks the keys in blocks of BN with an online softmax, so the seq x seq scores never
reach memory."""

from __future__ import annotations

from kiln.codegen.kernels import Kernel, contiguous_strides
from kiln.codegen.triton.render import Exprs, KernelArgs, accumulator_type, py_dim, signature

# Query x key blocks: autotuned on a GPU (per kernel and sizes); under the interpreter a block of queries smaller
# than the block of keys, so the tests cross both kinds of block boundary at different lengths.
CONFIGS = ('[triton.Config({"BM": 16, "BN": 32})] if INTERPRET else ['
           'triton.Config({"BM": 64, "BN": 64}, num_warps=4, num_stages=2), '
           'triton.Config({"BM": 128, "BN": 64}, num_warps=8, num_stages=2), '
           'triton.Config({"BM": 64, "BN": 32}, num_warps=4, num_stages=3)]')


def attention_kernel(name: str, kernel: Kernel) -> tuple[list[str], list[str]]:
    """softmax(epilogue(Q Kᵀ)) V with the output GEMM's epilogue. Per block of keys: the scores tile (`tl.dot`, IEEE
    float32) through the scores GEMM's epilogue (scale, masks), then the online softmax: the running row max `m_i`,
    the running sum `l_i` and the accumulator, both rescaled by exp(old max - new max). A max of -inf (every score so
    far -inf) subtracts 0 instead, so fully masked blocks add exact zeros rather than NaN. At the end a row whose
    scores were all -inf (and none NaN) gives 0 @ V under the safe softmax, as torch's `where` does, and 0 / 0 = NaN
    otherwise, as a plain softmax of an all -inf row does; a NaN score makes its row NaN either way."""
    detail, out = kernel.detail, kernel.outputs[0]
    args = KernelArgs()
    (q_buf, q_strides, q_offset), (k_buf, k_strides, k_offset) = detail.q, detail.k
    v_buf, v_strides, v_offset = detail.v
    batch, queries, value_dim = kernel.shape
    M, L, D, DV = (args.size(size) for size in (queries, detail.keys, detail.dim, value_dim))
    views = Exprs(args, [], "mask")
    q_index = views.index(q_strides, q_offset, ["pid_b", "rm[:, None]", "rd[None, :]"])
    k_index = views.index(k_strides, k_offset, ["pid_b", "rd[:, None]", "rn[None, :]"])
    v_index = views.index(v_strides, v_offset, ["pid_b", "rn[:, None]", "rv[None, :]"])
    q, k, v = args.buffer(q_buf), args.buffer(k_buf), args.buffer(v_buf)
    # (pid_b is one batch entry: a read only it reaches is a scalar)
    scores = Exprs(args, ["pid_b", "rm[:, None]", "rn[None, :]"], "mask", accumulator="acc_value", block_dims={1, 2})
    outputs = ["pid_b", "rm[:, None]", "rv[None, :]"]
    epilogue = Exprs(args, outputs, "mask", accumulator="acc_value", block_dims={1, 2}).render(kernel.expr)
    flat = Exprs(args, outputs, "mask").index(contiguous_strides(kernel.shape), 0)
    # Under the safe softmax an all -inf row (a NaN score leaves l_i NaN, so not one of these) keeps acc = 0 @ V.
    total = "tl.where((m_i == NEG_INF) & (l_i == l_i), 1.0, l_i)" if detail.safe else "l_i"
    body = [
        "pid_m, pid_b = tl.program_id(0), tl.program_id(1).to(tl.int64)",
        "NEG_INF = float('-inf')",
        "rm = pid_m.to(tl.int64) * BM + tl.arange(0, BM)",
        "rd = tl.arange(0, BD)",
        "rv = tl.arange(0, BDV)",
        f"q = tl.load({q} + ({q_index}), mask=(rm[:, None] < {M}) & (rd[None, :] < {D}), other=0.0).to(tl.float32)",
        "m_i = tl.full([BM], NEG_INF, tl.float32)",
        "l_i = tl.zeros([BM], tl.float32)",
        "acc = tl.zeros((BM, BDV), tl.float32)",
        f"for key_start in range(0, {L}, BN):",
        "    rn = key_start + tl.arange(0, BN)",
        f"    k = tl.load({k} + ({k_index}), mask=(rd[:, None] < {D}) & (rn[None, :] < {L}), other=0.0)",
        "    acc_value = tl.dot(q, k.to(tl.float32), input_precision=\"ieee\")",
        f"    mask = (rm[:, None] < {M}) & (rn[None, :] < {L})",
        f"    s = tl.where(rn[None, :] < {L}, ({scores.render(detail.scores)}).to(tl.float32), NEG_INF)",
        "    m_new = tl.maximum(m_i, tl.max(s, 1))",
        "    shift = tl.where(m_new == NEG_INF, 0.0, m_new)",
        "    p = tl.exp(s - shift[:, None])",
        "    alpha = tl.exp(m_i - shift)",
        "    l_i = l_i * alpha + tl.sum(p, 1)",
        f"    v = tl.load({v} + ({v_index}), mask=(rn[:, None] < {L}) & (rv[None, :] < {DV}), other=0.0)",
        "    acc = tl.dot(p, v.to(tl.float32), acc * alpha[:, None], input_precision=\"ieee\")",
        "    m_i = m_new",
        f"mask = (rm[:, None] < {M}) & (rv[None, :] < {DV})",
        f"acc_value = (acc / ({total})[:, None]).to({accumulator_type(kernel)})",
        f"tl.store({args.buffer(out)} + ({flat}), {epilogue}, mask=mask)",
    ]
    source = [f"@triton.autotune(configs={CONFIGS}, key={list(args.sizes.values())!r})", "@triton.jit",
              signature(name, args, ["BD: tl.constexpr", "BDV: tl.constexpr", "BM: tl.constexpr", "BN: tl.constexpr"]),
              *["    " + line for line in body]]
    numel = py_dim(batch * queries * value_dim)
    launch = [f"if {numel} > 0:",
              f"    {name}[lambda META: (triton.cdiv({py_dim(queries)}, META['BM']), {py_dim(batch)})]"
              f"({', '.join(args.arguments())}, BD=max(16, triton.next_power_of_2({py_dim(detail.dim)})), "
              f"BDV=max(16, triton.next_power_of_2({py_dim(value_dim)})))"]
    return source, launch
