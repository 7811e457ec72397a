"""The pass registry and the program edits passes share.

A pass is a frozen dataclass whose fields are its options (like xDSL's `ModulePass`). `apply_program` edits a
program in place and returns it; `kiln.passes.run` gives each pipeline its own copy and, after every pass,
drops unused weights from the signature and re-derives the signature's names from the IR.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, Iterator

import numpy as np
from xdsl.context import Context
from xdsl.dialects import builtin, func
from xdsl.ir import Block, BlockArgument, Operation, SSAValue
from xdsl.passes import ModulePass

from kiln.ir.control_flow import drop_unused_invariants
from kiln.ir.dialect import bound_arguments
from kiln.ir.errors import KilnError
from kiln.ir.program import ExportedProgram, ExportGraphSignature, InputKind, InputSpec, OutputSpec, value_names
from kiln.ir.types import TensorType, type_symbols


class PipelineError(KilnError):
    """A pass pipeline naming an unknown pass or option, giving an ill-typed value, or not parsing."""


class PassError(KilnError):
    """A pass that cannot do what it was asked (a custom pattern returning a value of the wrong type, ...)."""


# ---------------------------------------------------------------------------------------------
# Passes and their options


def option(default: Any, help: str) -> Any:
    """A pass option with its `--list-passes` help text: `freeze: bool = option(False, "...")`."""
    if isinstance(default, (list, dict, set)):
        raise KilnError("pass option defaults must be immutable", fix="use a tuple instead of a list")
    return dataclasses.field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class Pass(ModulePass):
    """Base class of kiln passes. Subclasses set `name`, a one-line docstring, and implement `apply_program`."""

    name: ClassVar[str]

    def apply_program(self, program: ExportedProgram) -> ExportedProgram:
        """Rewrite `program` (edit it in place or build a new one) and return the result."""
        raise NotImplementedError(f"pass {self.name} does not implement apply_program")

    def apply(self, ctx: Context, op: builtin.ModuleOp) -> None:
        """xDSL's entry point, for xdsl-opt style drivers: runs on a bare module (no weight values known)."""
        program = ExportedProgram.from_module(op.clone())
        result = finish_pass(self.apply_program(program))
        result.to_mlir()  # stores the signature in the module's attributes
        new_module = result.graph_module
        op.attributes.clear()
        op.attributes.update(new_module.attributes)
        for old in list(op.body.block.ops):
            op.body.block.detach_op(old)
        for new in list(new_module.body.block.ops):
            new_module.body.block.detach_op(new)
            op.body.block.add_op(new)

    @classmethod
    def description(cls) -> str:
        """The docstring's first line (not the `Name(field=...)` text @dataclass invents for a class without one)."""
        doc = (cls.__doc__ or "").strip()
        if not doc or doc.startswith(f"{cls.__name__}("):
            return ""
        return doc.splitlines()[0].strip()

    @classmethod
    def options(cls) -> list[OptionInfo]:
        try:
            hints = typing.get_type_hints(cls)
        except NameError:  # an annotation naming something out of scope: such options are Python-only
            hints = {f.name: _BUILTIN_TYPES.get(f.type, f.type) for f in dataclasses.fields(cls)}
        return [OptionInfo(f.name.replace("_", "-"), f.name, hints[f.name], f.default,
                           f.metadata.get("help", ""))
                for f in dataclasses.fields(cls) if f.init]

    def __str__(self) -> str:
        """The pipeline text that rebuilds this pass: `fold-constants{freeze=true}`."""
        changed = [o for o in self.options() if o.from_text and getattr(self, o.field) != o.default]
        if not changed:
            return self.name
        return self.name + "{" + " ".join(f"{o.name}={o.format(getattr(self, o.field))}" for o in changed) + "}"


