"""Control flow in the IR: region ops with the semantics of torch's higher-order ops.

`kiln.cond` (`higher_order.cond`): each branch's block takes the cond's operands as arguments and ends with
`kiln.yield`; the results are the yielded values of the branch its 0-d boolean predicate selects.
`kiln.map` (`higher_order.map_impl`): the body runs once per slice along the leading dim of the `xs`, with the
extra operands passed whole; the results are the yielded values stacked along a new leading dim.
`kiln.scan` (`higher_order.scan`): a carry threaded through one step per leading-dim slice of the `xs`; the body
takes (carries, slices, operands) and yields (next carries, per-step outputs); the results are the final carries
then the per-step outputs stacked along a new leading dim (the trip count, symbolic when the xs' dim is).
`kiln.while_loop` (`higher_order.while_loop`): carried values updated by the body region while the cond region
(a 0-d bool) holds; both take (carried, operands). The carried values keep their types across iterations.
"""

from __future__ import annotations

from typing import Any, Sequence

from xdsl.dialects.builtin import DenseArrayBase, i32
from xdsl.ir import Attribute, Block, BlockArgument, Operation, Region, SSAValue
from xdsl.irdl import (
    AttrSizedOperandSegments, IRDLOperation, irdl_op_definition, operand_def, region_def, traits_def,
    var_operand_def, var_result_def,
)
from xdsl.traits import IsTerminator

from kiln.ir.errors import VerificationError
from kiln.ir.types import TensorType


@irdl_op_definition
class YieldOp(IRDLOperation):
    name = "kiln.yield"
    values = var_operand_def()
    traits = traits_def(IsTerminator())

    def __init__(self, values: Sequence[SSAValue]):
        super().__init__(operands=[list(values)])


@irdl_op_definition
class CondOp(IRDLOperation):
    """`results = cond(pred, true_region, false_region, operands)`."""

    name = "kiln.cond"
    pred = operand_def(TensorType)
    operands_ = var_operand_def()
    results_ = var_result_def()
    true_region = region_def("single_block")
    false_region = region_def("single_block")

    def __init__(self, pred: SSAValue, operands: Sequence[SSAValue], result_types: Sequence[Attribute],
                 true_block: Block, false_block: Block):
        super().__init__(operands=[pred, list(operands)], result_types=[list(result_types)],
                         regions=[Region(true_block), Region(false_block)])

    def verify_(self) -> None:
        pred_type = self.pred.type
        if not isinstance(pred_type, TensorType) or pred_type.ndim != 0 or not pred_type.dtype.is_bool:
            raise VerificationError(f"kiln.cond: the predicate must be a 0-d bool tensor, got {pred_type}")
        for label, region in (("true", self.true_region), ("false", self.false_region)):
            block = region.block
            if [a.type for a in block.args] != [o.type for o in self.operands_]:
                raise VerificationError(f"kiln.cond: the {label} branch's arguments do not match the operands")
            terminator = block.last_op
            if not isinstance(terminator, YieldOp):
                raise VerificationError(f"kiln.cond: the {label} branch must end with kiln.yield")
            yielded = [v.type for v in terminator.values]
            if yielded != [r.type for r in self.results]:
                raise VerificationError(
                    f"kiln.cond: the {label} branch yields {_shorts(yielded)} but the cond returns "
                    f"{_shorts([r.type for r in self.results])}",
                    fix="make both branches return tensors of the same shapes and dtypes")


@irdl_op_definition
class MapOp(IRDLOperation):
    """`results = map(body, xs, operands)`: `stack([body(*[x[i] for x in xs], *operands) for i in range(n)])`,
    n being the leading dim the xs share."""

    name = "kiln.map"
    xs = var_operand_def(TensorType)
    operands_ = var_operand_def()
    results_ = var_result_def()
    body = region_def("single_block")
    irdl_options = (AttrSizedOperandSegments(as_property=True),)

    def __init__(self, xs: Sequence[SSAValue], operands: Sequence[SSAValue], result_types: Sequence[Attribute],
                 body: Block):
        super().__init__(operands=[list(xs), list(operands)], result_types=[list(result_types)],
                         regions=[Region(body)])

    @staticmethod
    def stacked_types(xs: Sequence[SSAValue], yielded: Sequence[Attribute]) -> list[Attribute]:
        """The body's yielded types, stacked along the xs' leading dim."""
        length = xs[0].type.shape[0]  # type: ignore[attr-defined]
        return [t.with_shape([length, *t.shape]) if isinstance(t, TensorType) else t for t in yielded]

    def verify_(self) -> None:
        _check_leading_dims("kiln.map", self.xs)
        block = self.body.block
        slices = [x.type.with_shape(x.type.shape[1:]) for x in self.xs]  # type: ignore[attr-defined]
        if [a.type for a in block.args] != [*slices, *(o.type for o in self.operands_)]:
            raise VerificationError("kiln.map: the body's arguments must be one slice of each x, then the operands")
        yielded = _yielded("kiln.map", block)
        stacked = MapOp.stacked_types(self.xs, yielded)
        if stacked != [r.type for r in self.results]:
            raise VerificationError(f"kiln.map: the body yields {_shorts(yielded)}, "
                                    f"which stack to {_shorts(stacked)}, but the map returns "
                                    f"{_shorts([r.type for r in self.results])}")


