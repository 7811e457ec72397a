"""Constant folding: ops whose inputs are all known are evaluated with the reference kernels; values that the
rest of the program still reads become CONSTANT_TENSOR inputs. Quantize/dequantize ops stay, so integer weights
stay integers. With `freeze`, parameters and buffers count as
known too (weights are then baked in, and the parameters they came from leave the signature). With `views=false`
a view of constants (a transpose, a reshape) that the program reads stays an op: a weight read both as it is and
transposed (GPT-2's tied embedding) is then stored once."""

from __future__ import annotations

from typing import Any

import numpy as np
import sympy
from xdsl.ir import Operation, SSAValue

from kiln.ir.dialect import bound_arguments
from kiln.ir.interpreter import run_op
from kiln.ir.program import ExportedProgram
from kiln.ir.types import TensorType
from kiln.passes.base import Pass, add_constant, erase_dead_program_ops, option, register_pass, weight_value


@register_pass
class FoldConstants(Pass):
    """Evaluate ops whose inputs are all constants and store their results as constants."""

    name = "fold-constants"

    freeze: bool = option(False, "treat parameters and buffers (not mutated ones) as constants too")
    views: bool = option(True, "store a view of constants (transpose, reshape) the program reads as a constant "
                               "of its own; false keeps it as an op over the stored value")

    def apply_program(self, program: ExportedProgram) -> ExportedProgram:
        known: dict[SSAValue, Any] = {}
        for arg in program.body.args:
            value = weight_value(program, arg, parameters=self.freeze)
            if value is not None:
                known[arg] = value
        folded: list[Operation] = []
        for op in program.body.ops:
            if _foldable(op, known):
                run_op(op, known, {})
                folded.append(op)
        folded_set = set(folded)
        if not self.views:  # (consumers first: a view read by a kept view is read too)
            for op in reversed(folded):
                if "view" in op.opdef.tags and any(use.operation not in folded_set
                                                   for result in op.results for use in result.uses):
                    folded_set.discard(op)
        for op in folded:
            if op not in folded_set:
                continue
            if not op.operands:
                continue  # a lone factory (full, arange) is cheaper as an op than as a stored weight
            for result in op.results:
                outside = [use for use in result.uses if use.operation not in folded_set]
                if not outside:
                    continue
                array = np.asarray(known[result], order="C")  # (ascontiguousarray makes a 0-d array 1-d)
                replacement = add_constant(program, array, _constant_name(op))
                for use in outside:
                    use.operation.operands[use.index] = replacement
        erase_dead_program_ops(program)
        return program


def _constant_name(op: Operation) -> str:
    """`h_0_attn_weight_permute` for permute(p_h_0_attn_weight): the weight it came from, then the op."""
    source = op.operands[0].name_hint or "folded"
    for prefix in ("p_", "b_", "c_"):
        source = source.removeprefix(prefix)
    return f"{source}_{op.opdef.schema.name}"  # type: ignore[attr-defined]


def _foldable(op: Operation, known: dict[SSAValue, Any]) -> bool:
    opdef = getattr(op, "opdef", None)
    if opdef is None or opdef.kernel is None or "random" in opdef.tags or op.regions:
        return False
    if "quantize" in opdef.tags:  # dequantize(int8 weight) is the quantized representation itself, as in torch
        return False
    if not all(isinstance(r.type, TensorType) and r.type.is_static for r in op.results):
        return False
    if not all(operand in known for operand in op.operands):
        return False
    return not any(_symbolic(argument) for argument in bound_arguments(op, lambda value: None))


def _symbolic(value: Any) -> bool:
    if isinstance(value, sympy.Expr):
        return bool(value.free_symbols)
    if isinstance(value, (list, tuple)):
        return any(_symbolic(v) for v in value)
    return False
