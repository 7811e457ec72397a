"""Data-dependent control flow that exports, mirroring torch's higher-order ops: `kiln.cond` (torch.cond),
`kiln.scan` (torch's scan), `kiln.while_loop` (torch's while_loop) and `kiln.map` (torch's map).

Eagerly each runs in Python. While tracing, every function is traced once into a region of one op
(`kiln/ir/control_flow.py`) with symbolic shapes; tensors a region uses from outside (parameters, closures)
become extra operands of the op, which torch calls `additional_inputs`.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from xdsl.dialects.builtin import StringAttr
from xdsl.ir import Operation, SSAValue

from kiln.frontend import functions as K
from kiln.frontend.tensor import Tensor, _find_tracer
from kiln.frontend.tracing import Tracer, tracing, user_source_line
from kiln.ir.control_flow import CondOp, MapOp, ScanOp, WhileLoopOp, YieldOp
from kiln.ir.errors import KilnError
from kiln.ir.program import GraphBuilder
from kiln.ir.pytree import TreeSpec, tree_flatten, tree_unflatten
from kiln.ir.types import TensorType

__all__ = ["cond", "scan", "while_loop", "map"]

class _Captures:
    """Outer values the branches use; every branch block gets one argument per capture, in one order."""

    def __init__(self, parent: Tracer):
        self.parent = parent
        self.values: list[SSAValue] = []
        self.blocks: list[Any] = []
        self.operand_count = 0  # each block's explicit arguments, before the captures (the same for every region)

    def argument_for(self, outer: SSAValue, block: Any) -> SSAValue:
        if outer not in self.values:
            self.values.append(outer)
            for other in self.blocks:
                other.insert_arg(outer.type, len(other.args)).name_hint = outer.name_hint
        return block.args[self.operand_count + self.values.index(outer)]


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


class _Regions:
    """The regions of one op being traced. Every block takes its explicit arguments, then one argument per
    capture, in one order shared by all the op's regions."""

    def __init__(self, parent: Tracer, op_name: str):
        self.parent, self.op_name = parent, op_name
        self.captures = _Captures(parent)

    def trace(self, fn: Callable[..., Any], arg_types: Sequence[Any], structure: Callable[[list[Tensor]], list[Any]],
              names: Sequence[str | None] = ()) -> tuple[Any, list[SSAValue], TreeSpec]:
        """Trace `fn(*structure(arguments))` into a new block; return (the block, its flat results, their spec)."""
        captures = self.captures
        captures.operand_count = len(arg_types)
        branch = _BranchTracer(self.parent, captures)
        block = branch.builder.block
        for index, arg_type in enumerate(arg_types):
            block.insert_arg(arg_type, index).name_hint = names[index] if index < len(names) else None
        for value in captures.values:
            block.insert_arg(value.type, len(block.args)).name_hint = value.name_hint
        captures.blocks.append(block)
        inputs = [Tensor._traced(arg, branch) for arg in block.args[:len(arg_types)]]
        with tracing(branch):
            result = fn(*structure(inputs))
        leaves, spec = tree_flatten(result)
        values = [branch.value_of(leaf) if isinstance(leaf, Tensor) else _refuse(self.op_name, leaf) for leaf in leaves]
        return block, values, spec

    def emit(self, op: Operation, hint: str) -> list[Tensor]:
        source = user_source_line()
        if source:
            op.attributes["kiln.source"] = StringAttr(source)
        self.parent.builder.block.add_op(op)
        for result in op.results:
            result.name_hint = hint
        return [Tensor._traced(r, self.parent) for r in op.results]


def _check_tensors(op_name: str, what: str, leaves: Sequence[Any]) -> None:
    for leaf in leaves:
        if not isinstance(leaf, Tensor):
            raise KilnError(f"{op_name} {what} must be tensors, got {type(leaf).__name__}",
                            source=user_source_line(), fix="close over non-tensor values in the functions instead")


def _types_text(values: Sequence[Any]) -> str:
    return "[" + ", ".join(v.type.short() if isinstance(v.type, TensorType) else str(v.type) for v in values) + "]"