@irdl_op_definition
class ScanOp(IRDLOperation):
    """`carries..., ys... = scan(body, init, xs, operands)`: torch's scan HOP with `dim=0, reverse=False` (the
    frontend moves and flips dims around it, as torch's `scan` does before its HOP)."""

    name = "kiln.scan"
    init = var_operand_def(TensorType)
    xs = var_operand_def(TensorType)
    operands_ = var_operand_def()
    results_ = var_result_def()
    body = region_def("single_block")
    irdl_options = (AttrSizedOperandSegments(as_property=True),)

    def __init__(self, init: Sequence[SSAValue], xs: Sequence[SSAValue], operands: Sequence[SSAValue],
                 result_types: Sequence[Attribute], body: Block):
        super().__init__(operands=[list(init), list(xs), list(operands)], result_types=[list(result_types)],
                         regions=[Region(body)])

    @staticmethod
    def body_arg_types(init: Sequence[SSAValue], xs: Sequence[SSAValue],
                       operands: Sequence[SSAValue]) -> list[Attribute]:
        """The body's arguments: each carry, one slice of each x, then the operands."""
        return [*(v.type for v in init), *(x.type.with_shape(x.type.shape[1:]) for x in xs),  # type: ignore
                *(o.type for o in operands)]

    @staticmethod
    def result_types_for(init: Sequence[SSAValue], xs: Sequence[SSAValue],
                         yielded: Sequence[Attribute]) -> list[Attribute]:
        """The carries' types, then the per-step outputs stacked along the xs' leading dim."""
        return [*(v.type for v in init), *MapOp.stacked_types(xs, yielded[len(init):])]

    @property
    def carries(self) -> list[SSAValue]:
        return list(self.results[:len(self.init)])

    @property
    def stacked(self) -> list[SSAValue]:
        return list(self.results[len(self.init):])

    def verify_(self) -> None:
        _check_leading_dims("kiln.scan", self.xs)
        block = self.body.block
        if [a.type for a in block.args] != ScanOp.body_arg_types(self.init, self.xs, self.operands_):
            raise VerificationError("kiln.scan: the body's arguments must be the carries, one slice of each x, "
                                    "then the operands")
        yielded = _yielded("kiln.scan", block)
        carried = [v.type for v in self.init]
        if yielded[:len(carried)] != carried:
            raise VerificationError(f"kiln.scan: the body yields carries {_shorts(yielded[:len(carried)])}"
                                    f" but the initial carries are {_shorts(carried)}",
                                    fix="return a next carry with the initial carry's shape and dtype")
        expected = ScanOp.result_types_for(self.init, self.xs, yielded)
        if expected != [r.type for r in self.results]:
            raise VerificationError(f"kiln.scan: the body's yields make {_shorts(expected)}, but the scan "
                                    f"returns {_shorts([r.type for r in self.results])}")


@irdl_op_definition
class WhileLoopOp(IRDLOperation):
    """`carried... = while_loop(cond, body, carried, operands)`: torch's while_loop HOP."""

    name = "kiln.while_loop"
    carried = var_operand_def(TensorType)
    operands_ = var_operand_def()
    results_ = var_result_def()
    cond_region = region_def("single_block")
    body = region_def("single_block")
    irdl_options = (AttrSizedOperandSegments(as_property=True),)

    def __init__(self, carried: Sequence[SSAValue], operands: Sequence[SSAValue], cond_block: Block,
                 body: Block):
        super().__init__(operands=[list(carried), list(operands)], result_types=[[v.type for v in carried]],
                         regions=[Region(cond_block), Region(body)])

    def verify_(self) -> None:
        arg_types = [v.type for v in (*self.carried, *self.operands_)]
        carried = [v.type for v in self.carried]
        for label, region in (("cond", self.cond_region), ("body", self.body)):
            if [a.type for a in region.block.args] != arg_types:
                raise VerificationError(f"kiln.while_loop: the {label} region's arguments must be the carried "
                                        "values, then the operands")
        predicate = _yielded("kiln.while_loop", self.cond_region.block)
        if len(predicate) != 1 or not isinstance(predicate[0], TensorType) or predicate[0].ndim != 0 \
                or not predicate[0].dtype.is_bool:
            raise VerificationError(f"kiln.while_loop: the cond region must yield one 0-d bool tensor, got "
                                    f"{_shorts(predicate)}", fix="return e.g. (i < n) from cond_fn")
        yielded = _yielded("kiln.while_loop", self.body.block)
        if yielded != carried:
            raise VerificationError(f"kiln.while_loop: the body yields {_shorts(yielded)} but the "
                                    f"carried values are {_shorts(carried)}",
                                    fix="return values of the carried values' shapes and dtypes from body_fn")
        if [r.type for r in self.results] != carried:
            raise VerificationError("kiln.while_loop: the results must have the carried values' types")


