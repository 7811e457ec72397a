"""Pattern rewrites: the user-facing way to write a pass.

A `RewritePass` method decorated with `@pattern(kiln.ops.aten.gelu.default)` is called with the matched op's
arguments (tensors as IR values) and returns the values that replace its results, or None to leave it alone.
Ops it calls through `kiln.ops.aten` are inserted in front of the matched op with result types from the meta
rules. xDSL's PatternRewriteWalker drives the matching until nothing changes; ops left unused are erased.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterator

import numpy as np
from xdsl.ir import Operation, SSAValue
from xdsl.pattern_rewriter import PatternRewriter, PatternRewriteWalker, RewritePattern
from xdsl.rewriter import InsertPoint

from kiln.ir.control_flow import outermost_source, pass_down
from kiln.ir.dialect import bound_arguments
from kiln.ir.program import ExportedProgram, GraphBuilder
from kiln.ir.registry import OpOverload, OpOverloadPacket, lookup, split_bound
from kiln.ir.symbolic import ShapeEnv
from kiln.ir.types import TensorType
from kiln.passes.base import Pass, PassError, add_constant, erase_dead_program_ops, same_type, weight_value

Handler = Callable[..., Any]


def pattern(*ops: Any) -> Callable[[Handler], Handler]:
    """Mark a RewritePass method as the rewrite of `ops` (handles like `kiln.ops.aten.gelu.default`, a packet
    like `kiln.ops.aten.squeeze` for all its overloads, or names like "aten.gelu.default")."""
    names = [name for op in ops for name in op_names(op)]

    def mark(method: Handler) -> Handler:
        method.__kiln_pattern__ = tuple(getattr(method, "__kiln_pattern__", ())) + tuple(names)  # type: ignore
        return method
    return mark


def op_names(op: Any) -> list[str]:
    """Qualified op names for a handle, a packet (all its overloads) or a name."""
    if isinstance(op, OpOverload):
        return [op.name]
    if isinstance(op, OpOverloadPacket):
        return [f"{op!r}.{overload}" for overload in op.overloads()]
    if isinstance(op, str):
        return [lookup(op).name]
    raise PassError(f"@pattern takes op handles such as kiln.ops.aten.relu.default, got {op!r}")


@dataclass(frozen=True)
class RewritePass(Pass):
    """Base class of pattern passes: subclasses define `@pattern` methods (their docstring describes the pass)."""

    name: ClassVar[str]

    @classmethod
    def patterns(cls) -> dict[str, list[str]]:
        """Op name -> names of the methods that rewrite it, in definition order (base classes first)."""
        methods: dict[str, tuple[str, ...]] = {}
        for klass in reversed(cls.__mro__):  # an override replaces (or, undecorated, removes) the base's pattern
            for attribute, method in vars(klass).items():
                if hasattr(method, "__kiln_pattern__"):
                    methods[attribute] = method.__kiln_pattern__
                elif attribute in methods:
                    del methods[attribute]
        table: dict[str, list[str]] = {}
        for attribute, op_names_ in methods.items():
            for op_name in op_names_:
                table.setdefault(op_name, []).append(attribute)
        return table

    def handlers(self) -> dict[str, list[Handler]]:
        """Op name -> the bound methods to try on it (override to choose patterns from options)."""
        return {name: [getattr(self, m) for m in methods] for name, methods in self.patterns().items()}

    def apply_program(self, program: ExportedProgram) -> ExportedProgram:
        table = self.handlers()
        driver = _HandlerPattern(self, table, program, program.shape_env())
        walker = PatternRewriteWalker(driver, apply_recursively=True)
        try:
            walker.rewrite_region(program.graph.body)
        except _Abort as abort:
            raise abort.error from None
        erase_dead_program_ops(program)
        return program


# ---------------------------------------------------------------------------------------------
# Helpers for pattern bodies


@dataclass
class Match:
    """An op found by `producer`: the op, and its arguments split like a call (`args`, `kwargs`)."""

    op: Operation
    args: list[Any]
    kwargs: dict[str, Any]

    @property
    def name(self) -> str:
        return self.op.name

    @property
    def result(self) -> SSAValue:
        return self.op.results[0]

    @property
    def handle(self) -> OpOverload:
        """The op's `kiln.ops` handle, to emit a variant of it: `m.handle(*new_args, **m.kwargs)`."""
        return OpOverload(self.op.opdef)  # type: ignore[attr-defined]

    @property
    def has_one_use(self) -> bool:
        """True when the op's results feed exactly one operand (replacing its user makes it dead)."""
        return sum(result.uses.get_length() for result in self.op.results) == 1


def producer(value: Any, *ops: Any) -> Match | None:
    """The op that computed `value`, if it is one of `ops` (any op when none are given); else None.

    Use it to match small DAGs: `if (s := producer(y, aten.sigmoid.default)) and s.args[0] is x: ...`.
    """
    if not isinstance(value, SSAValue) or not isinstance(value.owner, Operation):
        return None
    op = value.owner
    if not hasattr(op, "opdef"):
        return None
    if ops and op.name not in {name for handle in ops for name in op_names(handle)}:
        return None
    args, kwargs = split_bound(op.opdef, bound_arguments(op))  # type: ignore[attr-defined]
    return Match(op, args, kwargs)


def current_op() -> Operation:
    """The op the running pattern matched."""
    return _active("current_op").anchor


