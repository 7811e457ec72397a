"""Scans that are exactly one direction of a torch RNN, LSTM or GRU layer, lowered to ONNX's `RNN`/`LSTM`/`GRU` op.

kiln's recurrent layers export each layer and direction as a `kiln.scan` over input gates that one `linear` of the
layer input computes before the loop (the reverse direction flips them in time). When a scan's body is exactly the
cell of torch's LSTM (without projections), GRU or Elman RNN (kiln/codegen/recurrent.py), and its xs are that
linear, the pair is one ONNX op, which onnxruntime runs as one fused kernel; a bidirectional layer's two scans are
one op. Anything else, e.g. an LSTM with `proj_size` or a float16 one, stays a `Scan`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.ir.control_flow import ScanOp

from kiln.codegen.onnx.graph import INT64_MIN, OnnxGraph, Value
from kiln.codegen.recurrent import FLIP, LINEAR, Cell, match_cell, matches, op


@dataclass
class RecurrentMatch:
    """A scan that is one ONNX recurrent op: its cell and the outer values the op reads."""
    cell: Cell
    input: Any            # the layer input [seq, batch, input_size], in the scan's step order when not `flipped`
    flipped: bool         # the scan steps through `input` backwards (the reverse direction)
    w_ih: Any
    b_ih: Any
    w_hh: Any
    b_hh: Any
    init: list[Any]       # the initial carries, in the cell's carry order
    hidden_size: int


def match_recurrent(scan: ScanOp) -> RecurrentMatch | None:
    """The recurrent op `scan` is exactly, or None: a cell (kiln/codegen/recurrent.py) whose xs are the linear of
    the layer input, flipped in time or not."""
    found = match_cell(scan)
    if found is None:
        return None
    gates = _input_gates(scan.xs[0])
    if gates is None or (gates[2] is None) != (found.b_hh is None):
        return None
    layer_input, w_ih, b_ih, flipped = gates
    return RecurrentMatch(found.cell, layer_input, flipped, w_ih, b_ih, found.w_hh, found.b_hh, list(scan.init),
                          found.w_hh.type.shape[-1])


def _input_gates(xs: Any) -> tuple[Any, Any, Any, bool] | None:
    """(layer input, w_ih, b_ih, flipped) when `xs` is linear(input, w_ih, b_ih) of a 3-D input, flipped in time
    or not."""
    for pattern, flipped in ((op(LINEAR, "$input", "$w_ih", "$b_ih"), False),
                             (op(FLIP, op(LINEAR, "$input", "$w_ih", "$b_ih"), [0]), True)):
        bound: dict[str, Any] = {}
        if matches(xs, pattern, bound) and len(bound["$input"].type.shape) == 3:
            return bound["$input"], bound["$w_ih"], bound["$b_ih"], flipped
    return None


# ---------------------------------------------------------------------------------------------
# Emission


def lower_recurrent(graph: OnnxGraph, match: RecurrentMatch, values: dict[Any, Value]) -> list[str]:
    """Emit the ONNX op for `match`; returns the scan's results (final carries, then the stacked outputs)."""
    layer_input = values[match.input].name
    if match.flipped:
        layer_input = _reversed_in_time(graph, layer_input)
    outputs = _emit_op(graph, [match], layer_input, values, {})
    # Y is [seq, directions, batch, hidden]; Y_h and Y_c are [directions, batch, hidden].
    stacked = graph.node("Squeeze", [outputs[0], graph.ints([1])])
    finals = [graph.node("Squeeze", [name, graph.ints([0])]) for name in outputs[1:]]
    return [*finals, stacked]


def bidirectional_partner(forward: ScanOp, match: RecurrentMatch, values: dict[Any, Value]) -> tuple | None:
    """(scan, match) of the reverse direction of `forward`'s layer, when one op can compute both: a later scan in
    the same block with the same cell, layer input and hidden size, stepping the input backwards, whose operands the
    graph already has here (the bidirectional op is emitted at the forward scan's place)."""
    if match.flipped:
        return None
    for candidate in _later_ops(forward):
        if not isinstance(candidate, ScanOp):
            continue
        other = match_recurrent(candidate)
        if (other is not None and other.flipped and other.cell == match.cell and other.input is match.input
                and other.hidden_size == match.hidden_size and (other.b_ih is None) == (match.b_ih is None)
                and all(v is None or v in values for v in (other.w_ih, other.b_ih, other.w_hh, other.b_hh,
                                                           *other.init))):
            return candidate, other
    return None


