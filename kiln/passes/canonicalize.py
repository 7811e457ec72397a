"""Canonicalization: algebraic identities, no-op ops, chains of transposes/permutes and reshapes, and zero padding
a convolution can do itself.

Every rule is a `@pattern` of one RewritePass, so this file doubles as a catalogue of examples. A rule that
replaces an op by one of its operands only fires when the types agree exactly (so `int_tensor * 1.0`, which
promotes, stays), and never makes an output alias a forward argument.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from xdsl.dialects import func
from xdsl.ir import BlockArgument, SSAValue

from kiln.ir.errors import KilnError
from kiln.ir.registry import ops
from kiln.ir.symbolic import is_static
from kiln.passes.base import register_pass, same_type
from kiln.passes.rewrite import RewritePass, current_op, pattern, producer, value_of

aten = ops.aten

# Ops that only rearrange or re-type data and are the identity when their result type equals their input's.
_IDENTITY_WHEN_SAME_TYPE = (
    aten._to_copy.default, aten.to.dtype, aten.clone.default, aten.alias.default, aten.contiguous.default,
    aten.lift_fresh_copy.default, aten.expand.default, aten.expand_as.default, aten.slice.Tensor,
    aten.repeat.default, aten.view.default, aten.view_as.default, aten.reshape.default, aten._unsafe_view.default,
    aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.flatten.using_ints, aten.unflatten.int,
)
# Ops that only reshape (row-major order kept): two in a row collapse into one view/reshape.
_RESHAPES = (
    aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.squeeze.default, aten.squeeze.dim,
    aten.squeeze.dims, aten.unsqueeze.default, aten.flatten.using_ints, aten.unflatten.int,
)
_COPYING_RESHAPES = {"aten.reshape.default", "aten.flatten.using_ints"}  # may copy: their chains stay reshapes
_PERMUTES = (aten.permute.default, aten.transpose.int, aten.t.default)


@register_pass
class Canonicalize(RewritePass):
    """Fold algebraic identities (x*1, x+0, --x), no-op copies/views, transpose/permute/reshape chains, and zero
    pads into the convolutions they feed."""

    name = "canonicalize"

    # -- algebraic identities
    @pattern(aten.mul.Scalar, aten.div.Scalar, aten.pow.Tensor_Scalar)
    def times_one(self, x: SSAValue, other: Any) -> SSAValue | None:
        return _unchanged(x) if _is(other, 1) else None

    @pattern(aten.add.Scalar, aten.sub.Scalar)
    def plus_zero(self, x: SSAValue, other: Any, alpha: Any = 1) -> SSAValue | None:
        return _unchanged(x) if _is(other, 0) else None

    @pattern(aten.mul.Tensor)
    def times_ones(self, x: SSAValue, y: SSAValue) -> SSAValue | None:
        if _splat(y) == 1:
            return _unchanged(x)
        return _unchanged(y) if _splat(x) == 1 else None

    @pattern(aten.div.Tensor)
    def divided_by_ones(self, x: SSAValue, y: SSAValue) -> SSAValue | None:
        return _unchanged(x) if _splat(y) == 1 else None

    @pattern(aten.add.Tensor)
    def plus_zeros(self, x: SSAValue, y: SSAValue, alpha: Any = 1) -> SSAValue | None:
        if _splat(y) == 0:
            return _unchanged(x)
        return _unchanged(y) if _splat(x) == 0 and _is(alpha, 1) else None

    @pattern(aten.sub.Tensor)
    def minus(self, x: SSAValue, y: SSAValue, alpha: Any = 1) -> SSAValue | None:
        if _splat(y) == 0:
            return _unchanged(x)
        # x - x is 0 only where no inf/nan can hide: integer tensors.
        if x is y and _is(alpha, 1) and x.type.dtype.is_integral:
            return aten.full_like.default(x, 0)
        return None

    @pattern(aten.neg.default, aten.bitwise_not.default, aten.logical_not.default)
    def double_negation(self, x: SSAValue) -> SSAValue | None:
        inner = producer(x, aten.neg.default, aten.bitwise_not.default, aten.logical_not.default)
        if inner is None or inner.name != current_op().name:
            return None
        # not(not(x)) is x only for booleans; for numbers it is x != 0.
        if inner.name == "aten.logical_not.default" and not inner.args[0].type.dtype.is_bool:
            return None
        return _unchanged(inner.args[0])

    # -- ops that do nothing
    @pattern(*_IDENTITY_WHEN_SAME_TYPE)
    def no_op(self, x: SSAValue, *args: Any, **kwargs: Any) -> SSAValue | None:
        return _unchanged(x)

    @pattern(aten.cat.default)
    def cat_without_empties(self, tensors: list, dim: int = 0) -> SSAValue | None:
        """cat leaves out inputs that add nothing: legacy 1-D empty tensors and inputs of size 0 along `dim`. Of
        one input left, the cat is that input (a Hugging Face cache's first update, cat([tensor([]), past], -2),
        copied the whole past every decoding step); of several, a cat of those."""
        result = current_op().results[0]
        rank = result.type.ndim
        kept = [t for t in tensors if not _adds_nothing(t.type, rank, dim)]
        if len(kept) == 1:
            return _unchanged(kept[0])
        # the inputs left must still promote to the result's dtype: one of them has it (an empty float input may be
        # what made a cat of booleans float)
        if 1 < len(kept) < len(tensors) and any(t.type.dtype is result.type.dtype for t in kept):
            return aten.cat.default(kept, dim)
        return None

    # -- padding a convolution can do itself
    @pattern(aten.convolution.default)
    def zero_pad_into_convolution(self, input: SSAValue, weight: SSAValue, bias: Any, stride: Any, padding: Any,
                                  dilation: Any, transposed: bool, output_padding: Any, groups: int) -> Any:
        """conv(constant_pad_nd(x, pads, 0), padding=p) is conv(x, padding=p + pad) when each spatial dim is padded
        by the same amount on both sides (TF-style 'same' padding at stride 1: Hugging Face's MobileNet and
        EfficientNet pad every depthwise input so): the padded copy is never made."""
        pad = producer(input, aten.constant_pad_nd.default)
        if transposed or pad is None or not pad.has_one_use:
            return None
        source, pads = pad.args[0], list(pad.args[1])
        value = pad.args[2] if len(pad.args) > 2 else pad.kwargs.get("value", 0)
        spatial = input.type.ndim - 2
        if not _is(value, 0) or math.copysign(1.0, value) < 0 or len(pads) > 2 * spatial:
            return None  # a fill other than +0, or a pad of the batch or channel dim
        pads += [0] * (2 * spatial - len(pads))
        widths = [(pads[2 * k], pads[2 * k + 1]) for k in reversed(range(spatial))]  # pads run from the last dim
        current = list(padding) if len(padding) == spatial else list(padding) * spatial
        if any(not (isinstance(lo, int) and isinstance(hi, int) and lo == hi >= 0) for lo, hi in widths) or \
                not all(isinstance(p, int) for p in current):
            return None
        merged = [p + lo for p, (lo, _) in zip(current, widths)]
        return aten.convolution.default(source, weight, bias, stride, merged, dilation, transposed, output_padding,
                                        groups)

    # -- chains
    @pattern(*_PERMUTES)
    def permute_chain(self, x: SSAValue, *args: Any) -> SSAValue | None:
        outer = _permutation(current_op().name, x.type.ndim, args)
        inner = producer(x, *_PERMUTES)
        source = x
        if inner is not None:
            source = inner.args[0]
            first = _permutation(inner.name, source.type.ndim, inner.args[1:])
            outer = [first[i] for i in outer]
        if outer == list(range(len(outer))):
            return _unchanged(source)
        if inner is None:
            return None  # a lone, real permutation
        return aten.permute.default(source, outer)

    @pattern(*_RESHAPES)
    def reshape_chain(self, x: SSAValue, *args: Any, **kwargs: Any) -> SSAValue | None:
        inner = producer(x, *_RESHAPES)
        if inner is None:
            return None
        source = inner.args[0]
        result = current_op().results[0]
        if same_type(source.type, result.type) and _unchanged(source) is not None:
            return source
        reshape = {inner.name, current_op().name} & _COPYING_RESHAPES
        try:
            return (aten.reshape.default if reshape else aten.view.default)(source, list(result.type.shape))
        except KilnError:  # a size the meta rule cannot prove equal (unbacked): leave the chain
            return None


def _is(value: Any, number: float) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value == number


def _adds_nothing(tensor_type: Any, rank: int, dim: int) -> bool:
    """Whether a cat input of `tensor_type` contributes no element to a rank-`rank` result: a legacy 1-D empty
    tensor (ATen's rule, kiln.ir.ops.shape._cat_skipped, which may guard on a symbolic size: a pass must not), or
    an input whose size along `dim` is 0, both known at compile time."""
    shape = list(tensor_type.shape)
    if rank != 1 and len(shape) == 1:
        size = shape[0]
    elif len(shape) == rank > 0:
        size = shape[dim % rank]
    else:
        return False
    return is_static(size) and int(size) == 0


def _unchanged(value: SSAValue) -> SSAValue | None:
    """`value` in place of the matched op's result, if that changes no type and no output aliases an input."""
    result = current_op().results[0]
    if not same_type(value.type, result.type):
        return None
    if isinstance(value, BlockArgument) and any(isinstance(use.operation, func.ReturnOp) for use in result.uses):
        return None
    return value


_SPLAT_FACTORIES = {
    "aten.scalar_tensor.default": lambda m: m.args[0], "aten.full.default": lambda m: m.args[1],
    "aten.full_like.default": lambda m: m.args[1], "aten.zeros.default": lambda m: 0,
    "aten.zeros_like.default": lambda m: 0, "aten.ones.default": lambda m: 1, "aten.ones_like.default": lambda m: 1,
}


def _splat(value: SSAValue) -> float | None:
    """The one number every element of `value` holds, when a factory op or a constant says so."""
    made = producer(value)
    if made is not None:
        fill = _SPLAT_FACTORIES.get(made.name)
        fill_value = fill(made) if fill is not None else None
        return fill_value if isinstance(fill_value, (int, float)) and not isinstance(fill_value, bool) else None
    array = value_of(value, parameters=False)
    if array is None or array.size == 0 or array.size > 4096 or array.dtype == np.bool_:
        return None
    first = array.flat[0]
    return float(first) if np.all(array == first) else None


def _permutation(name: str, rank: int, args: tuple[Any, ...] | list[Any]) -> list[int]:
    """The dims order a permute/transpose/t call applies: result dim i is input dim order[i]."""
    order = list(range(rank))
    if name == "aten.permute.default":
        return [d % rank if rank else d for d in args[0]]
    if name == "aten.transpose.int":
        a, b = (d % rank if rank else d for d in args[:2])
        order[a], order[b] = order[b], order[a]
    elif rank == 2:  # aten.t on fewer than 2 dims is the identity
        order = [1, 0]
    return order
