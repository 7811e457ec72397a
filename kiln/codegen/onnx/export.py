"""Lower an ExportedProgram to an ONNX ModelProto: decompose what has no lowering, walk the ops through the
lowering table, turn the region ops into ONNX control flow (`kiln.cond` into `If`, `kiln.map` and `kiln.scan`
into `Scan`, `kiln.while_loop` into `Loop`), weights into deduplicated initializers and symbols into dim_params.
"""

from __future__ import annotations

import json

from typing import Any, Callable, Mapping, Sequence

import onnx
import sympy
from onnx import helper
from xdsl.dialects import func

from kiln.ir import dtypes
from kiln.ir.control_flow import CondOp, MapOp, ScanOp, WhileLoopOp, YieldOp
from kiln.ir.dialect import bound_arguments
from kiln.ir.errors import KilnError, UnsupportedError
from kiln.ir.program import ExportedProgram, InputKind, OutputKind, value_names
from kiln.ir.registry import REGISTRY, OpOverload, split_bound
from kiln.ir.types import SymIntType, TensorType

from kiln.codegen.onnx.context import Lowering, LoweringContext
from kiln.codegen.onnx.graph import DimSource, Model, OnnxGraph, Value, value_info
from kiln.codegen.onnx.lowerings import COMPLEX_VALUES, LOWERING_TABLE, UNSUPPORTED
from kiln.codegen.onnx.optimize import clean_graph
from kiln.codegen.onnx.recurrent import bidirectional_partner, lower_bidirectional, lower_recurrent, match_recurrent
import kiln.codegen.onnx.composites  # noqa: F401,E402  (adds the composite ops' lowerings to the table)
import kiln.codegen.onnx.quantized  # noqa: F401,E402  (adds the quantize/dequantize lowerings)

# Opset 20 is the default, as in torch.onnx 2.13 (torch.onnx._constants.ONNX_DEFAULT_OPSET): it has Gelu, which
# onnxruntime runs as one kernel. Opset 18 is the oldest the table targets (Col2Im, BitwiseAnd, reductions with
# `axes` inputs, Split with a sizes input); 23 adds Attention and RMSNormalization.
DEFAULT_OPSET = 20
MIN_OPSET, MAX_OPSET = 18, 23
PRODUCER = "kiln"


class MissingLoweringError(UnsupportedError):
    """Raised once per export, listing every op that has neither an ONNX lowering nor a decomposition."""


def onnx_lowerable(custom: Mapping[str, Lowering] | None = None) -> set[str]:
    return set(LOWERING_TABLE) | set(custom or {})


def decomposition_table(lowerable: set[str]) -> dict[OpOverload, Callable[..., Any]]:
    """Decompositions of the ops the ONNX table cannot lower directly (lowered ops stay as they are)."""
    return {OpOverload(opdef): opdef.decomposition for name, opdef in REGISTRY.items()
            if opdef.decomposition is not None and name not in lowerable}


def _walk(block: Any) -> Any:
    for op in block.ops:
        yield op
        for region in op.regions:
            for inner in region.blocks:
                yield from _walk(inner)


def prepare_program(program: ExportedProgram, custom: Mapping[str, Lowering] | None = None,
                    optimize: bool = True, opset: int = DEFAULT_OPSET) -> ExportedProgram:
    """Decompose ops without a lowering, then check every op can be lowered; with `optimize`, fold eval batch norm
    into its convolution first (and from opset 23, whose Attention takes fewer key/value heads than query heads,
    read repeated key/value heads unrepeated), and fold constants, CSE and DCE after."""
    from kiln.passes import run
    from kiln.passes.complex import complex_boundary
    if not complex_boundary(program):  # onnxruntime has no complex tensors: pairs of real ones instead
        program = run(program, "lower-complex")
    if optimize:  # while conv and batch_norm are still whole ops: fold eval batch norm into the weights
        program = run(program, "fold-batchnorm" + (",group-query-attention" if opset >= 23 else ""))
    lowerable = onnx_lowerable(custom)
    table = decomposition_table(lowerable)
    present = {op.name for op in _walk(program.body) if hasattr(op, "opdef")}
    if present & {handle.name for handle in table}:  # retracing costs time: only when something decomposes
        program = program.run_decompositions(table)
    if optimize:
        program = run(program, "fold-constants,cse,dce")
    check_lowerable(program, lowerable)
    return program


