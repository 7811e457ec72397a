"""Convolution + batch norm in quantization-aware training (torch.ao's _fuse_conv_bn_qat and _fold_conv_bn_qat).

Inference folds batch norm into the convolution, so the weight that gets quantized is w·γ/σ, not w. QAT has to
fake-quantize that weight while batch norm still normalizes with batch statistics. prepare_qat_pt2e rewrites

    conv(x, w, b) → batch_norm(training)
into
    conv(x, w·s, 0) / s + b → batch_norm(training),    s = γ / sqrt(running_var + eps) per output channel

(nniqat.ConvBn2d's approximate fusion). The convolution's weight edge, and its fake quantizer, now carry w·s. After
training, convert folds the chain, with batch norm on running statistics, into one convolution:
conv(x, w·s, (b - running_mean)·s + β), quantized with the scales training learned.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from xdsl.ir import Operation, SSAValue
from xdsl.rewriter import InsertPoint, Rewriter

from kiln.ir.dialect import bound_arguments
from kiln.ir.meta import shape_of
from kiln.ir.program import ExportedProgram, running_statistic_targets
from kiln.ir.registry import ops
from kiln.passes.base import add_constant, erase_dead_program_ops, weight_value
from kiln.passes.fold_batchnorm import folded_bias
from kiln.passes.quant.quantizer import Renaming

aten = ops.aten

CONVOLUTIONS = ("aten.conv1d.default", "aten.conv2d.default", "aten.conv3d.default")
_RUNNING_STATISTICS_UPDATE = "aten.var_mean.correction"


def training_batch_norm_after(conv: Operation) -> Operation | None:
    """The training-mode batch norm that normalizes `conv`'s output, when nothing else reads that output (the
    batch norm's own running-statistics update aside)."""
    users = [use.operation for use in conv.results[0].uses]
    norms = [op for op in users if op.name == "aten.batch_norm.default"]
    if len(norms) != 1 or any(op.name != _RUNNING_STATISTICS_UPDATE for op in users if op is not norms[0]):
        return None
    norm = norms[0]
    return norm if norm.operands[0] is conv.results[0] and bound_arguments(norm)[5] else None


@dataclass
class ConvBatchNorm:
    """One convolution + batch norm rewritten for QAT: the values convert folds."""

    conv: Operation  # conv(x, w·s, 0 or None)
    scaled_weight: SSAValue  # w·s: the weight the fake quantizer sees
    zero_bias: SSAValue | None
    normalized_input: SSAValue  # conv / s + b: the batch norm's input
    weight: SSAValue
    bias: SSAValue | None
    eps: float


def _scale_factor(gamma: Any, running_var: Any, eps: float) -> Any:
    """s = γ / sqrt(running_var + eps): IR values in, ops out; arrays in, arrays out (one formula for both)."""
    std = aten.sqrt.default(aten.add.Scalar(running_var, eps))
    return aten.reciprocal.default(std) if gamma is None else aten.div.Tensor(gamma, std)


def _per_output_channel(scale: Any, rank: int) -> Any:
    return aten.view.default(scale, [-1] + [1] * (rank - 1))


def _per_channel_of_output(scale: Any, rank: int) -> Any:
    return aten.view.default(scale, [1, -1] + [1] * (rank - 2))


def _copy_provenance(source: Operation, targets: list[Operation]) -> None:
    """The source line and module path of the op a rewrite replaced, on the ops that replace it."""
    for name in ("kiln.nn_module_stack", "kiln.source"):
        if name in source.attributes:
            for op in targets:
                op.attributes[name] = source.attributes[name]


