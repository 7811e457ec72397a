"""ExportedProgram: an xDSL module with one `func.func @forward`, its graph signature, weights and ranges.

Mirrors torch.export.ExportedProgram: inputs are lifted parameters, buffers, constants and user inputs
(`InputSpec`), outputs are user outputs and mutations (`OutputSpec`); weights live in `state_dict` and
`constants`, never in the IR. GraphBuilder records ops into a new program through the op handles.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from enum import Enum
from typing import Any, Iterator, Sequence

import numpy as np
import sympy
from xdsl.dialects import func
from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, ModuleOp, StringAttr, UnitAttr
from xdsl.ir import Block, Region, SSAValue
from xdsl.irdl import IRDLOperation

from kiln.ir import dtypes
from kiln.ir.errors import InputError, KilnError, ParseError, VerificationError
from kiln.ir.registry import OpDef, emitting, run_meta
from kiln.ir.symbolic import Guard, ShapeEnv, ValueRange, active_shape_env, format_dim, guard_source, parse_dim
from kiln.ir.types import ScalarType, SymIntType, TensorType


class InputKind(Enum):
    USER_INPUT = "USER_INPUT"
    PARAMETER = "PARAMETER"
    BUFFER = "BUFFER"
    CONSTANT_TENSOR = "CONSTANT_TENSOR"
    CUSTOM_OBJ = "CUSTOM_OBJ"
    TOKEN = "TOKEN"


class OutputKind(Enum):
    USER_OUTPUT = "USER_OUTPUT"
    BUFFER_MUTATION = "BUFFER_MUTATION"
    USER_INPUT_MUTATION = "USER_INPUT_MUTATION"
    LOSS_OUTPUT = "LOSS_OUTPUT"
    GRADIENT_TO_PARAMETER = "GRADIENT_TO_PARAMETER"
    GRADIENT_TO_USER_INPUT = "GRADIENT_TO_USER_INPUT"
    TOKEN = "TOKEN"


@dataclass
class InputSpec:
    kind: InputKind
    name: str  # the graph argument's name (`p_weight`)
    target: str | None = None  # the state-dict key (`weight`) for parameters, buffers and constants
    persistent: bool | None = None  # buffers only


@dataclass
class OutputSpec:
    kind: OutputKind
    name: str
    target: str | None = None  # the mutated buffer or input


@dataclass
class ExportGraphSignature:
    input_specs: list[InputSpec]
    output_specs: list[OutputSpec]

    @property
    def user_inputs(self) -> list[str]:
        return [s.name for s in self.input_specs if s.kind is InputKind.USER_INPUT]

    @property
    def user_outputs(self) -> list[str]:
        return [s.name for s in self.output_specs if s.kind is OutputKind.USER_OUTPUT]

    @property
    def parameters(self) -> list[str]:
        return [s.target for s in self.input_specs if s.kind is InputKind.PARAMETER]  # type: ignore[misc]

    @property
    def buffers(self) -> list[str]:
        return [s.target for s in self.input_specs if s.kind is InputKind.BUFFER]  # type: ignore[misc]

    @property
    def inputs_to_parameters(self) -> dict[str, str]:
        return {s.name: s.target for s in self.input_specs if s.kind is InputKind.PARAMETER}  # type: ignore

    @property
    def inputs_to_buffers(self) -> dict[str, str]:
        return {s.name: s.target for s in self.input_specs if s.kind is InputKind.BUFFER}  # type: ignore

    @property
    def buffers_to_mutate(self) -> dict[str, str]:
        return {s.name: s.target for s in self.output_specs  # type: ignore[misc]
                if s.kind is OutputKind.BUFFER_MUTATION}

    def __str__(self) -> str:
        lines = ["    # inputs"]
        for spec in self.input_specs:
            extra = f" target='{spec.target}'" if spec.target else ""
            if spec.persistent is not None and spec.kind is InputKind.BUFFER:
                extra += f" persistent={spec.persistent}"
            lines.append(f"    {spec.name}: {spec.kind.value}{extra}")
        lines += ["", "    # outputs"]
        for spec in self.output_specs:
            extra = f" target='{spec.target}'" if spec.target else ""
            lines.append(f"    {spec.name}: {spec.kind.value}{extra}")
        return "\n".join(lines)


@functools.lru_cache(maxsize=4096)
def _sanitize(name: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return name if name and not name[0].isdigit() else f"_{name}"


def value_names(block: Block) -> dict[SSAValue, str]:
    """The names xDSL's printer gives the block's values: the hint, then `hint_1`, `hint_2`, ... in order.

    xDSL strips a trailing `_<digits>` from hints, so this (not `name_hint`) is the one naming authority
    shared by the MLIR text, torch.export's printed form and the graph signature.
    """
    names: dict[SSAValue, str] = {}
    counters: dict[str, int] = {}
    anonymous = 0

    def assign(value: SSAValue) -> None:
        nonlocal anonymous
        hint = value.name_hint
        if hint is None:
            names[value] = str(anonymous)
            anonymous += 1
            return
        count = counters.get(hint, 0)
        names[value] = hint if count == 0 else f"{hint}_{count}"
        counters[hint] = count + 1

    def walk(inner: Block) -> None:  # the printer's order: results, then nested regions
        for arg in inner.args:
            assign(arg)
        for op in inner.ops:
            for result in op.results:
                assign(result)
            for region in op.regions:
                for nested in region.blocks:
                    walk(nested)

    walk(block)
    return names


@dataclass
class ModuleCallSignature:
    """How a submodule was called inside forward (torch's ModuleCallSignature): the graph values it took
    and returned, and the pytree specs of its arguments and results."""

    inputs: list[str]
    outputs: list[str]
    in_spec: Any = None
    out_spec: Any = None
    forward_arg_names: list[str] | None = None  # the root's: torch names the unlifted module's parameters so


@dataclass
class ModuleCallEntry:
    fqn: str  # "" for the exported module itself
    signature: ModuleCallSignature | None = None


_REQUIRED = object()  # `stored` without a default: a missing target raises


class ExportedProgram:
    """A functional ATen program with symbolic shapes, plus everything needed to run it."""

    def __init__(self, module: ModuleOp, graph_signature: ExportGraphSignature,
                 state_dict: dict[str, np.ndarray] | None = None,
                 range_constraints: dict[sympy.Symbol, ValueRange] | None = None,
                 constants: dict[str, np.ndarray] | None = None,
                 in_spec: Any = None, out_spec: Any = None):
        self.graph_module = module
        self.graph_signature = graph_signature
        self.state_dict = dict(state_dict or {})
        self.constants = dict(constants or {})
        self.range_constraints = dict(range_constraints or {})
        self.in_spec, self.out_spec = in_spec, out_spec
        self.input_constants: dict[int, Any] = {}  # non-tensor inputs baked in at export, by leaf index
        # The root entry, then one per submodule named in export's preserve_module_call_signature.
        self.module_call_graph: list[ModuleCallEntry] = [ModuleCallEntry("")]
        # Notes on where the program came from, e.g. metadata["skipped"]: the files kiln.load did not read, and why.
        self.metadata: dict[str, Any] = {}
        # (args, kwargs) it was exported with, like torch's ExportedProgram.example_inputs: kiln.save writes them for
        # torch's tools (AOTInductor needs them); kiln.load leaves None, since it never unpickles them.
        self.example_inputs: tuple[tuple, dict] | None = None
        # The example value of each input symbol (torch's ShapeEnv `var_to_val`): meta rules decide what the ranges
        # leave open the way the export did.
        self.hints: dict[sympy.Symbol, int] = {}
        # Conditions on the symbols the program assumes and every runner checks (torch's `_assert_scalar` nodes):
        # relations torch asserted (`u0 <= s0`) and the guards kiln decided from hints where it could not prove them.
        self.runtime_asserts: list[Guard] = []

    # -- structure
    @property
    def graph(self) -> func.FuncOp:
        for op in self.graph_module.ops:
            if isinstance(op, func.FuncOp) and op.sym_name.data == "forward":
                return op
        raise VerificationError("program has no func.func @forward")

    @property
    def body(self) -> Block:
        return self.graph.body.block

    def nodes(self) -> Iterator[IRDLOperation]:
        """The aten ops of forward, in order (the return excluded)."""
        for op in self.body.ops:
            if not isinstance(op, func.ReturnOp):
                yield op  # type: ignore[misc]

    def walk_nodes(self) -> Iterator[IRDLOperation]:
        """The ops of forward and of the regions inside it (loop bodies, cond branches), in program order: a region
        op comes before the ops of its regions."""
        return (op for op in self.body.walk()  # type: ignore[misc]
                if not isinstance(op, func.ReturnOp) and op.name != "kiln.yield")

    def op_histogram(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for op in self.nodes():
            counts[op.name] = counts.get(op.name, 0) + 1
        return counts

    def shape_env(self, hints: bool = True) -> ShapeEnv:
        """A ShapeEnv holding the program's symbols, ranges, hints and runtime assertions (as facts). Without
        hints it decides only what holds over the whole ranges, as code for every size must."""
        env = ShapeEnv()
        for sym, value_range in self.range_constraints.items():
            if isinstance(sym, sympy.Symbol):  # derived entries (`s0 + 1`) follow from their symbols
                env.create_symbol(self.hints.get(sym) if hints else None, name=str(sym), min=value_range.lower,
                                  max=value_range.upper)
        env.facts.extend(guard.expr for guard in self.runtime_asserts)
        return env

    def copy_annotations_from(self, source: "ExportedProgram") -> None:
        """Take over what describes `source` beyond its graph (calling convention, examples, symbol facts) when
        this program computes the same thing, e.g. after a pass rewrote its ops."""
        self.in_spec, self.out_spec = source.in_spec, source.out_spec
        self.input_constants = dict(source.input_constants)
        self.example_inputs = source.example_inputs
        self.module_call_graph = list(source.module_call_graph)  # value names survive when values do
        self.hints = {**source.hints, **self.hints}
        self.runtime_asserts = list(source.runtime_asserts)

    # -- parameters and buffers, torch's API
    def stored(self, target: str, default: Any = _REQUIRED) -> Any:
        """The stored value of a parameter, buffer or lifted constant by its target: the state dict's entry, else the
        constants' (torch keeps non-persistent buffers and lifted tensors there); `default` when neither holds it,
        KeyError without one."""
        if target in self.state_dict:
            return self.state_dict[target]
        if target in self.constants:
            return self.constants[target]
        if default is _REQUIRED:
            raise KeyError(target)
        return default

    def named_parameters(self) -> Iterator[tuple[str, np.ndarray]]:
        for target in self.graph_signature.parameters:
            yield target, self.state_dict[target]

    def parameters(self) -> Iterator[np.ndarray]:
        return (value for _, value in self.named_parameters())

    def named_buffers(self) -> Iterator[tuple[str, np.ndarray]]:
        for spec in self.graph_signature.input_specs:
            if spec.kind is InputKind.BUFFER and spec.target is not None:
                yield spec.target, self.stored(spec.target, None)

    def buffers(self) -> Iterator[np.ndarray]:
        return (value for _, value in self.named_buffers())

    # -- checking and running
    def verify(self) -> None:
        """xDSL structural verification plus every op's types against its meta rule."""
        with active_shape_env(self.shape_env()):
            try:
                self.graph_module.verify()
            except VerificationError:
                raise
            except Exception as error:  # xDSL's own VerifyException
                raise VerificationError(str(error).splitlines()[0]) from error
        expected = len(self.graph_signature.input_specs)
        if len(self.body.args) != expected:
            raise VerificationError(f"forward has {len(self.body.args)} arguments but the signature lists {expected}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run on the reference interpreter with the calling convention of the exported model. The program is a
        function: buffers it mutates keep their stored values (`module()` keeps the updates)."""
        return self._call(args, kwargs, None)

    def _call(self, args: tuple, kwargs: dict, state: dict[str, Any] | None) -> Any:
        """`self(*args, **kwargs)` reading the buffers in `state` where it has them, and writing their updates
        (BUFFER_MUTATION outputs) there."""
        from kiln.ir.interpreter import run_program
        from kiln.ir.pytree import check_structure, tree_unflatten
        if self.in_spec is not None:
            flat = check_structure(self.in_spec, (tuple(args), dict(kwargs)))
            for index, expected in self.input_constants.items():
                if flat[index] != expected:
                    raise InputError(f"input {index} was {expected!r} at export and is baked into the program, "
                                     f"but {flat[index]!r} was passed", fix="re-export for the new value")
            flat = [leaf for index, leaf in enumerate(flat) if index not in self.input_constants]
        else:
            flat = list(args)
        outputs = run_program(self, flat, state)
        _write_back_input_mutations(self, flat, outputs)
        if state is not None:
            state.update({spec.target: value for spec, value in zip(self.graph_signature.output_specs, outputs)
                          if spec.kind is OutputKind.BUFFER_MUTATION})
        user = [value for value, spec in zip(outputs, self.graph_signature.output_specs)
                if spec.kind in _RETURNED_KINDS]
        wrapper = next((getattr(a, "output_class", type(a)) for a in flat if hasattr(a, "__kiln_array__")), None)
        if wrapper is not None:  # called with kiln Tensors: answer with kiln Tensors
            user = [wrapper(u) if isinstance(u, np.ndarray) else u for u in user]
        if self.out_spec is not None:
            return tree_unflatten(user, self.out_spec)
        return user[0] if len(user) == 1 else tuple(user)

    def user_output_names(self) -> list[str]:
        """A name for each user output, for artifacts (ONNX graph outputs, package manifests): the keys leading to it
        in the output structure where it has keys (`logits`, `hidden_0`), else the output value's name."""
        from kiln.ir.pytree import leaf_paths
        specs = [spec for spec in self.graph_signature.output_specs if spec.kind is OutputKind.USER_OUTPUT]
        paths = leaf_paths(self.out_spec) if self.out_spec is not None else []
        if len(paths) != len(specs):
            paths = [()] * len(specs)
        names = []
        for path, spec in zip(paths, specs):
            keyed = any(isinstance(part, str) for part in path)
            name = re.sub(r"\W", "_", "_".join(map(str, path))) if keyed else spec.name
            names.append(name if name not in names else f"{name}_{len(names)}")
        return names

    def run_decompositions(self, decomp_table: Any = None) -> "ExportedProgram":
        """A new program with ops decomposed: None → Core ATen (`kiln.default_decompositions()`), `{}` → none.

        Tables are dicts keyed by `kiln.ops.aten` handles; delete entries to keep ops, or add your own
        decompositions written with kiln ops.
        """
        from kiln.ir.retrace import default_decompositions, retrace
        program = retrace(self, default_decompositions() if decomp_table is None else decomp_table)
        program.verify()
        return program

    def module(self) -> "ExportedModule":
        """A callable with the original calling convention (like torch's `ExportedProgram.module()`); it is stateful
        as torch's is: the buffers the program mutates (a static KV cache) keep their updates from call to call."""
        return ExportedModule(self)

    # -- printing
    def to_mlir(self) -> str:
        """MLIR text (xDSL's printer); `from_mlir` parses it back to an identical program."""
        self._store_signature_attributes()
        return str(self.graph_module)

    @staticmethod
    def from_module(module: ModuleOp, state_dict: dict[str, np.ndarray] | None = None,
                    constants: dict[str, np.ndarray] | None = None) -> "ExportedProgram":
        """A program around an xDSL module (signature and ranges read from its kiln.* attributes)."""
        return _program_from_module(module, state_dict, constants)

    @staticmethod
    def from_mlir(text: str, state_dict: dict[str, np.ndarray] | None = None,
                  constants: dict[str, np.ndarray] | None = None) -> "ExportedProgram":
        from xdsl.parser import Parser

        from kiln.ir.dialect import context
        try:
            module = Parser(context(), text).parse_module()
        except Exception as error:  # xDSL reports "<unknown>:line:col", the line, a caret, the message
            lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
            where = lines[0].replace("<unknown>", "line") if lines else ""
            raise ParseError(f"cannot parse kiln MLIR ({where}): {lines[-1] if lines else error}",
                             fix="check the text against `ExportedProgram.to_mlir()` output") from error
        return _program_from_module(module, state_dict, constants)

    def _store_signature_attributes(self) -> None:
        graph = self.graph
        graph.attributes["kiln.inputs"] = ArrayAttr([StringAttr(
            ":".join([s.kind.value, s.name, s.target or "", "" if s.persistent is None else str(s.persistent)]))
            for s in self.graph_signature.input_specs])
        graph.attributes["kiln.outputs"] = ArrayAttr([StringAttr(
            ":".join([s.kind.value, s.name, s.target or ""])) for s in self.graph_signature.output_specs])
        self.graph_module.attributes["kiln.range_constraints"] = DictionaryAttr(
            {str(sym): StringAttr(str(r)) for sym, r in self.range_constraints.items()})
        from kiln.ir.serde.symexpr import print_srepr
        attributes = self.graph_module.attributes
        attributes.pop("kiln.hints", None)
        attributes.pop("kiln.runtime_asserts", None)
        if self.hints:
            attributes["kiln.hints"] = DictionaryAttr({str(s): StringAttr(str(v)) for s, v in self.hints.items()})
        if self.runtime_asserts:
            attributes["kiln.runtime_asserts"] = ArrayAttr([
                ArrayAttr([StringAttr(print_srepr(guard.expr, {})), StringAttr(guard.source)])
                for guard in self.runtime_asserts])

    def __str__(self) -> str:
        from kiln.ir.printer import format_program
        return format_program(self)

    def __repr__(self) -> str:
        return str(self)


# What calling a program returns: its user outputs, and a joint program's loss and gradients (in signature order).
_RETURNED_KINDS = (OutputKind.USER_OUTPUT, OutputKind.LOSS_OUTPUT, OutputKind.GRADIENT_TO_PARAMETER,
                   OutputKind.GRADIENT_TO_USER_INPUT)


def running_statistic_targets(program: ExportedProgram, batch_norm: Any) -> tuple[str, str]:
    """The buffer targets of a training-mode batch norm's running mean and variance. kiln's export writes their
    update as ops after the normalization (var_mean of the same input, then mul/add into the buffers, returned as
    BUFFER_MUTATION outputs): follow each mutated buffer's value back to the var_mean that feeds it."""
    source = batch_norm.operands[0]
    found: dict[int, str] = {}  # var_mean result index (0 variance, 1 mean) -> buffer target
    returned = list(program.body.last_op.operands)
    for spec, value in zip(program.graph_signature.output_specs, returned):
        if spec.kind is not OutputKind.BUFFER_MUTATION:
            continue
        pending, seen = [value], set()
        while pending:
            current = pending.pop()
            owner = getattr(current, "owner", None)
            if current in seen or owner is None or not hasattr(owner, "opdef"):
                continue
            seen.add(current)
            if owner.opdef.name == "aten.var_mean.correction" and owner.operands[0] is source:
                found[list(owner.results).index(current)] = spec.target
                break
            pending.extend(owner.operands)
    if set(found) != {0, 1}:
        raise KilnError("cannot find the running statistics of a batch norm exported in training mode",
                        fix="export the model in eval mode for inference, or keep its running-stat update")
    return found[1], found[0]


class ExportedModule:
    """`ExportedProgram.module()`: calls run the program on the interpreter, with this module's own copy of the
    buffers the program mutates; `named_buffers()` reads them, `load_state_dict()` sets them, `reset_state()`
    restores them."""

    def __init__(self, program: ExportedProgram):
        self.program = program
        self.reset_state()

    def reset_state(self) -> None:
        """The mutated buffers back to the program's values (a KV cache emptied for the next sequence)."""
        self._state = {target: np.array(self.program.stored(target))
                       for target in self.program.graph_signature.buffers_to_mutate.values()}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.program._call(args, kwargs, self._state)

    def named_buffers(self) -> Iterator[tuple[str, np.ndarray]]:
        """(target, value) of every buffer, as this module holds them now."""
        for spec in self.program.graph_signature.input_specs:
            if spec.kind is InputKind.BUFFER:
                yield spec.target, self._state.get(spec.target, self.program.stored(spec.target, None))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Set mutated buffers (by target; others are the program's and cannot change), e.g. to reset a KV cache."""
        for target, value in state.items():
            if target not in self._state:
                raise KilnError(f"'{target}' is not a buffer the program mutates",
                                fix=f"mutated buffers: {', '.join(self._state) or 'none'}")
            value = np.asarray(value)
            if value.shape != self._state[target].shape:
                raise InputError(f"buffer '{target}' has shape {list(self._state[target].shape)}, got "
                                 f"{list(value.shape)}")
            self._state[target] = np.array(value, dtype=self._state[target].dtype)

    def __repr__(self) -> str:
        return "ExportedModule(forward=<kiln program>)"


def _write_back_input_mutations(program: ExportedProgram, flat: list[Any], outputs: list[Any]) -> None:
    """Like torch's `ep.module()(x)`: an input the program mutates in place (USER_INPUT_MUTATION) is updated."""
    mutated = {spec.target: value for spec, value in zip(program.graph_signature.output_specs, outputs)
               if spec.kind is OutputKind.USER_INPUT_MUTATION}
    if not mutated:
        return
    user_specs = [s for s in program.graph_signature.input_specs if s.kind is InputKind.USER_INPUT]
    for spec, passed in zip(user_specs, flat):
        if spec.name not in mutated:
            continue
        target = passed.__kiln_array__() if hasattr(passed, "__kiln_array__") else passed
        if not isinstance(target, np.ndarray) or not target.flags.writeable:
            raise InputError(f"the program mutates input '{spec.name}' in place, but a "
                             f"{'read-only array' if isinstance(target, np.ndarray) else type(passed).__name__} "
                             "was passed there", fix="pass a writable numpy array (np.array(x)) or kiln Tensor")
        np.copyto(target, np.asarray(mutated[spec.name]), casting="unsafe")


def _program_from_module(module: ModuleOp, state_dict: dict[str, np.ndarray] | None,
                         constants: dict[str, np.ndarray] | None) -> ExportedProgram:
    ranges: dict[sympy.Symbol, ValueRange] = {}
    range_attr = module.attributes.get("kiln.range_constraints")
    if isinstance(range_attr, DictionaryAttr):
        for name, value in range_attr.data.items():
            match = re.fullmatch(r"VR\[(-?\w+), (-?\w+)\]", value.data)  # type: ignore[union-attr]
            if match is None:
                raise ParseError(f"malformed range {value} for symbol {name}")
            lower, upper = (float("inf") if b == "int_oo" else float("-inf") if b == "-int_oo" else int(b)
                            for b in match.groups())
            ranges[sympy.sympify(parse_dim(name))] = ValueRange(lower, upper)
    program = ExportedProgram(module, ExportGraphSignature([], []), state_dict, ranges, constants)
    hints = module.attributes.get("kiln.hints")
    if isinstance(hints, DictionaryAttr):
        for name, value in hints.data.items():
            if not (isinstance(value, StringAttr) and re.fullmatch(r"-?\d+", value.data)):
                raise ParseError(f"malformed hint {value} for symbol {name}")
            program.hints[sympy.sympify(parse_dim(name))] = int(value.data)
    asserts = module.attributes.get("kiln.runtime_asserts")
    if isinstance(asserts, ArrayAttr):
        from kiln.ir.serde.errors import SerdeError
        from kiln.ir.serde.symexpr import parse_srepr_condition
        for entry in asserts.data:
            try:
                expr, source = (item.data for item in entry.data)  # type: ignore[attr-defined]
                program.runtime_asserts.append(Guard(parse_srepr_condition(expr), source))
            except (AttributeError, TypeError, ValueError, SerdeError) as error:
                raise ParseError(f"malformed runtime assertion {entry}", fix="check the kiln.runtime_asserts "
                                 "attribute against `ExportedProgram.to_mlir()` output") from error
    graph = program.graph
    inputs = graph.attributes.get("kiln.inputs")
    outputs = graph.attributes.get("kiln.outputs")
    names = value_names(program.body)
    if inputs is None:
        program.graph_signature.input_specs = [InputSpec(InputKind.USER_INPUT, names[a]) for a in program.body.args]
    else:
        for entry in inputs.data:  # type: ignore[union-attr]
            kind, name, target, persistent = entry.data.split(":")
            program.graph_signature.input_specs.append(InputSpec(
                InputKind(kind), name, target or None, None if persistent == "" else persistent == "True"))
    if outputs is None:
        returned = list(program.body.last_op.operands) if program.body.last_op else []
        program.graph_signature.output_specs = [OutputSpec(OutputKind.USER_OUTPUT, names[v]) for v in returned]
    else:
        for entry in outputs.data:  # type: ignore[union-attr]
            kind, name, target = entry.data.split(":")
            program.graph_signature.output_specs.append(OutputSpec(OutputKind(kind), name, target or None))
    return program


# ---------------------------------------------------------------------------------------------
# Building programs


class GraphBuilder:
    """Records ops into a new `forward` function. Use as an emitter:

        builder = GraphBuilder()
        x = builder.add_input("x", TensorType.of([s0, 64], "f32"))
        with builder:
            y = kiln.ops.aten.relu.default(x)
        program = builder.build([y])
    """

    def __init__(self, shape_env: ShapeEnv | None = None):
        self.shape_env = shape_env or ShapeEnv()
        self.block = Block()
        self._input_kinds: list[tuple[InputKind, str | None, bool | None]] = []
        self._scopes: list[Any] = []
        self.source: str | None = None  # set by the tracer: the user's line for the next ops

    # -- inputs
    def add_input(self, name: str, type_: TensorType, kind: InputKind = InputKind.USER_INPUT,
                  target: str | None = None, persistent: bool | None = None, *,
                  index: int | None = None) -> SSAValue:
        """A new argument of forward (appended, or inserted at `index`); its final name is `name` made
        unique (`x`, `x_1`, ...)."""
        index = len(self.block.args) if index is None else index
        arg = self.block.insert_arg(type_, index)
        arg.name_hint = _sanitize(name)
        self._input_kinds.insert(index, (kind, target, persistent))
        return arg

    def set_input_kind(self, arg: SSAValue, kind: InputKind, target: str | None = None,
                       persistent: bool | None = None) -> None:
        """Change what an argument added by add_input is (a constant found to be state becomes a buffer)."""
        self._input_kinds[self.block.args.index(arg)] = (kind, target, persistent)

    # -- emitter protocol
    def accepts(self, value: Any) -> bool:
        # None: an op without tensor arguments (a factory) is recorded too while building.
        return value is None or isinstance(value, SSAValue)

    def emit(self, opdef: OpDef, bound: list[Any]) -> Any:
        from kiln.ir.dialect import build_op
        from kiln.ir.verifier import flatten_meta

        types_bound = [_type_of(argument, value) for argument, value in zip(opdef.schema.arguments, bound)]
        with active_shape_env(self.shape_env), guard_source(self.source):
            meta = run_meta(opdef, types_bound)
        op = build_op(opdef, bound, flatten_meta(meta))
        if self.source:
            op.attributes["kiln.source"] = StringAttr(self.source)
        self.insert(op)
        for result in op.results:
            result.name_hint = _sanitize(opdef.schema.name)
        return _shape_like(meta, list(op.results))

    def emit_assumed(self, opdef: OpDef, bound: list[Any], result_types: list[Any]) -> Any:
        """Record an op with result types that its meta rule cannot derive here but that someone proved, torch when
        it saved the program: the op is marked, verification accepts the types, and runners check them."""
        from kiln.ir.dialect import build_op
        from kiln.ir.verifier import ASSUMED_TYPES

        op = build_op(opdef, bound, result_types)
        op.attributes[ASSUMED_TYPES] = UnitAttr()
        self.insert(op)
        for result in op.results:
            result.name_hint = _sanitize(opdef.schema.name)
        results = list(op.results)
        return results[0] if len(opdef.schema.returns) == 1 and not opdef.schema.returns[0].type.is_list \
            else results if len(opdef.schema.returns) == 1 else tuple(results)

    def insert(self, op: Any) -> None:
        """Where emitted ops go: the end of the block. Subclasses insert elsewhere (e.g. before a matched op)."""
        self.block.add_op(op)

    def __enter__(self) -> "GraphBuilder":
        self._scopes = [emitting(self), active_shape_env(self.shape_env)]
        for scope in self._scopes:
            scope.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        for scope in reversed(self._scopes):
            scope.__exit__(*exc)

    # -- finishing
    def build(self, outputs: Sequence[SSAValue], output_specs: Sequence[OutputSpec] | None = None,
              state_dict: dict[str, np.ndarray] | None = None,
              constants: dict[str, np.ndarray] | None = None,
              range_constraints: dict[sympy.Symbol, ValueRange] | None = None) -> ExportedProgram:
        self.block.add_op(func.ReturnOp(*outputs))
        function = func.FuncOp("forward", ([a.type for a in self.block.args], [o.type for o in outputs]),
                               Region(self.block))
        names = value_names(self.block)
        input_specs = [InputSpec(kind, names[arg], target, persistent)
                       for arg, (kind, target, persistent) in zip(self.block.args, self._input_kinds)]
        if output_specs is None:
            output_specs = [OutputSpec(OutputKind.USER_OUTPUT, names[o]) for o in outputs]
        if range_constraints is None:
            used = set()
            for arg in self.block.args:
                if isinstance(arg.type, TensorType):
                    for dim in arg.type.shape:
                        if not isinstance(dim, int):
                            used |= dim.free_symbols
            range_constraints = {s: info.range for s, info in self.shape_env.symbols.items()
                                 if s in used and not info.unbacked}
        program = ExportedProgram(ModuleOp([function]), ExportGraphSignature(input_specs, list(output_specs)),
                                  state_dict, range_constraints, constants)
        program.hints = {s: self.shape_env.symbols[s].hint for s in range_constraints
                         if s in self.shape_env.symbols and self.shape_env.symbols[s].hint is not None}
        return program


def result_types(opdef: OpDef, bound: list[Any]) -> list[Any]:
    """The flat result types of `opdef` on bound arguments (traced values), as emitting it would give them."""
    from kiln.ir.verifier import flatten_meta
    return flatten_meta(run_meta(opdef, [_type_of(argument, value)
                                         for argument, value in zip(opdef.schema.arguments, bound)]))


def _type_of(argument: Any, value: Any) -> Any:
    if not argument.type.is_tensor or value is None:
        return value
    if argument.type.is_list:
        return [None if v is None else v.type for v in value]
    return value.type


def _shape_like(meta: Any, results: list[SSAValue]) -> Any:
    """Arrange flat results the way the meta rule returned types (a value, a tuple, or a list)."""
    if isinstance(meta, (TensorType, SymIntType, ScalarType)):
        return results[0]
    iterator = iter(results)
    arranged = []
    for item in meta:
        if isinstance(item, list):
            arranged.append([next(iterator) for _ in item])
        else:
            arranged.append(next(iterator))
    return list(arranged) if isinstance(meta, list) else tuple(arranged)


def format_value(value: Any, names: dict[SSAValue, str]) -> str:
    """Python-like rendering of an op argument for torch.export's printed form."""
    if isinstance(value, SSAValue):
        return names.get(value, "?")
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(format_value(v, names) for v in value) + "]"
    if isinstance(value, dtypes.DType):
        return f"torch.{value.name}"
    if isinstance(value, str):
        return f"'{value}'"
    if isinstance(value, sympy.Expr):
        return format_dim(value)
    return repr(value)


__all__ = [
    "ExportedProgram", "ExportGraphSignature", "InputSpec", "OutputSpec", "InputKind", "OutputKind",
    "ModuleCallEntry", "ModuleCallSignature",
    "GraphBuilder",
]
