"""Reverse-mode autodiff on programs: the joint forward+backward program (torch's `_export_forward_backward`).

The forward ops are replayed into a new program, then visited in reverse; each op whose results carry a
gradient contributes its VJP rule's ops (the same rules eager autograd runs), and gradients meeting at a value
are summed. The joint program returns the forward's outputs, its loss marked LOSS_OUTPUT, then one
GRADIENT_TO_PARAMETER output per parameter (and GRADIENT_TO_USER_INPUT ones on request), as torch marks them.
"""

from __future__ import annotations

from typing import Any

from xdsl.dialects import func

from kiln.ir.autodiff import call_vjp, slot_names, tensor_slots
from kiln.ir.dialect import bound_arguments
from kiln.ir.errors import KilnError
from kiln.ir.meta import dtype_of, numel, shape_of
from kiln.ir.program import ExportedProgram, GraphBuilder, InputKind, OutputKind, OutputSpec, value_names
from kiln.ir.registry import ops
from kiln.ir.retrace import default_decompositions, replay, retrace
from kiln.ir.symbolic import sym_eq
from kiln.passes.base import Pass, option, register_pass

aten = ops.aten


class JointProgramError(KilnError):
    """The program cannot be differentiated as asked (no such loss, a non-scalar loss, control flow, ...)."""


def joint_program(program: ExportedProgram, joint_loss_index: int = 0, *,
                  input_gradients: bool = False) -> ExportedProgram:
    """The forward program plus its backward: d(loss)/d(parameter) for every parameter (zeros for parameters the
    loss does not use), and with `input_gradients` d(loss)/d(user input) for each floating user input."""
    from kiln.ir.control_flow import REGION_OPS

    signature = program.graph_signature
    user_positions = [i for i, spec in enumerate(signature.output_specs) if spec.kind is OutputKind.USER_OUTPUT]
    if not 0 <= joint_loss_index < len(user_positions):
        raise JointProgramError(f"joint_loss_index {joint_loss_index} is out of range: the program has "
                                f"{len(user_positions)} user outputs", fix="pass the index of the loss output")
    # Like torch's joint graphs, the joint program is in core ATen: composite ops without a rule of their own are
    # differentiated through their decompositions.
    program = retrace(program, {handle: fn for handle, fn in default_decompositions().items()
                                if handle.opdef.vjp is None})
    returned = list(program.body.last_op.operands)
    loss = returned[user_positions[joint_loss_index]]
    if not dtype_of(loss).is_floating_point or not sym_eq(numel(shape_of(loss)), 1):
        raise JointProgramError(f"the loss must be a floating tensor with one element, got {loss.type}",
                                fix="reduce the loss (e.g. .mean() or .sum()) before returning it")

    builder = GraphBuilder(program.shape_env())
    mapping: dict[Any, Any] = {}
    for arg, spec in zip(program.body.args, signature.input_specs):
        mapping[arg] = builder.add_input(spec.name, arg.type, spec.kind, spec.target, spec.persistent)
    outputs = replay(program.body, builder, mapping)

    gradients: dict[Any, Any] = {}
    with builder:
        gradients[loss] = aten.full_like.default(mapping[loss], 1.0)
        for op in reversed(list(program.body.ops)):
            if isinstance(op, func.ReturnOp):
                continue
            opdef = getattr(op, "opdef", None)
            frozen = opdef.nondifferentiable_outputs if opdef is not None else frozenset()
            output_grads = [None if i in frozen else gradients.get(result) for i, result in enumerate(op.results)]
            if all(g is None for g in output_grads):
                continue
            source = op.attributes.get("kiln.source")
            where = source.data if source is not None else None  # type: ignore[union-attr]
            if isinstance(op, REGION_OPS):
                raise JointProgramError(f"differentiating through {op.name} is not supported yet", source=where)
            if "nondifferentiable" in opdef.tags:
                continue
            builder.source = where
            slot_grads = call_vjp(opdef, output_grads, [mapping[r] for r in op.results],
                                  bound_arguments(op, mapping.__getitem__), source=where)
            arguments = bound_arguments(op)
            for old, name, gradient in zip(tensor_slots(opdef, arguments), slot_names(opdef, arguments), slot_grads):
                if old is None or gradient is None or name in opdef.nondifferentiable_arguments:
                    continue
                gradients[old] = gradient if old not in gradients else aten.add.Tensor(gradients[old], gradient)

    specs = [OutputSpec(s.kind, s.name, s.target) for s in signature.output_specs]
    specs[user_positions[joint_loss_index]].kind = OutputKind.LOSS_OUTPUT
    results = list(outputs)
    with builder:
        for arg, spec in zip(program.body.args, signature.input_specs):
            wanted = spec.kind is InputKind.PARAMETER or (
                input_gradients and spec.kind is InputKind.USER_INPUT and dtype_of(arg).is_floating_point)
            if not wanted:
                continue
            gradient = gradients.get(arg)
            results.append(gradient if gradient is not None else aten.full_like.default(mapping[arg], 0.0))
            kind = (OutputKind.GRADIENT_TO_PARAMETER if spec.kind is InputKind.PARAMETER
                    else OutputKind.GRADIENT_TO_USER_INPUT)
            specs.append(OutputSpec(kind, "", spec.target if spec.kind is InputKind.PARAMETER else spec.name))
    joint = builder.build(results, specs, program.state_dict, program.constants, dict(program.range_constraints))
    names = value_names(joint.body)
    for spec, value in zip(joint.graph_signature.output_specs, results):
        spec.name = names[value]
    joint.copy_annotations_from(program)
    joint.out_spec = None  # calling it returns the flat (outputs..., gradients...)
    joint.runtime_asserts = list(program.runtime_asserts)
    joint.verify()
    return joint


@register_pass
class JointBackward(Pass):
    """Append the backward of a loss output: the program then returns d(loss)/d(each parameter) as well."""

    name = "joint-backward"

    loss_index: int = option(0, "which user output is the loss (torch's joint_loss_index)")
    input_gradients: bool = option(False, "also return the gradient of each floating user input")

    def apply_program(self, program: ExportedProgram) -> ExportedProgram:
        return joint_program(program, self.loss_index, input_gradients=self.input_gradients)
