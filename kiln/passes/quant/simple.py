"""Two more quantizers: a symmetric int8 one in XNNPACK's style, and weight-only quantization of linear layers
(int8 per channel, int4 in groups)."""

from __future__ import annotations

from kiln.ir import dtypes
from kiln.ir.errors import KilnError
from kiln.ir.program import ExportedProgram
from kiln.passes.quant.observer import (
    MinMaxObserver, MovingAverageMinMaxObserver, MovingAveragePerChannelMinMaxObserver, PerChannelMinMaxObserver,
    PerGroupMinMaxObserver, PlaceholderObserver, per_channel_symmetric, per_tensor_affine, per_tensor_symmetric,
)
from kiln.passes.quant.quantizer import (
    QuantizationAnnotation, QuantizationConfig, QuantizationSpec, Quantizer, annotate, fake_quantize_class,
)
from kiln.passes.quant.transforms import linear_layers
from kiln.passes.quant.x86 import X86InductorQuantizer


def get_symmetric_quantization_config(is_per_channel: bool = True, is_qat: bool = False,
                                      is_dynamic: bool = False) -> QuantizationConfig:
    """XNNPACK's int8 config: int8 activations (affine, [-128, 127]; chosen at run time when dynamic) and
    symmetric int8 weights in [-127, 127], per output channel or per tensor. is_qat: observed by fake quantizers
    with moving averages (torch's QAT recipe), for prepare_qat_pt2e."""
    eps = 2.0 ** -12
    if is_qat:
        fused = fake_quantize_class("FusedMovingAvgObsFakeQuantize")
        activation_observer = (fake_quantize_class("FakeQuantize").with_args(
            eps=eps, observer=MovingAverageMinMaxObserver.with_args(averaging_constant=1)) if is_dynamic
            else fused.with_args(eps=eps))
        weight_observer = fused.with_args(eps=eps, observer=MovingAveragePerChannelMinMaxObserver if is_per_channel
                                          else MovingAverageMinMaxObserver)
    else:
        activation_observer = (PlaceholderObserver if is_dynamic else MinMaxObserver).with_args(eps=eps)
        weight_observer = (PerChannelMinMaxObserver if is_per_channel else MinMaxObserver).with_args(eps=eps)
    activation = QuantizationSpec(dtypes.int8, activation_observer, quant_min=-128, quant_max=127,
                                  qscheme=per_tensor_affine, is_dynamic=is_dynamic)
    weight = QuantizationSpec(dtypes.int8, weight_observer, quant_min=-127, quant_max=127,
                              qscheme=per_channel_symmetric if is_per_channel else per_tensor_symmetric,
                              ch_axis=0 if is_per_channel else None)
    return QuantizationConfig(activation, activation, weight, None, is_qat)


class XNNPACKQuantizer(X86InductorQuantizer):
    """Symmetric int8 quantization in XNNPACK's style, annotated with the X86 recipe's patterns (conv/linear with
    their activations, pools, cat, flatten). `set_global(get_symmetric_quantization_config())`."""

    def set_module_type(self, module_type: type, config: QuantizationConfig | None) -> "XNNPACKQuantizer":
        self.set_module_type_qconfig(module_type, config)
        return self

    def set_module_name(self, module_name: str, config: QuantizationConfig | None) -> "XNNPACKQuantizer":
        self.set_module_name_qconfig(module_name, config)
        return self


WEIGHT_ONLY_SCHEMES = ("int8", "int4", "fp16")


class WeightOnlyQuantizer(Quantizer):
    """Quantize the weights of linear layers only; activations stay float, so no calibration is needed:
    `int8` (symmetric, per output channel), `int4` (symmetric, per group of `group_size` input columns, values in
    [-8, 7] held in int8) or `fp16` (stored as float16, read through convert_element_type.no_fuse)."""

    def __init__(self, scheme: str = "int8", group_size: int = 32):
        if scheme not in WEIGHT_ONLY_SCHEMES:
            raise KilnError(f"unknown weight-only scheme {scheme!r}",
                            fix=f"use one of {', '.join(WEIGHT_ONLY_SCHEMES)}")
        if scheme == "int4" and group_size not in (32, 64, 128, 256):
            raise KilnError(f"int4 group size {group_size} is not supported", fix="use 32, 64, 128 or 256")
        self.scheme, self.group_size = scheme, group_size

    def weight_spec(self) -> QuantizationSpec:
        if self.scheme == "fp16":
            return QuantizationSpec(dtypes.float16, PlaceholderObserver)
        if self.scheme == "int8":
            return QuantizationSpec(dtypes.int8, PerChannelMinMaxObserver, quant_min=-127, quant_max=127,
                                    qscheme=per_channel_symmetric, ch_axis=0)
        return QuantizationSpec(dtypes.int8, PerGroupMinMaxObserver.with_args(group_size=self.group_size),
                                quant_min=-8, quant_max=7, qscheme=per_channel_symmetric)

    def transform_for_annotation(self, program: ExportedProgram) -> ExportedProgram:
        return linear_layers(program)  # GPT-2's Conv1D layers count as linear

    def annotate(self, program: ExportedProgram) -> ExportedProgram:
        spec = self.weight_spec()
        for op in program.walk_nodes():
            if op.name == "aten.linear.default":
                annotate(program, op, QuantizationAnnotation({op.operands[1]: spec}))
        return program