def check_lowerable(program: ExportedProgram, lowerable: set[str]) -> None:
    """Refuse, all at once, the ops with no lowering, and those on complex values (which lower-complex leaves where
    the program takes or returns one: `fftn` of a 0-d tensor is only a cast to complex)."""
    missing: dict[str, list[str]] = {}
    on_complex: set[str] = set()
    for op in _walk(program.body):
        if not hasattr(op, "opdef"):
            continue
        if any(getattr(getattr(v.type, "dtype", None), "is_complex", False) for v in (*op.operands, *op.results)):
            on_complex.add(op.name)
        elif op.name in lowerable:
            continue
        source = op.attributes.get("kiln.source")
        missing.setdefault(op.name, []).append(source.data if source is not None else "<no source line>")
    if not missing:
        return
    lines = []
    for name, sources in sorted(missing.items()):
        reason = UNSUPPORTED.get(name, COMPLEX_VALUES if name in on_complex else
                                 "no ONNX lowering and no decomposition")
        where = "; ".join(dict.fromkeys(sources))
        lines.append(f"  {name} ({reason}) at {where}")
    raise MissingLoweringError(
        f"{len(missing)} op(s) cannot be exported to ONNX:\n" + "\n".join(lines),
        fix="register a decomposition for them (kiln.ir.registry.register_decomposition, or decompose with "
            "ep.run_decompositions(table) first), or pass custom_translation_table={'aten.op.overload': fn} "
            "to kiln.onnx.export, fn(ctx, *args) emitting ONNX nodes")


def _dim_sources(program: ExportedProgram, graph_inputs: dict[Any, str]) -> dict[sympy.Symbol, DimSource]:
    """Each symbol's input dim: one that is the symbol itself where there is one, else one that is a whole multiple
    of it plus a constant (torch exports a waveform's length as 320 * frames: its strides' product)."""
    sources: dict[sympy.Symbol, DimSource] = {}
    dims = [(name, axis, dim) for arg, name in graph_inputs.items() if isinstance(arg.type, TensorType)
            for axis, dim in enumerate(arg.type.shape) if isinstance(dim, sympy.Expr) and dim.free_symbols]
    for name, axis, dim in dims:
        if dim.is_Symbol:
            sources.setdefault(dim, DimSource(name, axis))
    for name, axis, dim in dims:
        if len(dim.free_symbols) == 1 and not dim.is_Symbol:
            symbol, = dim.free_symbols
            if not dim.is_polynomial(symbol):  # floor(s / 2), Max(s, 3): no inverse to compute s from
                continue
            polynomial = sympy.Poly(dim, symbol)
            if polynomial.degree() == 1 and all(c.is_Integer for c in polynomial.all_coeffs()):
                scale, offset = (int(c) for c in polynomial.all_coeffs())
                sources.setdefault(symbol, DimSource(name, axis, scale, offset))
    return sources


