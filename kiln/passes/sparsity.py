"""Pruning and sparsification: `prune` zeroes linear and convolution weights by magnitude, `sparsify` stores the
pruned ones in a sparse layout so backends run sparse kernels.

`prune` follows torch.ao.pruning's WeightNormSparsifier: unstructured (1x1 blocks), block (whole RxC blocks, for
BSR) and 2:4 (two zeros in every 1x4 block along the input dim), scored by the squared weight (L2) or its
magnitude (L1), plus torch.nn.utils.prune's global unstructured pruning (one magnitude threshold for every layer).
Weights of convolutions are pruned as their [out, in * kh * kw] matrix, the one a sparse im2col kernel reads; a
block there spans whole input channels with all their taps (block (R, C) is R output channels x C input channels),
so a block-pruned convolution stores as a hybrid BSR weight [out, in, kh, kw] whose taps are dense dims. (torch's
sparsifier would pool blocks over a conv weight's last two dims, its kernel taps, which no sparse kernel can use.)
"""

from __future__ import annotations

import math
from typing import Any, Iterator

import numpy as np
from xdsl.ir import SSAValue

from kiln.ir.errors import KilnError
from kiln.ir.program import ExportedProgram, InputKind
from kiln.ir.registry import ops
from kiln.ir.sparse import SparseArray, from_dense
from kiln.passes.base import Pass, add_constant, input_spec, option, register_pass
from kiln.passes.rewrite import RewritePass, constant, pattern, value_of

aten = ops.aten

PRUNABLE = ("aten.linear.default", "aten.conv1d.default", "aten.conv2d.default", "aten.conv3d.default",
            "aten.convolution.default")
PATTERNS = ("unstructured", "block", "semi_structured")


class SparsityError(KilnError):
    """A pruning or sparsify request that cannot be met (bad options, shapes that do not fit the pattern)."""


# ---------------------------------------------------------------------------------------------
# Masks (numpy): True keeps a weight


def _scores(weight: np.ndarray, norm: str) -> np.ndarray:
    matrix = np.asarray(weight, np.float64).reshape(weight.shape[0], -1)
    return matrix * matrix if norm == "L2" else np.abs(matrix)