@dataclass(frozen=True)
class OptionInfo:
    """One option of a pass: its pipeline spelling (`keep-going`), field name, type, default and help."""

    name: str
    field: str
    type: Any
    default: Any
    help: str

    @property
    def base_type(self) -> Any:
        """The scalar type (bool, int, float, str) a pipeline value is converted to, or None (Python only)."""
        hint = _strip_optional(self.type)
        if typing.get_origin(hint) is tuple:
            element, *rest = typing.get_args(hint)
            return element if rest == [Ellipsis] and element in (bool, int, float, str) else None
        return hint if hint in (bool, int, float, str) else None

    @property
    def is_tuple(self) -> bool:
        return typing.get_origin(_strip_optional(self.type)) is tuple

    @property
    def from_text(self) -> bool:
        return self.base_type is not None

    @property
    def type_name(self) -> str:
        if not self.from_text:
            return "Python only"
        name = self.base_type.__name__
        return f"{name},..." if self.is_tuple else name

    def format(self, value: Any) -> str:
        if isinstance(value, tuple):
            return ",".join(self.format(v) for v in value)
        if isinstance(value, bool):
            return str(value).lower()
        if isinstance(value, str) and not re.fullmatch(r"[A-Za-z0-9_-]+", value):
            return f'"{value}"'
        return str(value)

    def convert(self, pass_name: str, values: tuple[Any, ...]) -> Any:
        """A parsed pipeline value (a tuple of scalars) as this option's type, or a PipelineError."""
        base = self.base_type
        if base is None:
            raise PipelineError(f"option '{self.name}' of pass '{pass_name}' can only be set from Python",
                                fix=f"construct the pass in Python: {self.field}=...")
        if not values:
            if base is bool and not self.is_tuple:
                return True  # `fold-constants{freeze}` reads as freeze=true, like mlir-opt's flags
            if _is_optional(self.type):
                return None
        converted = []
        for value in values:
            if base is float and isinstance(value, (int, str)) and not isinstance(value, bool):
                try:  # `1e-5` lexes as an identifier, `1` as an int
                    value = float(value)
                except ValueError:
                    pass
            if base is str and isinstance(value, (int, float)) and not isinstance(value, bool):
                value = str(value)
            if not isinstance(value, base) or (base is int and isinstance(value, bool)):
                shown = ",".join(self.format(v) for v in values) if values else "nothing"
                raise PipelineError(f"option '{self.name}' of pass '{pass_name}' expects {self.type_name}, "
                                    f"got {shown}", fix=f"write {pass_name}{{{self.name}=<{self.type_name}>}}")
            converted.append(value)
        if self.is_tuple:
            return tuple(converted)
        if len(converted) != 1:
            raise PipelineError(f"option '{self.name}' of pass '{pass_name}' takes one {self.type_name}, "
                                f"got {len(converted)} values", fix="separate options with spaces, not commas")
        return converted[0]


_BUILTIN_TYPES = {"bool": bool, "int": int, "float": float, "str": str}


def _strip_optional(hint: Any) -> Any:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def _is_optional(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint)


PASSES: dict[str, type[Pass]] = {}


def register_pass(target: Any = None, *, replace: bool = False) -> Any:
    """Register a pass class under its `name` (`@register_pass`) or a given one (`@register_pass("my-pass")`).

    The class becomes a frozen dataclass if it is not one already; its docstring's first line is its
    description in `kiln opt --list-passes`.
    """
    def register(cls: type, name: str | None) -> type:
        if not (isinstance(cls, type) and issubclass(cls, Pass)):
            raise KilnError(f"{getattr(cls, '__name__', cls)!r} is not a kiln pass",
                            fix="derive it from kiln.passes.Pass or kiln.passes.RewritePass")
        if name is not None:
            cls.name = name
        if "__dataclass_fields__" not in cls.__dict__:
            cls = dataclass(frozen=True)(cls)
        pass_name = getattr(cls, "name", None)
        if not isinstance(pass_name, str) or not re.fullmatch(r"[a-z][a-z0-9-]*", pass_name):
            raise KilnError(f"pass class {cls.__name__} needs a name in kebab-case, got {pass_name!r}",
                            fix='set `name = "my-pass"` on the class or use @register_pass("my-pass")')
        if not cls.description():
            raise KilnError(f"pass {pass_name} has no docstring",
                            fix="give the class a one-line docstring: it is the pass's description")
        existing = PASSES.get(pass_name)
        if existing is not None and existing is not cls and not replace and not _same_definition(existing, cls):
            raise KilnError(f"a pass named {pass_name!r} is already registered ({existing.__module__})",
                            fix="choose another name, or pass replace=True to override it")
        PASSES[pass_name] = cls
        return cls

    if isinstance(target, str):
        return lambda cls: register(cls, target)
    if target is None:
        return lambda cls: register(cls, None)
    return register(target, None)


def _same_definition(a: type, b: type) -> bool:
    """The same class defined again (a module reloaded)."""
    return a.__qualname__ == b.__qualname__ and a.__module__ == b.__module__


def lookup_pass(name: str) -> type[Pass]:
    found = PASSES.get(name)
    if found is None:
        close = difflib.get_close_matches(name, PASSES, n=3)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise PipelineError(f"unknown pass '{name}'",
                            fix=f"{hint}valid passes: {', '.join(sorted(PASSES))} (see `kiln opt --list-passes`)")
    return found