def lower_to_model(program: ExportedProgram, *, opset: int = DEFAULT_OPSET,
                   input_names: list[str] | None = None, output_names: list[str] | None = None,
                   custom_translation_table: Mapping[str, Lowering] | None = None,
                   graph_name: str = "main_graph", sparse_initializers: bool = False) -> onnx.ModelProto:
    """The ONNX model of a prepared program (see `prepare_program`); `sparse_initializers`: see Model."""
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise KilnError(f"opset {opset} is not supported by the ONNX emitter",
                        fix=f"choose an opset from {MIN_OPSET} to {MAX_OPSET} (default {DEFAULT_OPSET})")
    table = {**LOWERING_TABLE, **dict(custom_translation_table or {})}
    model = Model(sparse_initializers)
    names = value_names(program.body)
    specs = program.graph_signature.input_specs
    user_args = [(arg, spec) for arg, spec in zip(program.body.args, specs) if spec.kind is InputKind.USER_INPUT]
    if input_names is not None and len(input_names) != len(user_args):
        raise KilnError(f"input_names has {len(input_names)} names but the model has {len(user_args)} inputs")
    values: dict[Any, Value] = {}
    graph_inputs: dict[Any, str] = {}
    inputs_proto = []
    for index, (arg, spec) in enumerate(user_args):
        name = model.fresh(input_names[index] if input_names else spec.name)
        graph_inputs[arg] = name
        values[arg] = Value(name, arg.type)
        inputs_proto.append(value_info(name, arg.type))
    # A buffer the program mutates (a KV cache) is state ONNX cannot keep: a graph input whose new value is a graph
    # output (`<input>_updated`), which the caller feeds back (kiln's ONNXProgram does).
    mutated = set(program.graph_signature.buffers_to_mutate.values())
    state_inputs: dict[str, str] = {}  # buffer target -> graph input
    for arg, spec in zip(program.body.args, specs):
        if spec.kind is InputKind.USER_INPUT:
            continue
        if spec.target in mutated:
            name = state_inputs[spec.target] = model.fresh(spec.target)
            graph_inputs[arg] = name
            values[arg] = Value(name, arg.type)
            inputs_proto.append(value_info(name, arg.type))
            continue
        store = program.state_dict if spec.target in program.state_dict else program.constants
        if spec.target not in store:
            raise KilnError(f"{spec.kind.value.lower()} '{spec.target}' is missing from the state dict")
        values[arg] = Value(model.initializer(store[spec.target], spec.target or spec.name), arg.type)
    graph = OnnxGraph(model, _dim_sources(program, graph_inputs))
    results = _lower_block(graph, program.body, values, names, table, opset)

    user_outputs = [(value, spec) for value, spec in zip(results, program.graph_signature.output_specs)
                    if spec.kind is OutputKind.USER_OUTPUT]
    if output_names is not None and len(output_names) != len(user_outputs):
        raise KilnError(f"output_names has {len(output_names)} names but the model has {len(user_outputs)} outputs")
    outputs_proto = []
    taken: set[str] = set(graph_inputs.values()) | {name for name, _ in model.initializers}
    default_names = program.user_output_names()  # the pytree keys (`logits`) where the outputs have them
    renamed: dict[str, str] = {}  # a value an earlier output renamed: later outputs read it by its new name
    for index, (value, spec) in enumerate(user_outputs):
        wanted = (output_names or default_names)[index]
        name = _claim_output(graph, renamed.get(value.name, value.name), wanted, taken, renamed)
        taken.add(name)
        outputs_proto.append(value_info(name, value.type))
    state_outputs = []
    for value, spec in zip(results, program.graph_signature.output_specs):
        if spec.kind is OutputKind.BUFFER_MUTATION:
            wanted = f"{state_inputs[spec.target]}_updated"
            name = _claim_output(graph, renamed.get(value.name, value.name), wanted, taken, renamed)
            taken.add(name)
            outputs_proto.append(value_info(name, value.type))
            state_outputs.append((state_inputs[spec.target], name, spec.target))
    graph.nodes, model.initializers = clean_graph(graph.nodes, model.initializers, {o.name for o in outputs_proto})
    # Built in place: helper.make_graph/make_model would copy every weight twice (seconds for GPT-2).
    result = onnx.ModelProto()
    result.ir_version = 10  # what onnxruntime 1.2x reads
    result.producer_name, result.producer_version = PRODUCER, _version()
    result.opset_import.add(domain="", version=opset)
    onnx_graph = result.graph
    onnx_graph.name = graph_name
    onnx_graph.node.extend(model.sparse_constants())
    onnx_graph.node.extend(graph.nodes)
    onnx_graph.input.extend(inputs_proto)
    onnx_graph.output.extend(outputs_proto)
    model.write_initializers(onnx_graph)
    ranges = {str(sym): str(r) for sym, r in sorted(program.range_constraints.items(), key=lambda kv: str(kv[0]))}
    for key, text in ranges.items():
        entry = result.metadata_props.add()
        entry.key, entry.value = f"kiln.range.{key}", text
    if state_outputs:  # which inputs are state, the outputs that update them, and the buffers they are
        entry = result.metadata_props.add()
        entry.key, entry.value = "kiln.state", json.dumps(state_outputs)
    return result


def _version() -> str:
    import sys
    return getattr(sys.modules.get("kiln"), "__version__", "0")  # the parent package (no upward import)


