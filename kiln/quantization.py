"""kiln.quantization: PT2E post-training quantization, as torch.ao.quantization / torchao.quantization.pt2e.

    prepared = prepare_pt2e(program, X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config()))
    for batch in calibration_data:
        prepared(batch)
    quantized = convert_pt2e(prepared)  # quantize/dequantize ops around float ops
"""

from kiln.passes.quant.convert import convert_pt2e
from kiln.passes.quant.observer import (
    HistogramObserver, MinMaxObserver, MovingAverageMinMaxObserver, ObserverBase, PerChannelMinMaxObserver,
    PerGroupMinMaxObserver, PlaceholderObserver, QScheme, UniformQuantizationObserverBase, per_channel_affine,
    per_channel_symmetric, per_tensor_affine, per_tensor_symmetric,
)
from kiln.passes.quant.prepare import PreparedProgram, prepare_pt2e
from kiln.passes.quant.quantizer import (
    QuantizationAnnotation, QuantizationConfig, QuantizationSpec, Quantizer, SharedQuantizationSpec, annotate,
    annotation_of,
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
]
