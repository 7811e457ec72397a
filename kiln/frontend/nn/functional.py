"""kiln.nn.functional (`import kiln.nn.functional as F`): torch.nn.functional's API over kiln's ATen ops.

Each function validates its arguments like torch, then dispatches the ATen op torch.export keeps for it
(`aten.conv2d.default`, `aten.layer_norm.default`, `aten.scaled_dot_product_attention.default`, ...), so it
runs eagerly on numpy and records the same op a torch program would show when traced.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Sequence

from kiln.frontend.tensor import Tensor, dispatch
from kiln.ir import dtypes
from kiln.ir.errors import KilnError, OpArgumentError, ShapeError, UnsupportedError
from kiln.ir.registry import ops

aten = ops.aten

__all__ = [
    "linear", "bilinear", "conv1d", "conv2d", "conv_transpose1d", "conv_transpose2d", "max_pool1d", "max_pool2d",
    "max_pool1d_with_indices", "max_pool2d_with_indices", "avg_pool1d", "avg_pool2d", "adaptive_avg_pool1d",
    "adaptive_avg_pool2d", "batch_norm", "layer_norm", "group_norm", "rms_norm", "embedding", "dropout", "relu",
    "relu_", "relu6", "leaky_relu", "elu", "gelu", "silu", "mish", "sigmoid", "tanh", "hardswish", "hardsigmoid",
    "hardtanh", "softplus", "logsigmoid", "softmax", "log_softmax", "normalize", "cosine_similarity", "pad",
    "interpolate", "upsample", "scaled_dot_product_attention", "one_hot", "mse_loss", "l1_loss", "smooth_l1_loss",
    "huber_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div", "nll_loss", "cross_entropy",
]


class FunctionalArgumentError(KilnError, ValueError):
    """An argument torch.nn.functional rejects with ValueError (a probability outside [0, 1], ...)."""


# ---------------------------------------------------------------------------------------------
# Argument helpers


def _ntuple(value: Any, n: int, name: str = "argument") -> list[Any]:
    """`value` as a list of n entries: one int repeats (torch's _pair/_single), a sequence is kept."""
    if isinstance(value, (list, tuple)):
        if len(value) == 1 and n > 1:
            return list(value) * n
        if len(value) != n:
            raise OpArgumentError(f"expected {name} to have {n} entries, got {list(value)}")
        return list(value)
    return [value] * n


def _stride_or_kernel(stride: Any, kernel_size: list[Any], n: int) -> list[Any]:
    """torch's pools take stride=None (or []) as "same as kernel_size"."""
    if stride is None or (isinstance(stride, (list, tuple)) and len(stride) == 0):
        return list(kernel_size)
    return _ntuple(stride, n, "stride")


def _inplace(input: Tensor, result: Tensor, inplace: bool) -> Tensor:
    """torch's `inplace=True`: `input` itself holds the result (kiln rebinds it functionally)."""
    return input._assign(result) if inplace else result


_REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}


def _reduction_enum(reduction: str, size_average: Any = None, reduce: Any = None) -> int:
    if size_average is not None or reduce is not None:
        # torch's legacy arguments: reduce=False means 'none'; otherwise size_average picks mean or sum.
        size_average = True if size_average is None else size_average
        reduce = True if reduce is None else reduce
        reduction = "none" if not reduce else "mean" if size_average else "sum"
    if reduction not in _REDUCTIONS:
        raise FunctionalArgumentError(f"{reduction} is not a valid value for reduction",
                                      fix="use 'none', 'mean' or 'sum'")
    return _REDUCTIONS[reduction]


def _registered(packet: str, overload: str = "default") -> Any:
    """The `aten.<packet>.<overload>` handle, or None while the op registry lacks it (then callers compose
    the op from core ops, with the same semantics)."""
    try:
        return getattr(getattr(aten, packet), overload)
    except (AttributeError, KilnError):
        return None


def _static_product(sizes: Sequence[Any]) -> int | None:
    product = 1
    for size in sizes:
        if not isinstance(size, int):
            return None
        product *= size
    return product


# ---------------------------------------------------------------------------------------------
# Linear and convolution


def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """y = x Wᵀ + b."""
    return dispatch(aten.linear.default, input, weight, bias)