def _claim_output(graph: OnnxGraph, produced: str, wanted: str, taken: set[str], renamed: dict[str, str]) -> str:
    """Name a graph output `wanted`: rename the node output that produced it (recorded in `renamed`), or add an
    Identity."""
    renamable = produced not in taken and any(produced in node.output for node in graph.nodes)
    if renamable and (wanted == produced or wanted not in graph.model.used_names):
        if wanted != produced:
            graph.model.used_names.add(wanted)
            graph.rename(produced, wanted)
            renamed[produced] = wanted
        return wanted
    name = wanted if wanted not in graph.model.used_names else graph.model.fresh(wanted)
    graph.model.used_names.add(name)
    graph.nodes.append(helper.make_node("Identity", [produced], [name], name=name))
    return name


def _lower_block(graph: OnnxGraph, block: Any, values: dict[Any, Value], names: dict[Any, str],
                 table: Mapping[str, Lowering], opset: int) -> list[Value]:
    for op in block.ops:
        if isinstance(op, (func.ReturnOp, YieldOp)):
            return [values[v] for v in op.operands]
        if op.results and all(result in values for result in op.results):
            continue  # computed ahead by an op that covers it too (a bidirectional recurrent layer's reverse scan)
        region_lowering = _REGION_LOWERINGS.get(type(op))
        if region_lowering is not None:
            region_lowering(graph, op, values, names, table, opset)
            continue
        lowering = table.get(op.name)
        if lowering is None:  # prepare_program reports these all at once; this guards direct callers
            raise MissingLoweringError(f"{op.name} has no ONNX lowering")
        hint = names.get(op.results[0], "v") if op.results else "v"
        graph.hint = hint
        context = LoweringContext(graph, op, opset)
        context.values = values  # what the kiln values computed so far are in the graph (for pattern lowerings)
        arguments = [_widen(graph, a) for a in bound_arguments(op, values.__getitem__)]
        narrow_results = [t.dtype if isinstance(t, TensorType) and t.dtype in _LOW_PRECISION else None
                          for t in context.result_types]
        context.result_types = [t.with_dtype(dtypes.float32) if d is not None else t
                                for t, d in zip(context.result_types, narrow_results)]
        positional, keywords = split_bound(op.opdef, arguments)
        mark = len(graph.nodes)
        try:
            produced = lowering(context, *positional, **keywords)
        except KilnError as error:
            source = op.attributes.get("kiln.source")
            raise UnsupportedError(f"cannot lower {op.name} to ONNX: {error.cause}",
                                   source=error.source or (source.data if source is not None else None),
                                   fix=error.fix) from error
        produced_list = produced if isinstance(produced, (list, tuple)) else [produced]
        if len(produced_list) != len(op.results):
            raise KilnError(f"the ONNX lowering of {op.name} returned {len(produced_list)} values "
                            f"for {len(op.results)} results")
        for result, name, narrow in zip(op.results, produced_list, narrow_results):
            if narrow is not None:
                name = graph.cast(name, dtypes.float32, narrow)
            wanted = names.get(result, name)
            name = _rename_fresh(graph, mark, name, wanted)
            values[result] = Value(name, result.type)
            _bind_data_dependent_size(graph, result, name)
    raise KilnError("block has no terminator")


def _bind_data_dependent_size(graph: OnnxGraph, result: Any, name: str) -> None:
    """Where later sizes find a fresh symbol a result names: a symbolic integer result (`item()` of a count: u0; its
    lowering gives a 0-d int64, as LoweringContext.out_dtype types symbolic integers), or a tensor's dim (nonzero's
    rows, the rows a mask picks: read from the tensor's shape)."""
    if isinstance(result.type, SymIntType) and isinstance(result.type.expr, sympy.Symbol) \
            and result.type.expr not in graph.dim_sources:
        graph.dim_sources[result.type.expr] = DimSource(name, None)
    if isinstance(result.type, TensorType):
        for axis, dim in enumerate(result.type.shape):
            if isinstance(dim, sympy.Symbol) and dim not in graph.dim_sources:
                graph.dim_sources[dim] = DimSource(name, axis)


# onnxruntime's CPU provider lacks most float16/bfloat16 kernels (even Expand, Pad, Tile), so ops on them compute
# in float32 and round back: exact for data movement, and what ATen's opmath does for arithmetic.
_LOW_PRECISION = dtypes.REDUCED_FLOATS


def _widen(graph: OnnxGraph, argument: Any) -> Any:
    if isinstance(argument, list):
        return [_widen(graph, a) for a in argument]
    if isinstance(argument, Value) and isinstance(argument.type, TensorType) and argument.dtype in _LOW_PRECISION:
        name = graph.cast(argument.name, argument.dtype, dtypes.float32)
        graph.widened[name] = argument.dtype
        return Value(name, argument.type.with_dtype(dtypes.float32))
    return argument


