"""Recurrent cells recognized in a scan's body: torch's LSTM (without projections), GRU and Elman RNN cells, as
kiln.nn's recurrent layers trace them (and ATen's CPU kernels compute them), matched structurally against a pattern
of the cell's ops, whatever the scan's source (kiln.nn, a loaded .pt2, a user's `kiln.scan`).

Backends use a match to run a whole cell as one fused op: ONNX's `LSTM`/`GRU`/`RNN` (onnx/recurrent.py), C's LSTM
step with the gate math in its GEMM's epilogue (c/recurrent.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from xdsl.ir import BlockArgument, OpResult

from kiln.ir import dtypes
from kiln.ir.control_flow import ScanOp, invariant_source
from kiln.ir.dialect import bound_arguments
from kiln.ir.types import TensorType

LINEAR, ADD, SUB, MUL = "aten.linear.default", "aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor"
SIGMOID, TANH, RELU = "aten.sigmoid.default", "aten.tanh.default", "aten.relu.default"
SPLIT, FLIP = "aten.split_with_sizes.default", "aten.flip.default"
ADDMM, MM, PERMUTE = "aten.addmm.default", "aten.mm.default", "aten.permute.default"
_COMMUTATIVE = {ADD, MUL}


# ---------------------------------------------------------------------------------------------
# Patterns: an op name with argument patterns (in schema order), a "$name" that binds a value (and must be the
# same value wherever the name recurs), a linear layer in any of its forms, a predicate on a non-tensor argument,
# or a literal it must equal.


@dataclass(frozen=True)
class Op:
    name: str
    args: tuple[Any, ...]
    result: int = 0


def op(name: str, *args: Any, result: int = 0) -> Op:
    return Op(name, args, result)


@dataclass(frozen=True)
class Linear:
    """linear(input, weight, bias), as exported or as `decompose` leaves it for the compiled backends:
    addmm(bias, input, permute(weight, [1, 0])), or mm(input, permute(weight, [1, 0])) with the bias bound to None."""
    input: Any
    weight: Any
    bias: Any

    def forms(self) -> list[tuple[Op, dict[str, Any]]]:
        transposed = op(PERMUTE, self.weight, [1, 0])
        return [(op(LINEAR, self.input, self.weight, self.bias), {}),
                (op(ADDMM, self.bias, self.input, transposed, 1, 1), {}),
                (op(MM, self.input, transposed), {self.bias: None})]


def matches(value: Any, pattern: Any, bound: dict[str, Any]) -> bool:
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
            if all(matches(a, p, trial) for a, p in zip(candidate, pattern.args)):
                bound.update(trial)
                return True
        return False
    if isinstance(pattern, Linear):
        for form, implied in pattern.forms():
            trial = dict(bound)
            if any(name in trial and trial[name] is not value_ for name, value_ in implied.items()):
                continue
            trial.update(implied)
            if matches(value, form, trial):
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
    gates = op(ADD, Linear("$h", "$w_hh", "$b_hh"), "$x", 1)

    def gate(part: int, activation: str) -> Op:
        return op(activation, _split(gates, 4, part))
    c_next = op(ADD, op(MUL, gate(1, SIGMOID), "$c"), op(MUL, gate(0, SIGMOID), gate(2, TANH)), 1)
    h_next = op(MUL, gate(3, SIGMOID), op(TANH, c_next))
    return [h_next, c_next, h_next]


def _gru_yields() -> list[Any]:
    hidden = Linear("$h", "$w_hh", "$b_hh")
    reset = op(SIGMOID, op(ADD, _split(hidden, 3, 0), _split("$x", 3, 0), 1))
    update = op(SIGMOID, op(ADD, _split(hidden, 3, 1), _split("$x", 3, 1), 1))
    new = op(TANH, op(ADD, _split("$x", 3, 2), op(MUL, _split(hidden, 3, 2), reset), 1))
    h_next = op(ADD, op(MUL, op(SUB, "$h", new, 1), update), new, 1)
    return [h_next, h_next]


def _rnn_yields(activation: str) -> Callable[[], list[Any]]:
    def yields() -> list[Any]:
        h_next = op(activation, op(ADD, Linear("$h", "$w_hh", "$b_hh"), "$x", 1))
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
class CellMatch:
    """A scan whose body is exactly `cell`: the body values the pattern bound ("$h", "$c", "$x", "$w_hh", "$b_hh"),
    the outer values of the recurrent weights (invariant operands of the scan), and what the body yields."""
    cell: Cell
    bound: dict[str, Any]
    w_hh: Any
    b_hh: Any
    yielded: list[Any]


def match_cell(scan: ScanOp) -> CellMatch | None:
    """The cell `scan`'s body is exactly (float32, one x, recurrent weights that are loop invariants), or None."""
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
        if not all(matches(v, p, bound) for v, p in zip(yielded, cell.yields())):
            continue
        w_hh = _invariant(scan, bound["$w_hh"])
        b_hh = None if bound["$b_hh"] is None else _invariant(scan, bound["$b_hh"])
        if w_hh is None or (b_hh is None) != (bound["$b_hh"] is None):
            continue  # the weights must be loop invariants, not carries or the step's slice
        hidden_size = w_hh.type.shape[-1]
        if not isinstance(hidden_size, int) or w_hh.type.shape[0] != len(cell.gate_order) * hidden_size:
            continue
        return CellMatch(cell, bound, w_hh, b_hh, yielded)
    return None


def _invariant(scan: ScanOp, value: Any) -> Any:
    """The scan operand a body value stands for, or None (a carry, the step's slice, a computed value)."""
    if isinstance(value, BlockArgument) and value.block is scan.body.block:
        return invariant_source(value)
    return None


def _is_float32(value: Any) -> bool:
    return isinstance(value.type, TensorType) and value.type.dtype is dtypes.float32


__all__ = ["CELLS", "Cell", "CellMatch", "match_cell", "matches", "op", "Op", "Linear", "LINEAR", "FLIP"]