# ---------------------------------------------------------------------------------------------
# Program edits shared by passes


def clone_program(program: ExportedProgram) -> ExportedProgram:
    """A copy whose IR and signature can be edited without touching `program` (weight arrays are shared:
    passes replace arrays, they never write into them)."""
    signature = ExportGraphSignature([dataclasses.replace(s) for s in program.graph_signature.input_specs],
                                     [dataclasses.replace(s) for s in program.graph_signature.output_specs])
    copy = ExportedProgram(program.graph_module.clone(), signature, program.state_dict,
                           program.range_constraints, program.constants)
    copy.copy_annotations_from(program)
    return copy


def input_spec(program: ExportedProgram, value: SSAValue) -> InputSpec | None:
    """The signature entry of a forward argument (None for op results and region arguments)."""
    if isinstance(value, BlockArgument) and value.block is program.body:
        return program.graph_signature.input_specs[value.index]
    return None


def weight_value(program: ExportedProgram, value: SSAValue, *, parameters: bool = True) -> np.ndarray | None:
    """The array behind a constant (or, with `parameters`, a parameter or non-mutated buffer) argument."""
    spec = input_spec(program, value)
    if spec is None or spec.target is None:
        return None
    frozen = spec.kind is InputKind.PARAMETER or (
        spec.kind is InputKind.BUFFER and spec.target not in mutated_buffers(program))
    if not (spec.kind is InputKind.CONSTANT_TENSOR or parameters and frozen):
        return None
    return program.stored(spec.target, None)


def mutated_buffers(program: ExportedProgram) -> set[str]:
    return set(program.graph_signature.buffers_to_mutate.values())


def add_constant(program: ExportedProgram, array: np.ndarray, hint: str = "folded") -> BlockArgument:
    """A new CONSTANT_TENSOR argument holding `array` (stored in `program.constants`), placed before the user
    inputs like torch.export's lifted constants."""
    from kiln.ir import dtypes
    taken = set(program.state_dict) | set(program.constants) | {
        s.target for s in program.graph_signature.input_specs if s.target}
    stem = re.sub(r"[^A-Za-z0-9_]", "_", hint).strip("_") or "folded"
    index = 0
    while f"{stem}_{index}" in taken:
        index += 1
    target = f"{stem}_{index}"
    layout = getattr(array, "layout", None)  # a SparseArray keeps its components
    array = array if layout is not None else np.asarray(array)
    specs = program.graph_signature.input_specs
    position = next((i for i, s in enumerate(specs) if s.kind is InputKind.USER_INPUT), len(specs))
    arg = program.body.insert_arg(TensorType.of(array.shape, dtypes.dtype(array.dtype), layout), position)
    arg.name_hint = f"c_{target}"
    specs.insert(position, InputSpec(InputKind.CONSTANT_TENSOR, f"c_{target}", target))
    program.constants = {**program.constants, target: array}  # never write into the caller's dict
    return arg


def prune_unused_inputs(program: ExportedProgram) -> None:
    """Drop unused parameter, buffer and constant arguments, and their weights when nothing else names them."""
    specs = program.graph_signature.input_specs
    keep_targets = mutated_buffers(program)
    removable = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)
    for arg in reversed(list(program.body.args)):
        spec = specs[arg.index]
        if arg.uses or spec.kind not in removable or spec.target in keep_targets:
            continue
        index = arg.index
        program.body.erase_arg(arg)
        del specs[index]
    named = {s.target for s in specs if s.target}
    if any(key not in named for key in program.state_dict):
        program.state_dict = {k: v for k, v in program.state_dict.items() if k in named}
    if any(key not in named for key in program.constants):
        program.constants = {k: v for k, v in program.constants.items() if k in named}


def sync_signature(program: ExportedProgram) -> None:
    """Make forward's type and the signature's names agree with the IR after a pass edited it."""
    graph = program.graph
    graph.update_function_type()
    names = value_names(program.body)
    for arg, spec in zip(program.body.args, program.graph_signature.input_specs):
        spec.name = names[arg]
    returned = program.body.last_op
    if isinstance(returned, func.ReturnOp):
        for value, spec in zip(returned.operands, program.graph_signature.output_specs):
            spec.name = names[value]


def finish_pass(program: ExportedProgram) -> ExportedProgram:
    """The bookkeeping after every pass: unused weights leave, names and types follow the IR."""
    prune_unused_inputs(program)
    sync_signature(program)
    return program