def fuse_conv_bn_qat(program: ExportedProgram) -> list[ConvBatchNorm]:
    """Rewrite every convolution → training-mode batch norm of `program` for QAT (see the module docstring),
    keeping the quantizer's annotations on the new convolution. Returns what convert needs to fold them."""
    from kiln.passes.quant.convert import _InsertAt

    arguments = {spec.target: arg for arg, spec in zip(program.body.args, program.graph_signature.input_specs)
                 if spec.target is not None}
    fused = []
    renaming = Renaming()
    for conv in list(program.nodes()):
        norm = training_batch_norm_after(conv) if conv.name in CONVOLUTIONS else None
        if norm is None:
            continue
        values = bound_arguments(conv)
        norm_values = bound_arguments(norm)
        gamma, running_var, eps = norm_values[1], norm_values[4], norm_values[7]
        if running_var is None:  # kiln's export: the statistics' update follows as separate ops
            running_var = arguments[running_statistic_targets(program, norm)[1]]
        weight, bias = values[1], values[2]
        rank = len(shape_of(weight))
        with _InsertAt(program, InsertPoint.before(conv)) as builder:
            scale = _scale_factor(gamma, running_var, eps)
            scaled_weight = aten.mul.Tensor(weight, _per_output_channel(scale, rank))
            zero_bias = None if bias is None else aten.zeros_like.default(bias)
            new_conv_output = getattr(aten, conv.name.split(".")[1]).default(
                values[0], scaled_weight, zero_bias, *values[3:])
            output = aten.div.Tensor(new_conv_output, _per_channel_of_output(scale, rank))
            if bias is not None:
                output = aten.add.Tensor(output, _per_channel_of_output(bias, rank))
        _copy_provenance(conv, builder.inserted)
        new_conv = new_conv_output.owner
        conv.results[0].replace_all_uses_with(output)
        renaming.values[conv.results[0]] = new_conv_output
        renaming.ops[conv] = new_conv
        renaming.edges[(weight, conv)] = (scaled_weight, new_conv)
        if bias is not None:
            renaming.edges[(bias, conv)] = (zero_bias, new_conv)
        Rewriter.erase_op(conv)
        fused.append(ConvBatchNorm(new_conv, scaled_weight, zero_bias, output, weight, bias, eps))
    renaming.annotations(program)
    return fused


def fold_conv_bn_qat(prepared: Any) -> None:
    """Fold each convolution + batch norm that `fuse_conv_bn_qat` rewrote in the PreparedProgram, now with batch norm
    on running statistics, into one convolution with the folded weight and bias as constants (the weight training
    fake-quantized, with the current statistics)."""
    from kiln.passes.quant.convert import _InsertAt

    program = prepared.program
    for record in prepared.conv_batch_norms:
        norms = [use.operation for use in record.normalized_input.uses
                 if use.operation.name == "aten.batch_norm.default"]
        if len(norms) != 1 or bound_arguments(norms[0])[5]:
            continue
        norm = norms[0]
        _, gamma, beta, mean, var = bound_arguments(norm)[:5]
        arrays = [None if v is None else np.asarray(weight_value(program, v)) for v in
                  (record.weight, record.bias, gamma, beta, mean, var)]
        weight, bias, gamma, beta, mean, var = arrays
        rank = weight.ndim
        scale = np.asarray(_scale_factor(gamma, var, record.eps))
        scaled_weight = np.asarray(aten.mul.Tensor(weight, _per_output_channel(scale, rank)))
        stored_weight = add_constant(program, scaled_weight.astype(weight.dtype), "weight_bn_folded")
        stored_bias = add_constant(program, np.asarray(folded_bias(bias, mean, beta, scale)).astype(weight.dtype),
                                   "bias_bn_folded")
        values = bound_arguments(record.conv)
        with _InsertAt(program, InsertPoint.before(norm)):
            folded = getattr(aten, record.conv.name.split(".")[1]).default(
                values[0], stored_weight, stored_bias, *values[3:])
        folded_conv = folded.owner
        _copy_provenance(record.conv, [folded_conv])
        norm.results[0].replace_all_uses_with(folded)
        renaming = Renaming({record.conv.results[0]: folded, norm.results[0]: folded}, {record.conv: folded_conv},
                            {(record.scaled_weight, record.conv): (stored_weight, folded_conv)})
        if record.zero_bias is not None:
            renaming.edges[(record.zero_bias, record.conv)] = (stored_bias, folded_conv)
        prepared.rename(renaming)
    erase_dead_program_ops(program)
