"""Fold eval-mode batch norm into the convolution or linear layer feeding it (like torch's mobile_optimizer).

conv(x, W, b) followed by batch_norm(gamma, beta, mean, var, eps) is conv(x, W * s, (b - mean) * s + beta)
with s = gamma / sqrt(var + eps) per output channel. When the weights are in the program the folded ones are
computed in float64 and stored as constants; otherwise (a bare .mlir) the same formula is emitted as ops on the
parameters, which `fold-constants{freeze=true}` can fold once weights are known.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from xdsl.ir import SSAValue

from kiln.ir.meta import shape_of
from kiln.ir.registry import ops
from kiln.ir.sparse import SparseArray, from_dense
from kiln.passes.base import register_pass
from kiln.passes.rewrite import RewritePass, constant, current_op, pattern, producer, value_of

aten = ops.aten

# conv{1,2,3}d.padding: padding given as 'same' or 'valid' (Hugging Face's EfficientNet, Keras ports)
_LAYERS = (aten.conv1d.default, aten.conv2d.default, aten.conv3d.default, aten.conv1d.padding, aten.conv2d.padding,
           aten.conv3d.padding, aten.convolution.default, aten.linear.default)


@register_pass
class FoldBatchNorm(RewritePass):
    """Fold eval-mode batch norm into the preceding convolution or linear layer."""

    name = "fold-batchnorm"

    @pattern(aten.batch_norm.default)
    def batch_norm(self, input: SSAValue, weight: Any, bias: Any, running_mean: Any, running_var: Any,
                   training: bool, momentum: float, eps: float, cudnn_enabled: bool) -> SSAValue | None:
        return None if training else _fold(input, weight, bias, running_mean, running_var, eps)

    @pattern(aten._native_batch_norm_legit.default)
    def native_batch_norm(self, input: SSAValue, weight: Any, bias: Any, running_mean: SSAValue,
                          running_var: SSAValue, training: bool, momentum: float, eps: float) -> Any:
        return None if training else _fold_first_result(input, weight, bias, running_mean, running_var, eps)

    @pattern(aten._native_batch_norm_legit_no_training.default)
    def native_batch_norm_eval(self, input: SSAValue, weight: Any, bias: Any, running_mean: SSAValue,
                               running_var: SSAValue, momentum: float, eps: float) -> Any:
        return _fold_first_result(input, weight, bias, running_mean, running_var, eps)


def _fold_first_result(*args: Any) -> tuple[SSAValue, None, None] | None:
    if any(result.uses for result in current_op().results[1:]):
        return None  # the saved mean / inverse std are read: keep the batch norm
    folded = _fold(*args)
    return None if folded is None else (folded, None, None)


def _bias_name(weight_name: str) -> str:
    """`conv1_weight` -> `conv1_bias` (and `conv1_weight_sparse_bsr` -> `conv1_bias`: the bias is dense)."""
    head, found, _ = weight_name.rpartition("weight")
    return f"{head}bias" if found else f"{weight_name}_bias"


def _fold(input: SSAValue, gamma: Any, beta: Any, mean: Any, var: Any, eps: float) -> SSAValue | None:
    layer = producer(input, *_LAYERS)
    if layer is None or not layer.has_one_use or mean is None or var is None:
        return None
    if layer.name == "aten.convolution.default" and layer.args[6]:
        return None  # transposed convolution: output channels live on weight dim 1, per group
    if layer.name == "aten.linear.default" and input.type.ndim != 2:
        return None  # batch norm normalizes dim 1, which is the linear's feature dim only for 2-d inputs
    weight, bias = layer.args[1], layer.args[2]
    parameters = [weight, bias, gamma, beta, mean, var]
    values = [None if p is None else value_of(p) for p in parameters]
    if all(v is not None for p, v in zip(parameters, values) if p is not None):
        sparse = values[0] if isinstance(values[0], SparseArray) else None  # scaled rows keep their zeros
        as_f64 = [None if v is None else np.asarray(v.to_dense() if v is sparse else v, np.float64) for v in values]
        new_weight, new_bias = _folded_parameters(*as_f64, eps)
        dtype = values[0].dtype  # type: ignore[union-attr]
        hint = (weight.name_hint or "weight").removeprefix("p_").removeprefix("c_")
        new_weight = np.asarray(new_weight, dtype)
        if sparse is not None:
            layout = sparse.layout
            new_weight = from_dense(new_weight, layout, blocksize=layout.blocksize, dense_dim=layout.dense_dim)
        new_weight = constant(new_weight, f"{hint}_bn_folded")
        new_bias = constant(np.asarray(new_bias, dtype), f"{_bias_name(hint)}_bn_folded")
    else:
        new_weight, new_bias = _folded_parameters(*parameters, eps)
    args = list(layer.args)
    args[1], args[2] = new_weight, new_bias
    return layer.handle(*args, **layer.kwargs)


def _folded_parameters(weight: Any, bias: Any, gamma: Any, beta: Any, mean: Any, var: Any, eps: float) -> Any:
    """The folded weight and bias, written once with kiln ops: numpy arrays in, arrays out; IR values in, ops."""
    scale = aten.rsqrt.default(aten.add.Scalar(var, eps))
    if gamma is not None:
        scale = aten.mul.Tensor(scale, gamma)
    per_output_channel = aten.view.default(scale, [-1] + [1] * (len(shape_of(weight)) - 1))
    return aten.mul.Tensor(weight, per_output_channel), folded_bias(bias, mean, beta, scale)


def folded_bias(bias: Any, mean: Any, beta: Any, scale: Any) -> Any:
    """(bias − mean) · scale + β, the bias of a layer with batch norm folded in (scale = γ / sqrt(var + eps)); a
    missing bias or β counts as zero. Arrays or IR values, like `_folded_parameters`."""
    shift = aten.neg.default(mean) if bias is None else aten.sub.Tensor(bias, mean)
    shift = aten.mul.Tensor(shift, scale)
    return shift if beta is None else aten.add.Tensor(shift, beta)
