"""Recognizes scaled-dot-product attention in a kernel schedule: batched GEMM -> softmax -> batched GEMM becomes one
"attention" kernel, which each backend renders (C: c/render._attention, Triton: triton/attention.py).

The pattern, on float32 kernels whose intermediates nothing else reads:

    scores = bmm(Q, K^T) with a pointwise epilogue (the scale, a mask)      matmul kernel, rank 3
    probs  = _softmax(scores, -1)                                          rows kernel
    [torch's safe softmax: where(amax(scores, -1) == -inf, 0, probs)]     rows amax, pointwise eq, pointwise where
    out    = bmm(probs, V) with a pointwise epilogue                       matmul kernel, rank 3
"""

from __future__ import annotations

import math
from typing import Any

import sympy

from kiln.codegen.memory import kernel_reads
from kiln.codegen.kernels import (
    Apply, AttentionDetail, Buffer, Constant, Kernel, Load, Schedule, View, contiguous_strides, same_dim as _same,
)
from kiln.ir import dtypes


def fuse_attention(schedule: Schedule) -> Schedule:
    """Replace every matching chain in `schedule.kernels` by one attention kernel (in place; returns it)."""
    graph = _Graph(schedule.kernels)
    for second in list(schedule.kernels):
        match = graph.match(second)
        if match is None:
            continue
        replaced, first, safe = match
        schedule.kernels[schedule.kernels.index(second)] = _fused_kernel(replaced, first, second, safe)
        for kernel in replaced:
            schedule.kernels.remove(kernel)
    return schedule


def _is_f32_bmm(kernel: Kernel | None) -> bool:
    if kernel is None or kernel.kind != "matmul" or len(kernel.shape) != 3 or kernel.detail.bias is not None or \
            kernel.detail.a_gather is not None:
        return False
    return kernel.detail.a[0].dtype == kernel.detail.b[0].dtype == kernel.outputs[0].dtype == dtypes.float32


def _reads_rows(load: Any, shape: list, row_values: bool) -> bool:
    """`load` walks a contiguous tensor of `shape` from its start; with `row_values`, one value per row of the
    last dim (a keepdim reduction's result: the last stride 0, the others a [..., 1] tensor's)."""
    if not isinstance(load, Load) or not _same(load.offset, 0):
        return False
    strides = contiguous_strides(list(shape[:-1]) + [1]) if row_values else contiguous_strides(shape)
    expected = strides[:-1] + [0] if row_values else strides
    return len(load.strides) == len(expected) and all(_same(s, e) for s, e in zip(load.strides, expected))


def _whole(view: Any, buf: Buffer) -> bool:
    """`view` reads all of `buf`, contiguously, from its start."""
    return (isinstance(view, View) and view.buffer is buf and _same(view.offset, 0) and view.is_contiguous
            and _same(math.prod(map(sympy.sympify, view.shape)), buf.numel))


class _Graph:
    """Who writes and who reads each buffer of a schedule."""

    def __init__(self, kernels: list[Kernel]):
        self.writer = {id(buf): kernel for kernel in kernels for buf in kernel.outputs}
        self.readers: dict[int, list[Kernel]] = {}
        for kernel in kernels:
            for buf in kernel_reads(kernel):
                self.readers.setdefault(id(buf), []).append(kernel)

    def read_only_by(self, buf: Buffer, *kernels: Kernel) -> bool:
        """A temporary that exactly `kernels` read (nothing else, not the program's outputs)."""
        return buf.kind == "temp" and buf.inside is None and \
            sorted(map(id, self.readers.get(id(buf), []))) == sorted(map(id, kernels))

    def match(self, second: Kernel) -> tuple[list[Kernel], Kernel, bool] | None:
        """(the kernels the fused one replaces besides `second`, the scores GEMM, whether the softmax is safe) when
        `second` is the output GEMM of an attention chain."""
        if not _is_f32_bmm(second):
            return None
        probs, probs_strides, probs_offset = second.detail.a
        batch, queries, keys = second.shape[0], second.shape[1], second.detail.k
        if not (_same(probs_offset, 0) and all(_same(s, c) for s, c in zip(
                probs_strides, contiguous_strides([batch, queries, keys])))
                and self.read_only_by(probs, second)):
            return None
        writer = self.writer.get(id(probs))
        safe = writer is not None and writer.kind == "pointwise"
        softmax_chain = self.safe_softmax(writer) if safe else [writer]
        if softmax_chain is None:
            return None
        softmax = softmax_chain[0]
        if softmax is None or softmax.kind != "rows" or softmax.ops != ["aten._softmax.default"] \
                or softmax.outputs[0].dtype != dtypes.float32:
            return None
        scores = softmax.detail.input
        if scores is None or softmax.detail.dim != len(scores.shape) - 1:
            return None
        first = self.writer.get(id(scores.buffer))
        if not _is_f32_bmm(first) or not _whole(scores, first.outputs[0]):
            return None
        if not self.read_only_by(first.outputs[0], *softmax_chain[:2 if safe else 1]):
            return None
        if not all(_same(a, b) for a, b in zip(first.shape, (batch, queries, keys))):
            return None
        return [first, *softmax_chain], first, safe

    def safe_softmax(self, where: Kernel) -> list[Kernel] | None:
        """[softmax, amax, eq, where] when `where` computes where(amax(s, -1) == -inf, 0, softmax(s, -1))."""
        expr = where.expr
        if not (isinstance(expr, Apply) and expr.op == "aten.where.self" and len(expr.args) == 3):
            return None
        condition, zero, value = expr.args
        if not (_reads_rows(condition, where.shape, row_values=True) and isinstance(zero, Constant)
                and zero.value == 0 and _reads_rows(value, where.shape, row_values=False)):
            return None
        eq, softmax = self.writer.get(id(condition.buffer)), self.writer.get(id(value.buffer))
        if eq is None or softmax is None or eq.kind != "pointwise" or softmax.kind != "rows":
            return None
        test = eq.expr
        if not (isinstance(test, Apply) and test.op == "aten.eq.Scalar" and test.args[1] == -math.inf
                and _reads_rows(test.args[0], eq.shape, row_values=False)):
            return None
        amax = self.writer.get(id(test.args[0].buffer))
        scores = softmax.detail.input
        if amax is None or amax.kind != "rows" or amax.ops != ["aten.amax.default"] or scores is None \
                or not _whole(amax.detail.input, scores.buffer) \
                or amax.detail.dim != len(scores.shape) - 1:
            return None
        if not (self.read_only_by(value.buffer, where) and self.read_only_by(condition.buffer, where)
                and self.read_only_by(test.args[0].buffer, eq)):
            return None
        return [softmax, amax, eq, where]


def _fused_kernel(replaced: list[Kernel], first: Kernel, second: Kernel, safe: bool) -> Kernel:
    """The "attention" kernel: shape and outputs the output GEMM's, its expr the output GEMM's epilogue, its detail
    an AttentionDetail (`safe`: the chain had the safe softmax's `where`)."""
    detail = AttentionDetail(q=first.detail.a, k=first.detail.b, dim=first.detail.k, keys=first.shape[2],
                             scores=first.expr, v=second.detail.b, safe=safe)
    ops = list(dict.fromkeys(op for kernel in [*replaced, second] for op in kernel.ops))
    return Kernel("attention", f"attention_{second.outputs[0].name}", ops, second.outputs, second.shape,
                  second.expr, detail)