def cond(pred: Any, true_fn: Callable[..., Any], false_fn: Callable[..., Any], operands: Sequence[Any] = ()) -> Any:
    """`true_fn(*operands)` if `pred` else `false_fn(*operands)`; a 0-d bool tensor predicate exports both."""
    operands = tuple(operands)
    if not isinstance(pred, Tensor):
        return (true_fn if bool(pred) else false_fn)(*operands)
    tracer = _find_tracer((pred, *operands))
    if tracer is None:
        return (true_fn if bool(pred) else false_fn)(*operands)
    if pred.dim() != 0 or not pred.dtype.is_bool:
        raise KilnError(f"kiln.cond needs a 0-d bool tensor predicate, got {pred.dtype.name}{list(pred.shape)}",
                        source=user_source_line(), fix="reduce it first, e.g. pred = (x.sum() > 0)")
    _check_tensors("kiln.cond", "operands", operands)
    outer_operands = [tracer.value_of(o) for o in operands]
    regions = _Regions(tracer, "kiln.cond")
    traced = [regions.trace(fn, [v.type for v in outer_operands], list, [v.name_hint for v in outer_operands])
              for fn in (true_fn, false_fn)]
    (true_block, true_values, true_spec), (false_block, false_values, false_spec) = traced
    if true_spec != false_spec:
        raise KilnError(f"kiln.cond branches return different structures: {true_spec} vs {false_spec}",
                        source=user_source_line(), fix="return the same (nested) tuple of tensors from both")
    if [v.type for v in true_values] != [v.type for v in false_values]:
        raise KilnError(f"kiln.cond branches return different shapes or dtypes: {_types_text(true_values)} vs "
                        f"{_types_text(false_values)}", source=user_source_line(),
                        fix="make both branches return tensors of the same type")
    true_block.add_op(YieldOp(true_values))
    false_block.add_op(YieldOp(false_values))
    op = CondOp(tracer.value_of(pred), [*outer_operands, *regions.captures.values], [v.type for v in true_values],
                true_block, false_block)
    return tree_unflatten(regions.emit(op, "cond"), true_spec)


def scan(combine_fn: Callable[[Any, Any], tuple[Any, Any]], init: Any, xs: Any, *, dim: int = 0,
         reverse: bool = False) -> tuple[Any, Any]:
    """torch's scan: `carry = init; for each slice x of xs along dim: carry, y = combine_fn(carry, x)`; returns
    the final carry and the ys stacked along a new dim 0 (in the order of xs, also when `reverse`)."""
    init_leaves, init_spec = tree_flatten(init)
    x_leaves, x_spec = tree_flatten(xs)
    if not init_leaves:
        raise KilnError("kiln.scan needs at least one carry in init", source=user_source_line(),
                        fix="pass the initial state as init (e.g. a zeros tensor)")
    _check_tensors("kiln.scan", "init leaves", init_leaves)
    _check_tensors("kiln.scan", "xs leaves", x_leaves)
    if not x_leaves:
        return init, []
    if not isinstance(dim, int) or not isinstance(reverse, bool):
        raise KilnError("kiln.scan: dim must be an int and reverse a bool", source=user_source_line())
    if dim < 0:  # as torch canonicalizes it: against the first xs leaf's rank
        dim += x_leaves[0].dim()
    if dim < 0 or any(x.dim() <= dim for x in x_leaves):
        raise KilnError(f"kiln.scan: every xs leaf needs a dimension {dim} to scan over, got shapes "
                        f"{[list(x.shape) for x in x_leaves]}", source=user_source_line())
    x_leaves = [x.movedim(dim, 0) if dim != 0 else x for x in x_leaves]
    if reverse:
        x_leaves = [x.flip(0) for x in x_leaves]

    def step(carry_leaves: list[Tensor], x_slices: list[Tensor]) -> tuple[list[Any], list[Any], Any]:
        carry, y = _combine_result(combine_fn(tree_unflatten(carry_leaves, init_spec),
                                              tree_unflatten(x_slices, x_spec)))
        next_leaves, next_spec = tree_flatten(carry)
        if next_spec != init_spec:
            raise KilnError(f"kiln.scan: combine_fn returns a carry of structure {next_spec}, but init is "
                            f"{init_spec}", source=user_source_line(), fix="return the next carry shaped like init")
        y_leaves, y_spec = tree_flatten(y)
        _check_tensors("kiln.scan", "combine_fn's carries and outputs", [*next_leaves, *y_leaves])
        return next_leaves, y_leaves, y_spec

    tracer = _find_tracer((*init_leaves, *x_leaves))
    if tracer is None:
        carry_leaves, per_step, y_spec = list(init_leaves), [], None
        for index in range(x_leaves[0].shape[0]):
            carry_leaves, ys, y_spec = step(carry_leaves, [x[index] for x in x_leaves])
            if _eager_types(carry_leaves) != _eager_types(init_leaves):  # as the traced region is checked below
                raise KilnError(f"kiln.scan: combine_fn returns carries {_eager_types_text(carry_leaves)} but init "
                                f"is {_eager_types_text(init_leaves)}", source=user_source_line(),
                                fix="keep the carry's shape and dtype across steps (cast or reshape it in combine_fn)")
            per_step.append(ys)
        if not per_step:
            raise KilnError("kiln.scan: the scanned dimension is empty, which torch's scan refuses too",
                            source=user_source_line(), fix="scan over at least one slice")
        stacked = [K.stack([ys[i] for ys in per_step], 0) for i in range(len(per_step[0]))]
        return tree_unflatten(carry_leaves, init_spec), tree_unflatten(_unscan(stacked, dim, reverse), y_spec)

    init_values, x_values = [tracer.value_of(t) for t in init_leaves], [tracer.value_of(x) for x in x_leaves]
    regions = _Regions(tracer, "kiln.scan")
    slice_types = [x.type.with_shape(x.type.shape[1:]) for x in x_values]
    count = len(init_values)
    y_specs: list[Any] = []

    def body(*arguments: Tensor) -> list[Tensor]:
        next_leaves, y_leaves, y_spec = step(list(arguments[:count]), list(arguments[count:]))
        y_specs.append(y_spec)
        return [*next_leaves, *y_leaves]

    block, values, _ = regions.trace(body, [*(v.type for v in init_values), *slice_types], list,
                                     [*(f"carry{i}" for i in range(count)), *(f"x{i}" for i in range(len(x_values)))])
    next_types = [v.type for v in values[:count]]
    if next_types != [v.type for v in init_values]:
        raise KilnError(f"kiln.scan: combine_fn returns carries {_types_text(values[:count])} but init is "
                        f"{_types_text(init_values)}", source=user_source_line(),
                        fix="keep the carry's shape and dtype across steps (cast or reshape it in combine_fn)")
    block.add_op(YieldOp(values))
    op = ScanOp(init_values, x_values, regions.captures.values,
                ScanOp.result_types_for(init_values, x_values, [v.type for v in values]), block)
    results = regions.emit(op, "scan")
    stacked = _unscan(results[count:], dim, reverse)
    return tree_unflatten(results[:count], init_spec), tree_unflatten(stacked, y_specs[0])