def _block_means(scores: np.ndarray, block: tuple[int, int]) -> np.ndarray:
    """avg_pool2d(ceil_mode=True) over blocks; partial edge blocks average over their cells inside the matrix, as
    torch's avg_pool2d with ceil mode does."""
    rows, cols = scores.shape
    pad_rows, pad_cols = -rows % block[0], -cols % block[1]
    padded = np.pad(scores, ((0, pad_rows), (0, pad_cols)))
    counts = np.pad(np.ones_like(scores), ((0, pad_rows), (0, pad_cols)))
    shape = (padded.shape[0] // block[0], block[0], padded.shape[1] // block[1], block[1])
    return padded.reshape(shape).sum(axis=(1, 3)) / counts.reshape(shape).sum(axis=(1, 3))


def weight_norm_mask(weight: np.ndarray, sparsity_level: float, sparse_block_shape: tuple[int, int] = (1, 1),
                     zeros_per_block: int | None = None, norm: str = "L2") -> np.ndarray:
    """torch.ao.pruning.WeightNormSparsifier's mask for one weight (as its 2-D [out, -1] matrix).

    The tensor mask zeroes the `round(sparsity_level * blocks)` blocks of smallest mean score (at most all but one);
    the block mask zeroes the `zeros_per_block` smallest scores inside every block. A weight is zeroed only where
    both masks zero it, so a block pattern (2:4) with sparsity_level 1 zeroes two of every four.
    """
    scores = _scores(weight, norm)
    rows, cols = scores.shape
    block_rows, block_cols = sparse_block_shape
    per_block = block_rows * block_cols
    zeros_per_block = per_block if zeros_per_block is None else zeros_per_block
    if not 0 <= zeros_per_block <= per_block:
        raise SparsityError(f"zeros_per_block must be in [0, {per_block}] for blocks of {sparse_block_shape}, "
                            f"got {zeros_per_block}")
    if sparsity_level <= 0 or zeros_per_block == 0:
        return np.ones(weight.shape, np.bool_)
    if sparsity_level >= 1 and zeros_per_block == per_block:
        return np.zeros(weight.shape, np.bool_)
    grid = (-(-rows // block_rows), -(-cols // block_cols))
    if sparsity_level >= 1:
        tensor_keep = np.zeros(grid, np.bool_)
    else:
        means = _block_means(scores, sparse_block_shape).reshape(-1)
        pruned = min(max(round(sparsity_level * means.size), 0), means.size - 1)
        tensor_keep = np.ones(means.size, np.bool_)
        tensor_keep[np.argsort(means, kind="stable")[:pruned]] = False
        tensor_keep = tensor_keep.reshape(grid)
    keep = np.repeat(np.repeat(tensor_keep, block_rows, axis=0), block_cols, axis=1)[:rows, :cols]
    if per_block != zeros_per_block:
        padded = np.full((grid[0] * block_rows, grid[1] * block_cols), np.inf)  # torch pads with NaN: never smallest
        padded[:rows, :cols] = scores
        blocks = padded.reshape(grid[0], block_rows, grid[1], block_cols).transpose(0, 2, 1, 3).reshape(*grid, -1)
        block_keep = np.ones(blocks.shape, np.bool_)
        smallest = np.argsort(blocks, axis=-1, kind="stable")[..., :zeros_per_block]
        np.put_along_axis(block_keep, smallest, False, axis=-1)
        block_keep = block_keep.reshape(grid[0], grid[1], block_rows, block_cols).transpose(0, 2, 1, 3)
        keep |= block_keep.reshape(grid[0] * block_rows, grid[1] * block_cols)[:rows, :cols]
    return keep.reshape(weight.shape)


def pattern_mask(weight: np.ndarray, pattern: str, sparsity: float, block: tuple[int, int] = (16, 16),
                 norm: str = "L2") -> np.ndarray:
    """The per-layer mask of one of the `prune` pass's patterns (a convolution's blocks span its taps)."""
    if pattern == "unstructured":
        return weight_norm_mask(weight, sparsity, (1, 1), 1, norm)
    if pattern == "block":
        block = (block[0], block[1] * _taps(weight))
        return weight_norm_mask(weight, sparsity, block, block[0] * block[1], norm)
    if pattern == "semi_structured":
        if weight.reshape(weight.shape[0], -1).shape[1] % 4:
            raise SparsityError(f"2:4 pruning needs a multiple of 4 input features, the weight has shape "
                                f"{list(weight.shape)}", fix="pad the layer, or use pattern=unstructured")
        return weight_norm_mask(weight, 1.0, (1, 4), 2, norm)
    raise SparsityError(f"unknown pruning pattern {pattern!r}", fix="one of " + ", ".join(PATTERNS))


def _taps(weight: np.ndarray) -> int:
    """Kernel taps per (output, input) channel pair of a convolution's weight; 1 for a linear layer's."""
    return math.prod(weight.shape[2:])


def global_magnitude_masks(weights: list[np.ndarray], sparsity: float) -> list[np.ndarray]:
    """torch.nn.utils.prune.global_unstructured with L1Unstructured: zero the `round(sparsity * total)` smallest
    magnitudes across every weight."""
    flat = np.concatenate([np.abs(np.asarray(w, np.float64)).reshape(-1) for w in weights])
    pruned = round(sparsity * flat.size)
    keep = np.ones(flat.size, np.bool_)
    keep[np.argsort(flat, kind="stable")[:pruned]] = False
    masks, start = [], 0
    for weight in weights:
        masks.append(keep[start:start + weight.size].reshape(weight.shape))
        start += weight.size
    return masks


# ---------------------------------------------------------------------------------------------
# The passes


def prunable_weights(program: ExportedProgram) -> Iterator[SSAValue]:
    """The weight operands of the program's linear and convolution ops."""
    for op in program.graph.body.walk():
        opdef = getattr(op, "opdef", None)
        if opdef is not None and opdef.name in PRUNABLE and len(op.operands) > 1:
            yield op.operands[1]


@register_pass
class Prune(Pass):
    """Zero linear and convolution weights by magnitude (WeightNormSparsifier's unstructured, block and 2:4)."""

    name = "prune"

    sparsity: float = option(0.5, "fraction of weights (blocks for pattern=block) to zero; 2:4 is always 0.5")
    pattern: str = option("unstructured", "unstructured | block | semi_structured (2:4)")
    block: tuple[int, ...] = option((16, 16), "block shape for pattern=block (rows, columns)")
    scope: str = option("layer", "layer: every weight to the target sparsity; global: one magnitude threshold "
                                 "across all (torch.nn.utils.prune.global_unstructured)")
    norm: str = option("L2", "block score: L2 (squared weights, torch's default) or L1 (magnitudes)")
    min_elements: int = option(0, "leave weights with fewer elements dense")

    def __post_init__(self) -> None:
        if self.pattern not in PATTERNS:
            raise SparsityError(f"prune: unknown pattern {self.pattern!r}", fix="one of " + ", ".join(PATTERNS))
        if self.scope not in ("layer", "global") or self.scope == "global" and self.pattern != "unstructured":
            raise SparsityError(f"prune: scope {self.scope!r} with pattern {self.pattern!r}",
                                fix="scope is layer or global; global applies to pattern=unstructured")
        if not 0 <= self.sparsity <= 1:
            raise SparsityError(f"prune: sparsity must be in [0, 1], got {self.sparsity}")
        if len(self.block) != 2 or min(self.block) < 1:
            raise SparsityError(f"prune: block must be two positive sizes, got {list(self.block)}")
        if self.norm not in ("L1", "L2"):
            raise SparsityError(f"prune: norm must be L1 or L2, got {self.norm!r}")

    def apply_program(self, program: ExportedProgram) -> ExportedProgram:
        targets: dict[str, tuple[dict[str, Any], np.ndarray]] = {}
        for weight in prunable_weights(program):
            spec = input_spec(program, weight)
            if spec is None or spec.kind not in (InputKind.PARAMETER, InputKind.CONSTANT_TENSOR, InputKind.BUFFER):
                continue
            store = program.state_dict if spec.target in program.state_dict else program.constants
            value = store.get(spec.target)
            if isinstance(value, np.ndarray) and value.dtype.kind == "f" and value.size >= self.min_elements:
                targets[spec.target] = (store, value)
        if not targets:
            return program
        weights = [value for _, value in targets.values()]
        if self.scope == "global":
            masks = global_magnitude_masks(weights, self.sparsity)
        else:
            masks = [pattern_mask(w, self.pattern, self.sparsity, tuple(self.block), self.norm) for w in weights]
        for (target, (store, value)), mask in zip(targets.items(), masks):
            store[target] = np.where(mask, value, np.zeros((), value.dtype))  # a new array: weights are shared
        return program


def sparse_weights(program: ExportedProgram) -> list[str]:
    """The targets of the program's sparse-layout weights (parameters, buffers, constants)."""
    return [spec.target for arg, spec in zip(program.body.args, program.graph_signature.input_specs)
            if spec.kind is not InputKind.USER_INPUT and arg.type.is_sparse and spec.target]


@register_pass
class DensifyWeights(Pass):
    """Store sparse-layout weights densely again, for backends without sparse kernels (ONNX)."""

    name = "densify-weights"

    def apply_program(self, program: ExportedProgram) -> ExportedProgram:
        sparse = [(arg, spec) for arg, spec in zip(program.body.args, program.graph_signature.input_specs)
                  if spec.kind is not InputKind.USER_INPUT and arg.type.is_sparse]
        for arg, spec in sparse:
            store = program.state_dict if spec.target in program.state_dict else program.constants
            # every op on it computes the same dense result; kiln.passes.run drops the unused sparse input
            arg.replace_all_uses_with(add_constant(program, store[spec.target].to_dense(), f"{spec.target}_dense"))
        return program


SPARSE_LAYOUTS = ("auto", "csr", "bsr", "semi_structured")


# The C kernels' break-even against dense, measured on the 1024 -> 4096 -> 1024 MLP (benchmarks/sparse.py; AMD EPYC
# Zen 3, AVX2, 2 threads, batch 1, 8 and 32): CSR pays from about 75% zeros (70%: 1.6x at batch 1 but 0.86x at 8;
# 80%: 1.2-2.2x), BSR 16x16 from about 55% zero blocks (50%: 1.4x at batch 1 and 8, 0.99x at 32). 2:4
# (benchmarks/sparse_24_batches.py: the MLP and the 768 -> 3072 -> 768 FFN, 2 threads, Intel Xeon with AVX-512 and
# forced to AVX2) pays at one and two activation rows (reading the weights bounds the layer; up to four rows the
# kernel expands its weights, kiln_24_expanded: 1.33-1.58x at batch 1, 1.25-1.50x at 2, but 0.87-1.35x at 4), and
# from 16 rows with the pair kernel (kiln_24p_unit: 1.22-1.65x at 16, 32 and 64). Between, its units run 8 or 16
# rows whatever the batch, and 5 to 12 rows measured 0.85-1.40x (0.92x and 0.99x for the FFN at 12). (The AMD EPYC
# ran the earlier 2:4 kernels at 1.2-1.3x at batch 32; the pair kernel is not measured there yet.)
CSR_BREAK_EVEN = 0.75
TWO_FOUR_FEW_ROWS = 2  # 2:4 beats dense on AVX2 and AVX-512 builds up to this many activation rows,
TWO_FOUR_MANY_ROWS = 16  # and from this many
BSR_BREAK_EVEN = 0.55
# Convolutions (BSR over im2col, 16x16 channel blocks; benchmarks/sparse.py's cnn row and 3x3 layers of 64-512
# channels at 56x56 down to 7x7, batch 1 and 8): 50% zero blocks ran at 1.04-1.66x dense, 40% at 0.76-1.35x.
CONV_BSR_BREAK_EVEN = 0.5


def zero_block_fraction(weight: np.ndarray, block: tuple[int, int]) -> float | None:
    """The fraction of (R x C)-blocks of a weight's first two dims that are zero, each block with all the trailing
    dims (a convolution's taps: the BSR blocks of its im2col matrix); None when the blocks do not tile the weight."""
    if weight.shape[0] % block[0] or weight.shape[1] % block[1]:
        return None
    blocks = weight.reshape(weight.shape[0] // block[0], block[0], weight.shape[1] // block[1], -1)
    return 1 - float((blocks != 0).any(axis=(1, 3)).mean())


def choose_layout(weight: np.ndarray, block: tuple[int, int], min_sparsity: float,
                  rows: int | None = None) -> tuple[str, dict[str, Any]] | None:
    """The sparse layout a pruned [out, in] weight is stored in, or None to keep it dense: the measured cost model.

    2:4 when every group of four holds at most two nonzeros and the layer sees at most TWO_FOUR_FEW_ROWS or at least
    TWO_FOUR_MANY_ROWS rows of activations (`rows`, None when not static); BSR when whole blocks are zero to the
    break-even; CSR when single zeros are; else dense. `min_sparsity` raises the break-evens. A convolution's weight
    [out, in, *taps] is only ever BSR, with blocks of `block[0]` output x `block[1]` input channels and all their
    taps (`sparsify` stores it as a hybrid BSR).
    """
    conv = weight.ndim > 2
    rows_out, cols = weight.shape[0], weight[0].size
    two_four = not conv and cols % 8 == 0 and (weight.reshape(rows_out, -1, 4) != 0).sum(axis=-1).max(initial=0) <= 2
    if two_four and rows is not None and (rows <= TWO_FOUR_FEW_ROWS or rows >= TWO_FOUR_MANY_ROWS):
        return "semi_structured", {}
    zero_blocks = zero_block_fraction(weight, block)
    if zero_blocks is not None and zero_blocks >= max(min_sparsity, CONV_BSR_BREAK_EVEN if conv else BSR_BREAK_EVEN):
        return "sparse_bsr", {"blocksize": block}
    if not conv and 1 - np.count_nonzero(weight) / weight.size >= max(min_sparsity, CSR_BREAK_EVEN):
        return "sparse_csr", {}
    return None


@register_pass
class Sparsify(RewritePass):
    """Store pruned linear weights in a sparse layout (CSR, BSR or 2:4) and pruned convolution weights as BSR over
    their im2col matrix, so backends run sparse kernels."""

    name = "sparsify"

    layout: str = option("auto", "auto | csr | bsr | semi_structured (auto: the measured cost model of "
                                 "choose_layout: 2:4 for one or two activation rows or 16 and more, then BSR, then "
                                 "CSR, where they beat dense)")
    block: tuple[int, ...] = option((16, 16), "BSR block shape")
    min_sparsity: float = option(0.5, "keep weights with fewer zeros (blocks, for BSR) dense")

    def __post_init__(self) -> None:
        if self.layout not in SPARSE_LAYOUTS:
            raise SparsityError(f"sparsify: unknown layout {self.layout!r}", fix="one of " + ", ".join(SPARSE_LAYOUTS))

    @pattern(aten.linear.default)
    def linear(self, input: SSAValue, weight: SSAValue, bias: Any = None) -> SSAValue | None:
        value = value_of(weight)
        if not isinstance(value, np.ndarray) or value.ndim != 2 or value.dtype.kind != "f":
            return None
        rows = math.prod(input.type.shape[:-1]) if input.type.is_static else None
        chosen = self._layout_for(value, rows)
        if chosen is None:
            return None
        kind, options = chosen
        sparse: SparseArray = from_dense(value, kind, **options)
        hint = (weight.name_hint or "weight").removeprefix("p_").removeprefix("c_")
        return aten.linear.default(input, constant(sparse, f"{hint}_{kind}"), bias)

    @pattern(aten.conv1d.default, aten.conv2d.default, aten.conv3d.default)
    def conv(self, input: SSAValue, weight: SSAValue, bias: Any = None, stride: Any = 1, padding: Any = 0,
             dilation: Any = 1, groups: int = 1) -> SSAValue | None:
        sparse = self._conv_weight(weight, False, groups)
        conv = getattr(aten, f"conv{len(weight.type.shape) - 2}d").default
        return None if sparse is None else conv(input, sparse, bias, stride, padding, dilation, groups)

    @pattern(aten.convolution.default)
    def convolution(self, input: SSAValue, weight: SSAValue, bias: Any, stride: Any, padding: Any, dilation: Any,
                    transposed: bool, output_padding: Any, groups: int) -> SSAValue | None:
        sparse = self._conv_weight(weight, transposed, groups)
        return None if sparse is None else aten.convolution.default(input, sparse, bias, stride, padding, dilation,
                                                                    transposed, output_padding, groups)

    def _conv_weight(self, weight: SSAValue, transposed: bool, groups: int) -> SSAValue | None:
        """A pruned convolution's weight as a hybrid BSR [out, in, *taps] (blocks of channels, taps dense), or None
        to keep it dense."""
        value = value_of(weight)
        if transposed or groups != 1 or not isinstance(value, np.ndarray) or value.dtype.kind != "f" or \
                self.layout not in ("auto", "bsr"):
            return None
        chosen = self._layout_for(value, None)
        if chosen is None:
            return None
        kind, options = chosen
        hint = (weight.name_hint or "weight").removeprefix("p_").removeprefix("c_")
        return constant(from_dense(value, kind, dense_dim=value.ndim - 2, **options), f"{hint}_{kind}")

    def _layout_for(self, weight: np.ndarray, rows: int | None) -> tuple[str, dict[str, Any]] | None:
        block = (int(self.block[0]), int(self.block[1]))
        if self.layout == "auto":
            return choose_layout(weight, block, self.min_sparsity, rows)
        zeros = 1 - np.count_nonzero(weight) / weight.size
        if self.layout == "semi_structured":
            try:
                from_dense(weight, "semi_structured")
            except KilnError:
                return None  # not 2:4: stays dense
            return "semi_structured", {}
        if zeros < self.min_sparsity:
            return None
        if self.layout == "bsr":
            zero_blocks = zero_block_fraction(weight, block)
            if zero_blocks is None or zero_blocks < self.min_sparsity:
                return None
            return "sparse_bsr", {"blocksize": block}
        return "sparse_csr", {}
