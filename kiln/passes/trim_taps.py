"""Drop the convolution taps that only ever read padding.

A 3×3 convolution with padding 1 over a 1×1 image reads its one pixel through the centre tap; the other eight
taps of every output multiply zeros. Deep CNNs meet this on small images (a 512-channel 3×3 stage at 1×1 is 2.4M
weights, of which 0.26M do anything), and a direct convolution, such as onnxruntime's, skips such taps where an
implicit GEMM would stream all of them. So, where the image's spatial sizes are known, each spatial dim keeps the
taps some output reads inside the image (from the first such tap to the last), with the padding shortened to
match; the output is the same, element for element.

The weights must be in the program (stored or folded), and finite in the dropped taps: ATen multiplies the
padding's zeros by them, so an inf or NaN there makes NaN outputs that the trimmed convolution would not.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from xdsl.ir import SSAValue

from kiln.ir.ops.nn import conv_output_size, per_dim
from kiln.ir.registry import ops
from kiln.passes.base import register_pass
from kiln.passes.rewrite import RewritePass, constant, current_op, pattern, value_of

aten = ops.aten


@register_pass
class TrimConvolutionTaps(RewritePass):
    """Slice away the taps of a convolution's weight that read only padding, shortening the padding to match."""

    name = "trim-convolution-taps"

    @pattern(aten.convolution.default)
    def convolution(self, input: SSAValue, weight: SSAValue, bias: Any, stride: Any, padding: Any, dilation: Any,
                    transposed: bool, output_padding: Any, groups: int) -> SSAValue | None:
        if transposed:
            return None
        trimmed = _trimmed(input, weight, stride, padding, dilation)
        if trimmed is None:
            return None
        new_weight, new_padding = trimmed
        return aten.convolution.default(input, new_weight, bias, stride, new_padding, dilation, transposed,
                                        output_padding, groups)

    @pattern(aten.conv1d.default, aten.conv2d.default, aten.conv3d.default)
    def conv(self, input: SSAValue, weight: SSAValue, bias: Any = None, stride: Any = 1, padding: Any = 0,
             dilation: Any = 1, groups: int = 1) -> SSAValue | None:
        trimmed = _trimmed(input, weight, stride, padding, dilation)
        if trimmed is None:
            return None
        new_weight, new_padding = trimmed
        spatial = input.type.ndim - 2
        layer = {1: aten.conv1d.default, 2: aten.conv2d.default, 3: aten.conv3d.default}[spatial]
        return layer(input, new_weight, bias, stride, new_padding, dilation, groups)


def used_taps(size: int, kernel: int, stride: int, padding: int, dilation: int) -> tuple[int, int] | None:
    """The first and last tap of one spatial dim that some output reads inside an image of `size` (not padding);
    None when the dim has no output."""
    outputs = conv_output_size(size, kernel, stride, padding, dilation)
    used = []
    for tap in range(kernel):
        first = tap * dilation - padding  # the position output 0 reads; output o reads first + o * stride
        o = max(0, -(first // stride))  # the first output whose position is not before the image
        if outputs > 0 and o < outputs and 0 <= first + o * stride < size:
            used.append(tap)
    return (used[0], used[-1]) if used else None


def _trimmed(input: SSAValue, weight: SSAValue, stride: Any, padding: Any, dilation: Any) -> Any:
    """(the trimmed weight, its padding), or None when every tap of every dim reads the image somewhere."""
    spatial = input.type.ndim - 2
    sizes = input.type.shape[2:]
    values = value_of(weight)
    if spatial < 1 or not isinstance(values, np.ndarray) or not all(isinstance(s, int) for s in sizes):
        return None
    strides, paddings, dilations = (per_dim(current_op().name, name, option, spatial)
                                    for name, option in (("stride", stride), ("padding", padding),
                                                         ("dilation", dilation)))
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (*strides, *paddings, *dilations)):
        return None  # a symbolic option
    kept, new_padding = [], []
    for size, kernel, step, pad, spread in zip(sizes, values.shape[2:], strides, paddings, dilations):
        taps = used_taps(size, kernel, step, pad, spread)
        if taps is None:
            return None
        first, last = taps
        shortened = pad - first * spread
        # the same outputs from the kept taps, with padding kept symmetric as ATen's convolution takes it
        if shortened < 0 or conv_output_size(size, last - first + 1, step, shortened, spread) != \
                conv_output_size(size, kernel, step, pad, spread):
            first, last, shortened = 0, kernel - 1, pad
        kept.append(slice(first, last + 1))
        new_padding.append(shortened)
    if all(k.stop - k.start == kernel for k, kernel in zip(kept, values.shape[2:])):
        return None
    dropped = np.ones(values.shape, bool)
    dropped[(slice(None), slice(None), *kept)] = False
    if not np.isfinite(values[dropped]).all():
        return None
    hint = (weight.name_hint or "weight").removeprefix("p_").removeprefix("c_")
    return constant(np.ascontiguousarray(values[(slice(None), slice(None), *kept)]), f"{hint}_trimmed"), new_padding