def _rename_fresh(graph: OnnxGraph, mark: int, produced: str, wanted: str) -> str:
    """Give a node output created by this op the IR's name for the value (keeps the ONNX graph readable)."""
    if wanted in graph.model.used_names:
        return produced
    for node in graph.nodes[mark:]:
        if produced in node.output:
            graph.model.used_names.add(wanted)
            graph.rename(produced, wanted, since=mark)
            return wanted
    return produced


def _lower_region(graph: OnnxGraph, block: Any, arguments: Sequence[Value], values: dict[Any, Value],
                  names: dict[Any, str], table: Mapping[str, Lowering], opset: int) -> list[Value]:
    """Lower a region's ops into `graph`, its block arguments bound to `arguments`; returns what it yields. The
    region reads the other outer values by name (ONNX subgraphs see their enclosing graphs' values)."""
    inner = dict(values)
    inner.update(zip(block.args, arguments))
    return _lower_block(graph, block, inner, names, table, opset)


def _subgraph(graph: OnnxGraph, name: str, inputs: Sequence[Value],
              lower: Callable[[OnnxGraph], Sequence[Value]]) -> onnx.GraphProto:
    """The ONNX subgraph (an If branch, a Scan or Loop body) `name` with formal `inputs`; `lower(body)` emits its
    nodes and returns its outputs."""
    body = OnnxGraph(graph.model, graph.dim_sources, parent=graph)
    outputs = []
    for value in lower(body):
        # A subgraph's outputs must be produced inside it (a formal input or an outer value passed on is not) and
        # be named apart from every other value in the model: each gets its own Identity.
        output = graph.model.fresh(f"{name}_out")
        body.nodes.append(helper.make_node("Identity", [value.name], [output], name=output))
        outputs.append(value_info(output, value.type))
    return helper.make_graph(body.nodes, name, [value_info(v.name, v.type) for v in inputs], outputs)


def _formal_inputs(graph: OnnxGraph, arguments: Sequence[Any], names: dict[Any, str], suffix: str) -> list[Value]:
    """Fresh ONNX names for block arguments that become a subgraph's formal inputs."""
    return [Value(graph.model.fresh(f"{names.get(arg, 'x')}_{suffix}"), arg.type) for arg in arguments]


def _bind_results(graph: OnnxGraph, op: Any, values: dict[Any, Value], produced: Any) -> None:
    produced = produced if isinstance(produced, list) else [produced]
    for result, name in zip(op.results, produced):
        values[result] = Value(name, result.type)


def _lower_cond(graph: OnnxGraph, op: CondOp, values: dict[Any, Value], names: dict[Any, str],
                table: Mapping[str, Lowering], opset: int) -> None:
    """`kiln.cond` → ONNX `If`: each branch is a subgraph with no inputs, reading the operands from the outer
    scope."""
    hint = names.get(op.results[0], "cond") if op.results else "cond"
    operands = [values[o] for o in op.operands_]
    then_branch, else_branch = (
        _subgraph(graph, f"{hint}_{label}", [],
                  lambda body, region=region: _lower_region(body, region.block, operands, values, names, table, opset))
        for label, region in (("then", op.true_region), ("else", op.false_region)))
    graph.hint = hint
    _bind_results(graph, op, values, graph.node("If", [values[op.pred].name], outputs=len(op.results),
                                                then_branch=then_branch, else_branch=else_branch))


def _lower_map(graph: OnnxGraph, op: MapOp, values: dict[Any, Value], names: dict[Any, str],
               table: Mapping[str, Lowering], opset: int) -> None:
    """`kiln.map` → ONNX `Scan` with no state: the body takes one slice of each x along axis 0 and reads the other
    operands from the outer scope; Scan stacks what it yields along a new axis 0, as map_impl does."""
    _lower_scan_like(graph, op, [], list(op.xs), values, names, table, opset, "map")


