"""kiln.quantization: PT2E post-training quantization, as torch.ao.quantization / torchao.quantization.pt2e.

    prepared = prepare_pt2e(program, X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config()))
    for batch in calibration_data:
        prepared(batch)                 # or: calibrate(prepared, batches, backend="c"), compiled once
    quantized = convert_pt2e(prepared)  # quantize/dequantize ops around float ops
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

from kiln.passes.quant.convert import convert_pt2e
from kiln.passes.quant.observer import (
    HistogramObserver, MinMaxObserver, MovingAverageMinMaxObserver, ObserverBase, PerChannelMinMaxObserver,
    PerGroupMinMaxObserver, PlaceholderObserver, QScheme, UniformQuantizationObserverBase, per_channel_affine,
    per_channel_symmetric, per_tensor_affine, per_tensor_symmetric,
)
from kiln.passes.quant.prepare import PreparedProgram, prepare_pt2e
from kiln.passes.quant.quantizer import (
    DerivedQuantizationSpec, Int32Bias, QuantizationAnnotation, QuantizationConfig, QuantizationSpec, Quantizer,
    SharedQuantizationSpec, annotate, annotation_of,
)
from kiln.passes.quant.report import LayerError, QuantizationReport, report
from kiln.passes.quant.simple import (
    WeightOnlyQuantizer, XNNPACKQuantizer, get_symmetric_quantization_config,
)
from kiln.passes.quant.x86 import X86InductorQuantizer, get_default_x86_inductor_quantization_config

__all__ = [
    "convert_pt2e", "prepare_pt2e", "PreparedProgram", "HistogramObserver", "MinMaxObserver",
    "MovingAverageMinMaxObserver", "ObserverBase", "PerChannelMinMaxObserver", "PlaceholderObserver", "QScheme",
    "UniformQuantizationObserverBase", "per_channel_affine", "per_channel_symmetric", "per_tensor_affine",
    "per_tensor_symmetric", "QuantizationAnnotation", "QuantizationConfig", "QuantizationSpec", "Quantizer",
    "SharedQuantizationSpec", "annotate", "annotation_of", "X86InductorQuantizer",
    "get_default_x86_inductor_quantization_config", "PerGroupMinMaxObserver", "WeightOnlyQuantizer",
    "XNNPACKQuantizer", "get_symmetric_quantization_config", "LayerError", "QuantizationReport", "report",
    "calibrate", "CALIBRATION_BACKENDS", "DerivedQuantizationSpec", "Int32Bias",
]


CALIBRATION_BACKENDS = ("interpreter", "c")


def calibrate(prepared: PreparedProgram, batches: Iterable[Sequence[Any]], backend: str = "interpreter",
              progress: Callable[[int], None] | None = None) -> None:
    """Run `prepared` on each batch (a tuple of arguments) and feed its observers.

    backend="c" compiles the float program once, with every observed value as an extra output, and runs the
    batches in C: the way to calibrate GPT-2-sized models (the interpreter computes matmuls in float64). The
    observers see the C kernels' float32 results, which differ from the interpreter's in the last bits."""
    if backend not in CALIBRATION_BACKENDS:
        from kiln.ir.errors import KilnError
        raise KilnError(f"unknown calibration backend {backend!r}", fix=f"use one of {', '.join(CALIBRATION_BACKENDS)}")
    run = prepared if backend == "interpreter" else _compiled_observing(prepared)
    for index, args in enumerate(batches):
        run(*(tuple(args) if isinstance(args, (tuple, list)) else (args,)))
        if progress is not None:
            progress(index + 1)


def _compiled_observing(prepared: PreparedProgram) -> Callable[..., Any]:
    """A C build of the prepared program that returns the observed values after its outputs, and a runner that
    feeds them (and the observed inputs and weights) to the observers."""
    from xdsl.ir import Operation

    from kiln.ir.program import InputKind, OutputKind, OutputSpec
    from kiln.passes.base import weight_value
    from kiln.runtime import compile as compile_c

    program = prepared.program
    watched = prepared.watched_values()
    computed = [value for value in watched if isinstance(value.owner, Operation)]
    returned = program.body.last_op
    outputs, specs, out_spec = list(returned.operands), list(program.graph_signature.output_specs), program.out_spec
    if any(spec.kind is not OutputKind.USER_OUTPUT for spec in specs):
        from kiln.ir.errors import KilnError
        raise KilnError("calibrating in C needs a program without buffer mutations",
                        fix="calibrate with backend='interpreter'")
    try:  # the observed values become extra outputs for the build only
        returned.operands = outputs + computed
        program.graph_signature.output_specs = specs + [OutputSpec(OutputKind.USER_OUTPUT, f"observed_{i}")
                                                        for i in range(len(computed))]
        program.out_spec = None
        program.graph.update_function_type()
        package = compile_c(program)
    finally:
        returned.operands = outputs
        program.graph_signature.output_specs = specs
        program.out_spec = out_spec
        program.graph.update_function_type()
    user_inputs = [arg for arg, spec in zip(program.body.args, program.graph_signature.input_specs)
                   if spec.kind is InputKind.USER_INPUT]
    # Weights do not change between batches: they are observed once (torch's observers see them every call, which
    # changes nothing for the min/max observers weights use).
    weights = {value: weight_value(program, value) for value in watched if value not in computed}
    for value, array in weights.items():
        if array is not None:
            prepared.observe(value, array)

    def run(*args: Any) -> None:
        results = package(*args)
        results = results if isinstance(results, tuple) else (results,)
        for value, array in zip(computed, results[len(outputs):]):
            prepared.observe(value, array)
        for value, array in zip(user_inputs, args):
            prepared.observe(value, array)
    return run
