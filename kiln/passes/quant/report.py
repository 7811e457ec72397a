"""The per-layer quantization report: how far each quantized layer's output drifts from the float program's.

The quantized program keeps the float program's ops in order (convert only adds quantize/dequantize ops around
them), so the two pair up op by op. Both run on the same data; for each op that reads a dequantized value (the
layers quantization changed) the report gives the SQNR of its output against the float output and the largest
error. The SQNR drop from one quantized layer to the next is what that layer costs; the costliest layers are the
suggestion for keeping in float.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np
from xdsl.ir import Operation

from kiln.ir.errors import KilnError
from kiln.ir.interpreter import watching
from kiln.ir.program import ExportedProgram

QUANTIZED_NAMESPACE = "quantized_decomposed."


@dataclass
class LayerError:
    name: str  # the submodule path where the program knows it, else the op's result name
    op: str
    sqnr_db: float
    max_error: float
    cost_db: float = 0.0  # SQNR lost since the previous quantized layer (0 for the first)


@dataclass
class QuantizationReport:
    layers: list[LayerError]
    output_sqnr_db: float
    suggestions: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        width = max([len(layer.name) for layer in self.layers] + [5])
        lines = [f"{'layer':<{width}}  {'op':<24}  {'SQNR dB':>8}  {'cost dB':>8}  {'max error':>10}"]
        for layer in self.layers:
            lines.append(f"{layer.name:<{width}}  {layer.op:<24}  {layer.sqnr_db:8.2f}  {layer.cost_db:8.2f}  "
                         f"{layer.max_error:10.4g}")
        lines.append(f"output SQNR: {self.output_sqnr_db:.2f} dB")
        if self.suggestions:
            lines.append("to recover accuracy, keep in float (most costly first): " + ", ".join(self.suggestions))
        return "\n".join(lines)


def _compute_ops(program: ExportedProgram) -> list[Operation]:
    return [op for op in program.nodes() if not op.name.startswith(QUANTIZED_NAMESPACE)]


def _layer_name(op: Operation) -> str:
    stack = op.attributes.get("kiln.nn_module_stack")
    if stack is not None and stack.data:  # type: ignore[union-attr]
        return stack.data[-1].data.rsplit(":", 1)[0]  # type: ignore[union-attr]
    return op.results[0].name_hint or op.name


class _Accumulator:
    def __init__(self) -> None:
        self.signal = 0.0
        self.noise = 0.0
        self.max_error = 0.0

    def add(self, reference: np.ndarray, actual: np.ndarray) -> None:
        reference64, difference = reference.astype(np.float64), actual.astype(np.float64) - reference
        self.signal += float(np.sum(reference64 * reference64))
        self.noise += float(np.sum(difference * difference))
        self.max_error = max(self.max_error, float(np.abs(difference).max(initial=0.0)))

    @property
    def sqnr_db(self) -> float:
        if self.noise == 0.0:
            return math.inf
        return 10 * math.log10(self.signal / self.noise) if self.signal > 0 else -math.inf


def report(float_program: ExportedProgram, quantized_program: ExportedProgram, data: Iterable[Sequence[Any]],
           suggest: int = 3) -> QuantizationReport:
    """SQNR and max error of each quantized layer's output against the float program, over `data` (an iterable of
    argument tuples), and up to `suggest` layers to keep in float."""
    float_ops, quantized_ops = _compute_ops(float_program), _compute_ops(quantized_program)
    if [op.name for op in float_ops] != [op.name for op in quantized_ops]:  # the quantizers' layer rewrites
        from kiln.passes.quant.transforms import linear_layers
        float_program = linear_layers(float_program)
        float_ops = _compute_ops(float_program)
    if [op.name for op in float_ops] != [op.name for op in quantized_ops]:
        raise KilnError("the quantized program's ops do not pair up with the float program's",
                        fix="pass the float program that was prepared and converted into this one")
    layers = [index for index, op in enumerate(quantized_ops) if any(
        getattr(operand.owner, "name", "").startswith(QUANTIZED_NAMESPACE + "dequantize") for operand in op.operands)]
    watched_float = {float_ops[i].results[0]: i for i in layers}
    watched_quantized = {quantized_ops[i].results[0]: i for i in layers}
    accumulators = {i: _Accumulator() for i in layers}
    output = _Accumulator()
    batches = 0
    for args in data:
        args = tuple(args) if isinstance(args, (tuple, list)) else (args,)
        reference: dict[int, np.ndarray] = {}
        with watching(lambda value, array: reference.__setitem__(watched_float[value], array)
                      if value in watched_float else None):
            expected = float_program(*args)
        with watching(lambda value, array: accumulators[watched_quantized[value]].add(
                reference[watched_quantized[value]], array) if value in watched_quantized else None):
            actual = quantized_program(*args)
        for want, got in zip(_leaves(expected), _leaves(actual)):
            output.add(np.asarray(want), np.asarray(got))
        batches += 1
    if not batches:
        raise KilnError("the report needs at least one batch of data", fix="pass a non-empty list of inputs")
    rows = []
    for position, index in enumerate(layers):
        sqnr = accumulators[index].sqnr_db
        before = accumulators[layers[position - 1]].sqnr_db if position else math.inf
        cost = before - sqnr if position and math.isfinite(before) and math.isfinite(sqnr) else 0.0
        rows.append(LayerError(_layer_name(quantized_ops[index]), quantized_ops[index].name, sqnr,
                               accumulators[index].max_error, max(cost, 0.0)))
    costly = sorted((row for row in rows if row.cost_db > 0), key=lambda row: -row.cost_db)[:suggest]
    return QuantizationReport(rows, output.sqnr_db, [row.name for row in costly])


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, (tuple, list)):
        return [leaf for item in value for leaf in _leaves(item)]
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _leaves(item)]
    return [value]