def _lower_scan(graph: OnnxGraph, op: ScanOp, values: dict[Any, Value], names: dict[Any, str],
                table: Mapping[str, Lowering], opset: int) -> None:
    """`kiln.scan` → ONNX `Scan`: the carries are its state variables, the xs its scan inputs along axis 0, and the
    per-step outputs its scan outputs stacked along a new axis 0; both order their inputs and outputs as the scan
    HOP does (state first). `reverse` needs nothing here: the frontend flips the xs and ys around the op. A scan that
    is exactly one direction of an RNN, LSTM or GRU layer becomes ONNX's op for it instead (see recurrent.py)."""
    match = match_recurrent(op)
    if match is not None:
        graph.hint = names.get(op.results[-1], "rnn")
        partner = bidirectional_partner(op, match, values)
        if partner is None:
            _bind_results(graph, op, values, lower_recurrent(graph, match, values))
            return
        # The layer's two directions are one op: the reverse scan's results (or its time flip's) are bound now, and
        # _lower_block skips the ops whose results are all bound.
        forward_results, reverse_results = lower_bidirectional(graph, match, partner, values)
        _bind_results(graph, op, values, forward_results)
        values.update((result, Value(name, result.type)) for result, name in reverse_results.items())
        return
    _lower_scan_like(graph, op, list(op.init), list(op.xs), values, names, table, opset, "scan")


def _lower_scan_like(graph: OnnxGraph, op: MapOp | ScanOp, init: list[Any], xs: list[Any],
                     values: dict[Any, Value], names: dict[Any, str], table: Mapping[str, Lowering], opset: int,
                     default_hint: str) -> None:
    """A `Scan` whose body's formal inputs are the carries then one slice of each x; the remaining block arguments
    (the extra operands) are read from the outer scope."""
    hint = names.get(op.results[0], default_hint) if op.results else default_hint
    block = op.body.block
    count = len(init) + len(xs)
    formal = _formal_inputs(graph, block.args[:count], names, "step")
    operands = [values[o] for o in op.operands_]
    body = _subgraph(graph, f"{hint}_body", formal,
                     lambda body: _lower_region(body, block, [*formal, *operands], values, names, table, opset))
    graph.hint = hint
    _bind_results(graph, op, values, graph.node("Scan", [values[v].name for v in (*init, *xs)],
                                                outputs=len(op.results), body=body, num_scan_inputs=len(xs)))


def _lower_while_loop(graph: OnnxGraph, op: WhileLoopOp, values: dict[Any, Value], names: dict[Any, str],
                      table: Mapping[str, Lowering], opset: int) -> None:
    """`kiln.while_loop` → ONNX `Loop` with no trip count: the carried values are its loop-carried dependencies.
    Loop tests its condition before the first iteration from an input and afterwards from what the body returns, so
    the cond region is lowered twice: in the outer graph on the initial values, and at the end of the body on the
    next ones."""
    hint = names.get(op.results[0], "while_loop") if op.results else "while_loop"
    operands = [values[o] for o in op.operands_]
    cond_block, body_block = op.cond_region.block, op.body.block
    initial = [values[v] for v in op.carried]
    (first,) = _lower_region(graph, cond_block, [*initial, *operands], values, names, table, opset)
    iteration = Value(graph.model.fresh(f"{hint}_iteration"), TensorType.of([], dtypes.int64))
    keep_going = Value(graph.model.fresh(f"{hint}_cond_in"), TensorType.of([], dtypes.bool_))
    carried = _formal_inputs(graph, body_block.args[:len(initial)], names, "carried")

    def lower_body(body: OnnxGraph) -> list[Value]:
        following = _lower_region(body, body_block, [*carried, *operands], values, names, table, opset)
        (again,) = _lower_region(body, cond_block, [*following, *operands], values, names, table, opset)
        return [again, *following]

    body = _subgraph(graph, f"{hint}_body", [iteration, keep_going, *carried], lower_body)
    graph.hint = hint
    _bind_results(graph, op, values, graph.node("Loop", ["", first.name, *(v.name for v in initial)],
                                                outputs=len(op.results), body=body))


# The region ops, each lowered to an ONNX control-flow op whose subgraphs are built from its regions.
_REGION_LOWERINGS: dict[type, Callable[..., None]] = {
    CondOp: _lower_cond, MapOp: _lower_map, ScanOp: _lower_scan, WhileLoopOp: _lower_while_loop}


__all__ = ["DEFAULT_OPSET", "MIN_OPSET", "MAX_OPSET", "MissingLoweringError", "prepare_program", "lower_to_model",
           "decomposition_table", "onnx_lowerable", "check_lowerable"]
