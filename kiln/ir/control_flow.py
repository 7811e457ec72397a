"""Control flow in the IR: region ops with the semantics of torch's higher-order ops.

`kiln.cond` (`higher_order.cond`): each branch's block takes the cond's operands as arguments and ends with
`kiln.yield`; the results are the yielded values of the branch its 0-d boolean predicate selects.
`kiln.map` (`higher_order.map_impl`): the body runs once per slice along the leading dim of the `xs`, with the
extra operands passed whole; the results are the yielded values stacked along a new leading dim.
"""

from __future__ import annotations

from typing import Any, Sequence

from xdsl.ir import Attribute, Block, Region, SSAValue
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
                    f"kiln.cond: the {label} branch yields {[_short(t) for t in yielded]} but the cond returns "
                    f"{[_short(r.type) for r in self.results]}",
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
        if not self.xs:
            raise VerificationError("kiln.map needs at least one tensor to map over",
                                    fix="pass the tensors to slice as xs")
        lengths = {x.type.shape[0] if x.type.ndim else None for x in self.xs}  # type: ignore[attr-defined]
        if None in lengths or len(lengths) != 1:
            raise VerificationError(f"kiln.map: the xs must share a leading dim, got "
                                    f"{[_short(x.type) for x in self.xs]}",
                                    fix="map over tensors with the same first dimension")
        block = self.body.block
        slices = [x.type.with_shape(x.type.shape[1:]) for x in self.xs]  # type: ignore[attr-defined]
        if [a.type for a in block.args] != [*slices, *(o.type for o in self.operands_)]:
            raise VerificationError("kiln.map: the body's arguments must be one slice of each x, then the operands")
        terminator = block.last_op
        if not isinstance(terminator, YieldOp):
            raise VerificationError("kiln.map: the body must end with kiln.yield")
        stacked = MapOp.stacked_types(self.xs, [v.type for v in terminator.values])
        if stacked != [r.type for r in self.results]:
            raise VerificationError(f"kiln.map: the body yields {[_short(v.type) for v in terminator.values]}, "
                                    f"which stack to {[_short(t) for t in stacked]}, but the map returns "
                                    f"{[_short(r.type) for r in self.results]}")


def _short(value_type: Any) -> str:
    return value_type.short() if isinstance(value_type, TensorType) else str(value_type)


CONTROL_FLOW_OPS = [CondOp, MapOp, YieldOp]