def lower_bidirectional(graph: OnnxGraph, forward: RecurrentMatch, backward: tuple[ScanOp, RecurrentMatch],
                        values: dict[Any, Value]) -> tuple[list[str], dict[Any, str]]:
    """Emit one `direction="bidirectional"` op for a layer's two scans. Returns the forward scan's results, and the
    ONNX names of the reverse scan's results and of the flip that puts its per-step outputs back in time order
    (when that is their one reader), for the caller to bind: ONNX's reverse direction yields Y in input time order,
    where the scan stacks its steps backwards."""
    scan, match = backward
    bound: dict[Any, str] = {}
    outputs = _emit_op(graph, [forward, match], values[forward.input].name, values, {"direction": "bidirectional"})

    def direction(name: str, axis: int, index: int) -> str:
        return graph.node("Gather", [name, graph.const(np.asarray(index, dtype=np.int64))], axis=axis)

    in_time = direction(outputs[0], 1, 1)
    stacked = scan.results[-1]
    bound[stacked] = _reversed_in_time(graph, in_time)  # (clean_graph drops it when only the flip read it)
    readers = [use.operation for use in stacked.uses]
    if len(readers) == 1 and matches(readers[0].results[0], op(FLIP, "$y", [0]), {}):
        bound[readers[0].results[0]] = in_time
    for result, name in zip(scan.results[:-1], outputs[1:]):
        bound[result] = direction(name, 0, 1)
    return [*(direction(name, 0, 0) for name in outputs[1:]), direction(outputs[0], 1, 0)], bound


def _emit_op(graph: OnnxGraph, directions: list[RecurrentMatch], layer_input: str, values: dict[Any, Value],
             attributes: dict[str, Any]) -> list[str]:
    """The ONNX op over `layer_input` with one direction per match (forward first): W, R and B stacked along a
    leading direction axis, torch's gate blocks in ONNX's order; returns Y, Y_h[, Y_c]."""
    cell, size = directions[0].cell, directions[0].hidden_size
    rows = np.concatenate([np.arange(k * size, (k + 1) * size) for k in cell.gate_order]).astype(np.int64)
    order = graph.const(rows)

    def stacked(parts: list[str]) -> str:
        return parts[0] if len(parts) == 1 else graph.node("Concat", parts, axis=0)

    def per_direction(name: str) -> str:  # torch's gate blocks in ONNX's order, with a direction axis in front
        return graph.node("Unsqueeze", [graph.node("Gather", [name, order], axis=0), graph.ints([0])])

    weights = [stacked([per_direction(values[getattr(m, w)].name) for m in directions]) for w in ("w_ih", "w_hh")]
    if directions[0].b_ih is not None:
        weights.append(stacked([graph.node("Concat", [per_direction(values[m.b_ih].name),
                                                      per_direction(values[m.b_hh].name)], axis=1)
                                for m in directions]))
    else:
        weights.append("")
    initial = [stacked([graph.node("Unsqueeze", [values[m.init[k]].name, graph.ints([0])]) for m in directions])
               for k in range(len(cell.carries))]
    cell_attributes = {key: value * len(directions) if key == "activations" else value  # (one list per direction)
                       for key, value in cell.attributes.items()}
    return graph.node(cell.onnx_op, [layer_input, *weights, "", *initial], outputs=1 + len(cell.carries),
                      hidden_size=size, **cell_attributes, **attributes)


def _reversed_in_time(graph: OnnxGraph, name: str) -> str:
    return graph.node("Slice", [name, graph.ints([-1]), graph.ints([INT64_MIN]), graph.ints([0]), graph.ints([-1])])


def _later_ops(op: Any):
    following = op.next_op
    while following is not None:
        yield following
        following = following.next_op


__all__ = ["match_recurrent", "lower_recurrent", "bidirectional_partner", "lower_bidirectional", "RecurrentMatch"]