def is_pure_op(op: Operation) -> bool:
    """Ops that only compute their results (every aten op and the region ops): removable when unused."""
    from kiln.ir.control_flow import REGION_OPS
    return hasattr(op, "opdef") or isinstance(op, REGION_OPS)


def _defines_a_used_symbol(op: Operation, referenced: set) -> bool:
    """Whether `op` binds a data-dependent size later values are sized by: `item()` of a count is `u0`, which the
    interpreter binds when the op runs, and `split_with_sizes(x, [u0, ...])`'s results carry it in their types only,
    so the op has no SSA use yet must stay; nonzero's row count, read only through its shape (`full([u0])`), too.
    An op binds the symbols its results name that neither its operands' types nor its arguments do."""
    named = set().union(*(type_symbols(r.type) for r in op.results)) & referenced
    if not named:
        return False
    given = set().union(*(type_symbols(v.type) for v in op.operands))
    if hasattr(op, "opdef"):  # sizes passed as arguments (full's, split_with_sizes') are used there, not bound
        given |= {s for a in bound_arguments(op) for s in _argument_symbols(a)}
    return bool(named - given)


def _argument_symbols(argument: Any) -> set:
    if isinstance(argument, (list, tuple)):
        return set().union(*map(_argument_symbols, argument))
    return set() if isinstance(argument, SSAValue) else set(getattr(argument, "free_symbols", ()))


def erase_dead_ops(block: Block, referenced: set | None = None) -> int:
    """Erase ops whose results are unused, users before producers, in nested regions too (and the invariant operands
    a region op's regions no longer read), keeping the ops that bind a data-dependent size a kept value's type
    names; return how many ops. `referenced`: the symbols an enclosing block's kept values name."""
    referenced = set(referenced or ())
    erased = 0
    for op in reversed(list(block.ops)):
        for region in op.regions:
            for nested in region.blocks:
                erased += erase_dead_ops(nested, referenced)
        drop_unused_invariants(op)
        if is_pure_op(op) and not any(result.uses for result in op.results) and not _defines_a_used_symbol(
                op, referenced):
            block.erase_op(op)
            erased += 1
            continue
        for value in (*op.results, *op.operands):
            referenced |= type_symbols(value.type)
    return erased


def erase_dead_program_ops(program: ExportedProgram) -> int:
    """erase_dead_ops over a program's body, keeping too the ops that bind a data-dependent size its runtime
    assertions check: torch._check(mask.all()) reads the bool into u0 and asserts u0 == 1, which nothing else uses."""
    return erase_dead_ops(program.body, {s for guard in program.runtime_asserts for s in guard.expr.free_symbols})


def walk_blocks(block: Block) -> Iterator[Block]:
    """`block` and every block nested in its ops' regions."""
    yield block
    for op in block.ops:
        for region in op.regions:
            for nested in region.blocks:
                yield from walk_blocks(nested)


def check_signature(program: ExportedProgram) -> None:
    """The signature invariants a pass must keep (raised as PassError naming what broke)."""
    specs = program.graph_signature.input_specs
    if len(specs) != len(program.body.args):
        raise PassError(f"forward has {len(program.body.args)} arguments but the signature lists {len(specs)}")
    has_weights = bool(program.state_dict or program.constants)
    for spec in specs:
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR) and has_weights:
            if spec.target not in program.state_dict and spec.target not in program.constants:
                raise PassError(f"{spec.kind.value.lower()} '{spec.target}' ({spec.name}) has no value in the "
                                "state dict or constants")
    returned = program.body.last_op
    outputs: list[OutputSpec] = program.graph_signature.output_specs
    if not isinstance(returned, func.ReturnOp) or len(returned.operands) != len(outputs):
        raise PassError("forward's return does not match the signature's outputs")


def same_type(a: Any, b: Any) -> bool:
    """Two value types are interchangeable: same dtype and layout, and dims provably equal."""
    if a == b:
        return True
    if not (isinstance(a, TensorType) and isinstance(b, TensorType)):
        return False
    if a.dtype is not b.dtype or a.layout != b.layout or a.ndim != b.ndim:
        return False
    return all(_same_dim(x, y) for x, y in zip(a.shape, b.shape))


def _same_dim(x: Any, y: Any) -> bool:
    if x == y:
        return True
    if isinstance(x, int) or isinstance(y, int):
        return False  # a number equals a symbolic size only on part of its range: not interchangeable
    return (x - y).expand() == 0  # cheap normal form; sizes it cannot prove equal count as different
