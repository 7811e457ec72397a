"""Weights packed at compile time into the layouts the float32 micro-kernels read (kiln_gemm.h), stored in weights.bin.

A GEMM's constant B operand is read as zero-padded panels of KILN_NR columns, and a convolution's weights as
blocks of KILN_MR rows (or, with few output pixels and many channels, `conv_weight_layout`, as B panels of KILN_NR
output channels). Packing them here rather than when the model is created means a package loads by mapping
weights.bin, with no copy of its weights in the process's memory (a 512 MB linear layer used to take 0.5 s and
512 MB of anonymous memory to load), and the layout is computed once per compile instead of once per load. The
tile sizes depend on the CPU capability the package is built for; model.c refuses to build with other flags.
The integer and sparse kernels still pack when the model is created.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import sympy

from kiln.codegen.c.recurrent import gate_panels
from kiln.codegen.kernels import Kernel


def tile_sizes(capability: str) -> tuple[int, int]:
    """(KILN_MR, KILN_NR) of the micro-kernels built for `capability` (kiln_gemm.h)."""
    return (6, 16) if capability == "AVX2" else (12, 32)


@dataclass(frozen=True)
class PackedWeight:
    """A weight in a micro-kernel's layout: the weights.bin entry `name`, computed by `pack` from the weight."""
    name: str
    source: str                                   # the weight it is packed from (its weight_key)
    layout: str                                   # "panels" (a GEMM's B), "row_blocks" (a convolution's A) or
                                                  # "gate_panels" (an LSTM step's, c/recurrent.py)
    pack: Callable[[np.ndarray], np.ndarray]      # the weight's array -> the packed float32 array


def packed_weight(kernel: Kernel, capability: str) -> PackedWeight | None:
    """How `kernel`'s constant operand is packed at compile time, or None when it is not (see
    render._prepacked for which kernels keep a packed operand at all)."""
    mr, nr = tile_sizes(capability)
    if kernel.kind == "matmul" and kernel.detail.a_gather is not None:  # each gathered matrix's transpose
        a_buf, _, a_offset = kernel.detail.a
        layout = (int(a_offset), int(kernel.detail.a_gather.size[0]), int(kernel.shape[1]), int(kernel.detail.k), nr)
        return PackedWeight(_name(a_buf.weight_key, "panels", layout), a_buf.weight_key, "panels",
                            lambda array: _group_panels(array, *layout))
    if kernel.kind == "matmul":
        b_buf, b_strides, b_offset = kernel.detail.b
        k, n = int(kernel.detail.k), int(kernel.shape[-1])
        layout = (int(b_offset), int(b_strides[1]), int(b_strides[2]), k, n, nr)
        return PackedWeight(_name(b_buf.weight_key, "panels", layout), b_buf.weight_key, "panels",
                            lambda weight: _panels(weight, *layout))
    if kernel.kind == "conv":
        weight = kernel.detail.weight
        groups = int(kernel.detail.groups)
        rows = int(weight.shape[0]) // groups
        k = int(np.prod([int(d) for d in weight.shape[1:]]))
        if conv_weight_layout(kernel, capability) == "panels":  # each group's W^T [k x rows]
            layout = (int(weight.offset), groups, rows, k, nr)
            return PackedWeight(_name(weight.buffer.weight_key, "panels", layout), weight.buffer.weight_key,
                                "panels", lambda array: _group_panels(array, *layout))
        layout = (int(weight.offset), groups, rows, k, mr)
        return PackedWeight(_name(weight.buffer.weight_key, "row_blocks", layout), weight.buffer.weight_key,
                            "row_blocks", lambda array: _row_blocks(array, *layout))
    if kernel.kind == "lstm_cell":
        weight, hidden = kernel.detail.weight, kernel.detail.hidden
        layout = (int(weight.offset), hidden, nr)
        return PackedWeight(_name(weight.buffer.weight_key, "gate_panels", layout), weight.buffer.weight_key,
                            "gate_panels", lambda array: gate_panels(array, *layout))
    return None


PIXEL_ROWS_LIMIT = 256  # output pixels per image up to which a convolution may take its pixels as the GEMM's rows


def conv_weight_layout(kernel: Kernel, capability: str) -> str:
    """How a float32 convolution's implicit GEMM is oriented, named by its weights' layout. "row_blocks": output
    channels are the rows (the weights are A, in KILN_MR-row blocks) and output pixels the KILN_NR-wide columns.
    "panels": output pixels are the rows (an image's im2col in row blocks) and the weights the B panels of KILN_NR
    output channels, as a linear layer's. The second wins for images of few pixels and many channels (ResNet's
    14x14 and 7x7 stages: 49 pixels filled two 32-pixel panels to 77%, and the weights streamed from memory once
    per panel), so it is taken where pixels are few and fill their panels worse than the channels fill theirs."""
    _, nr = tile_sizes(capability)
    sizes = [sympy.sympify(d) for d in kernel.shape[2:]]
    if not all(d.is_Integer for d in sizes):
        return "row_blocks"
    pixels = math.prod(int(d) for d in sizes)
    channels = int(kernel.detail.weight.shape[0]) // int(kernel.detail.groups)
    def fill(n: int) -> float:  # the share of KILN_NR-wide panels' columns that n columns use
        return n / (-(-n // nr) * nr)
    return "panels" if 0 < pixels <= PIXEL_ROWS_LIMIT and fill(channels) > fill(pixels) else "row_blocks"


def _name(weight_key: str, kind: str, layout: tuple[int, ...]) -> str:
    digest = hashlib.sha256(repr(layout).encode()).hexdigest()[:8]
    return f"{weight_key}.{kind}_{digest}"


def _panels(weight: np.ndarray, offset: int, sk: int, sn: int, k: int, n: int, nr: int) -> np.ndarray:
    """B [k x n] (element (i, j) at flat[offset + i * sk + j * sn]) as kiln_pack_b lays it out: panel p holds
    columns [p * nr, (p + 1) * nr) k-major, zero past n."""
    flat = np.ascontiguousarray(weight, np.float32).reshape(-1)
    item = flat.itemsize
    b = np.lib.stride_tricks.as_strided(flat[offset:], shape=(k, n), strides=(sk * item, sn * item), writeable=False)
    panels = np.zeros((-(-n // nr), k, nr), np.float32)
    for panel, start in enumerate(range(0, n, nr)):  # one panel at a time: no second copy of a large weight
        panels[panel, :, :min(nr, n - start)] = b[:, start:start + nr]
    return panels


def _group_panels(weight: np.ndarray, offset: int, groups: int, rows: int, k: int, nr: int) -> np.ndarray:
    """Each group's W^T [k x rows] (W is [rows x k] per group, row-major) in panels of nr output channels."""
    return np.stack([_panels(weight, offset + g * rows * k, 1, k, k, rows, nr) for g in range(groups)])


def _row_blocks(weight: np.ndarray, offset: int, groups: int, rows: int, k: int, mr: int) -> np.ndarray:
    """Each group's A [rows x k] as kiln_pack_a lays it out: blocks of mr rows, each k-major, zero past rows."""
    flat = np.ascontiguousarray(weight, np.float32).reshape(-1)
    a = flat[offset:offset + groups * rows * k].reshape(groups, rows, k)
    blocks = -(-rows // mr)
    padded = np.zeros((groups, blocks * mr, k), np.float32)
    padded[:, :rows] = a
    return np.ascontiguousarray(padded.reshape(groups, blocks, mr, k).transpose(0, 1, 3, 2))