def bilinear(input1: Tensor, input2: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """y = x1ᵀ A x2 + b."""
    return dispatch(aten.bilinear.default, input1, input2, weight, bias)


def _check_padding_string(padding: str, stride: list[Any]) -> None:
    if padding not in ("same", "valid"):
        raise FunctionalArgumentError(f"Invalid padding string '{padding}', should be one of ['valid', 'same']")
    if padding == "same" and any(s != 1 for s in stride):
        raise FunctionalArgumentError("padding='same' is not supported for strided convolutions")


def _conv(n: int, input: Tensor, weight: Tensor, bias: Tensor | None, stride: Any, padding: Any, dilation: Any,
          groups: int) -> Tensor:
    name = f"conv{n}d"
    stride_list, dilation_list = _ntuple(stride, n, "stride"), _ntuple(dilation, n, "dilation")
    if isinstance(padding, str):
        _check_padding_string(padding, stride_list)
        op = _registered(name, "padding")
        if op is not None:
            return dispatch(op, input, weight, bias, stride_list, padding, dilation_list, groups)
        input, padding = _explicit_padding(input, weight, padding, dilation_list)
    return dispatch(getattr(aten, name).default, input, weight, bias, stride_list, _ntuple(padding, n, "padding"),
                    dilation_list, groups)


def _explicit_padding(input: Tensor, weight: Tensor, padding: str, dilation: list[Any]) -> tuple[Tensor, list[int]]:
    """'valid'/'same' as numeric padding, as ATen's _convolution_mode does: 'same' pads d * (k - 1) in
    total per dim, the odd extra element on the right (applied with an explicit pad first)."""
    n = len(dilation)
    if padding == "valid":
        return input, [0] * n
    kernel = list(weight.shape)[2:]
    totals = [d * (k - 1) for d, k in zip(dilation, kernel)]
    symmetric = [total // 2 for total in totals]
    if all(total % 2 == 0 for total in totals):
        return input, symmetric
    extra: list[int] = []
    for total in reversed(totals):  # F.pad lists (left, right) from the last dim backwards
        extra.extend([0, total % 2])
    return pad(input, extra), symmetric


def conv1d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0,
           dilation: Any = 1, groups: int = 1) -> Tensor:
    """1-D convolution over (N, C, L) or (C, L); padding may be an int, a tuple, 'same' or 'valid'."""
    return _conv(1, input, weight, bias, stride, padding, dilation, groups)


def conv2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0,
           dilation: Any = 1, groups: int = 1) -> Tensor:
    """2-D convolution over (N, C, H, W) or (C, H, W); padding may be an int, a tuple, 'same' or 'valid'."""
    return _conv(2, input, weight, bias, stride, padding, dilation, groups)


def conv_transpose1d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0,
                     output_padding: Any = 0, groups: int = 1, dilation: Any = 1) -> Tensor:
    """1-D transposed convolution; weight is (in_channels, out_channels / groups, kW)."""
    return dispatch(aten.conv_transpose1d.default, input, weight, bias, _ntuple(stride, 1), _ntuple(padding, 1),
                    _ntuple(output_padding, 1), groups, _ntuple(dilation, 1))


def conv_transpose2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0,
                     output_padding: Any = 0, groups: int = 1, dilation: Any = 1) -> Tensor:
    """2-D transposed convolution; weight is (in_channels, out_channels / groups, kH, kW)."""
    return dispatch(aten.conv_transpose2d.input, input, weight, bias, _ntuple(stride, 2), _ntuple(padding, 2),
                    _ntuple(output_padding, 2), groups, _ntuple(dilation, 2))


# ---------------------------------------------------------------------------------------------
# Pooling


def _max_pool(n: int, input: Tensor, kernel_size: Any, stride: Any, padding: Any, dilation: Any, ceil_mode: bool,
              return_indices: bool) -> Any:
    kernel = _ntuple(kernel_size, n, "kernel_size")
    strides = _stride_or_kernel(stride, kernel, n)
    paddings, dilations = _ntuple(padding, n, "padding"), _ntuple(dilation, n, "dilation")
    if not return_indices:
        return dispatch(getattr(aten, f"max_pool{n}d").default, input, kernel, strides, paddings, dilations, ceil_mode)
    op = _registered(f"max_pool{n}d_with_indices")
    if op is not None:
        return tuple(dispatch(op, input, kernel, strides, paddings, dilations, ceil_mode))
    # 1-D as 2-D over a plane of height 1: the flat index h * W + w is then the position along L.
    values, indices = dispatch(aten.max_pool2d_with_indices.default, input.unsqueeze(-2), [1, *kernel],
                               [1, *strides], [0, *paddings], [1, *dilations], ceil_mode)
    return values.squeeze(-2), indices.squeeze(-2)


