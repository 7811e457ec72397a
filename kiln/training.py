"""Training steps as programs: the forward pass, the loss, the backward pass and the optimizer's update traced into
one functional program (`export_train_step`), and `TrainStep`, which runs such a program (in the interpreter, or
compiled to C) and keeps the training state between calls.

In a train-step program every piece of state is a BUFFER input with a BUFFER_MUTATION output: the model's
parameters and buffers (`model.<name>`) and the optimizer's state (`optimizer.<name>.<key>`); the loss is the
LOSS_OUTPUT. So one call is one optimizer step, and torch's `ExportedProgram.module()` runs it the same way.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from kiln.frontend.nn.module import Module
from kiln.frontend.optim.optimizer import Optimizer
from kiln.frontend.tensor import Tensor
from kiln.frontend.tracing import Tracer, tracing
from kiln.ir.errors import KilnError
from kiln.ir.program import ExportedProgram, GraphBuilder, InputKind, OutputKind, OutputSpec, value_names
from kiln.ir.retrace import replay
from kiln.passes.autodiff import joint_program

__all__ = ["export_train_step", "compile_train_step", "TrainStep", "TrainStepError", "WithLoss"]


class TrainStepError(KilnError):
    """A training step that cannot be exported: an optimizer over tensors that are not the model's parameters."""


class WithLoss(Module):
    """`loss_fn(model(*inputs), target)` as one module taking `(*inputs, target)`: what a training step (or a joint
    program) exports."""

    def __init__(self, model: Module, loss_fn: Callable[..., Any]):
        super().__init__()
        self.model = model
        self._loss_fn = loss_fn

    def forward(self, *batch: Any) -> Any:
        *inputs, target = batch
        return self._loss_fn(self.model(*inputs), target)


def export_train_step(model: Module, loss_fn: Callable[[Any, Any], Any], optimizer: Optimizer,
                      args: Sequence[Any], *, dynamic_shapes: Any = None) -> ExportedProgram:
    """Trace `loss = loss_fn(model(*args[:-1]), args[-1]); loss.backward(); optimizer.step()` into one program.

    The optimizer's hyperparameters (lr, betas, ...) are baked in as they are now; its state is created first if
    it does not exist yet (as its first step would). The model and optimizer are left unchanged.
    """
    import kiln
    batch = tuple(Tensor(a) if isinstance(a, np.ndarray) else a for a in args)
    forward = kiln.export(WithLoss(model, loss_fn), batch, dynamic_shapes=dynamic_shapes)
    joint = joint_program(forward)

    parameter_names = {id(p): name for name, p in model.named_parameters()}
    optimized = [p for group in optimizer.param_groups for p in group["params"]]
    strangers = [i for i, p in enumerate(optimized) if id(p) not in parameter_names]
    if strangers:
        raise TrainStepError(f"the optimizer updates {len(strangers)} tensor(s) that are not parameters of the "
                             "model", fix="build the optimizer from model.parameters()")
    for group in optimizer.param_groups:
        for param in group["params"]:
            if not optimizer.state.get(param):
                optimizer._init_state(param, group)

    tracer = Tracer(joint.shape_env())
    builder = tracer.builder
    mapping: dict[Any, Any] = {}
    state_dict: dict[str, np.ndarray] = {}
    user_args = []
    for arg, spec in zip(joint.body.args, joint.graph_signature.input_specs):
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            mapping[arg] = builder.add_input(spec.name, arg.type, InputKind.BUFFER, spec.target, True)
            state_dict[spec.target] = joint.stored(spec.target)
        else:
            user_args.append((arg, spec))
    # The optimizer's state: buffers after the model's, before the user inputs (torch's input order).
    lifted: list[tuple[Tensor, Any, Any]] = []
    state_inputs: list[tuple[str, Tensor, Any]] = []
    for param in optimized:
        for key, value in optimizer.state[param].items():
            if not isinstance(value, Tensor):
                continue
            target = f"optimizer.{parameter_names[id(param)]}.{key}"
            from kiln.frontend.export import _type_of
            placeholder = builder.add_input("o_" + target.replace(".", "_"), _type_of(value), InputKind.BUFFER,
                                            target, True)
            state_dict[target] = np.array(value._value, copy=True)
            state_inputs.append((target, value, placeholder))
    for arg, spec in user_args:
        mapping[arg] = builder.add_input(spec.name, arg.type, spec.kind, spec.target, spec.persistent)
    joint_outputs = replay(joint.body, builder, mapping)

    by_kind: dict[OutputKind, list[tuple[OutputSpec, Any]]] = {}
    for spec, value in zip(joint.graph_signature.output_specs, joint_outputs):
        by_kind.setdefault(spec.kind, []).append((spec, value))
    gradients = {spec.target: value for spec, value in by_kind.get(OutputKind.GRADIENT_TO_PARAMETER, [])}
    inputs_by_target = {spec.target: value for value, spec in zip(mapping.values(), joint.graph_signature.input_specs)
                        if spec.target is not None}

    parameters = list(model.named_parameters())
    saved_grads = []
    try:
        for name, param in parameters:
            lifted.append((param, param._value, param._tracer))
            saved_grads.append((param, param._grad))
            param._value, param._tracer = inputs_by_target[f"model.{name}"], tracer
            param._grad = Tensor._traced(gradients[f"model.{name}"], tracer)
        for target, tensor, placeholder in state_inputs:
            lifted.append((tensor, tensor._value, tensor._tracer))
            tensor._value, tensor._tracer = placeholder, tracer
        with tracing(tracer):
            optimizer.step()
        returned, specs = [], []
        mutated_buffers = {spec.target: value for spec, value in by_kind.get(OutputKind.BUFFER_MUTATION, [])}
        for name, param in parameters:
            returned.append(_graph_value(param, tracer))
            specs.append(OutputSpec(OutputKind.BUFFER_MUTATION, "", f"model.{name}"))
        for target, value in mutated_buffers.items():
            returned.append(value)
            specs.append(OutputSpec(OutputKind.BUFFER_MUTATION, "", target))
        for target, tensor, placeholder in state_inputs:
            if tensor._value is not placeholder:
                returned.append(_graph_value(tensor, tracer))
                specs.append(OutputSpec(OutputKind.BUFFER_MUTATION, "", target))
        for spec, value in by_kind[OutputKind.LOSS_OUTPUT]:
            returned.append(value)
            specs.append(OutputSpec(OutputKind.LOSS_OUTPUT, ""))
    finally:
        for tensor, value, owner in lifted:
            tensor._value, tensor._tracer = value, owner
        for param, grad in saved_grads:
            param._grad = grad

    program = builder.build(returned, specs, state_dict=state_dict, constants={**joint.constants, **tracer.constants},
                            range_constraints=dict(joint.range_constraints))
    names = value_names(program.body)
    for spec, value in zip(program.graph_signature.output_specs, returned):
        spec.name = names[value]
    program.in_spec, program.out_spec = forward.in_spec, None
    program.verify()
    return program


