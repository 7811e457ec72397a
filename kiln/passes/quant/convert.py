"""convert_pt2e: a calibrated PreparedProgram becomes the reference quantized program.

Every observed activation gets `quantize → dequantize` with its observer's qparams (or, for dynamic specs,
`choose_qparams` at run time); every observed weight is quantized now and stored as an integer constant read
through `dequantize`. The float ops stay: backends match `dequantize → op → quantize` into integer kernels.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from xdsl.ir import Operation, SSAValue
from xdsl.rewriter import InsertPoint, Rewriter

from kiln.ir import dtypes
from kiln.ir.control_flow import outermost_source, pass_down
from kiln.ir.errors import KilnError
from kiln.ir.program import ExportedProgram, GraphBuilder
from kiln.ir.registry import ops
from kiln.passes.base import add_constant, finish_pass, weight_value
from kiln.passes.quant.observer import FLOAT32_EPS, PerGroupMinMaxObserver
from kiln.passes.quant.prepare import PreparedProgram
from kiln.passes.quant.quantizer import ANNOTATIONS_KEY, DerivedQuantizationSpec

qd = ops.quantized_decomposed


class _InsertAt(GraphBuilder):
    """Records `kiln.ops` calls on IR values at a fixed point of an existing block."""

    def __init__(self, program: ExportedProgram, point: InsertPoint):
        super().__init__(program.shape_env())
        self.point = point
        self.inserted: list[Operation] = []

    def insert(self, op: Operation) -> None:
        Rewriter.insert_op(op, self.point)
        self.inserted.append(op)


def _insert_point_after(value: SSAValue) -> InsertPoint:
    owner = value.owner
    if isinstance(owner, Operation):
        return InsertPoint.after(owner)
    return InsertPoint.at_start(owner)  # a forward argument: at the top


def convert_pt2e(prepared: PreparedProgram) -> ExportedProgram:
    """Replace observers by quantize/dequantize ops with the qparams they chose (torch.ao's convert_pt2e)."""
    if not isinstance(prepared, PreparedProgram):
        raise KilnError(f"convert_pt2e takes the result of prepare_pt2e, got {type(prepared).__name__}")
    if prepared.converted:
        raise KilnError("this prepared program was already converted", fix="prepare the float program again")
    program = prepared.program
    converted = _Converter(prepared)
    for edge_or_node in prepared.groups:  # outputs first: their users read the dequantized value
        if not isinstance(edge_or_node, tuple):
            converted.quantize_output(edge_or_node)
    for edge_or_node in prepared.groups:
        if isinstance(edge_or_node, tuple):
            converted.quantize_edge(*edge_or_node)
    prepared.converted = True
    program.metadata.pop(ANNOTATIONS_KEY, None)
    finish_pass(program)
    program.verify()
    return program


class _Converter:
    def __init__(self, prepared: PreparedProgram):
        self.prepared = prepared
        self.program = prepared.program
        self.output_group: dict[SSAValue, int] = {}
        self.done: dict[tuple[SSAValue, int], SSAValue] = {}  # (value, group) -> its dequantized replacement
        self.group_specs: dict[int, Any] = {}
        self.block = self.program.body  # where the value being quantized is read
        for edge_or_node, group in prepared.groups.items():
            self.group_specs.setdefault(group, prepared.specs[edge_or_node])

    def quantize_output(self, value: SSAValue) -> None:
        group = self.prepared.groups[value]
        dequantized, inserted = self._quantized(value, group, _insert_point_after(value))
        value.replace_uses_with_if(dequantized, lambda use: use.operation not in inserted)
        self.output_group[value] = group

    def quantize_edge(self, value: SSAValue, user: Operation) -> None:
        group = self.prepared.groups[(value, user)]
        if self.output_group.get(value) == group:
            return  # the output's quantize/dequantize already serves this edge
        current = self.done.get((value, self.output_group.get(value, -1)))
        source = current if current is not None else value
        key = (source, group)
        replacement = self.done.get(key)
        if replacement is None:
            replacement, _ = self._quantized(source, group, _insert_point_after(source))
        user.operands = [replacement if operand is source else operand for operand in user.operands]

    def _quantized(self, value: SSAValue, group: int, point: InsertPoint) -> tuple[SSAValue, set[Operation]]:
        """`value` quantized and dequantized with the group's qparams, and the ops that compute it. A weight read in
        a loop body (an invariant operand of the loop) is quantized once, outside: the body dequantizes it."""
        observer = self.prepared.observers[group]
        spec = self.group_specs[group]
        weight = weight_value(self.program, outermost_source(value))
        self.block = point.block
        builder = _InsertAt(self.program, point)
        with builder:
            if isinstance(spec, DerivedQuantizationSpec):
                result = self._derived(value, weight, spec)
            elif weight is not None and not spec.is_dynamic:
                result = self._dequantized_weight(weight, observer)
            elif spec.is_dynamic:
                result = self._dynamic(value, observer)
            else:
                result = self._static(value, observer)
        self.done[(value, group)] = result
        return result, set(builder.inserted)

    def _constant(self, array: np.ndarray, hint: str) -> SSAValue:
        """A new constant of the program, as the block being converted reads it."""
        return pass_down(add_constant(self.program, array, hint), self.block)

    def _derived(self, value: SSAValue, weight: np.ndarray | None, spec: DerivedQuantizationSpec) -> SSAValue:
        """A value whose qparams follow from other edges' (an int32 bias): quantized now, read through dequantize."""
        if weight is None:
            raise KilnError("a DerivedQuantizationSpec annotates a value that is not a weight or constant",
                            fix="derive qparams only for weights and biases")
        observers = [self.prepared.observer_of(edge) for edge in spec.derived_from]
        for observer, edge in zip(observers, spec.derived_from):
            if observer is None or not self.prepared.saw(observer):
                raise KilnError(f"the qparams of a derived spec need calibrated observers on {edge!r}",
                                fix="calibrate the prepared program before convert_pt2e")
        scale, zero_point = spec.derive_qparams_fn(observers)
        low, high, axis = spec.quant_min, spec.quant_max, spec.ch_axis or 0
        quantized = qd.quantize_per_channel.default(weight, scale, zero_point, axis, low, high, spec.dtype)
        stored = self._constant(quantized, "quantized_bias")
        scales = self._constant(scale, "bias_scale")
        zero_points = self._constant(zero_point, "bias_zero_point")
        return qd.dequantize_per_channel.default(stored, scales, zero_points, axis, low, high, spec.dtype)

    def _static(self, value: SSAValue, observer: Any) -> SSAValue:
        scale, zero_point = observer.calculate_qparams()
        if getattr(observer, "qscheme", None) is not None and observer.qscheme.is_per_channel:
            raise KilnError("per-channel activation quantization is not supported",
                            fix="use a per-tensor spec for activations")
        arguments = (float(scale[0]), int(zero_point[0]), observer.quant_min, observer.quant_max, observer.dtype)
        return qd.dequantize_per_tensor.default(qd.quantize_per_tensor.default(value, *arguments), *arguments)

    def _dynamic(self, value: SSAValue, observer: Any) -> SSAValue:
        quant_min, quant_max = observer.quant_min, observer.quant_max
        eps = observer.eps if observer.eps is not None else FLOAT32_EPS
        scale, zero_point = qd.choose_qparams.tensor(value, quant_min, quant_max, eps, observer.dtype)
        quantized = qd.quantize_per_tensor.tensor(value, scale, zero_point, quant_min, quant_max, observer.dtype)
        return qd.dequantize_per_tensor.tensor(quantized, scale, zero_point, quant_min, quant_max, observer.dtype)

    def _dequantized_weight(self, weight: np.ndarray, observer: Any) -> SSAValue:
        if observer.dtype.is_floating_point:  # fp16 weight-only: stored in the narrow float, read as float32
            stored = self._constant(weight.astype(observer.dtype.numpy), "weight")
            return qd.convert_element_type.no_fuse(stored, dtypes.dtype(weight.dtype))
        if not self.prepared.saw(observer):  # not calibrated (e.g. weight-only): the weight is known now
            observer(weight)
        scale, zero_point = observer.calculate_qparams()
        low, high, dtype = observer.quant_min, observer.quant_max, observer.dtype
        if isinstance(observer, PerGroupMinMaxObserver):  # int4 values in int8 storage, one scale per group
            size = observer.group_size
            quantized = qd.quantize_per_channel_group.default(weight, scale, zero_point, low, high, dtype, size)
            stored = self._constant(quantized, "quantized_weight")
            scales = self._constant(scale, "weight_scale")
            zero_points = self._constant(zero_point, "weight_zero_point")
            return qd.dequantize_per_channel_group.default(stored, scales, zero_points, low, high, dtype, size,
                                                           dtypes.float32)
        if observer.qscheme.is_per_channel:
            axis = observer.ch_axis
            quantized = qd.quantize_per_channel.default(weight, scale, zero_point, axis, low, high, dtype)
            stored = self._constant(quantized, "quantized_weight")
            scales = self._constant(scale, "weight_scale")
            zero_points = self._constant(zero_point, "weight_zero_point")
            return qd.dequantize_per_channel.default(stored, scales, zero_points, axis, low, high, dtype)
        arguments = (float(scale[0]), int(zero_point[0]), low, high, dtype)
        stored = self._constant(qd.quantize_per_tensor.default(weight, *arguments), "quantized_weight")
        return qd.dequantize_per_tensor.default(stored, *arguments)