def _unscan(stacked: list[Tensor], dim: int, reverse: bool) -> list[Tensor]:
    """The per-step outputs in the order of xs, their step dim moved back to `dim` (where they have one), as
    torch's scan returns them."""
    if reverse:
        stacked = [y.flip(0) for y in stacked]
    return [y.movedim(0, dim) if 0 < dim < y.dim() else y for y in stacked]


def _combine_result(result: Any) -> tuple[Any, Any]:
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise KilnError("kiln.scan: combine_fn must return (next_carry, y)", source=user_source_line(),
                        fix="return a pair: the next carry and this step's output")
    return result[0], result[1]


def while_loop(cond_fn: Callable[..., Any], body_fn: Callable[..., Any], carried_inputs: Sequence[Any]) -> Any:
    """torch's while_loop: `while cond_fn(*carried): carried = body_fn(*carried)`; returns the final carried
    values (a tuple, as torch does)."""
    carried_inputs = tuple(carried_inputs) if isinstance(carried_inputs, (tuple, list)) else carried_inputs
    if not isinstance(carried_inputs, tuple):
        raise KilnError("kiln.while_loop: carried_inputs must be a tuple", source=user_source_line(),
                        fix="pass the loop's values as a tuple, e.g. (i, x)")
    leaves, spec = tree_flatten(carried_inputs)
    if not leaves:
        raise KilnError("kiln.while_loop needs at least one carried tensor", source=user_source_line(),
                        fix="pass the loop's state as carried_inputs, e.g. (i, x)")
    _check_tensors("kiln.while_loop", "carried inputs", leaves)
    tracer = _find_tracer(leaves)
    if tracer is None:
        carried = carried_inputs
        while _truth(cond_fn(*carried)):
            carried = _body_result(body_fn(*carried))
            new_leaves, new_spec = tree_flatten(carried)
            _check_tensors("kiln.while_loop", "body_fn's results", new_leaves)
            if new_spec != spec or _eager_types(new_leaves) != _eager_types(leaves):  # as traced bodies are checked
                raise KilnError(f"kiln.while_loop: body_fn returns {_eager_types_text(new_leaves)} but the carried "
                                f"inputs are {_eager_types_text(leaves)}", source=user_source_line(),
                                fix="return values with the carried inputs' structure, shapes and dtypes")
        return carried
    outer = [tracer.value_of(t) for t in leaves]
    regions = _Regions(tracer, "kiln.while_loop")

    def structure(arguments: list[Tensor]) -> list[Any]:
        return list(tree_unflatten(arguments, spec))

    names = [v.name_hint for v in outer]
    cond_block, predicate, _ = regions.trace(cond_fn, [v.type for v in outer], structure, names)
    if len(predicate) != 1 or not isinstance(predicate[0].type, TensorType) or predicate[0].type.ndim != 0 \
            or not predicate[0].type.dtype.is_bool:
        raise KilnError(f"kiln.while_loop: cond_fn must return one 0-d bool tensor, got {_types_text(predicate)}",
                        source=user_source_line(), fix="return e.g. (i < n) from cond_fn")
    body_block, values, body_spec = regions.trace(lambda *a: _body_result(body_fn(*a)), [v.type for v in outer],
                                                  structure, names)
    if body_spec != spec or [v.type for v in values] != [v.type for v in outer]:
        raise KilnError(f"kiln.while_loop: body_fn returns {_types_text(values)} but the carried inputs are "
                        f"{_types_text(outer)}", source=user_source_line(),
                        fix="return values with the carried inputs' structure, shapes and dtypes")
    cond_block.add_op(YieldOp(predicate))
    body_block.add_op(YieldOp(values))
    op = WhileLoopOp(outer, regions.captures.values, cond_block, body_block)
    return tree_unflatten(regions.emit(op, "while_loop"), spec)


