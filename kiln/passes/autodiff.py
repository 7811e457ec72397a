"""Reverse-mode autodiff on programs: the joint forward+backward program (torch's `_export_forward_backward`).

The forward ops are replayed into a new program, then visited in reverse; each op whose results carry a
gradient contributes its VJP rule's ops (the same rules eager autograd runs), and gradients meeting at a value
are summed. The joint program returns the forward's outputs, its loss marked LOSS_OUTPUT, then one
GRADIENT_TO_PARAMETER output per parameter (and GRADIENT_TO_USER_INPUT ones on request), as torch marks them.
"""

from __future__ import annotations

from typing import Any


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
        backpropagate(list(program.body.ops)[:-1], mapping, gradients, builder)

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


def backpropagate(forward_ops: list[Any], mapping: dict[Any, Any], gradients: dict[Any, Any],
                  builder: GraphBuilder) -> None:
    """Visit `forward_ops` in reverse, adding each one's VJP ops to `builder` (the current emitter): `gradients`
    maps the forward's values to their gradients (new values), `mapping` the forward's values to the new ones."""
    from kiln.ir.control_flow import REGION_OPS, ScanOp

    for op in reversed(forward_ops):
        opdef = getattr(op, "opdef", None)
        frozen = opdef.nondifferentiable_outputs if opdef is not None else frozenset()
        output_grads = [None if i in frozen else gradients.get(result) for i, result in enumerate(op.results)]
        if all(g is None for g in output_grads):
            continue
        source = op.attributes.get("kiln.source")
        where = source.data if source is not None else None  # type: ignore[union-attr]
        if isinstance(op, ScanOp):
            _scan_vjp(op, output_grads, mapping, gradients, builder, where)
            continue
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
            _accumulate(gradients, old, gradient)


def _accumulate(gradients: dict[Any, Any], value: Any, gradient: Any) -> None:
    gradients[value] = gradient if value not in gradients else aten.add.Tensor(gradients[value], gradient)


def _scan_vjp(op: Any, output_grads: list[Any], mapping: dict[Any, Any], gradients: dict[Any, Any],
              builder: GraphBuilder, where: str | None) -> None:
    """The VJP of a scan is a scan backwards over the steps, recomputing each step's forward (torch's approach).
    A first scan recomputes the carry entering every step; the backward scan then carries the carries' gradients
    and the operands' accumulated gradients, and at each step replays the body on that step's carry and runs the
    body's own VJP, seeded with the next carry's and the step output's gradients."""
    from kiln.ir.control_flow import ScanOp, YieldOp

    values = [*op.init, *op.xs, *op.results]
    if not all(dtype_of(v).is_floating_point for v in values):
        raise JointProgramError("differentiating through a kiln.scan with integer carries, xs or outputs is not "
                                "supported yet", source=where)
    count, block = len(op.init), op.body.block
    init, xs = [mapping[v] for v in op.init], [mapping[v] for v in op.xs]
    operands = [mapping[v] for v in op.operands_]
    differentiable = [i for i, v in enumerate(op.operands_) if dtype_of(v).is_floating_point]
    seeds = [g if g is not None else aten.zeros_like.default(mapping[r]) for g, r in zip(output_grads, op.results)]

    # the carry entering each step, stacked: the body replayed, yielding its incoming carries as extra outputs
    recompute = GraphBuilder(builder.shape_env)
    arguments = [recompute.add_input(a.name_hint or "arg", t)
                 for a, t in zip(block.args, ScanOp.body_arg_types(init, xs, operands))]
    yielded = replay(block, recompute, dict(zip(block.args, arguments)))
    recompute.block.add_op(YieldOp([*yielded, *arguments[:count]]))
    forward = ScanOp(init, xs, operands, ScanOp.result_types_for(init, xs, [v.type for v in (*yielded,
                                                                                               *arguments[:count])]),
                     recompute.block)
    builder.block.add_op(forward)
    entering = list(forward.results[len(op.results):])

    # the backward scan over the reversed steps
    flip = [aten.flip.default(v, [0]) for v in (*entering, *xs, *seeds[count:])]
    accumulators = [aten.zeros_like.default(operands[i]) for i in differentiable]
    backward = GraphBuilder(builder.shape_env)
    carried = [backward.add_input("grad_carry", v.type) for v in (*seeds[:count], *accumulators)]
    slices = [backward.add_input("step", v.type.with_shape(v.type.shape[1:])) for v in flip]
    outer = [backward.add_input(a.name_hint or "operand", a.type) for a in operands]
    step_carries, step_xs, step_grads = slices[:count], slices[count:count + len(xs)], slices[count + len(xs):]
    inner = dict(zip(block.args, [*step_carries, *step_xs, *outer]))
    with backward:
        replay(block, backward, inner)  # the step's forward values, which the body's VJP reads
        body_grads: dict[Any, Any] = {}
        for value, gradient in zip(block.last_op.operands, [*carried[:count], *step_grads]):
            _accumulate(body_grads, value, gradient)
        backpropagate(list(block.ops)[:-1], inner, body_grads, backward)

        def grad_of(arg: Any) -> Any:
            found = body_grads.get(arg)
            return found if found is not None else aten.zeros_like.default(inner[arg])
        carry_args, x_args, operand_args = (block.args[:count], block.args[count:count + len(xs)],
                                            block.args[count + len(xs):])
        next_carried = [grad_of(a) for a in carry_args]
        next_accumulated = [aten.add.Tensor(acc, grad_of(operand_args[i]))
                            for acc, i in zip(carried[count:], differentiable)]
        x_grads = [grad_of(a) for a in x_args]
    backward.block.add_op(YieldOp([*next_carried, *next_accumulated, *x_grads]))
    initial = [*seeds[:count], *accumulators]
    reverse = ScanOp(initial, flip, operands,
                     ScanOp.result_types_for(initial, flip, [v.type for v in (*next_carried, *next_accumulated,
                                                                                 *x_grads)]),
                     backward.block)
    builder.block.add_op(reverse)
    results = list(reverse.results)
    for value, gradient in zip(op.init, results[:count]):
        _accumulate(gradients, value, gradient)
    for i, gradient in zip(differentiable, results[count:count + len(differentiable)]):
        _accumulate(gradients, op.operands_[i], gradient)
    for value, gradient in zip(op.xs, results[count + len(differentiable):]):
        _accumulate(gradients, value, aten.flip.default(gradient, [0]))


@register_pass
class JointBackward(Pass):
    """Append the backward of a loss output: the program then returns d(loss)/d(each parameter) as well."""

    name = "joint-backward"

    loss_index: int = option(0, "which user output is the loss (torch's joint_loss_index)")
    input_gradients: bool = option(False, "also return the gradient of each floating user input")

    def apply_program(self, program: ExportedProgram) -> ExportedProgram:
        return joint_program(program, self.loss_index, input_gradients=self.input_gradients)
