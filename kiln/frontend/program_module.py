"""An exported program as a trainable kiln.nn.Module (torch's `ExportedProgram.module()`, which one can train).

Its parameters become Parameters and its buffers buffers, under their qualified names (`0.weight`), so
`named_parameters()` and `state_dict()` read like the original model's. Calling it runs the program's ops one by
one through `dispatch` on kiln Tensors, so eager autograd records them and kiln.optim can train it. Submodules may
be attached to values (`transform_value`) or to one use of a value (`transform_edge`): QAT's fake quantizers.
Like torch's `move_exported_model_to_eval`, `eval()` runs batch norm on its running statistics, turns dropout
off and leaves the running statistics as they are (other buffer updates, a KV cache's, still happen); `train()`
undoes it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from xdsl.dialects import func

from kiln.frontend.nn.module import Module
from kiln.frontend.tensor import Parameter, Tensor, dispatch
from kiln.ir.dialect import bound_arguments
from kiln.ir.errors import KilnError
from kiln.ir.interpreter import bind_symbols, concrete_value
from kiln.ir.program import ExportedProgram, InputKind, OutputKind, running_statistic_targets
from kiln.ir.pytree import tree_unflatten
from kiln.ir.registry import OpOverload, split_bound

__all__ = ["ProgramModule"]

# Ops whose `training` (or dropout's `train`) argument follows the module's mode, by argument name.
_MODE_ARGUMENTS = {"aten.batch_norm.default": "training", "aten.dropout.default": "train",
                   "aten.native_dropout.default": "train", "aten.feature_dropout.default": "train"}


class ProgramModule(Module):
    """`program` as a Module: call it like the exported model; train its parameters with kiln.optim."""

    def __init__(self, program: ExportedProgram):
        super().__init__()
        object.__setattr__(self, "program", program)
        object.__setattr__(self, "_inputs", [])  # per forward argument: ("user", None) or (kind, owner, name)
        object.__setattr__(self, "_value_transforms", {})  # SSA value -> submodule name
        object.__setattr__(self, "_edge_transforms", {})  # (SSA value, op) -> submodule name
        for arg, spec in zip(program.body.args, program.graph_signature.input_specs):
            if spec.kind is InputKind.USER_INPUT:
                self._inputs.append(("user", None, None))
                continue
            array = np.array(program.stored(spec.target), copy=True)
            owner, name = self._owner_of(spec.target)
            if spec.kind is InputKind.PARAMETER:
                owner.register_parameter(name, Parameter(array))
            elif spec.kind is InputKind.BUFFER:
                owner.register_buffer(name, Tensor(array), persistent=spec.persistent is not False)
            else:  # constants stay attributes outside the state dict, like torch's lifted constants
                object.__setattr__(owner, name, Tensor(array))
            self._inputs.append((spec.kind, owner, name))

    def _owner_of(self, target: str) -> tuple[Module, str]:
        """The submodule holding `target` (`layer1.0.weight` -> the module at layer1.0), created as needed."""
        *path, name = target.split(".")
        owner: Module = self
        for part in path:
            child = owner._modules.get(part)
            if child is None:
                child = Module()
                owner.add_module(part, child)
            owner = child
        return owner, name

    # -- transforms on values (QAT)
    def transform_value(self, value: Any, name: str, module: Module) -> None:
        """Every use of `value` (an SSA value of the program) sees `module(value)`."""
        if name not in self._modules:
            self.add_module(name, module)
        self._value_transforms[value] = name

    def transform_edge(self, value: Any, user: Any, name: str, module: Module) -> None:
        """Only `user` (an op of the program) sees `module(value)`."""
        if name not in self._modules:
            self.add_module(name, module)
        self._edge_transforms[(value, user)] = name

    # -- running
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        program = self.program
        if program.in_spec is not None:
            from kiln.ir.pytree import check_structure
            user = [a for i, a in enumerate(check_structure(program.in_spec, (tuple(args), dict(kwargs))))
                    if i not in program.input_constants]
        else:
            user = list(args)
        supplied = iter(Tensor(a) if isinstance(a, np.ndarray) else a for a in user)
        inputs: list[Any] = []
        for kind, owner, name in self._inputs:
            inputs.append(next(supplied) if kind == "user" else getattr(owner, name))
        bindings = bind_symbols(program, [t.numpy() if isinstance(t, Tensor) else np.asarray(t) for t in inputs])
        values: dict[Any, Any] = {}
        edge_cache: dict[tuple[Any, str], Any] = {}
        for arg, tensor in zip(program.body.args, inputs):
            values[arg] = self._transformed(arg, tensor)

        def operand(op: Any) -> Any:
            def resolve(value: Any) -> Any:
                name = self._edge_transforms.get((value, op))
                if name is None:
                    return values[value]
                key = (value, name)  # edges sharing one quantizer quantize a value once per call
                if key not in edge_cache:
                    edge_cache[key] = self._modules[name](values[value])
                return edge_cache[key]
            return resolve

        for op in program.body.ops:
            if isinstance(op, func.ReturnOp):
                returned = [values[v] for v in op.operands]
                break
            opdef = getattr(op, "opdef", None)
            if opdef is None:
                raise KilnError(f"{op.name} cannot run in a ProgramModule yet",
                                fix="export the model without control flow (kiln.cond / kiln.map) for training")
            arguments = [concrete_value(a, bindings) for a in bound_arguments(op, operand(op))]
            mode_argument = _MODE_ARGUMENTS.get(opdef.name)
            if mode_argument is not None:
                names = [a.name for a in opdef.schema.arguments]
                arguments[names.index(mode_argument)] = self.training
                if opdef.name == "aten.batch_norm.default" and not self.training and arguments[3] is None:
                    arguments[3], arguments[4] = self._running_statistics(op)
            positional, keywords = split_bound(opdef, arguments)
            result = dispatch(OpOverload(opdef), *positional, **keywords)
            flat = result if isinstance(result, (list, tuple)) else [result]
            flat = [v for item in flat for v in (item if isinstance(item, list) else [item])]
            for value, computed in zip(op.results, flat):
                values[value] = self._transformed(value, computed)
        else:
            raise KilnError("the program has no return")

        outputs = []
        # eval: running statistics stay as they are; other state (a KV cache) keeps its updates
        frozen = set() if self.training else self._running_statistic_targets()
        for spec, value in zip(program.graph_signature.output_specs, returned):
            if spec.kind is OutputKind.BUFFER_MUTATION:
                if spec.target not in frozen:
                    owner, name = self._owner_of(spec.target)
                    buffer = getattr(owner, name)
                    buffer._value = np.array(value.detach()._value if isinstance(value, Tensor) else value)
            elif spec.kind is OutputKind.USER_OUTPUT:
                outputs.append(value)
        if program.out_spec is not None:
            return tree_unflatten(outputs, program.out_spec)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _running_statistic_targets(self) -> set[str]:
        """The buffers that are batch norms' running statistics (updated in training mode only)."""
        found: set[str] = set()
        for op in self.program.body.ops:
            if getattr(getattr(op, "opdef", None), "name", None) == "aten.batch_norm.default":
                try:
                    found.update(running_statistic_targets(self.program, op))
                except KilnError:  # a batch norm exported in eval mode updates nothing
                    continue
        return found

    def _running_statistics(self, batch_norm: Any) -> tuple[Tensor, Tensor]:
        """A training-mode batch norm's running mean and variance buffers."""
        mean, variance = running_statistic_targets(self.program, batch_norm)
        return getattr(*self._owner_of(mean)), getattr(*self._owner_of(variance))

    def _transformed(self, value: Any, tensor: Any) -> Any:
        name = self._value_transforms.get(value)
        return tensor if name is None else self._modules[name](tensor)

    def current_state(self) -> dict[str, np.ndarray]:
        """The program's parameters and buffers as this module holds them now, by target (a state_dict for it)."""
        state = {}
        for (kind, owner, name), spec in zip(self._inputs, self.program.graph_signature.input_specs):
            if kind in (InputKind.PARAMETER, InputKind.BUFFER):
                state[spec.target] = np.array(getattr(owner, name).numpy(), copy=True)
        return state
