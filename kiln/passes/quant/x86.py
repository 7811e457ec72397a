"""X86InductorQuantizer: torchao's recipe for x86 CPUs (uint8 affine activations, int8 per-channel weights).

It annotates conv/linear (alone, followed by an activation, or conv2d into a residual add and relu) on their
activation input and weight, then
propagates quantization through ops that run in int8 (max_pool2d, avg pools, cat, flatten) when their inputs are
quantized, and gives those ops' outputs their input's qparams. Static, dynamic and reduce-range configurations
match `get_default_x86_inductor_quantization_config`.
"""

from __future__ import annotations

from typing import Callable, Sequence

from xdsl.ir import Operation, SSAValue

from kiln.ir import dtypes
from kiln.ir.program import ExportedProgram
from kiln.passes.quant import transforms  # noqa: F401  (registers addmm-to-linear)
from kiln.passes.quant.observer import (
    HistogramObserver, MovingAverageMinMaxObserver, MovingAveragePerChannelMinMaxObserver, PerChannelMinMaxObserver,
    PlaceholderObserver, per_channel_symmetric, per_tensor_affine,
)
from kiln.passes.quant.qat import training_batch_norm_after
from kiln.passes.quant.quantizer import (
    Int32Bias, QuantizationAnnotation, QuantizationConfig, QuantizationSpec, Quantizer, SharedQuantizationSpec,
    annotate, annotation_of, fake_quantize_class,
)

Filter = Callable[[Sequence[Operation]], bool]

CONV_OPS = ("aten.conv1d.default", "aten.conv2d.default")
LINEAR = "aten.linear.default"
CONV_UNARY_OPS = ("aten.relu.default", "aten.hardtanh.default", "aten.hardswish.default", "aten.silu.default")
LINEAR_UNARY_OPS = ("aten.relu.default", "aten.leaky_relu.default", "aten.tanh.default", "aten.gelu.default")
# Ops that run in int8 when their input is int8, so quantization propagates through them.
INT8_IN_INT8_OUT_OPS = ("aten.max_pool2d.default", "aten.cat.default", "aten.avg_pool2d.default",
                        "aten.adaptive_avg_pool2d.default", "aten.flatten.using_ints")
QUANTIZABLE_OPS = INT8_IN_INT8_OUT_OPS + CONV_OPS + (LINEAR, "aten.mul.Tensor", "aten.matmul.default")


def get_default_x86_inductor_quantization_config(is_qat: bool = False, is_dynamic: bool = False,
                                                 reduce_range: bool = False,
                                                 int32_bias: bool = False) -> QuantizationConfig:
    """uint8 per-tensor affine activations (HistogramObserver; chosen at run time when dynamic) and int8
    per-channel symmetric weights. reduce_range keeps activations to 7 bits for CPUs without VNNI. int32_bias
    (kiln's addition) stores static conv/linear biases as int32 on the input scale × weight scale grid, the form
    onnxruntime fuses into QGemm; torch's recipe keeps them float. is_qat: the same specs observed by fake quantizers
    (FusedMovingAvgObsFakeQuantize; per-channel moving averages for weights), for prepare_qat_pt2e."""
    eps = 2.0 ** -12
    if is_qat:  # torch's QAT recipe: fake quantizers that observe with moving averages
        if is_dynamic:
            act_observer = fake_quantize_class("FakeQuantize").with_args(
                eps=eps, observer=MovingAverageMinMaxObserver.with_args(averaging_constant=1))
        else:
            act_observer = fake_quantize_class("FusedMovingAvgObsFakeQuantize").with_args(eps=eps)
        weight_observer = fake_quantize_class("FusedMovingAvgObsFakeQuantize").with_args(
            eps=eps, observer=MovingAveragePerChannelMinMaxObserver)
    else:
        act_observer = (PlaceholderObserver if is_dynamic else HistogramObserver).with_args(eps=eps)
        weight_observer = PerChannelMinMaxObserver.with_args(eps=eps)
    activation = QuantizationSpec(dtypes.uint8, act_observer, quant_min=0,
                                  quant_max=127 if reduce_range else 255, qscheme=per_tensor_affine,
                                  is_dynamic=is_dynamic)
    weight = QuantizationSpec(dtypes.int8, weight_observer, quant_min=-128,
                              quant_max=127, qscheme=per_channel_symmetric, ch_axis=0)
    return QuantizationConfig(activation, activation, weight, Int32Bias() if int32_bias else None, is_qat)


