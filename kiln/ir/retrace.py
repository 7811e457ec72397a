"""Replay a program through op handles into a new GraphBuilder, rewriting ops on the way.

This is the one mechanism behind `ExportedProgram.run_decompositions` and the passes that replace ops:
each op is re-issued through its `kiln.ops` handle, so result types are re-inferred from the meta rules;
ops found in a decomposition table are replaced by what their decomposition emits, recursively.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import sympy
from xdsl.dialects import func
from xdsl.ir import Block, Operation

from kiln.ir.dialect import bound_arguments
from kiln.ir.errors import GuardError
from kiln.ir.program import ExportedProgram, GraphBuilder, OutputSpec
from kiln.ir.registry import OpDef, OpOverload, emitting, sparse_layouts, split_bound
from kiln.ir.symbolic import Guard, active_shape_env, as_dim
from kiln.ir.types import SymIntType, TensorType
from kiln.ir.verifier import ASSUMED_TYPES

DecompositionTable = Mapping[OpOverload, Callable[..., Any]]


class DecomposingEmitter:
    """Emits into a builder, but calls of ops in `table` run their decomposition instead (recursively). A
    decomposition that returns NotImplemented declines that call (as torch's do): the op is emitted as it is."""

    def __init__(self, builder: GraphBuilder, table: DecompositionTable):
        self.builder = builder
        self.by_name = {handle.name: fn for handle, fn in table.items()}

    def accepts(self, value: Any) -> bool:
        return self.builder.accepts(value)

    def emit(self, opdef: OpDef, bound: list[Any]) -> Any:
        decomposition = self.by_name.get(opdef.name)
        if decomposition is None or sparse_layouts(bound) and not (
                getattr(decomposition, "forwards_sparse_weight", False) and not sparse_layouts(bound[:1] + bound[2:])):
            # Decompositions are written for dense operands; an op on a sparse one stays whole for the backends'
            # sparse kernels (its sparse rule defines it), unless its decomposition only forwards a sparse weight.
            return self.builder.emit(opdef, bound)
        args, kwargs = split_bound(opdef, bound)
        with active_shape_env(self.builder.shape_env):  # decompositions may guard on the program's ranges
            result = decomposition(*args, **kwargs)
        return self.builder.emit(opdef, bound) if result is NotImplemented else result


def retrace(program: ExportedProgram, table: DecompositionTable | None = None,
            substitutions: dict[Any, Any] | None = None) -> ExportedProgram:
    """A new program computing the same outputs, with every op in `table` decomposed and symbols replaced
    by `substitutions` (e.g. `s1 -> s0` once tracing proved them equal)."""
    substitutions = dict(substitutions or {})  # grows as replayed ops rename data-dependent symbols
    builder = GraphBuilder(program.shape_env())
    mapping: dict[Any, Any] = {}
    for arg, spec in zip(program.body.args, program.graph_signature.input_specs):
        arg_type = _substitute_type(arg.type, substitutions)
        mapping[arg] = builder.add_input(spec.name, arg_type, spec.kind, spec.target, spec.persistent)
    outputs = replay(program.body, builder, mapping, table or {}, substitutions)
    specs = [OutputSpec(s.kind, s.name, s.target) for s in program.graph_signature.output_specs]
    ranges = {k: v for k, v in program.range_constraints.items() if k not in substitutions}
    ranges.update({new: builder.shape_env.symbols[new].range for old, new in substitutions.items()
                   if isinstance(new, sympy.Symbol) and old in program.range_constraints and new not in ranges})
    new = builder.build(outputs, specs, program.state_dict, program.constants, ranges)
    from kiln.ir.program import value_names
    names = value_names(new.body)
    for spec, value in zip(new.graph_signature.output_specs, outputs):
        spec.name = names[value]
    new.copy_annotations_from(program)
    new.hints = {k: v for k, v in new.hints.items() if k not in substitutions}
    new.runtime_asserts = [Guard(expr, guard.source) for guard in program.runtime_asserts
                           if (expr := guard.expr.xreplace(substitutions)) is not sympy.true]
    # What the replay decided from hints, because the ranges and facts left it open, holds for the example
    # inputs but may not for others: the new program checks it at run time instead of silently assuming it.
    new.runtime_asserts += [guard for guard in builder.shape_env.guards if guard.expr not in builder.shape_env.facts]
    return new


def _substitute(value: Any, substitutions: dict[Any, Any]) -> Any:
    if isinstance(value, sympy.Expr):
        return as_dim(value.xreplace(substitutions)) if value.free_symbols & substitutions.keys() else value
    if isinstance(value, list):
        return [_substitute(v, substitutions) for v in value]
    return value


def _substitute_type(value_type: Any, substitutions: dict[Any, Any] | None) -> Any:
    if substitutions and isinstance(value_type, TensorType):
        return value_type.with_shape([_substitute(d, substitutions) for d in value_type.shape])
    return value_type


def replay(block: Any, builder: GraphBuilder, mapping: dict[Any, Any], table: DecompositionTable | None = None,
            substitutions: dict[Any, Any] | None = None) -> list[Any]:
    """Re-issue `block`'s ops into `builder`; return the new values its terminator passes on."""
    from kiln.ir.control_flow import REGION_OPS, CondOp, MapOp, ScanOp, WhileLoopOp, YieldOp

    emitter = DecomposingEmitter(builder, table or {})
    for op in block.ops:
        if isinstance(op, (func.ReturnOp, YieldOp)):
            return [mapping[v] for v in op.operands]
        source = op.attributes.get("kiln.source")
        builder.source = source.data if source is not None else None  # type: ignore[union-attr]
        if isinstance(op, CondOp):
            operands = [mapping[v] for v in op.operands_]
            branches = [_replay_region(region.block, [v.type for v in operands], builder, mapping, table,
                                       substitutions)[0] for region in (op.true_region, op.false_region)]
            new_op = CondOp(mapping[op.pred], operands, [r.type for r in op.results], *branches)
        elif isinstance(op, MapOp):
            xs, operands = [mapping[v] for v in op.xs], [mapping[v] for v in op.operands_]
            slices = [x.type.with_shape(x.type.shape[1:]) for x in xs]  # one slice of each x, then the operands
            body, yielded = _replay_region(op.body.block, [*slices, *(v.type for v in operands)], builder, mapping,
                                           table, substitutions)
            new_op = MapOp(xs, operands, MapOp.stacked_types(xs, [v.type for v in yielded]), body)
        elif isinstance(op, ScanOp):
            init, xs = [mapping[v] for v in op.init], [mapping[v] for v in op.xs]
            operands = [mapping[v] for v in op.operands_]
            body, yielded = _replay_region(op.body.block, ScanOp.body_arg_types(init, xs, operands), builder,
                                           mapping, table, substitutions)
            new_op = ScanOp(init, xs, operands, ScanOp.result_types_for(init, xs, [v.type for v in yielded]), body)
        elif isinstance(op, WhileLoopOp):
            carried, operands = [mapping[v] for v in op.carried], [mapping[v] for v in op.operands_]
            arg_types = [v.type for v in (*carried, *operands)]
            cond_block, body = (_replay_region(region.block, arg_types, builder, mapping, table, substitutions)[0]
                                for region in (op.cond_region, op.body))
            new_op = WhileLoopOp(carried, operands, cond_block, body)
        if isinstance(op, REGION_OPS):
            new_op.attributes.update(op.attributes)
            builder.block.add_op(new_op)
            for old, new in zip(op.results, new_op.results):
                new.name_hint = old.name_hint
                mapping[old] = new
            continue
        mark = builder.block.last_op  # the ops after it are this op's replacement
        arguments = bound_arguments(op, mapping.__getitem__)
        if substitutions:
            arguments = [_substitute(a, substitutions) for a in arguments]
        args, kwargs = split_bound(op.opdef, arguments)  # type: ignore[attr-defined]
        try:
            with emitting(emitter):
                result = OpOverload(op.opdef)(*args, **kwargs)  # type: ignore[attr-defined]
        except GuardError:
            if ASSUMED_TYPES not in op.attributes:
                raise
            for stale in reversed(_ops_after(builder.block, mark)):  # a decomposition's ops before it gave up
                builder.block.erase_op(stale)
            types = [_substitute_type(r.type, substitutions) for r in op.results]
            result = builder.emit_assumed(op.opdef, arguments, types)  # type: ignore[attr-defined]
        # Provenance carries over to the ops that replace this one; role annotations (like `kiln.fuse`)
        # describe this op itself and are dropped with it.
        for new_op in _ops_after(builder.block, mark):
            if "kiln.nn_module_stack" in op.attributes:
                new_op.attributes["kiln.nn_module_stack"] = op.attributes["kiln.nn_module_stack"]
        flat = result if isinstance(result, (list, tuple)) else [result]
        flat = [v for item in flat for v in (item if isinstance(item, list) else [item])]
        for old, new in zip(op.results, flat):
            mapping[old] = new
            if substitutions is not None:
                _follow_unbacked(old.type, getattr(new, "type", None), substitutions, builder.shape_env)
    raise ValueError("block has no terminator")


def _ops_after(block: Block, mark: Operation | None) -> list[Operation]:
    """The ops of `block` after `mark` (all of them when `mark` is None), without walking the ones before it."""
    found, current = [], block.first_op if mark is None else mark.next_op
    while current is not None:
        found.append(current)
        current = current.next_op
    return found


def _follow_unbacked(old_type: Any, new_type: Any, substitutions: dict[Any, Any], env: Any) -> None:
    """A replayed `item()` or `nonzero` names a fresh data-dependent symbol (u1 where the program had u0): later
    ops, the ranges and the facts about u0 move to u1."""
    pairs = []
    if isinstance(old_type, SymIntType) and isinstance(new_type, SymIntType):
        pairs = [(old_type.expr, new_type.expr)]
    elif isinstance(old_type, TensorType) and isinstance(new_type, TensorType) and old_type.ndim == new_type.ndim:
        pairs = list(zip(old_type.shape, new_type.shape))
    for old, new in pairs:
        if not (isinstance(old, sympy.Symbol) and isinstance(new, sympy.Symbol)) or old == new or old in substitutions:
            continue
        old_info, new_info = env.symbols.get(old), env.symbols.get(new)
        if old_info is None or new_info is None or not (old_info.unbacked and new_info.unbacked):
            continue
        substitutions[old] = new
        new_info.range = new_info.range.intersect(old_info.range)
        env.facts.extend(fact.xreplace({old: new}) for fact in list(env.facts) if old in fact.free_symbols)


def _replay_region(block: Any, arg_types: list[Any], builder: GraphBuilder, mapping: dict[Any, Any],
                   table: DecompositionTable, substitutions: dict[Any, Any] | None) -> tuple[Any, list[Any]]:
    """Replay a region's block into a new block taking `arg_types` (a cond branch, a loop body). Regions are closed:
    they read outside values only through their arguments, as torch's subgraphs do. Returns the block and what it
    yields."""
    from kiln.ir.control_flow import YieldOp

    inner_builder = GraphBuilder(builder.shape_env)
    inner = dict(mapping)
    for old_arg, arg_type in zip(block.args, arg_types):
        inner[old_arg] = inner_builder.add_input(old_arg.name_hint or "arg", arg_type)
    yielded = replay(block, inner_builder, inner, table, substitutions)
    inner_builder.block.add_op(YieldOp(yielded))
    return inner_builder.block, yielded


def default_decompositions(namespaces: tuple[str, ...] = ("aten",)) -> dict[OpOverload, Callable[..., Any]]:
    """Every registered decomposition of a non-core op in `namespaces`, keyed by op handle: lowers programs to Core
    ATen. Other namespaces stay, as torch keeps `quantized_decomposed` ops: backends match them; pass
    ("aten", "quantized_decomposed") to compute them in float instead."""
    from kiln.ir.registry import REGISTRY
    return {OpOverload(opdef): opdef.decomposition for opdef in REGISTRY.values()
            if opdef.decomposition is not None and not opdef.is_core and opdef.schema.namespace in namespaces}
