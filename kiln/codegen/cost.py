"""The schedule's backend-neutral cost model: a kernel's operation count, from its kind and its detail. Backends
size thread teams (C) and launch grids (Triton) from it; a Target may weigh it differently."""

from __future__ import annotations

from typing import Any

import sympy

from kiln.codegen.kernels import Kernel


def kernel_work(kernel: Kernel) -> Any:
    """A rough operation count of one kernel (multiply-adds count 2), as a size expression."""
    def size(shape: list) -> Any:
        return sympy.Mul(*[sympy.sympify(d) for d in shape])
    if kernel.kind == "loop":  # its body, once per step (a while loop's steps are unknown: counted once)
        steps = 1 if kernel.shape[0] is None else sympy.sympify(kernel.shape[0])
        return steps * sympy.Add(*[kernel_work(k) for k in kernel.detail.region_kernels()], 1)
    out = size(kernel.shape)
    if kernel.kind in ("matmul", "qlinear", "qconv", "wlinear"):
        return 2 * out * sympy.sympify(kernel.detail.k)
    if kernel.kind == "attention":  # two GEMMs and a softmax over the batch x queries x keys scores
        scores = sympy.sympify(kernel.shape[0]) * sympy.sympify(kernel.shape[1]) * sympy.sympify(kernel.detail.keys)
        return scores * (2 * sympy.sympify(kernel.detail.dim) + 2 * sympy.sympify(kernel.shape[2]) + 4)
    if kernel.kind == "conv":
        return 2 * out * size(kernel.detail.weight.shape[1:])
    if kernel.kind == "lstm_cell":  # the gates' GEMM over [batch, 4 x hidden], then the cell per hidden unit
        return out * (2 * kernel.detail.hidden + 3)
    if kernel.kind == "sparse_linear":
        # a multiply-add per stored weight and activation row, plus the indirect load each stored weight costs (as
        # much as ~3 rows' products: the 768 -> 3072 FFN at 90%, batch 1, counted as 0.9 MFLOP, ran on one thread at
        # 0.31 ms; two threads take 0.12 ms)
        return 2 * (sympy.sympify(kernel.detail.m) + 3) * kernel.detail.components["values"].numel
    if kernel.kind == "sparse_conv":  # a multiply-add per stored weight and pixel, plus packing the im2col panels
        pixels = size([kernel.shape[0], *kernel.shape[2:]])
        stored = kernel.detail.components["values"].numel
        return 2 * pixels * stored + pixels * size(kernel.detail.weight_shape[1:])
    if kernel.kind == "rows":
        return 4 * out
    if kernel.kind == "qpool":  # an add per input element
        return size(kernel.detail.x.shape)
    if kernel.kind == "distance":
        return 3 * out * sympy.sympify(kernel.detail.columns)
    return out * max(1, len(kernel.ops))


def team_work(kernel: Kernel) -> Any:
    """The work a thread team splits between two barriers: a kernel's, or one step of a loop's (its steps run one
    after another, each kernel of a step ending on a barrier, so a step's work is what decides whether more
    threads pay for their barriers)."""
    if kernel.kind == "loop":
        return sympy.Add(*[team_work(k) for k in kernel.detail.region_kernels()], 1)
    return kernel_work(kernel)