def _truth(predicate: Any) -> bool:
    if isinstance(predicate, Tensor):
        if predicate.dim() != 0 or not predicate.dtype.is_bool:
            raise KilnError(f"kiln.while_loop: cond_fn must return one 0-d bool tensor, got "
                            f"{_eager_types_text([predicate])}", source=user_source_line(),
                            fix="return e.g. (i < n) from cond_fn")
        return bool(predicate.item())
    if not isinstance(predicate, bool):
        raise KilnError(f"kiln.while_loop: cond_fn must return one 0-d bool tensor, got {type(predicate).__name__}",
                        source=user_source_line(), fix="return e.g. (i < n) from cond_fn")
    return predicate


def _body_result(result: Any) -> tuple[Any, ...]:
    if not isinstance(result, (tuple, list)):
        raise KilnError(f"kiln.while_loop: body_fn must return a tuple of the carried values, got "
                        f"{type(result).__name__}", source=user_source_line(),
                        fix="return a tuple, e.g. `return (i + 1, x * 2)` (or `(x,)` for one value)")
    return tuple(result)


def _eager_types(leaves: Sequence[Any]) -> list[Any]:
    return [(tuple(t.shape), t.dtype) if isinstance(t, Tensor) else type(t) for t in leaves]


def _eager_types_text(leaves: Sequence[Any]) -> str:
    return "[" + ", ".join(TensorType.of(list(t.shape), t.dtype).short() if isinstance(t, Tensor)
                           else type(t).__name__ for t in leaves) + "]"


def map(f: Callable[..., Any], xs: Any, *args: Any) -> Any:  # noqa: A001  (torch's name)
    """torch's map: `stack([f(x, *args) for x in xs])` over the leading dim of every xs leaf."""
    x_leaves, x_spec = tree_flatten(xs)
    _check_tensors("kiln.map", "xs leaves", x_leaves)
    arg_leaves, arg_spec = tree_flatten(list(args))
    if not x_leaves or any(x.dim() == 0 for x in x_leaves):
        raise KilnError("kiln.map needs tensors with a leading dim to map over", source=user_source_line())
    tracer = _find_tracer((*x_leaves, *[a for a in arg_leaves if isinstance(a, Tensor)]))
    if tracer is None:
        results, out_spec = [], None
        for index in range(x_leaves[0].shape[0]):
            leaves, out_spec = tree_flatten(f(tree_unflatten([x[index] for x in x_leaves], x_spec), *args))
            results.append(leaves)
        if not results:
            raise KilnError("kiln.map: the leading dimension of xs is 0, which torch's map refuses too",
                            source=user_source_line(), fix="map over at least one row")
        return tree_unflatten([K.stack([r[i] for r in results], 0) for i in range(len(results[0]))], out_spec)
    x_values = [tracer.value_of(x) for x in x_leaves]
    regions = _Regions(tracer, "kiln.map")
    count = len(x_values)

    # Tensor extra arguments become block arguments; with any non-tensor among them, all are closed over.
    tensor_args = [a for a in arg_leaves if isinstance(a, Tensor)]
    passed = tensor_args if len(tensor_args) == len(arg_leaves) else []
    arg_types = [tracer.value_of(a).type for a in passed]

    def structure(arguments: list[Tensor]) -> list[Any]:
        extra = arguments[count:] if passed else arg_leaves
        return [tree_unflatten(arguments[:count], x_spec), *tree_unflatten(list(extra), arg_spec)]

    block, values, out_spec = regions.trace(
        f, [*(x.type.with_shape(x.type.shape[1:]) for x in x_values), *arg_types], structure)
    block.add_op(YieldOp(values))
    op = MapOp(x_values, [*(tracer.value_of(a) for a in passed), *regions.captures.values],
               MapOp.stacked_types(x_values, [v.type for v in values]), block)
    return tree_unflatten(regions.emit(op, "map"), out_spec)


def _refuse(op_name: str, leaf: Any) -> Any:
    raise KilnError(f"{op_name}: its functions must return tensors, got {type(leaf).__name__}",
                    source=user_source_line())