# ---------------------------------------------------------------------------------------------
# Loop invariants: every region's block ends with one argument per `operands_` entry of its op, in order (the
# values the region reads from outside, torch's `additional_inputs`).

REGION_OPS = (CondOp, MapOp, ScanOp, WhileLoopOp)


def invariant_source(value: SSAValue) -> SSAValue | None:
    """The outer value a region's block argument stands for, when it is one of its op's `operands_`; else None."""
    if not isinstance(value, BlockArgument):
        return None
    op = value.block.parent_op()
    if not isinstance(op, REGION_OPS):
        return None
    first = len(value.block.args) - len(op.operands_)
    return op.operands_[value.index - first] if value.index >= first else None


def outermost_source(value: SSAValue) -> SSAValue:
    """`value`, or what it stands for outside every region it is an invariant operand of."""
    while (outer := invariant_source(value)) is not None:
        value = outer
    return value


def pass_down(value: SSAValue, block: Block) -> SSAValue:
    """`value`, defined in a block enclosing `block`, as `block` sees it: passed through each region op between
    them as an invariant operand (an existing one when the op already takes it, else a new one, which every region
    of the op gets an argument for)."""
    home = value.block if isinstance(value, BlockArgument) else value.owner.parent_block()
    chain: list[tuple[Operation, Block]] = []
    while block is not home:
        op = block.parent_op()
        if op is None:
            raise VerificationError("pass_down: the value is not defined in a block enclosing the target block")
        chain.append((op, block))
        block = op.parent_block()
    for op, inner in reversed(chain):
        value = _invariant_argument(op, value, inner)
    return value


def _invariant_argument(op: Any, outer: SSAValue, block: Block) -> BlockArgument:
    operands = list(op.operands_)
    if outer not in operands:
        _set_invariants(op, [*operands, outer])
        for region in op.regions:
            region.block.insert_arg(outer.type, len(region.block.args)).name_hint = outer.name_hint
        operands.append(outer)
    return block.args[len(block.args) - len(operands) + operands.index(outer)]


def drop_unused_invariants(op: Operation) -> int:
    """Remove the invariant operands that no region of `op` reads (e.g. a weight a rewrite replaced by a folded
    constant); returns how many."""
    if not isinstance(op, REGION_OPS):
        return 0
    operands = list(op.operands_)
    count = len(operands)
    read = [any(region.block.args[len(region.block.args) - count + index].uses for region in op.regions)
            for index in range(count)]
    if all(read):
        return 0
    for region in op.regions:
        block = region.block
        unread = [arg for arg, kept in zip(block.args[len(block.args) - count:], read) if not kept]
        for arg in unread:
            block.erase_arg(arg)
    _set_invariants(op, [value for value, kept in zip(operands, read) if kept])
    return read.count(False)


def _set_invariants(op: Any, invariants: list[SSAValue]) -> None:
    """Replace `op.operands_` (its last operand group) by `invariants`."""
    first = len(op.operands) - len(op.operands_)
    segments = op.properties.get("operandSegmentSizes")
    op.operands = [*op.operands[:first], *invariants]
    if segments is not None:
        sizes = [int(size) for size in segments.get_values()]
        op.properties["operandSegmentSizes"] = DenseArrayBase.from_list(i32, [*sizes[:-1], len(invariants)])


def _check_leading_dims(op_name: str, xs: Sequence[SSAValue]) -> None:
    if not xs:
        raise VerificationError(f"{op_name} needs at least one tensor to slice", fix="pass the tensors to slice as xs")
    lengths = {x.type.shape[0] if x.type.ndim else None for x in xs}  # type: ignore[attr-defined]
    if None in lengths or len(lengths) != 1:
        raise VerificationError(f"{op_name}: the xs must share a leading dim, got {_shorts([x.type for x in xs])}",
                                fix="slice tensors with the same first dimension")


def _yielded(op_name: str, block: Block) -> list[Attribute]:
    terminator = block.last_op
    if not isinstance(terminator, YieldOp):
        raise VerificationError(f"{op_name}: each region must end with kiln.yield")
    return [v.type for v in terminator.values]


def _short(value_type: Any) -> str:
    return value_type.short() if isinstance(value_type, TensorType) else str(value_type)


def _shorts(value_types: Sequence[Any]) -> str:
    """`[f32[batch, 4], i64[]]`, as the frontend's errors write types."""
    return "[" + ", ".join(_short(t) for t in value_types) + "]"


CONTROL_FLOW_OPS = [CondOp, MapOp, ScanOp, WhileLoopOp, YieldOp]
REGION_OPS = (CondOp, MapOp, ScanOp, WhileLoopOp)
"""The ops that carry regions: pure (removable when unused) and run by the interpreter."""
