"""The quantizer API of PT2E: specs that say how a value is quantized, and annotations that attach them to ops.

A `Quantizer` walks a program and records, per op, a `QuantizationAnnotation`: a spec for each input edge it wants
quantized and optionally one for its output. prepare_pt2e turns the annotations into observers (edges that share a
spec share an observer), and convert_pt2e into quantize/dequantize ops.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import Any, Union

from xdsl.ir import Operation, SSAValue

from kiln.ir.dtypes import DType
from kiln.ir.errors import KilnError
from kiln.ir.program import ExportedProgram
from kiln.passes.quant.observer import PartialConstructor, QScheme

# An input edge (the value, the op that reads it) or a node (an op's result, standing for its output).
EdgeOrNode = Union[tuple[SSAValue, Operation], SSAValue]


@dataclass(eq=True, frozen=True)
class QuantizationSpec:
    """How to quantize a value: storage dtype, range, scheme, and the observer that chooses its qparams."""

    dtype: DType
    observer_or_fake_quant_ctr: Any  # an observer class or `Observer.with_args(...)`
    quant_min: int | None = None
    quant_max: int | None = None
    qscheme: QScheme | None = None
    ch_axis: int | None = None
    is_dynamic: bool = False

    def make_observer(self) -> Any:
        """A fresh observer configured by this spec (its arguments override the constructor's bound ones)."""
        kwargs: dict[str, Any] = {"dtype": self.dtype, "is_dynamic": self.is_dynamic}
        if self.quant_min is not None and self.quant_max is not None:
            kwargs.update(quant_min=self.quant_min, quant_max=self.quant_max)
        if self.qscheme is not None:
            kwargs["qscheme"] = self.qscheme
        if self.ch_axis is not None:
            kwargs["ch_axis"] = self.ch_axis
        constructor = self.observer_or_fake_quant_ctr
        if not isinstance(constructor, PartialConstructor):
            constructor = PartialConstructor(constructor)
        return constructor(**kwargs)


@dataclass(eq=True, frozen=True)
class SharedQuantizationSpec:
    """Quantize like another edge or node, with the same observer (e.g. max_pool's output like its input)."""

    edge_or_node: Any


@dataclass(eq=True, frozen=True)
class DerivedQuantizationSpec:
    """Qparams computed from other edges' observers instead of observed, e.g. an int32 bias whose scale is the
    input's scale times the weight's (`derive_qparams_fn(observers) -> (scale, zero_point)`)."""

    derived_from: tuple[Any, ...]  # edges or nodes
    derive_qparams_fn: Any
    dtype: DType
    quant_min: int | None = None
    quant_max: int | None = None
    qscheme: QScheme | None = None
    ch_axis: int | None = None
    is_dynamic: bool = False


def _bias_qparams(observers: list[Any]) -> tuple[Any, Any]:
    """scale = input scale × weight scale (per output channel), zero point 0: the int32 accumulator's grid."""
    import numpy as np
    input_scale, _ = observers[0].calculate_qparams()
    weight_scale, _ = observers[1].calculate_qparams()
    scale = (np.float32(input_scale[0]) * weight_scale.astype(np.float32)).astype(np.float32)
    return scale, np.zeros(scale.shape, np.int64)


@dataclass(eq=True, frozen=True)
class Int32Bias:
    """A config's bias entry meaning "int32, on the accumulator's grid of the op's input and weight scales", as
    onnxruntime's quantizer stores biases; its QDQ fusion into QGemm needs that form."""

    def for_op(self, input_edge: Any, weight_edge: Any) -> DerivedQuantizationSpec:
        from kiln.ir import dtypes
        from kiln.passes.quant.observer import per_channel_symmetric
        return DerivedQuantizationSpec((input_edge, weight_edge), _bias_qparams, dtypes.int32, -2 ** 31,
                                       2 ** 31 - 1, per_channel_symmetric, 0)


@dataclass
class QuantizationAnnotation:
    """Which inputs of an op are quantized and how (`input_qspec_map`: value -> spec), and its output's spec."""

    input_qspec_map: dict[SSAValue, Any] = field(default_factory=dict)
    output_qspec: Any = None
    # The input edges of one value share an observer with each other and with the value's output spec when their
    # specs agree (torch's implicit sharing): one quantize/dequantize pair serves them all.
    allow_implicit_sharing: bool = True
    _annotated: bool = False
    # X86InductorQuantizer's marker: the op ends a pattern whose output can stay int8 (propagation reads it).
    _is_output_of_quantized_pattern: bool = False


@dataclass(frozen=True)
class QuantizationConfig:
    """The specs a quantizer applies to a pattern: activations in and out, weight, bias."""

    input_activation: QuantizationSpec | None
    output_activation: QuantizationSpec | None
    weight: QuantizationSpec | None
    bias: QuantizationSpec | Int32Bias | None
    is_qat: bool = False


ANNOTATIONS_KEY = "quantization_annotation"

# The fake-quantize classes QAT configs build specs from (`FakeQuantize`, `FusedMovingAvgObsFakeQuantize`). They are
# kiln.nn Modules, so they live in kiln.quantization, above this layer, which registers them here when imported.
FAKE_QUANTIZE_CLASSES: dict[str, Any] = {}


def fake_quantize_class(name: str) -> Any:
    if name not in FAKE_QUANTIZE_CLASSES:
        raise KilnError(f"QAT configs need kiln.quantization's {name}", fix="import kiln.quantization first")
    return FAKE_QUANTIZE_CLASSES[name]


def annotations(program: ExportedProgram) -> dict[Operation, QuantizationAnnotation]:
    """The program's annotations by op (torch keeps them in `node.meta["quantization_annotation"]`)."""
    return program.metadata.setdefault(ANNOTATIONS_KEY, {})


def annotate(program: ExportedProgram, op: Operation, annotation: QuantizationAnnotation) -> None:
    """Attach `annotation` to `op`; its input_qspec_map keys must be operands of `op`."""
    for value in annotation.input_qspec_map:
        if value not in op.operands:
            raise KilnError(f"the annotation of {op.name} names a value that is not one of its operands",
                            fix="key input_qspec_map by the op's own operands (op.operands[i])")
    annotation._annotated = True
    annotations(program)[op] = annotation


def annotation_of(program: ExportedProgram, op: Operation) -> QuantizationAnnotation | None:
    return annotations(program).get(op)


@dataclass
class Renaming:
    """How a rewrite replaced parts of a program (each map: old -> new): result values, ops, and single input edges
    (a convolution reading a new weight). Edges not listed follow their value and their op."""

    values: dict[SSAValue, SSAValue] = field(default_factory=dict)
    ops: dict[Operation, Operation] = field(default_factory=dict)
    edges: dict[tuple[SSAValue, Operation], tuple[SSAValue, Operation]] = field(default_factory=dict)

    def __call__(self, edge_or_node: Any) -> Any:
        if isinstance(edge_or_node, tuple):
            if edge_or_node in self.edges:
                return self.edges[edge_or_node]
            value, user = edge_or_node
            return self.values.get(value, value), self.ops.get(user, user)
        return self.values.get(edge_or_node, edge_or_node)

    def spec(self, spec: Any) -> Any:
        """`spec` with its references to other edges or nodes (shared, derived) renamed."""
        if isinstance(spec, SharedQuantizationSpec):
            return SharedQuantizationSpec(self(spec.edge_or_node))
        if isinstance(spec, DerivedQuantizationSpec):
            return replace(spec, derived_from=tuple(self(e) for e in spec.derived_from))
        return spec

    def annotations(self, program: ExportedProgram) -> None:
        """Move the program's annotations to the new ops and values (torch's
        _update_special_qspecs_after_replacement)."""
        table = annotations(program)
        for op, annotation in list(table.items()):
            annotation.input_qspec_map = {self((value, op))[0]: self.spec(spec)
                                          for value, spec in annotation.input_qspec_map.items()}
            annotation.output_qspec = self.spec(annotation.output_qspec)
            if op in self.ops:
                del table[op]
                table[self.ops[op]] = annotation


class Quantizer(ABC):
    """Decides what to quantize: `annotate` marks ops of a program with QuantizationAnnotations."""

    def transform_for_annotation(self, program: ExportedProgram) -> ExportedProgram:
        """Rewrite the program before annotation (e.g. decompose an op the quantizer matches in pieces)."""
        return program

    @abstractmethod
    def annotate(self, program: ExportedProgram) -> ExportedProgram:
        ...

    def validate(self, program: ExportedProgram) -> None:
        """Raise a KilnError if the annotations cannot be honoured."""