def max_pool1d(input: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
               ceil_mode: bool = False, return_indices: bool = False) -> Any:
    """Max over sliding windows of (N, C, L); with return_indices also the flat argmax positions."""
    return _max_pool(1, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def max_pool2d(input: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
               ceil_mode: bool = False, return_indices: bool = False) -> Any:
    """Max over sliding windows of (N, C, H, W); with return_indices also the flat argmax positions (h * W + w)."""
    return _max_pool(2, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def max_pool1d_with_indices(input: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0,
                            dilation: Any = 1, ceil_mode: bool = False, return_indices: bool = True) -> Any:
    return _max_pool(1, input, kernel_size, stride, padding, dilation, ceil_mode, True)


def max_pool2d_with_indices(input: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0,
                            dilation: Any = 1, ceil_mode: bool = False, return_indices: bool = True) -> Any:
    return _max_pool(2, input, kernel_size, stride, padding, dilation, ceil_mode, True)


def avg_pool1d(input: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
               count_include_pad: bool = True) -> Tensor:
    kernel = _ntuple(kernel_size, 1, "kernel_size")
    return dispatch(aten.avg_pool1d.default, input, kernel, _stride_or_kernel(stride, kernel, 1),
                    _ntuple(padding, 1, "padding"), ceil_mode, count_include_pad)


def avg_pool2d(input: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
               count_include_pad: bool = True, divisor_override: int | None = None) -> Tensor:
    kernel = _ntuple(kernel_size, 2, "kernel_size")
    return dispatch(aten.avg_pool2d.default, input, kernel, _stride_or_kernel(stride, kernel, 2),
                    _ntuple(padding, 2, "padding"), ceil_mode, count_include_pad, divisor_override)


def _adaptive_output_size(input: Tensor, output_size: Any, n: int) -> list[Any]:
    """Entries given as None keep the input's size (torch's _list_with_default)."""
    sizes = _ntuple(output_size, n, "output_size")
    spatial = list(input.shape)[-n:]
    return [spatial[i] if size is None else size for i, size in enumerate(sizes)]


def adaptive_avg_pool1d(input: Tensor, output_size: Any) -> Tensor:
    return dispatch(aten.adaptive_avg_pool1d.default, input, _ntuple(output_size, 1, "output_size"))


def adaptive_avg_pool2d(input: Tensor, output_size: Any) -> Tensor:
    return dispatch(aten.adaptive_avg_pool2d.default, input, _adaptive_output_size(input, output_size, 2))


# ---------------------------------------------------------------------------------------------
# Normalization


def _verify_batch_size(sizes: Sequence[Any]) -> None:
    """Training-mode batch statistics need more than one value per channel (static shapes only)."""
    values_per_channel = _static_product([sizes[0], *sizes[2:]])
    if values_per_channel == 1:
        raise FunctionalArgumentError(
            f"Expected more than 1 value per channel when training, got input size {list(sizes)}")


def batch_norm(input: Tensor, running_mean: Tensor | None, running_var: Tensor | None, weight: Tensor | None = None,
               bias: Tensor | None = None, training: bool = False, momentum: Any = 0.1, eps: float = 1e-5) -> Tensor:
    """Batch normalization over dim 1; in training mode with running stats, updates them in place like torch.

    Normalization uses the biased batch variance; running_var moves towards the unbiased one:
    running = (1 - momentum) * running + momentum * batch_stat. `momentum` may be a 0-d tensor (BatchNorm's
    cumulative average with momentum=None computes it from num_batches_tracked).
    """
    if training:
        _verify_batch_size(list(input.shape))
    if training and eps <= 0.0:
        raise FunctionalArgumentError(f"batch_norm eps must be positive during training, but got {eps}")
    if eps < 0.0:
        raise FunctionalArgumentError(f"batch_norm eps must be non-negative, but got {eps}")
    # The op's momentum argument is a float; a tensor momentum only ever feeds the update below.
    op_momentum = 0.0 if isinstance(momentum, Tensor) else momentum
    if not training or running_mean is None or running_var is None:
        return dispatch(aten.batch_norm.default, input, weight, bias, running_mean, running_var, training,
                        op_momentum, eps, True)
    # kiln's ops are functional: normalize with the batch statistics, then move the running statistics
    # with in-place tensor methods, which export records as BUFFER_MUTATION outputs. The statistics come from
    # the detached input: torch updates the buffers outside autograd, so they never join the graph.
    output = dispatch(aten.batch_norm.default, input, weight, bias, None, None, True, op_momentum, eps, True)
    reduce_dims = [0, *range(2, input.dim())]
    batch_var, batch_mean = dispatch(aten.var_mean.correction, input.detach(), reduce_dims, correction=1,
                                     keepdim=False)
    keep = 1 - momentum
    running_mean.mul_(keep).add_(batch_mean.to(running_mean.dtype) * momentum)
    running_var.mul_(keep).add_(batch_var.to(running_var.dtype) * momentum)
    return output


def layer_norm(input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    return dispatch(aten.layer_norm.default, input, list(normalized_shape), weight, bias, eps, True)


def group_norm(input: Tensor, num_groups: int, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
    if input.dim() < 2:
        raise ShapeError(f"Expected at least 2 dimensions for input tensor but received {input.dim()}")
    return dispatch(aten.group_norm.default, input, num_groups, weight, bias, eps, True)


def rms_norm(input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None = None,
             eps: float | None = None) -> Tensor:
    """x / sqrt(mean(x², normalized dims) + eps) * weight; eps=None uses the dtype's machine epsilon."""
    return dispatch(aten.rms_norm.default, input, list(normalized_shape), weight, eps)


# ---------------------------------------------------------------------------------------------
# Embedding and dropout


def normalize_padding_idx(padding_idx: int | None, num_embeddings: int) -> int | None:
    """torch's check and wrapping of a negative `padding_idx` (shared by F.embedding and nn.Embedding)."""
    if padding_idx is None:
        return None
    if padding_idx >= num_embeddings or padding_idx < -num_embeddings:
        raise FunctionalArgumentError("Padding_idx must be within num_embeddings")
    return padding_idx + num_embeddings if padding_idx < 0 else padding_idx


def embedding(input: Tensor, weight: Tensor, padding_idx: int | None = None, max_norm: float | None = None,
              norm_type: float = 2.0, scale_grad_by_freq: bool = False, sparse: bool = False) -> Tensor:
    """Rows of `weight` picked by the integer `input`."""
    padding_idx = normalize_padding_idx(padding_idx, weight.size(0))
    if padding_idx is None:
        padding_idx = -1
    if max_norm is not None:
        raise UnsupportedError("embedding with max_norm is not supported: it renormalizes the weight in place "
                               "on every call", fix="renormalize the weight once before the call, or pass "
                                                    "max_norm=None")
    return dispatch(aten.embedding.default, weight, input, padding_idx, scale_grad_by_freq, sparse)


def dropout(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Zero each element with probability p and scale the rest by 1 / (1 - p); the identity when not training."""
    if p < 0.0 or p > 1.0:
        raise FunctionalArgumentError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training:
        return input
    output, _mask = dispatch(aten.native_dropout.default, input, p, True)
    return _inplace(input, output, inplace)


# ---------------------------------------------------------------------------------------------
# Activations


def relu(input: Tensor, inplace: bool = False) -> Tensor:
    return _inplace(input, dispatch(aten.relu.default, input), inplace)


def relu_(input: Tensor) -> Tensor:
    return relu(input, inplace=True)


def hardtanh(input: Tensor, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> Tensor:
    if min_val > max_val:
        raise FunctionalArgumentError("min_val cannot be greater than max_val")
    return _inplace(input, dispatch(aten.hardtanh.default, input, min_val, max_val), inplace)


def relu6(input: Tensor, inplace: bool = False) -> Tensor:
    """min(max(0, x), 6), recorded as hardtanh(0, 6) like torch."""
    return hardtanh(input, 0.0, 6.0, inplace)


def leaky_relu(input: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:
    return _inplace(input, dispatch(aten.leaky_relu.default, input, negative_slope), inplace)


def elu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    return _inplace(input, dispatch(aten.elu.default, input, alpha, 1, 1), inplace)


def gelu(input: Tensor, approximate: str = "none") -> Tensor:
    if approximate not in ("none", "tanh"):
        raise FunctionalArgumentError(f"approximate argument must be either none or tanh, got {approximate!r}")
    return dispatch(aten.gelu.default, input, approximate=approximate)


def silu(input: Tensor, inplace: bool = False) -> Tensor:
    return _inplace(input, dispatch(aten.silu.default, input), inplace)


def mish(input: Tensor, inplace: bool = False) -> Tensor:
    return _inplace(input, dispatch(aten.mish.default, input), inplace)


def sigmoid(input: Tensor) -> Tensor:
    return dispatch(aten.sigmoid.default, input)


def tanh(input: Tensor) -> Tensor:
    return dispatch(aten.tanh.default, input)


def hardswish(input: Tensor, inplace: bool = False) -> Tensor:
    return _inplace(input, dispatch(aten.hardswish.default, input), inplace)


def hardsigmoid(input: Tensor, inplace: bool = False) -> Tensor:
    return _inplace(input, dispatch(aten.hardsigmoid.default, input), inplace)


def softplus(input: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    return dispatch(aten.softplus.default, input, beta, threshold)


def _softmax_dim(name: str, input: Tensor, dim: int | None, stacklevel: int) -> int:
    """torch's deprecated implicit dim when none is given: 0 for 0-D, 1-D and 3-D inputs, else 1."""
    if dim is not None:
        return dim
    warnings.warn(f"Implicit dimension choice for {name} has been deprecated. "
                  "Change the call to include dim=X as an argument.", stacklevel=stacklevel)
    return 0 if input.dim() in (0, 1, 3) else 1


def softmax(input: Tensor, dim: int | None = None, _stacklevel: int = 3, dtype: Any = None) -> Tensor:
    """exp(x) / sum(exp(x)) along `dim`; with `dtype`, the input is cast first (as torch does)."""
    return dispatch(aten.softmax.int, input, _softmax_dim("softmax", input, dim, _stacklevel),
                    None if dtype is None else dtypes.dtype(dtype))


def log_softmax(input: Tensor, dim: int | None = None, _stacklevel: int = 3, dtype: Any = None) -> Tensor:
    return dispatch(aten.log_softmax.int, input, _softmax_dim("log_softmax", input, dim, _stacklevel),
                    None if dtype is None else dtypes.dtype(dtype))


# ---------------------------------------------------------------------------------------------
# Distances, padding, resampling


def normalize(input: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12, out: Any = None) -> Tensor:
    """x / max(||x||_p, eps) along `dim` (the same four ops torch records)."""
    if out is not None:
        raise UnsupportedError("normalize(out=...) is not supported", fix="use the returned tensor")
    norm = dispatch(aten.linalg_vector_norm.default, input, p, [dim], True)
    denominator = dispatch(aten.expand_as.default, dispatch(aten.clamp_min.default, norm, eps), input)
    return dispatch(aten.div.Tensor, input, denominator)


def cosine_similarity(x1: Tensor, x2: Tensor, dim: int = 1, eps: float = 1e-8) -> Tensor:
    return dispatch(aten.cosine_similarity.default, x1, x2, dim, eps)


_PAD_MODES = ("constant", "reflect", "replicate", "circular")


def pad(input: Tensor, pad: Sequence[int], mode: str = "constant", value: float | None = None) -> Tensor:
    """Pad the last len(pad) / 2 dims; `pad` lists (left, right) pairs starting from the last dim."""
    if mode not in _PAD_MODES:
        raise FunctionalArgumentError(f"Unrecognised padding mode {mode}", fix=f"use one of {list(_PAD_MODES)}")
    if len(pad) % 2 != 0:
        raise FunctionalArgumentError("Padding length must be divisible by 2")
    if len(pad) // 2 > input.dim():
        raise FunctionalArgumentError("Padding length should be less than or equal to two times the input dimension "
                                      f"but got padding length {len(pad)} and input of dimension {input.dim()}")
    if mode != "constant" and value is not None and value != 0:
        raise FunctionalArgumentError(f"Padding mode \"{mode}\" doesn't take in value argument")
    return dispatch(aten.pad.default, input, list(pad), mode, value)


def interpolate(input: Tensor, size: Any = None, scale_factor: Any = None, mode: str = "nearest",
                align_corners: bool | None = None, recompute_scale_factor: bool | None = None,
                antialias: bool = False) -> Tensor:
    """Resize the spatial dims: 'nearest' (1-D/2-D), 'linear' (1-D), 'bilinear' (2-D) or 'area'."""
    if mode in ("nearest", "area", "nearest-exact"):
        if align_corners is not None:
            raise FunctionalArgumentError("align_corners option can only be set with the interpolating modes: "
                                          "linear | bilinear | bicubic | trilinear")
    elif align_corners is None:
        align_corners = False
    spatial = input.dim() - 2
    if size is not None and scale_factor is not None:
        raise FunctionalArgumentError("only one of size or scale_factor should be defined")
    scale_factors: list[float] | None
    output_size: list[Any] | None
    if size is not None:
        scale_factors = None
        if isinstance(size, (list, tuple)):
            if len(size) != spatial:
                raise FunctionalArgumentError(
                    f"Input and output must have the same number of spatial dimensions, but got input with spatial "
                    f"dimensions of {list(input.shape[2:])} and output size of {size}.")
            output_size = list(size)
        else:
            output_size = [size] * spatial
    elif scale_factor is not None:
        output_size = None
        if isinstance(scale_factor, (list, tuple)):
            if len(scale_factor) != spatial:
                raise FunctionalArgumentError(
                    f"Input and scale_factor must have the same number of spatial dimensions, but got input with "
                    f"spatial dimensions of {list(input.shape[2:])} and scale_factor of shape {scale_factor}.")
            scale_factors = [float(s) for s in scale_factor]
        else:
            scale_factors = [float(scale_factor)] * spatial
    else:
        raise FunctionalArgumentError("either size or scale_factor should be defined")
    if recompute_scale_factor and size is not None:
        raise FunctionalArgumentError("recompute_scale_factor is not meaningful with an explicit size.")
    if mode == "area" and output_size is None:
        recompute_scale_factor = True
    if recompute_scale_factor and scale_factors is not None:
        output_size = [_floor_size(input.shape[i + 2], scale_factors[i]) for i in range(spatial)]
        scale_factors = None
    if antialias:
        raise UnsupportedError("interpolate(antialias=True) is not supported", fix="pass antialias=False")
    rank = input.dim()
    if mode == "nearest" and rank == 3:
        return dispatch(aten.upsample_nearest1d.vec, input, output_size, scale_factors)
    if mode == "nearest" and rank == 4:
        return dispatch(aten.upsample_nearest2d.vec, input, output_size, scale_factors)
    if mode == "area" and rank == 3:
        return adaptive_avg_pool1d(input, output_size)
    if mode == "area" and rank == 4:
        return adaptive_avg_pool2d(input, output_size)
    if mode == "linear" and rank == 3:
        return dispatch(aten.upsample_linear1d.vec, input, output_size, align_corners, scale_factors)
    if mode == "bilinear" and rank == 4:
        return dispatch(aten.upsample_bilinear2d.vec, input, output_size, align_corners, scale_factors)
    raise UnsupportedError(f"interpolate mode {mode!r} on a {rank}-D input is not supported",
                           fix="use nearest/linear/area on 3-D (N, C, L) or nearest/bilinear/area on 4-D "
                               "(N, C, H, W) inputs")


def _floor_size(size: Any, scale: float) -> Any:
    """floor(size * scale) for an int or a SymInt size."""
    if isinstance(size, int):
        return int(math.floor(size * scale))
    return (size * scale).__floor__()


def upsample(input: Tensor, size: Any = None, scale_factor: Any = None, mode: str = "nearest",
             align_corners: bool | None = None) -> Tensor:
    """Deprecated in torch in favour of interpolate; kept for compatibility."""
    return interpolate(input, size, scale_factor, mode, align_corners)


# ---------------------------------------------------------------------------------------------
# Attention and encodings


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> Tensor:
    """softmax(Q Kᵀ * scale + mask) V, with scale = 1 / sqrt(E) by default."""
    if is_causal and attn_mask is not None:
        raise FunctionalArgumentError("_scaled_dot_product_attention: Explicit attn_mask should not be set when "
                                      "is_causal=True")
    return dispatch(aten.scaled_dot_product_attention.default, query, key, value, attn_mask, dropout_p, is_causal,
                    scale=scale, enable_gqa=enable_gqa)


def one_hot(tensor: Tensor, num_classes: int = -1) -> Tensor:
    """int64 one-hot vectors along a new last dim; num_classes=-1 means max(tensor) + 1 (eager only)."""
    op = _registered("one_hot")
    if op is not None:
        return dispatch(op, tensor, num_classes)
    from kiln.frontend.functions import arange
    if tensor.dtype is not dtypes.int64:
        raise OpArgumentError("one_hot is only applicable to index tensor of type LongTensor.")
    if not tensor.is_traced and tensor.numel() > 0:
        if tensor.min().item() < 0:
            raise FunctionalArgumentError("Class values must be non-negative.")
        if num_classes == -1:
            num_classes = int(tensor.max().item()) + 1
        elif tensor.max().item() >= num_classes:
            raise FunctionalArgumentError("Class values must be smaller than num_classes.")
    if num_classes == -1:
        raise OpArgumentError("one_hot needs num_classes when its input is empty or traced",
                              fix="pass num_classes explicitly")
    return tensor.unsqueeze(-1).eq(arange(num_classes)).to(dtypes.int64)


# ---------------------------------------------------------------------------------------------
# Losses: each is ATen's formula (aten/src/ATen/native/Loss.cpp, LossNLL.cpp) written with core ops, so its
# gradient comes from the ops' VJP rules and it traces like any other code.


class TargetIndexError(KilnError, IndexError):
    """A class-index target outside [0, C) that is not ignore_index (torch raises IndexError)."""


def _reduce(loss: Tensor, reduction: int) -> Tensor:
    return loss if reduction == 0 else loss.mean() if reduction == 1 else loss.sum()


def _warn_if_broadcast(input: Tensor, target: Tensor) -> None:
    if tuple(target.shape) != tuple(input.shape):
        warnings.warn(f"Using a target size ({target.shape}) that is different to the input size ({input.shape}). "
                      "This will likely lead to incorrect results due to broadcasting. Please ensure they have "
                      "the same size.", stacklevel=3)


def _weighted_reduce(loss: Tensor, weight: Tensor | None, input: Tensor, reduction: int,
                     mean_over_weights: bool) -> Tensor:
    """torch's optional elementwise `weight` (the input's shape) of mse/l1/huber: 'mean' divides by the sum of
    the weights for mse and l1, by the element count for huber."""
    if weight is None:
        return _reduce(loss, reduction)
    if tuple(weight.shape) != tuple(input.shape):
        raise FunctionalArgumentError("Weights and input must have the same size.")
    weighted = loss * weight
    if reduction == 1 and mean_over_weights:
        return weighted.sum() / weight.sum()
    return _reduce(weighted, reduction)


def _where(condition: Tensor, input: Any, other: Any) -> Tensor:
    from kiln.frontend.functions import where
    return where(condition, input, other)


def mse_loss(input: Tensor, target: Tensor, size_average: Any = None, reduce: Any = None, reduction: str = "mean",
             weight: Tensor | None = None) -> Tensor:
    """(input - target)², reduced; an elementwise `weight` makes 'mean' a weighted mean."""
    mode = _reduction_enum(reduction, size_average, reduce)
    _warn_if_broadcast(input, target)
    return _weighted_reduce((input - target).pow(2), weight, input, mode, mean_over_weights=True)


def l1_loss(input: Tensor, target: Tensor, size_average: Any = None, reduce: Any = None, reduction: str = "mean",
            weight: Tensor | None = None) -> Tensor:
    """|input - target|, reduced; an elementwise `weight` makes 'mean' a weighted mean."""
    mode = _reduction_enum(reduction, size_average, reduce)
    _warn_if_broadcast(input, target)
    return _weighted_reduce((input - target).abs(), weight, input, mode, mean_over_weights=True)


def smooth_l1_loss(input: Tensor, target: Tensor, size_average: Any = None, reduce: Any = None,
                   reduction: str = "mean", beta: float = 1.0) -> Tensor:
    """0.5 z² / beta where z = |input - target| < beta, else z - 0.5 beta; beta=0 is the L1 loss."""
    mode = _reduction_enum(reduction, size_average, reduce)
    _warn_if_broadcast(input, target)
    if beta < 0:
        raise FunctionalArgumentError("smooth_l1_loss does not support negative values for beta.")
    error = (input - target).abs()
    if beta == 0.0:
        return _reduce(error, mode)
    return _reduce(_where(error < beta, error.pow(2) * (0.5 / beta), error - 0.5 * beta), mode)


def huber_loss(input: Tensor, target: Tensor, reduction: str = "mean", delta: float = 1.0,
               weight: Tensor | None = None) -> Tensor:
    """0.5 z² where z = |input - target| < delta, else delta (z - 0.5 delta): smooth_l1_loss times delta."""
    mode = _reduction_enum(reduction)
    _warn_if_broadcast(input, target)
    if delta <= 0:
        raise FunctionalArgumentError("huber_loss does not support non-positive values for delta.")
    error = (input - target).abs()
    loss = _where(error < delta, error.pow(2) * 0.5, (error - 0.5 * delta) * delta)
    return _weighted_reduce(loss, weight, input, mode, mean_over_weights=False)


def _require_unit_interval(value: Tensor, name: str) -> None:
    """torch's data check of binary_cross_entropy's probabilities (eager only: a traced value is unknown)."""
    if value.is_traced or value.numel() == 0:
        return
    if not value.ge(0).logical_and(value.le(1)).all().item():
        raise FunctionalArgumentError(f"all elements of {name} should be between 0 and 1")


def binary_cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None, size_average: Any = None,
                         reduce: Any = None, reduction: str = "mean") -> Tensor:
    """-weight (target log(input) + (1 - target) log(1 - input)) for probabilities `input`; each log is clamped
    to >= -100 like torch, so confident mistakes cost 100 rather than infinity."""
    mode = _reduction_enum(reduction, size_average, reduce)
    if tuple(target.shape) != tuple(input.shape):
        raise FunctionalArgumentError(f"Using a target size ({target.shape}) that is different to the input size "
                                      f"({input.shape}) is deprecated. Please ensure they have the same size.")
    _require_unit_interval(input, "input")
    _require_unit_interval(target, "target")
    # An input of exactly 0 (or 1) takes the log of a stand-in and the floor directly, so the gradient through
    # the floor is 0 there rather than 0 / 0 = NaN (torch's hand-written gradient is finite there too).
    zero, one = input.eq(0), input.eq(1)
    log_input = input.masked_fill(zero, 1.0).log().masked_fill(zero, -100.0).clamp_min(-100)
    log_complement = input.masked_fill(one, 0.0).neg().log1p().masked_fill(one, -100.0).clamp_min(-100)
    loss = (target - 1) * log_complement - target * log_input
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, mode)


def logsigmoid(input: Tensor) -> Tensor:
    """log(sigmoid(x)), finite for any x (`aten.log_sigmoid`)."""
    return dispatch(aten.log_sigmoid.default, input)


def binary_cross_entropy_with_logits(input: Tensor, target: Tensor, weight: Tensor | None = None,
                                     size_average: Any = None, reduce: Any = None, reduction: str = "mean",
                                     pos_weight: Tensor | None = None) -> Tensor:
    """binary_cross_entropy(sigmoid(input), target) in the stable form (1 - t) x - log_sigmoid(x), with
    `pos_weight` scaling the positive term: (1 - t) x - (1 + (pos_weight - 1) t) log_sigmoid(x)."""
    mode = _reduction_enum(reduction, size_average, reduce)
    if tuple(target.shape) != tuple(input.shape):
        raise FunctionalArgumentError(f"Target size ({target.shape}) must be the same as input size ({input.shape})")
    log_sigmoid = logsigmoid(input)
    if pos_weight is not None:
        log_sigmoid = log_sigmoid * ((pos_weight - 1) * target + 1)
    loss = (1 - target) * input - log_sigmoid
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, mode)


def _xlogx(value: Tensor) -> Tensor:
    """xlogy(x, x): x log(x), 0 where x == 0 (NaN stays NaN)."""
    return _where(value.eq(0), 0.0, value * value.log())


def kl_div(input: Tensor, target: Tensor, size_average: Any = None, reduce: Any = None, reduction: str = "mean",
           log_target: bool = False) -> Tensor:
    """KL(target || exp(input)) pointwise for log-probabilities `input`: target (log(target) - input), or with
    log_target exp(target) (target - input). 'batchmean' sums and divides by the batch size (dim 0)."""
    batchmean = False
    if size_average is not None or reduce is not None:
        mode = _reduction_enum(reduction, size_average, reduce)
    else:
        if reduction == "mean":
            warnings.warn("reduction: 'mean' divides the total loss by both the batch size and the support size."
                          "'batchmean' divides only by the batch size, and aligns with the KL div math definition."
                          "'mean' will be changed to behave the same as 'batchmean' in the next major release.",
                          stacklevel=2)
        batchmean = reduction == "batchmean"
        mode = _REDUCTIONS["sum"] if batchmean else _reduction_enum(reduction)
    if log_target:
        loss = target.exp() * (target - input)
    else:
        loss = _xlogx(target) - target * input
    reduced = _reduce(loss, mode)
    if batchmean and input.dim() != 0:
        reduced = reduced / input.shape[0]
    return reduced


def _known_and_different(a: Any, b: Any) -> bool:
    """Two sizes that are both plain ints and differ (symbolic sizes are left to the ops' meta rules)."""
    return isinstance(a, int) and isinstance(b, int) and a != b


def _check_class_index_target(input: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int,
                              op: str) -> Tensor:
    """torch's checks of (N, C, d1, ...) / (C,) scores against class-index targets (N, d1, ...) / ();
    returns the target as int64."""
    if input.dim() < 1:
        raise ShapeError(f"Expected 1 or more dimensions (got {input.dim()})")
    if target.dtype not in (dtypes.int64, dtypes.uint8):
        raise OpArgumentError(f"expected target dtype to be Long or Byte, but got {target.dtype.name}",
                              fix="pass class indices as int64 (or class probabilities shaped like the input)")
    input_shape, target_shape = list(input.shape), list(target.shape)
    if input.dim() == 1:
        if target.dim() != 0:
            raise ShapeError(f"expected a 0-D target for an unbatched (C,) input, got shape {target_shape}")
    else:
        if target.dim() == 0 or _known_and_different(input_shape[0], target_shape[0]):
            raise ShapeError(f"Expected input batch_size ({input_shape[0]}) to match target batch_size "
                             f"({target_shape[0] if target_shape else 0}).")
        expected = [input_shape[0], *input_shape[2:]]
        if len(target_shape) != len(expected) or any(map(_known_and_different, expected, target_shape)):
            raise ShapeError(f"Expected target size {expected}, got {target_shape}")
    classes = input_shape[1 if input.dim() >= 2 else 0]
    if weight is not None and (weight.dim() != 1 or _known_and_different(weight.shape[0], classes)):
        raise ShapeError(f"{op}: weight tensor should be defined either for all {classes} classes or no classes but "
                         f"got weight tensor of shape: {list(weight.shape)}")
    target = target.long()
    if not target.is_traced and isinstance(classes, int) and target.numel() > 0:
        out_of_range = target.ne(ignore_index).logical_and(target.lt(0).logical_or(target.ge(classes)))
        if out_of_range.any().item():
            bad = target.masked_fill(out_of_range.logical_not(), 0).abs().argmax()  # an offending position
            raise TargetIndexError(f"Target {target.flatten()[bad].item()} is out of bounds.",
                                   fix=f"class indices must be in [0, {classes}) or equal ignore_index")
    return target


def _class_index_losses(log_probs: Tensor, target: Tensor, weight: Tensor | None,
                        ignore_index: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per-position -weight[t] * log_probs[t] (0 where t == ignore_index), the summed weight of the counted
    targets ('mean' divides by it), and the ignored mask."""
    class_dim = 1 if log_probs.dim() >= 2 else 0
    ignored = target.eq(ignore_index)
    safe_target = target.masked_fill(ignored, 0)  # gather needs in-range indices; ignored terms are zeroed
    picked = log_probs.gather(class_dim, safe_target.unsqueeze(class_dim)).squeeze(class_dim)
    picked = picked.masked_fill(ignored, 0.0)
    if weight is None:
        # the count of targets, as a float like ATen's total_weight (and so every backend can sum it)
        return picked.neg(), ignored.logical_not().to(picked.dtype).sum(), ignored
    target_weight = weight.index_select(0, safe_target.flatten()).view(list(target.shape)).masked_fill(ignored, 0.0)
    return picked.neg() * target_weight, target_weight.sum(), ignored


def nll_loss(input: Tensor, target: Tensor, weight: Tensor | None = None, size_average: Any = None,
             ignore_index: int = -100, reduce: Any = None, reduction: str = "mean") -> Tensor:
    """The negative log-likelihood of class indices `target` (N, d1, ...) under log-probabilities `input`
    (N, C, d1, ...), or of a 0-D target under (C,): -weight[t] input[t], skipping ignore_index; 'mean' divides
    by the summed weights of the counted targets (NaN when none counts, like torch)."""
    mode = _reduction_enum(reduction, size_average, reduce)
    target = _check_class_index_target(input, target, weight, ignore_index, "nll_loss")
    losses, total_weight, _ = _class_index_losses(input, target, weight, ignore_index)
    return losses.sum() / total_weight if mode == 1 else _reduce(losses, mode)


def cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None, size_average: Any = None,
                  ignore_index: int = -100, reduce: Any = None, reduction: str = "mean",
                  label_smoothing: float = 0.0) -> Tensor:
    """log_softmax over dim 1 (dim 0 unbatched) followed by the negative log-likelihood of `target`: class
    indices (with ignore_index and per-class weights) or, when shaped like the input, class probabilities;
    optionally label-smoothed towards the uniform distribution."""
    mode = _reduction_enum(reduction, size_average, reduce)
    if not 0.0 <= label_smoothing <= 1.0:
        raise FunctionalArgumentError(f"label_smoothing must be between 0.0 and 1.0. Got: {label_smoothing}")
    if input.dim() < 1:
        raise ShapeError(f"Expected 1 or more dimensions (got {input.dim()})")
    class_dim = 1 if input.dim() >= 2 else 0
    classes = input.shape[class_dim]
    if target.dim() == input.dim():  # torch: a target shaped like the input holds class probabilities
        return _cross_entropy_probabilities(input, target, weight, ignore_index, mode, label_smoothing)
    target = _check_class_index_target(input, target, weight, ignore_index, "cross_entropy")
    log_probs = log_softmax(input, class_dim)
    losses, total_weight, ignored = _class_index_losses(log_probs, target, weight, ignore_index)
    nll = losses.sum() / total_weight if mode == 1 else _reduce(losses, mode)
    if label_smoothing == 0:
        return nll
    # The smoothing term: the (weighted) sum of -log_probs over classes, with nll's ignore mask and denominator.
    class_weight = None if weight is None else weight.view([classes] + [1] * (input.dim() - class_dim - 1))
    smooth = (log_probs if class_weight is None else log_probs * class_weight).sum(class_dim).neg()
    smooth = smooth.masked_fill(ignored, 0.0)
    smooth = smooth.sum() / total_weight if mode == 1 else _reduce(smooth, mode)
    return nll * (1 - label_smoothing) + smooth * (label_smoothing / classes)


def _cross_entropy_probabilities(input: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int,
                                 reduction: int, label_smoothing: float) -> Tensor:
    """-sum_c weight[c] target[c] log_softmax(input)[c]; 'mean' averages over positions (N * d1 * ...)."""
    if not target.dtype.is_floating_point:
        raise OpArgumentError(f"Expected floating point type for target with class probabilities, got "
                              f"{target.dtype.name}", fix="pass int64 class indices of shape (N, d1, ...) instead")
    if ignore_index >= 0:
        raise FunctionalArgumentError("ignore_index is not supported for floating point target")
    if any(map(_known_and_different, input.shape, target.shape)):
        raise ShapeError(f"expected class probabilities shaped like the input {list(input.shape)}, got "
                         f"{list(target.shape)}")
    class_dim = 1 if input.dim() >= 2 else 0
    classes = input.shape[class_dim]
    if weight is not None and (weight.dim() != 1 or _known_and_different(weight.shape[0], classes)):
        raise ShapeError(f"cross_entropy: weight tensor should be defined either for all {classes} classes or no "
                         f"classes but got weight tensor of shape: {list(weight.shape)}")
    log_probs = log_softmax(input, class_dim)
    if label_smoothing > 0:
        target = target * (1 - label_smoothing) + label_smoothing / classes
    weighted = log_probs * target
    if weight is not None:
        weighted = weighted * weight.view([classes] + [1] * (input.dim() - class_dim - 1))
    return _reduce(weighted.sum(class_dim).neg(), reduction)