def _module_stack(op: Operation) -> list[tuple[str, str]]:
    stack = op.attributes.get("kiln.nn_module_stack")
    if stack is None:
        return []
    return [tuple(entry.data.rsplit(":", 1)) for entry in stack.data]  # type: ignore[union-attr, misc]


def module_name_filter(module_name: str) -> Filter:
    """True when every op of the pattern was recorded inside the submodule `module_name` (e.g. `encoder.fc1`)."""
    return lambda ops: all(any(path == module_name for path, _ in _module_stack(op)) for op in ops)


def operator_type_filter(op_name: str) -> Filter:
    """True when exactly one op of the pattern is `op_name` (the pattern's anchor, e.g. the linear)."""
    return lambda ops: sum(op.name == op_name for op in ops) == 1


def _global_filter(ops: Sequence[Operation]) -> bool:
    return True


# Module classes that set_module_type_qconfig maps to the op they export as (torch's own mapping).
_MODULE_OPS = {"Linear": LINEAR, "Conv2d": "aten.conv2d.default", "Conv1d": "aten.conv1d.default"}


class X86InductorQuantizer(Quantizer):
    def __init__(self) -> None:
        self.global_config: QuantizationConfig | None = None
        self.operator_type_qconfig: dict[str, QuantizationConfig | None] = {}
        self.module_name_qconfig: dict[str, QuantizationConfig | None] = {}

    def set_global(self, quantization_config: QuantizationConfig) -> "X86InductorQuantizer":
        self.global_config = quantization_config
        return self

    def set_module_type_qconfig(self, module_type: type, quantization_config: QuantizationConfig | None
                                ) -> "X86InductorQuantizer":
        """Quantize ops from modules of this class (kiln.nn or torch.nn Linear/Conv1d/Conv2d) with this config;
        None keeps them in float."""
        name = getattr(module_type, "__name__", str(module_type))
        if name not in _MODULE_OPS:
            from kiln.ir.errors import KilnError
            raise KilnError(f"set_module_type_qconfig supports {', '.join(_MODULE_OPS)}, got {name}",
                            fix="use set_module_name_qconfig for other modules")
        self.operator_type_qconfig[_MODULE_OPS[name]] = quantization_config
        return self

    def set_module_name_qconfig(self, module_name: str, quantization_config: QuantizationConfig | None
                                ) -> "X86InductorQuantizer":
        """Quantize ops recorded inside the submodule `module_name` with this config; None keeps them in float."""
        self.module_name_qconfig[module_name] = quantization_config
        return self

    def transform_for_annotation(self, program: ExportedProgram) -> ExportedProgram:
        """GPT-2's Conv1D layers (addmm with an [in, out] weight) become linear layers, so they are quantized too
        (torchao's recipe leaves them float)."""
        return transforms.linear_layers(program)

    # -- annotation
    def annotate(self, program: ExportedProgram) -> ExportedProgram:
        for name, config in self.module_name_qconfig.items():
            self._annotate_with_config(program, config, module_name_filter(name))
        for op_name, config in self.operator_type_qconfig.items():
            self._annotate_with_config(program, config, operator_type_filter(op_name))
        if self.global_config is not None:
            self._annotate_with_config(program, self.global_config, _global_filter)
        for op in program.walk_nodes():
            self._annotate_output_for_int8_in_int8_out(program, op)
        return program

    def _annotate_with_config(self, program: ExportedProgram, config: QuantizationConfig | None,
                              keep: Filter) -> None:
        ops = list(program.walk_nodes())
        if config is None or config.is_qat:  # QAT keeps batch norm until convert: its patterns include it
            for op in ops:
                if op.name == "aten.conv2d.default":
                    self._annotate_qat_conv_bn(program, op, config, keep)
        for op in ops:  # conv2d + add (+ relu): the residual add runs in the int8 conv's epilogue
            if op.name == "aten.conv2d.default":
                self._annotate_conv_binary(program, op, config, keep)
        for unary_ops, anchors in ((CONV_UNARY_OPS, CONV_OPS), (LINEAR_UNARY_OPS, (LINEAR,))):
            for op in ops:
                if op.name in anchors:
                    unary = _single_user(op)
                    if unary is not None and unary.name in unary_ops and not self._skip(program, [unary, op], keep):
                        self._annotate_anchor(program, op, config, output_quantized=False)
                        self._mark(program, unary, config, QuantizationAnnotation(_is_output_of_quantized_pattern=True))
        for op in ops:
            if op.name in ("aten.conv2d.default", LINEAR) and not self._skip(program, [op], keep):
                self._annotate_anchor(program, op, config, output_quantized=True)
        for op in ops:
            self._propagate(program, op, config, keep)

    def _annotate_conv_binary(self, program: ExportedProgram, conv: Operation, config: QuantizationConfig | None,
                              keep: Filter) -> None:
        """conv2d → add(conv, other) [→ relu]: the conv's input and weight and the add's other input are quantized;
        the add (or the relu after it) ends the pattern."""
        residual = _residual_add_after(conv)
        if residual is None:
            return
        add, other, relu = residual
        pattern = [relu, add, conv] if relu is not None else [add, conv]
        if not self._begin_conv_pattern(program, pattern, config, keep):
            return
        annotate(program, add, QuantizationAnnotation({other: config.input_activation},
                                                      _is_output_of_quantized_pattern=relu is None))
        if relu is not None:
            annotate(program, relu, QuantizationAnnotation(_is_output_of_quantized_pattern=True))

    def _annotate_qat_conv_bn(self, program: ExportedProgram, conv: Operation, config: QuantizationConfig | None,
                              keep: Filter) -> None:
        """conv2d → batch_norm (training) [→ add(·, other) [→ relu] | → unary]: torch's QAT patterns. The conv's
        input and weight are quantized, the add's other input too, and the pattern's last op's output (torch
        annotates it explicitly in QAT, since prepare_qat_pt2e rewrites the conv and batch norm after annotation)."""
        norm = training_batch_norm_after(conv)
        if norm is None:
            return
        pattern, residual_input = [norm, conv], {}
        residual = _residual_add_after(norm)
        follower = _single_user(norm)
        if residual is not None:
            add, other, relu = residual
            pattern[:0] = [relu, add] if relu is not None else [add]
            residual_input = {other: config.input_activation} if config is not None else {}
        elif follower is not None and follower.name in CONV_UNARY_OPS:
            pattern.insert(0, follower)
        if not self._begin_conv_pattern(program, pattern, config, keep):
            return
        for op in pattern[:-1]:
            inputs = residual_input if op.name == "aten.add.Tensor" else {}
            if op is pattern[0]:
                annotate(program, op, QuantizationAnnotation(inputs, output_qspec=config.output_activation,
                                                             _is_output_of_quantized_pattern=True))
            else:
                annotate(program, op, QuantizationAnnotation(inputs))

    def _begin_conv_pattern(self, program: ExportedProgram, pattern: list[Operation],
                            config: QuantizationConfig | None, keep: Filter) -> bool:
        """For a pattern ending in its conv (`pattern[-1]`): nothing if it is annotated already or filtered out; all
        of it kept in float for a None config; else the conv's input and weight annotated, and True: the caller
        annotates the rest."""
        if self._skip(program, pattern, keep):
            return False
        if config is None:
            for op in pattern:
                annotate(program, op, QuantizationAnnotation())
            return False
        self._annotate_anchor(program, pattern[-1], config, output_quantized=False)
        return True

    @staticmethod
    def _skip(program: ExportedProgram, ops: Sequence[Operation], keep: Filter) -> bool:
        return any(annotation_of(program, op) is not None for op in ops) or not keep(ops)

    @staticmethod
    def _mark(program: ExportedProgram, op: Operation, config: QuantizationConfig | None,
              annotation: QuantizationAnnotation) -> None:
        annotate(program, op, annotation if config is not None else QuantizationAnnotation())

    def _annotate_anchor(self, program: ExportedProgram, op: Operation, config: QuantizationConfig | None,
                         output_quantized: bool) -> None:
        if config is None:
            annotate(program, op, QuantizationAnnotation())
            return
        inputs = {op.operands[0]: config.input_activation, op.operands[1]: config.weight}
        if len(op.operands) > 2 and isinstance(config.bias, Int32Bias):
            if not config.input_activation.is_dynamic:  # a dynamic input's scale is known only at run time
                inputs[op.operands[2]] = config.bias.for_op((op.operands[0], op), (op.operands[1], op))
        elif len(op.operands) > 2 and config.bias is not None:
            inputs[op.operands[2]] = config.bias
        annotate(program, op, QuantizationAnnotation(inputs, _is_output_of_quantized_pattern=output_quantized))

    def _propagate(self, program: ExportedProgram, op: Operation, config: QuantizationConfig | None,
                   keep: Filter) -> None:
        if op.name not in INT8_IN_INT8_OUT_OPS or annotation_of(program, op) is not None or not keep([op]):
            return
        if config is None:
            annotate(program, op, QuantizationAnnotation())
            return
        if op.name == "aten.cat.default":
            if not all(_is_quantized_output(program, v) for v in op.operands):
                return
            first = op.operands[0]
            shared = SharedQuantizationSpec((first, op))
            inputs = {first: config.input_activation}
            inputs.update({v: shared for v in op.operands[1:] if v not in inputs})
            annotate(program, op, QuantizationAnnotation(inputs, _is_output_of_quantized_pattern=True))
            return
        if op.name == "aten.flatten.using_ints" and op.results[0].uses and not any(
                use.operation.name in QUANTIZABLE_OPS for use in op.results[0].uses):
            return
        source = op.operands[0]
        if not _is_quantized_output(program, source):
            return
        annotate(program, op, QuantizationAnnotation({source: config.input_activation},
                                                     _is_output_of_quantized_pattern=True))

    @staticmethod
    def _annotate_output_for_int8_in_int8_out(program: ExportedProgram, op: Operation) -> None:
        annotation = annotation_of(program, op)
        if op.name in INT8_IN_INT8_OUT_OPS and annotation is not None and annotation._is_output_of_quantized_pattern:
            annotation.output_qspec = SharedQuantizationSpec((op.operands[0], op))


def _alpha(op: Operation) -> float:
    from kiln.ir.dialect import bound_arguments
    return bound_arguments(op)[2]


def _residual_add_after(op: Operation) -> tuple[Operation, SSAValue, Operation | None] | None:
    """op → add(op, other) [→ relu], alpha 1: the add, its other input, and the relu when one follows."""
    add = _single_user(op)
    if add is None or add.name != "aten.add.Tensor" or _alpha(add) != 1:
        return None
    other = add.operands[1] if add.operands[0] is op.results[0] else add.operands[0]
    if other is op.results[0]:
        return None
    relu = _single_user(add)
    return add, other, relu if relu is not None and relu.name == "aten.relu.default" else None


def _single_user(op: Operation) -> Operation | None:
    uses = list(op.results[0].uses)
    return uses[0].operation if len(uses) == 1 else None


def _is_quantized_output(program: ExportedProgram, value: SSAValue) -> bool:
    owner = value.owner
    if not isinstance(owner, Operation):
        return False
    annotation = annotation_of(program, owner)
    return annotation is not None and annotation._is_output_of_quantized_pattern