def value_of(value: Any, *, parameters: bool = True) -> np.ndarray | None:
    """The weight array behind `value` when it is a constant argument (or, with `parameters`, a parameter or
    buffer argument) whose value the program holds, directly or as a region's invariant operand; else None."""
    context = _active("value_of")
    if not isinstance(value, SSAValue):
        return None
    return weight_value(context.program, outermost_source(value), parameters=parameters)


def constant(array: np.ndarray, hint: str = "folded") -> SSAValue:
    """An IR value for `array`: a new CONSTANT_TENSOR input of the program (its value goes to `constants`), passed
    down as an invariant operand to the region the matched op is in."""
    context = _active("constant")
    return pass_down(add_constant(context.program, array, hint), context.anchor.parent_block())


def users(value: SSAValue) -> Iterator[Operation]:
    """The ops that use `value` (once per use)."""
    return (use.operation for use in value.uses)


# ---------------------------------------------------------------------------------------------
# The driver


@dataclass
class _Context:
    program: ExportedProgram
    anchor: Operation


_ACTIVE: contextvars.ContextVar[_Context | None] = contextvars.ContextVar("kiln_rewrite", default=None)


def _active(what: str) -> _Context:
    context = _ACTIVE.get()
    if context is None:
        raise PassError(f"kiln.passes.{what}() works only inside a @pattern method while its pass runs")
    return context


class _Abort(BaseException):
    """Carries a pattern's exception past xDSL's walker (which catches Exception to print the whole module)."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


class OpInserter(GraphBuilder):
    """An emitter that records ops called through `kiln.ops` in front of `anchor`.

    It reuses GraphBuilder's emit (meta rules, result names, source lines) and inserts through the
    PatternRewriter, so the walker revisits the new ops.
    """

    def __init__(self, shape_env: ShapeEnv, rewriter: PatternRewriter, anchor: Operation):
        super().__init__(shape_env)
        self.rewriter, self.anchor = rewriter, anchor
        self.inserted: list[Operation] = []
        self.module_stack = anchor.attributes.get("kiln.nn_module_stack")
        source = anchor.attributes.get("kiln.source")
        self.source = source.data if source is not None else None  # type: ignore[union-attr]

    def insert(self, op: Operation) -> None:
        if self.module_stack is not None:
            op.attributes["kiln.nn_module_stack"] = self.module_stack
        self.rewriter.insert(op, InsertPoint.before(self.anchor))
        self.inserted.append(op)


class _HandlerPattern(RewritePattern):
    """One xDSL pattern that dispatches each aten op to the RewritePass methods registered for its name."""

    def __init__(self, owner: RewritePass, table: dict[str, list[Handler]], program: ExportedProgram,
                 shape_env: ShapeEnv):
        self.owner, self.table, self.program, self.shape_env = owner, table, program, shape_env
        self.budget = 64 * (len(list(program.body.ops)) + 16)  # rewrites before we call it a loop

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter, /) -> None:
        handlers = self.table.get(op.name)
        if not handlers or op.parent is None:
            return
        args, kwargs = split_bound(op.opdef, bound_arguments(op))  # type: ignore[attr-defined]
        for handler in handlers:
            acted_before = rewriter.has_done_action
            inserter = OpInserter(self.shape_env, rewriter, op)
            token = _ACTIVE.set(_Context(self.program, op))
            try:
                with inserter:
                    result = handler(*args, **kwargs)
                replacements = None if result is None else self._replacements(handler, op, result)
            except _Abort:
                raise
            except Exception as error:
                raise _Abort(error) from error
            finally:
                _ACTIVE.reset(token)
            if replacements is None or replacements == list(op.results):
                # Declined: whatever the handler emitted goes, and the walk does not count it as a change.
                for new_op in reversed(inserter.inserted):
                    if not any(result.uses for result in new_op.results):
                        rewriter.erase(new_op)
                rewriter.has_done_action = acted_before
                continue
            self.budget -= 1
            if self.budget < 0:
                raise _Abort(PassError(f"pass {self.owner.name} keeps rewriting {op.name} without converging",
                                       fix=f"make {handler.__name__} return None once nothing is left to do"))
            rewriter.replace(op, [], replacements)
            return

    def _replacements(self, handler: Handler, op: Operation, result: Any) -> list[SSAValue | None]:
        flat = list(result) if isinstance(result, (tuple, list)) else [result]
        flat = [v for item in flat for v in (item if isinstance(item, list) else [item])]
        where = f"pattern {type(self.owner).__name__}.{handler.__name__} on {op.name}"
        if len(flat) != len(op.results):
            raise PassError(f"{where} returned {len(flat)} value(s) for {len(op.results)} result(s)",
                            fix="return one value per result (None for a result nothing uses)")
        for old, new in zip(op.results, flat):
            if new is None:
                if old.uses:
                    raise PassError(f"{where} returned None for result #{old.index}, which is used")
                continue
            if not isinstance(new, SSAValue):
                raise PassError(f"{where} returned {type(new).__name__}, not an IR value",
                                fix="build results with kiln.ops.aten handles or kiln.passes.constant(array)")
            if not same_type(new.type, old.type):
                raise PassError(f"{where} replaced a {_show(old.type)} result by a {_show(new.type)} value",
                                fix="a replacement must keep the shape and dtype of what it replaces")
        return flat


def _show(value_type: Any) -> str:
    return value_type.short() if isinstance(value_type, TensorType) else str(value_type)
