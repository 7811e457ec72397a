"""`kiln.cond(pred, true_fn, false_fn, operands)`: data-dependent branching that exports, like torch.cond.

Eagerly it calls the chosen branch. While tracing, both branches are traced into the regions of one
`kiln.cond` op; tensors a branch uses from outside (parameters, closures) become extra operands.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from xdsl.dialects.builtin import StringAttr
from xdsl.ir import SSAValue

from kiln.frontend.tensor import Tensor
from kiln.frontend.tracing import Tracer, tracing, user_source_line
from kiln.ir.control_flow import CondOp, YieldOp
from kiln.ir.errors import KilnError
from kiln.ir.program import GraphBuilder
from kiln.ir.pytree import tree_flatten, tree_unflatten
from kiln.ir.types import TensorType


class _Captures:
    """Outer values the branches use; every branch block gets one argument per capture, in one order."""

    def __init__(self, parent: Tracer):
        self.parent = parent
        self.values: list[SSAValue] = []
        self.blocks: list[Any] = []

    def argument_for(self, outer: SSAValue, block: Any) -> SSAValue:
        if outer not in self.values:
            self.values.append(outer)
            for other in self.blocks:
                other.insert_arg(outer.type, len(other.args)).name_hint = outer.name_hint
        return block.args[self.operand_count + self.values.index(outer)]

    operand_count = 0


class _BranchTracer(Tracer):
    def __init__(self, parent: Tracer, captures: _Captures):
        super().__init__(parent.shape_env, strict=parent.strict)
        self.builder = GraphBuilder(parent.shape_env)
        self.parent, self.captures = parent, captures
        self.module_stack, self.module_paths = parent.module_stack, parent.module_paths
        self.example_values = parent.example_values

    def lift_constant(self, array: Any) -> SSAValue:
        return self.captures.argument_for(self.parent.lift_constant(array), self.builder.block)

    def value_of(self, tensor: Any) -> SSAValue:
        if tensor._tracer is self:
            return tensor._value
        if tensor._tracer is None:
            return self.lift_constant(tensor._value)
        return self.captures.argument_for(self.parent.value_of(tensor), self.builder.block)


def cond(pred: Any, true_fn: Callable[..., Any], false_fn: Callable[..., Any], operands: Sequence[Any] = ()) -> Any:
    operands = tuple(operands)
    if not isinstance(pred, Tensor):
        return (true_fn if bool(pred) else false_fn)(*operands)
    from kiln.frontend.tensor import _find_tracer
    tracer = _find_tracer((pred, *operands))
    if tracer is None:
        return (true_fn if bool(pred) else false_fn)(*operands)
    if pred.dim() != 0 or not pred.dtype.is_bool:
        raise KilnError(f"kiln.cond needs a 0-d bool tensor predicate, got {pred.dtype.name}{list(pred.shape)}",
                        source=user_source_line(), fix="reduce it first, e.g. pred = (x.sum() > 0)")
    for operand in operands:
        if not isinstance(operand, Tensor):
            raise KilnError(f"kiln.cond operands must be tensors, got {type(operand).__name__}",
                            source=user_source_line(), fix="close over non-tensor values in the branch functions")
    outer_operands = [tracer.value_of(o) for o in operands]
    captures = _Captures(tracer)
    captures.operand_count = len(operands)
    branches = []
    for fn in (true_fn, false_fn):
        branch = _BranchTracer(tracer, captures)
        block = branch.builder.block
        for value in [*outer_operands, *captures.values]:
            block.insert_arg(value.type, len(block.args)).name_hint = value.name_hint
        captures.blocks.append(block)
        inputs = [Tensor._traced(arg, branch) for arg in block.args[:len(operands)]]
        with tracing(branch):
            result = fn(*inputs)
        leaves, spec = tree_flatten(result)
        values = [branch.value_of(leaf) if isinstance(leaf, Tensor) else _refuse(leaf) for leaf in leaves]
        branches.append((branch, values, spec))
    (true_branch, true_values, true_spec), (false_branch, false_values, false_spec) = branches
    if true_spec != false_spec:
        raise KilnError(f"kiln.cond branches return different structures: {true_spec} vs {false_spec}",
                        source=user_source_line(), fix="return the same (nested) tuple of tensors from both")
    result_types = [v.type for v in true_values]
    if result_types != [v.type for v in false_values]:
        shown = [[t.short() for t in types if isinstance(t, TensorType)]
                 for types in (result_types, [v.type for v in false_values])]
        raise KilnError(f"kiln.cond branches return different shapes or dtypes: {shown[0]} vs {shown[1]}",
                        source=user_source_line(), fix="make both branches return tensors of the same type")
    true_branch.builder.block.add_op(YieldOp(true_values))
    false_branch.builder.block.add_op(YieldOp(false_values))
    op = CondOp(tracer.value_of(pred), [*outer_operands, *captures.values], result_types,
                true_branch.builder.block, false_branch.builder.block)
    source = user_source_line()
    if source:
        op.attributes["kiln.source"] = StringAttr(source)
    tracer.builder.block.add_op(op)
    for result in op.results:
        result.name_hint = "cond"
    return tree_unflatten([Tensor._traced(r, tracer) for r in op.results], true_spec)


def _refuse(leaf: Any) -> Any:
    raise KilnError(f"kiln.cond branches must return tensors, got {type(leaf).__name__}",
                    source=user_source_line())
