"""Control flow in the IR: `kiln.cond`, torch's `higher_order.cond` with both branches as regions.

Each region's block takes the cond's operands as arguments and ends with `kiln.yield`; the cond's results
are the yielded values of the branch its 0-d boolean predicate selects.
"""

from __future__ import annotations

from typing import Any, Sequence

from xdsl.ir import Attribute, Block, Region, SSAValue
from xdsl.irdl import (
    IRDLOperation, irdl_op_definition, operand_def, region_def, traits_def, var_operand_def, var_result_def,
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


def _short(value_type: Any) -> str:
    return value_type.short() if isinstance(value_type, TensorType) else str(value_type)


CONTROL_FLOW_OPS = [CondOp, YieldOp]