def _graph_value(tensor: Tensor, tracer: Tracer) -> Any:
    from kiln.frontend.export import _as_graph_value
    return _as_graph_value(tensor, tracer)


def state_as_inputs(program: ExportedProgram) -> ExportedProgram:
    """The same computation with every BUFFER input a USER_INPUT (named by its target) and every output a
    USER_OUTPUT: what a runner that keeps the state itself (the C package) needs."""
    builder = GraphBuilder(program.shape_env())
    mapping = {}
    for arg, spec in zip(program.body.args, program.graph_signature.input_specs):
        name = spec.target if spec.kind is InputKind.BUFFER else spec.name
        kind = InputKind.USER_INPUT if spec.kind is InputKind.BUFFER else spec.kind
        mapping[arg] = builder.add_input(name.replace(".", "_") if kind is InputKind.USER_INPUT else name, arg.type,
                                         kind, None if kind is InputKind.USER_INPUT else spec.target,
                                         None if kind is InputKind.USER_INPUT else spec.persistent)
    outputs = replay(program.body, builder, mapping)
    lifted = builder.build(outputs, None, state_dict={}, constants=dict(program.constants),
                           range_constraints=dict(program.range_constraints))
    return lifted


class TrainStep:
    """Runs a train-step program one optimizer step per call, keeping the state (parameters, buffers, optimizer
    state) as numpy arrays between calls. `backend="c"` compiles it; `"interpreter"` runs the reference."""

    def __init__(self, program: ExportedProgram, backend: str = "c", *, num_threads: int | None = None):
        if backend not in ("c", "interpreter"):
            raise KilnError(f"unknown train-step backend {backend!r}", fix="use 'c' or 'interpreter'")
        self.program = program
        self.backend = backend
        signature = program.graph_signature
        self.state_names = [spec.target for spec in signature.input_specs if spec.kind is InputKind.BUFFER]
        self.state = {name: np.array(program.state_dict[name], copy=True) for name in self.state_names}
        self._outputs = [(spec.kind, spec.target) for spec in signature.output_specs]
        runnable = state_as_inputs(program)
        if backend == "c":
            import kiln
            self._run = kiln.compile(runnable, pipeline=_TRAINING_PIPELINE, num_threads=num_threads)
        else:
            self._run = runnable

    def __call__(self, *batch: Any) -> np.ndarray:
        """One step on `batch` (the model's inputs, then the target); returns the loss (before the update)."""
        arrays = [b.numpy() if isinstance(b, Tensor) else np.asarray(b) for b in batch]
        results = self._run(*[self.state[name] for name in self.state_names], *arrays)
        results = results if isinstance(results, (list, tuple)) else [results]
        loss = None
        for (kind, target), value in zip(self._outputs, results):
            if kind is OutputKind.BUFFER_MUTATION:
                self.state[target] = np.asarray(value)
            elif kind is OutputKind.LOSS_OUTPUT:
                loss = np.asarray(value)
        return loss

    def copy_to(self, model: Module, optimizer: Optimizer | None = None) -> None:
        """Write the trained state back into `model` (and `optimizer`'s state)."""
        named = dict(model.named_parameters())
        named.update(dict(model.named_buffers()))
        for name, param in named.items():
            value = self.state.get(f"model.{name}")
            if value is not None:
                param._value = np.array(value, copy=True)
        if optimizer is not None:
            names = {id(p): n for n, p in model.named_parameters()}
            for group in optimizer.param_groups:
                for param in group["params"]:
                    for key, tensor in optimizer.state.get(param, {}).items():
                        value = self.state.get(f"optimizer.{names[id(param)]}.{key}")
                        if value is not None and isinstance(tensor, Tensor):
                            tensor._value = np.array(value, copy=True)


# A training step's program is already core ATen: the inference pipeline's folds (eval batch norm, dropout) must not
# touch it, since it trains.
_TRAINING_PIPELINE = "decompose{namespaces=aten},canonicalize,cse,dce"


def compile_train_step(model: Module, loss_fn: Callable[[Any, Any], Any], optimizer: Optimizer, args: Sequence[Any],
                       *, backend: str = "c", dynamic_shapes: Any = None,
                       num_threads: int | None = None) -> TrainStep:
    """`export_train_step` then `TrainStep`: a training step that runs without Python between its ops."""
    return TrainStep(export_train_step(model, loss_fn, optimizer, args, dynamic_shapes=dynamic_shapes), backend,
                     num_threads=num_threads)
