"""The reference interpreter: runs an ExportedProgram on numpy inputs with the registry's kernels.

Before running anything it binds each symbol from the first input dim that is exactly that symbol,
then checks every other dim (static sizes, derived expressions like `s0 + 1`) and every range, so a
bad input is refused with the input, dimension, symbol and allowed range named.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import sympy
from xdsl.dialects import func

from kiln.ir.dialect import bound_arguments
from kiln.ir.errors import InputError, KilnError
from kiln.ir.registry import conform, run_kernel, sparse_layouts
from kiln.ir.sparse import SparseArray
from kiln.ir.symbolic import evaluate_dim, format_dim
from kiln.ir.types import SymIntType, TensorType
from kiln.ir.verifier import ASSUMED_TYPES


def bind_symbols(program: Any, inputs: Sequence[np.ndarray]) -> dict[sympy.Symbol, int]:
    """Bind symbols from input shapes and validate dtypes, ranks, dims, relations and ranges."""
    names = [spec.name for spec in program.graph_signature.input_specs]
    args = list(program.body.args)
    bindings: dict[sympy.Symbol, int] = {}
    where: dict[sympy.Symbol, str] = {}
    for name, arg, value in zip(names, args, inputs):
        value_type = arg.type
        if not isinstance(value_type, TensorType):
            continue
        if value.dtype != value_type.dtype.numpy:
            raise InputError(f"input '{name}' has dtype {value.dtype} "
                             f"but the program expects {value_type.dtype.name}",
                             fix=f"convert it with .astype({value_type.dtype.name!r})")
        if value.ndim != value_type.ndim:
            raise InputError(f"input '{name}' has rank {value.ndim} (shape {list(value.shape)}) "
                             f"but the program expects rank {value_type.ndim} ({value_type.short()})")
        for axis, dim in enumerate(value_type.shape):
            if isinstance(dim, sympy.Symbol) and dim not in bindings:
                bindings[dim] = int(value.shape[axis])
                where[dim] = f"{name}.shape[{axis}]"
    for name, arg, value in zip(names, args, inputs):  # dims like `2*s0 + 1` bind s0 when nothing else does
        if not isinstance(arg.type, TensorType):
            continue
        for axis, dim in enumerate(arg.type.shape):
            if isinstance(dim, int) or len(dim.free_symbols) != 1:
                continue
            (sym,) = dim.free_symbols
            if sym in bindings or not dim.is_polynomial(sym) or sympy.degree(dim, sym) != 1:
                continue
            scale, offset = sympy.Poly(dim, sym).all_coeffs()
            solved, remainder = divmod(int(value.shape[axis]) - int(offset), int(scale))
            if remainder:
                raise InputError(f"input '{name}' dimension {axis} is {value.shape[axis]}, which is not of the "
                                 f"form {dim} for an integer {sym}",
                                 fix="pass sizes of the form the program was exported with")
            bindings[sym] = solved
            where[sym] = f"{name}.shape[{axis}]"
    for sym, value in bindings.items():
        allowed = program.range_constraints.get(sym)  # derived entries need no check: their symbols have one
        if allowed is not None and value not in allowed:
            raise InputError(f"{where[sym]} = {value} is outside the range of symbol {sym}: {allowed}",
                             fix=f"pass a size in [{allowed.lower}, {allowed.upper}] for {where[sym]}")
    for name, arg, value in zip(names, args, inputs):
        value_type = arg.type
        if not isinstance(value_type, TensorType):
            continue
        for axis, dim in enumerate(value_type.shape):
            if isinstance(dim, int):
                if value.shape[axis] != dim:
                    raise InputError(f"input '{name}' dimension {axis} is {value.shape[axis]} "
                                     f"but the program was exported with static size {dim}",
                                     fix="re-export with a dynamic dim there, or pass the static size")
                continue
            unbound = [s for s in dim.free_symbols if s not in bindings]
            if unbound:
                continue
            expected = evaluate_dim(dim, bindings)
            if value.shape[axis] != expected:
                detail = ", ".join(f"{s} = {bindings[s]} (from {where[s]})" for s in sorted(dim.free_symbols, key=str))
                raise InputError(f"input '{name}' dimension {axis} is {value.shape[axis]} but must equal "
                                 f"{dim} = {expected}, given {detail}",
                                 fix="pass inputs whose sizes satisfy the relation the program was exported with")
    return bindings


def concrete_value(value: Any, bindings: dict[sympy.Symbol, int]) -> Any:
    """A symbolic size (or a list of them) as an int under `bindings`; any other argument as it is."""
    if isinstance(value, sympy.Expr):
        return evaluate_dim(value, bindings)
    if isinstance(value, list):
        return [concrete_value(v, bindings) for v in value]
    return value


def _concrete_type(value_type: Any, bindings: dict[sympy.Symbol, int]) -> Any:
    if isinstance(value_type, TensorType) and not value_type.is_static:
        shape = []
        for d in value_type.shape:
            try:
                shape.append(evaluate_dim(d, bindings))
            except KilnError:
                return TensorType.of(value_type.shape, value_type.dtype)  # unbacked: shape checked later
        return TensorType.of(shape, value_type.dtype)
    return value_type


# Called with (SSA value, array) for every forward argument and op result the interpreter computes: calibration's
# observers and debugging tools watch values through it.
ValueHook = Callable[[Any, Any], None]
_VALUE_HOOK: contextvars.ContextVar[ValueHook | None] = contextvars.ContextVar("kiln_value_hook", default=None)


@contextlib.contextmanager
def watching(hook: ValueHook) -> Iterator[None]:
    """Run `hook` on each value of the programs interpreted inside the block."""
    token = _VALUE_HOOK.set(hook)
    try:
        yield
    finally:
        _VALUE_HOOK.reset(token)


def run_program(program: Any, user_args: Sequence[Any], state: Mapping[str, Any] | None = None) -> list[Any]:
    """Run forward; return every output in signature order (mutations included). Buffers are read from `state`
    where it has them (a stateful module's copies), else from the program."""
    from kiln.ir.program import InputKind

    specs = program.graph_signature.input_specs
    user_specs = [s for s in specs if s.kind is InputKind.USER_INPUT]
    if len(user_args) != len(user_specs):
        raise InputError(f"the program takes {len(user_specs)} user input(s) "
                         f"({', '.join(s.name for s in user_specs)}) but got {len(user_args)}")
    supplied = iter(user_args)
    inputs: list[np.ndarray] = []
    for spec in specs:
        if spec.kind is InputKind.USER_INPUT:
            value = next(supplied)
            if hasattr(value, "__kiln_array__"):
                value = value.__kiln_array__()
            if not isinstance(value, (np.ndarray, SparseArray)):
                if isinstance(value, (int, float, bool, np.generic)):
                    value = np.asarray(value)
                else:
                    raise InputError(f"input '{spec.name}' must be a numpy array, got {type(value).__name__}")
        elif state is not None and spec.target in state:
            value = state[spec.target]
        else:
            value = program.stored(spec.target, None)
            if value is None:
                raise InputError(f"{spec.kind.value.lower()} '{spec.target}' is missing from the state dict")
        inputs.append(value)
    bindings = _Bindings(bind_symbols(program, inputs), program.range_constraints, program.runtime_asserts)
    return execute_block(program.body, inputs, bindings)


class _Bindings(dict):
    """Symbol -> value, plus the program's ranges and runtime assertions: a data-dependent symbol (`u0` from
    `item()`) is checked against its range when the op that computes it runs, and each assertion as soon as its
    symbols have values, as torch's `_assert_scalar` nodes check them."""

    def __init__(self, values: dict[sympy.Symbol, int], ranges: dict[Any, Any], asserts: Sequence[Any] = ()):
        super().__init__(values)
        self.ranges = ranges
        self.pending = list(asserts)
        self.check_asserts()

    def check_asserts(self) -> None:
        for guard in [g for g in self.pending if g.expr.free_symbols <= self.keys()]:
            self.pending.remove(guard)
            if not bool(guard.expr.xreplace({s: sympy.Integer(self[s]) for s in guard.expr.free_symbols})):
                values = ", ".join(f"{s} = {self[s]}" for s in sorted(guard.expr.free_symbols, key=str))
                where = f" (from {guard.source})" if guard.source else ""
                raise InputError(f"the program assumes {guard.expr}{where}, which fails for {values}",
                                 fix="pass inputs whose sizes and values satisfy the program's runtime assertions")


def execute_block(block: Any, inputs: Sequence[Any], bindings: dict[sympy.Symbol, int]) -> list[Any]:
    """Run a block's ops; return the values its terminator (func.return / kiln.yield) passes on."""
    from kiln.ir.control_flow import YieldOp

    values: dict[Any, Any] = dict(zip(block.args, inputs))
    hook = _VALUE_HOOK.get()
    if hook is not None:
        for arg, value in zip(block.args, inputs):
            hook(arg, value)
    for op in block.ops:
        if isinstance(op, (func.ReturnOp, YieldOp)):
            return [values[v] for v in op.operands]
        run_op(op, values, bindings)
        if hook is not None:
            for result in op.results:
                hook(result, values[result])
    raise KilnError("block has no terminator")


SQUEEZES = ("aten.squeeze.default", "aten.squeeze.dim", "aten.squeeze.dims")


def run_op(op: Any, values: dict[Any, Any], bindings: dict[sympy.Symbol, int]) -> None:
    """Compute one op's results from `values` (SSA value -> array) and store them there."""
    from kiln.ir.control_flow import CondOp, MapOp, ScanOp, WhileLoopOp

    if isinstance(op, CondOp):
        branch = op.true_region if bool(np.asarray(values[op.pred])) else op.false_region
        outputs = execute_block(branch.block, [values[v] for v in op.operands_], bindings)
        values.update(zip(op.results, outputs))
        return
    if isinstance(op, MapOp):
        values.update(zip(op.results, _run_map(op, values, bindings)))
        return
    if isinstance(op, ScanOp):
        values.update(zip(op.results, _run_scan(op, values, bindings)))
        return
    if isinstance(op, WhileLoopOp):
        values.update(zip(op.results, _run_while_loop(op, values, bindings)))
        return
    opdef = op.opdef
    if opdef.kernel is None:
        raise KilnError(f"{opdef.name} has no reference kernel, so the interpreter cannot run it",
                        fix="run the program's decompositions first")
    arguments = [concrete_value(a, bindings) for a in bound_arguments(op, values.__getitem__)]
    results = list(op.results)
    expected = [_concrete_type(r.type, bindings) for r in results]
    if opdef.name in SQUEEZES and expected[0].is_static and not sparse_layouts(arguments):
        # squeeze drops the dims its trace found to be 1. A data-dependent size that was undecided there stays,
        # even when it is 1 at run time (torch's guard_or_false), as it does in every compiled backend.
        result = np.reshape(arguments[0], tuple(int(d) for d in expected[0].shape))
    else:
        result = run_kernel(opdef, arguments)
    if ASSUMED_TYPES in op.attributes:
        _check_assumed_shapes(op, result, expected)
    if len(results) == 1 and not opdef.schema.returns[0].type.is_list:
        outputs = [conform(opdef, result, expected[0])]
    else:
        outputs = list(conform(opdef, list(result), expected))
    for value, output in zip(results, outputs):
        _bind_unbacked(value.type, output, bindings)
        values[value] = output


def _check_assumed_shapes(op: Any, result: Any, expected: list[Any]) -> None:
    """An op whose result types kiln took from torch's file: the values must have them, or the program was run
    outside what torch proved (kiln's meta rule could not derive them to check at load)."""
    arrays = [result] if len(expected) == 1 and not isinstance(result, (list, tuple)) else list(result)
    for array, value_type, declared_type in zip(arrays, expected, [r.type for r in op.results]):
        if isinstance(value_type, TensorType) and value_type.is_static and \
                tuple(np.shape(array)) != tuple(int(d) for d in value_type.shape):
            declared = ", ".join(format_dim(d) for d in declared_type.shape)
            raise InputError(f"{op.opdef.name} produced shape {list(np.shape(array))}, but the program assumes "
                             f"[{declared}] = {list(value_type.shape)} here, as torch recorded it",
                             fix="pass inputs inside what the program was exported for")


def _run_map(op: Any, values: dict[Any, Any], bindings: dict[sympy.Symbol, int]) -> list[np.ndarray]:
    """torch's map: the body on each leading-dim slice of the xs, the results stacked."""
    xs = [values[x] for x in op.xs]
    if len(xs[0]) == 0:  # torch refuses it too: the stacked results would have no example to take a shape from
        raise InputError("kiln.map: the leading dimension of the mapped xs is 0, which torch's map refuses too",
                         fix="map over at least one row")
    operands = [values[v] for v in op.operands_]
    per_slice = [execute_block(op.body.block, [x[i] for x in xs] + operands, bindings) for i in range(len(xs[0]))]
    return [np.stack([np.asarray(outputs[index]) for outputs in per_slice]) for index in range(len(op.results))]


def _run_scan(op: Any, values: dict[Any, Any], bindings: dict[sympy.Symbol, int]) -> list[np.ndarray]:
    """torch's scan: the carries threaded through the body once per leading-dim slice of the xs; the final
    carries, then the per-step outputs stacked (an empty stack, of the result's type, for zero steps)."""
    xs, operands = [values[x] for x in op.xs], [values[v] for v in op.operands_]
    carries = [values[v] for v in op.init]
    count = len(carries)
    steps = []
    for i in range(len(xs[0])):
        outputs = execute_block(op.body.block, [*carries, *(x[i] for x in xs), *operands], bindings)
        carries, per_step = outputs[:count], outputs[count:]
        steps.append([np.asarray(y) for y in per_step])
    stacked = []
    for index, result in enumerate(op.stacked):
        if steps:
            stacked.append(np.stack([step[index] for step in steps]))
        else:
            result_type = _concrete_type(result.type, bindings)
            stacked.append(np.zeros([int(d) for d in result_type.shape], result_type.dtype.numpy))
    return [*carries, *stacked]


def _run_while_loop(op: Any, values: dict[Any, Any], bindings: dict[sympy.Symbol, int]) -> list[Any]:
    """torch's while_loop: the body on the carried values for as long as the cond region yields True."""
    carried, operands = [values[v] for v in op.carried], [values[v] for v in op.operands_]
    while bool(np.asarray(execute_block(op.cond_region.block, [*carried, *operands], bindings)[0])):
        carried = execute_block(op.body.block, [*carried, *operands], bindings)
    return carried


def _bind_unbacked(value_type: Any, output: Any, bindings: dict[sympy.Symbol, int]) -> None:
    if isinstance(value_type, SymIntType):  # `item()`'s value names the data-dependent symbol u0
        if isinstance(value_type.expr, sympy.Symbol) and value_type.expr not in bindings:
            _bind_checked(bindings, value_type.expr, int(output), "the value read from a tensor")
        return
    if isinstance(value_type, TensorType):
        for axis, dim in enumerate(value_type.shape):
            if isinstance(dim, sympy.Symbol) and dim not in bindings:
                _bind_checked(bindings, dim, int(np.shape(output)[axis]), f"dimension {axis} of a computed tensor")


def _bind_checked(bindings: dict[sympy.Symbol, int], sym: sympy.Symbol, value: int, what: str) -> None:
    allowed = getattr(bindings, "ranges", {}).get(sym)
    if allowed is not None and value not in allowed:
        raise InputError(f"{what} is {value}, but the program was exported for {sym} in {allowed}",
                         fix=f"pass inputs that give a value in [{allowed.lower}, {allowed.upper}] there")
    bindings[sym] = value
    if isinstance(bindings, _Bindings):
        bindings.check_asserts()
