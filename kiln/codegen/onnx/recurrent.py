"""Scans that are exactly one direction of a torch RNN, LSTM or GRU layer, lowered to ONNX's `RNN`/`LSTM`/`GRU` op.

kiln's recurrent layers export each layer and direction as a `kiln.scan` over input gates that one `linear` of the
layer input computes before the loop (the reverse direction flips them in time). When a scan's body is exactly the
cell of torch's LSTM (without projections), GRU or Elman RNN, and its xs are that linear, the pair is one ONNX op,
which onnxruntime runs as one fused kernel. Cells are recognized structurally, by matching the body against a
pattern of the cell's ops, so a scan whatever its source (kiln.nn, a loaded .pt2, a user's `kiln.scan`) maps when
its math is the cell's, and anything else, e.g. an LSTM with `proj_size` or a float16 one, stays a `Scan`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from xdsl.ir import BlockArgument, OpResult

from kiln.ir import dtypes
from kiln.ir.control_flow import ScanOp
from kiln.ir.dialect import bound_arguments
from kiln.ir.types import TensorType

from kiln.codegen.onnx.graph import INT64_MIN, OnnxGraph, Value

LINEAR, ADD, SUB, MUL = "aten.linear.default", "aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor"
SIGMOID, TANH, RELU = "aten.sigmoid.default", "aten.tanh.default", "aten.relu.default"
SPLIT, FLIP = "aten.split_with_sizes.default", "aten.flip.default"
_COMMUTATIVE = {ADD, MUL}


# ---------------------------------------------------------------------------------------------
# Patterns: an op name with argument patterns (in schema order), a "$name" that binds a value (and must be the
# same value wherever the name recurs), a predicate on a non-tensor argument, or a literal it must equal.


@dataclass(frozen=True)
class Op:
    name: str
    args: tuple[Any, ...]
    result: int = 0


def op(name: str, *args: Any, result: int = 0) -> Op:
    return Op(name, args, result)


def _match(value: Any, pattern: Any, bound: dict[str, Any]) -> bool:
    if isinstance(pattern, str) and pattern.startswith("$"):
        if pattern in bound:
            return bound[pattern] is value
        bound[pattern] = value
        return True
    if isinstance(pattern, Op):
        if not isinstance(value, OpResult) or value.index != pattern.result:
            return False
        producer = value.op
        if getattr(producer, "name", None) != pattern.name or len(pattern.args) > len(producer.opdef.schema.arguments):
            return False
        arguments = bound_arguments(producer)
        orders = [arguments]
        if pattern.name in _COMMUTATIVE:
            orders.append([arguments[1], arguments[0], *arguments[2:]])
        for candidate in orders:
            trial = dict(bound)
            if all(_match(a, p, trial) for a, p in zip(candidate, pattern.args)):
                bound.update(trial)
                return True
        return False
    if callable(pattern):
        return bool(pattern(value))
    return value == pattern


def _equal_parts(count: int) -> Callable[[Any], bool]:
    return lambda sizes: isinstance(sizes, list) and len(sizes) == count and len(set(sizes)) == 1


def _last_of_two(dim: Any) -> bool:  # a gate split of a [batch, gates] step value
    return dim in (1, -1)


def _split(value: Any, count: int, part: int) -> Op:
    return op(SPLIT, value, _equal_parts(count), _last_of_two, result=part)


# ---------------------------------------------------------------------------------------------
# The cells, as kiln.nn's recurrent layers trace them (and ATen's CPU kernels compute them). Each names its carries
# ("$h", "$c"), the step's input gates "$x" and the recurrent weights "$w_hh", "$b_hh", and says what each
# carry and the per-step output become.


@dataclass(frozen=True)
class Cell:
    onnx_op: str
    carries: tuple[str, ...]
    gate_order: tuple[int, ...]  # ONNX's gate k is torch's gate gate_order[k]
    yields: Callable[[], list[Any]]
    attributes: dict[str, Any]


def _lstm_yields() -> list[Any]:
    gates = op(ADD, op(LINEAR, "$h", "$w_hh", "$b_hh"), "$x", 1)

    def gate(part: int, activation: str) -> Op:
        return op(activation, _split(gates, 4, part))
    c_next = op(ADD, op(MUL, gate(1, SIGMOID), "$c"), op(MUL, gate(0, SIGMOID), gate(2, TANH)), 1)
    h_next = op(MUL, gate(3, SIGMOID), op(TANH, c_next))
    return [h_next, c_next, h_next]


def _gru_yields() -> list[Any]:
    hidden = op(LINEAR, "$h", "$w_hh", "$b_hh")
    reset = op(SIGMOID, op(ADD, _split(hidden, 3, 0), _split("$x", 3, 0), 1))
    update = op(SIGMOID, op(ADD, _split(hidden, 3, 1), _split("$x", 3, 1), 1))
    new = op(TANH, op(ADD, _split("$x", 3, 2), op(MUL, _split(hidden, 3, 2), reset), 1))
    h_next = op(ADD, op(MUL, op(SUB, "$h", new, 1), update), new, 1)
    return [h_next, h_next]


def _rnn_yields(activation: str) -> Callable[[], list[Any]]:
    def yields() -> list[Any]:
        h_next = op(activation, op(ADD, op(LINEAR, "$h", "$w_hh", "$b_hh"), "$x", 1))
        return [h_next, h_next]
    return yields


CELLS = (
    # torch: input, forget, cell, output gates; ONNX: input, output, forget, cell
    Cell("LSTM", ("$h", "$c"), (0, 3, 1, 2), _lstm_yields, {}),
    # torch: reset, update, new; ONNX: update, reset, hidden. torch applies the reset gate after the recurrent
    # linear, which is ONNX's linear_before_reset=1.
    Cell("GRU", ("$h",), (1, 0, 2), _gru_yields, {"linear_before_reset": 1}),
    Cell("RNN", ("$h",), (0,), _rnn_yields(TANH), {"activations": ["Tanh"]}),
    Cell("RNN", ("$h",), (0,), _rnn_yields(RELU), {"activations": ["Relu"]}),
)


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
    """The recurrent op `scan` is exactly, or None."""
    if len(scan.xs) != 1 or not all(_is_float32(v) for v in (*scan.init, *scan.xs)):
        return None
    block = scan.body.block
    yielded = list(block.last_op.operands)
    for cell in CELLS:
        carries = len(cell.carries)
        if len(scan.init) != carries or len(yielded) != carries + 1:
            continue
        bound = dict(zip(cell.carries, block.args[:carries]))
        bound["$x"] = block.args[carries]
        if not all(_match(v, p, bound) for v, p in zip(yielded, cell.yields())):
            continue
        outer = {name: _outer(scan, bound[name]) for name in ("$w_hh", "$b_hh")}
        if any(value is _NOT_AN_OPERAND for value in outer.values()):
            continue  # the weights must be loop invariants, not carries or the step's slice
        gates = _input_gates(scan.xs[0])
        if gates is None:
            continue
        layer_input, w_ih, b_ih, flipped = gates
        w_hh_type = outer["$w_hh"].type
        hidden_size = w_hh_type.shape[-1]
        if not isinstance(hidden_size, int) or w_hh_type.shape[0] != len(cell.gate_order) * hidden_size:
            continue
        if (b_ih is None) != (outer["$b_hh"] is None):
            continue
        return RecurrentMatch(cell, layer_input, flipped, w_ih, b_ih, outer["$w_hh"], outer["$b_hh"],
                              list(scan.init), hidden_size)
    return None


_NOT_AN_OPERAND = object()


def _outer(scan: ScanOp, value: Any) -> Any:
    """The outer value a body value stands for when it is one of the scan's extra operands (None stays None)."""
    if value is None:
        return None
    if not isinstance(value, BlockArgument) or value.block is not scan.body.block:
        return _NOT_AN_OPERAND
    first = len(scan.init) + len(scan.xs)
    return scan.operands_[value.index - first] if value.index >= first else _NOT_AN_OPERAND


def _input_gates(xs: Any) -> tuple[Any, Any, Any, bool] | None:
    """(layer input, w_ih, b_ih, flipped) when `xs` is linear(input, w_ih, b_ih) of a 3-D input, flipped in time
    or not."""
    for pattern, flipped in ((op(LINEAR, "$input", "$w_ih", "$b_ih"), False),
                             (op(FLIP, op(LINEAR, "$input", "$w_ih", "$b_ih"), [0]), True)):
        bound: dict[str, Any] = {}
        if _match(xs, pattern, bound) and len(bound["$input"].type.shape) == 3:
            return bound["$input"], bound["$w_ih"], bound["$b_ih"], flipped
    return None


def _is_float32(value: Any) -> bool:
    return isinstance(value.type, TensorType) and value.type.dtype is dtypes.float32


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
    if len(readers) == 1 and _match(readers[0].results[0], op(FLIP, "$y", [0]), {}):
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


__all__ = ["match_recurrent", "lower_recurrent", "bidirectional_partner", "lower_bidirectional", "RecurrentMatch",
           "CELLS"]
