"""torch.export's serde JSON (schema major 8) + raw weights -> kiln ExportedProgram, without torch or pickle.

Nodes are replayed through the op registry inside a GraphBuilder, so every op is re-typed by kiln's meta
rules. torch's SymInt nodes (`sym_size.int`, `_operator.mul`, ...) become sympy expressions that the
consuming ops carry as properties; in-place ops on buffers become functional ops plus buffer mutations.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from typing import Any, Callable

import numpy as np
import sympy
from xdsl.ir import Attribute, Block, SSAValue

from kiln.ir import dtypes
from kiln.ir.control_flow import CondOp, MapOp, ScanOp, WhileLoopOp, YieldOp
from kiln.ir.errors import GuardError, KilnError, UnknownOpError
from kiln.ir.program import (
    ExportedProgram, GraphBuilder, InputKind, ModuleCallEntry, ModuleCallSignature, OutputKind, OutputSpec,
    value_names,
)
from kiln.ir.pytree import TreeSpec
from kiln.ir.registry import REGISTRY, OpDef, call_op, ops
from kiln.ir.serde import archive, formats
from kiln.ir.serde.archive import ArchiveReader, FileLike, Limits
from kiln.ir.serde.errors import SerdeError, UnsafeArchiveError
from kiln.ir.serde.safe_json import load_json
from kiln.ir.serde.symexpr import parse_srepr
from kiln.ir.serde.writer import KILN_SYMBOLS_KEY
from kiln.ir.serde.sparse_graph import fold_sparse_constructors
from kiln.ir.serde.views import ViewTracker
from kiln.ir.sparse import parse_layout
from kiln.ir.symbolic import INF, Guard, ShapeEnv, ValueRange
from kiln.ir.types import SymIntType, TensorType, type_symbols

MAX_TENSOR_ELEMENTS = 1 << 40


def _if_then_else(condition: Any, then: Any, otherwise: Any) -> Any:
    """torch.sym_ite: `then` where the SymBool holds, else `otherwise`. A bool read by `item()` is kiln's 0/1 symbol
    (transformers' `torch._check(mask.all())` asserts the result), which picks by arithmetic."""
    if isinstance(condition, (bool, int)) or condition in (sympy.true, sympy.false):
        return then if bool(condition) else otherwise
    if isinstance(condition, sympy.Expr):  # a 0/1 integer symbol
        return otherwise + (then - otherwise) * condition
    return sympy.Piecewise((then, condition), (otherwise, True))


_SYM_OPERATORS = {
    "_operator.add": lambda a, b: a + b, "_operator.sub": lambda a, b: a - b, "_operator.mul": lambda a, b: a * b,
    "_operator.floordiv": lambda a, b: sympy.floor(sympy.sympify(a) / b), "_operator.mod": sympy.Mod,
    "_operator.neg": lambda a: -a, "torch.sym_max": sympy.Max, "torch.sym_min": sympy.Min,
    "_operator.pow": lambda a, b: a ** b,
    # SymBools: torch asserts them (`_assert_scalar`: runtime assertions) or branches on them (`cond`)
    "_operator.ge": sympy.Ge, "_operator.gt": sympy.Gt, "_operator.le": sympy.Le, "_operator.lt": sympy.Lt,
    "_operator.eq": sympy.Eq, "_operator.ne": sympy.Ne, "_operator.and_": sympy.And, "_operator.or_": sympy.Or,
    "_operator.not_": sympy.Not, "torch.sym_not": sympy.Not, "torch.sym_ite": _if_then_else,
}
# torch's loops: the reader method that reads each into a kiln region op
_LOOP_NODES = {"torch.ops.higher_order.map_impl": "map_node", "torch.ops.higher_order.scan": "scan_node",
               "torch.ops.higher_order.while_loop": "while_loop_node"}
_HIGHER_ORDER_OPS = {"torch.ops.higher_order.cond", "torch.ops.higher_order.wrap_with_set_grad_enabled",
                     *_LOOP_NODES}
# Ops read as the op named here: those that change nothing in a functional program without autograd, and
# torch's other names for an op (`torch.concat`).
_ALIASES = {"aten.detach.default": "aten.alias.default", "aten.detach_.default": "aten.alias.default",
            "aten.concat.default": "aten.cat.default", "aten.concatenate.default": "aten.cat.default",
            # Python's operators on tensors (`mask |= other` in SmolVLM's patch selection), by their ATen names
            **{f"aten.__{i}{op}__.{kind}": f"aten.bitwise_{name}{'_' if i else ''}.{kind}"
               for op, name in (("or", "or"), ("and", "and"), ("xor", "xor")) for i in ("", "i")
               for kind in ("Tensor", "Scalar")}}
# `SymInt result = op(SymInt a, SymInt b)`: the kiln op that hands on a symbolic expression as a value.
_MATERIALIZE = {sympy.Add: "add", sympy.Mul: "mul", sympy.Mod: "mod"}
_SYM_SIZE_OPS = {"torch.ops.aten.sym_size.int", "torch.ops.aten.sym_numel.default",
                 "torch.ops.aten.sym_stride.int", "torch.ops.aten.sym_storage_offset.default"}
_BATCH_NORM_TRAINING = {"aten.batch_norm.default", "aten._native_batch_norm_legit_functional.default"}
_ASSERT_SCALAR = "torch.ops.aten._assert_scalar.default"
_IGNORED_OPS = {_ASSERT_SCALAR, "torch.ops.aten.sym_constrain_range_for_size.default",
                "torch.ops.aten._assert_tensor_metadata.default", "torch.ops.aten.sym_constrain_range.default",
                "torch.ops.aten._assert_async.msg", "torch.ops.higher_order._assert_async"}


def _field(data: Any, key: str, kind: type | tuple[type, ...], what: str) -> Any:
    if not isinstance(data, dict) or key not in data or not _is(data[key], kind):
        raise SerdeError(f"malformed program: {what} lacks a valid {key!r}")
    return data[key]


def _optional(data: Any, key: str, kind: type | tuple[type, ...], what: str, default: Any = None) -> Any:
    """data[key], or `default` where the key is absent or null; a malformed program where `data` is not an object or
    the value has another type."""
    if not isinstance(data, dict):
        raise SerdeError(f"malformed program: {what} is not an object")
    value = data.get(key)
    if value is None:
        return default
    if not _is(value, kind):
        raise SerdeError(f"malformed program: {what} has an invalid {key!r}")
    return value


def _is(value: Any, kind: type | tuple[type, ...]) -> bool:
    """isinstance, except that JSON's true and false are no int."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)


def _last_uses(nodes: list[Any], outputs: list[Any]) -> dict[str, int]:
    """Per name, the index of the last node whose inputs mention it (len(nodes) for the graph's outputs). Every
    string in a node's inputs counts, which may name more than the values it reads, never fewer."""
    last: dict[str, int] = {}

    def mention(data: Any, index: int) -> None:
        if isinstance(data, str):
            last[data] = index
        elif isinstance(data, dict):
            for item in data.values():
                mention(item, index)
        elif isinstance(data, list):
            for item in data:
                mention(item, index)
    for index, node in enumerate(nodes):
        if isinstance(node, dict):
            mention(node.get("inputs"), index)
    mention(outputs, len(nodes))
    return last


def _union(data: Any, what: str) -> tuple[str, Any]:
    """torch writes each union as a one-entry dict `{"as_tensor": ...}`."""
    if not isinstance(data, dict) or len(data) != 1:
        raise SerdeError(f"malformed program: {what} is not a one-field union")
    return next(iter(data.items()))


class _ProgramReader:
    def __init__(self, document: dict[str, Any]):
        self.document = document
        module = _field(document, "graph_module", dict, "the program")
        metadata = module.get("metadata") or {}
        renames = metadata.get(KILN_SYMBOLS_KEY) if isinstance(metadata, dict) else None
        self.rename: dict[str, str] = {}
        if isinstance(renames, str):
            loaded = load_json(renames.encode("utf-8"), "kiln's symbol names")
            if isinstance(loaded, dict):
                self.rename = {str(k): str(v) for k, v in loaded.items() if str(v).isidentifier()}
        self.shape_env = ShapeEnv()
        self.ranges: dict[sympy.Symbol, ValueRange] = {}
        self.sparse_inputs: dict[str, Any] = {}  # graph input name -> kiln layout text (formats.KILN_SPARSE_MEMBER)
        self.unbacked_ranges: dict[str, ValueRange] = {}  # torch's unbacked symbol name -> its range
        self.sym_values: dict[Any, SSAValue] = {}  # a SymInt expression -> the op result that computes it
        for name, bounds in _optional(document, "range_constraints", dict, "the program", {}).items():
            key = parse_srepr(f"Symbol('{name}')", self.rename) if str(name).isidentifier() else None
            if not isinstance(key, sympy.Symbol) or not isinstance(bounds, dict):
                continue  # derived entries (`s0 + 1`) follow from their symbols
            lower = _optional(bounds, "min_val", int, f"the range of {name}")
            upper = _optional(bounds, "max_val", int, f"the range of {name}")
            value_range = ValueRange(-INF if lower is None else int(lower), INF if upper is None else int(upper))
            if _is_unbacked_name(str(key)):  # kiln's meta rules make their own; torch's range narrows them
                self.unbacked_ranges[str(key)] = value_range
                continue
            self.ranges[key] = value_range
            # a hint lets meta rules decide size questions the way torch did; torch's own hint replaces it below
            hint = int(min(max(value_range.lower, 2), value_range.upper)) if value_range.upper != INF or \
                value_range.lower != -INF else 2
            self.shape_env.create_symbol(hint, name=str(key), min=value_range.lower, max=value_range.upper)
        self.unknown: Counter[str] = Counter()
        self.origin: dict[SSAValue, SSAValue] = {}  # latest value of a mutated input -> the input
        self.asserts: list[Guard] = []  # torch's runtime assertions the ranges do not imply
        self.views = ViewTracker()  # what each view aliases, for in-place ops on views
        self.live: Callable[[str], bool] = lambda name: True  # whether a later node of the graph read reads a name

    # -- values
    def dim(self, data: Any, what: str) -> Any:
        kind, value = _union(data, what)
        if kind == "as_int":
            return _constant(kind, value, what)
        if kind == "as_expr":
            expr = parse_srepr(_field(value, "expr_str", str, what), self.rename)
            hint = value.get("hint")
            if isinstance(expr, sympy.Symbol) and expr in self.shape_env.symbols and isinstance(hint, dict) and \
                    isinstance(hint.get("as_int"), int) and hint["as_int"] in self.shape_env.symbols[expr].range:
                self.shape_env.symbols[expr].hint = hint["as_int"]
            for sym in ([] if isinstance(expr, int) else expr.free_symbols):
                if sym not in self.shape_env.symbols:
                    unbacked = str(sym).startswith("u")
                    self.shape_env.create_symbol(None if unbacked else 2, name=str(sym))
            return self.shape_env.simplify(expr)
        raise SerdeError(f"malformed program: {what} is a {kind}, not a SymInt")

    def tensor_type(self, meta: Any, what: str, name: str | None = None) -> TensorType:
        dtype = formats.dtype_of_code(_field(meta, "dtype", int, what))
        sizes = [self.dim(d, f"a size of {what}") for d in _field(meta, "sizes", list, what)]
        code = meta.get("layout", formats.LAYOUT_STRIDED)
        if code == formats.LAYOUT_STRIDED:
            return TensorType.of(sizes, dtype)
        text = self.sparse_inputs.get(name) if name is not None else None
        if not isinstance(text, str):
            raise SerdeError(f"{what} has a non-strided layout (torch code {code!r}) that the file does not describe",
                             fix="kiln reads sparse inputs it wrote itself (their layouts are in "
                                 f"extra/{formats.KILN_SPARSE_MEMBER})")
        try:
            layout = parse_layout(text)
        except KilnError as error:
            raise SerdeError(f"{what}: malformed sparse layout {text!r}: {error.cause}") from None
        if formats.LAYOUT_CODES.get(layout.kind) != code:
            raise SerdeError(f"{what}: the file's layout {text!r} disagrees with torch's layout code {code!r}")
        return TensorType.of(sizes, dtype, layout)

    # -- graphs
    def read_graph(self, graph: dict[str, Any], builder: GraphBuilder, env: dict[str, Any],
                   mutated: dict[str, SSAValue] | None = None) -> list[Any]:
        """Replay `graph`'s nodes into `builder`; return the values of its outputs."""
        self.tensor_values = _field(graph, "tensor_values", dict, "a graph")
        self.sym_int_values = _optional(graph, "sym_int_values", dict, "a graph", {})
        nodes = _field(graph, "nodes", list, "a graph")
        last_use = _last_uses(nodes, _field(graph, "outputs", list, "a graph"))
        outer_live = self.live
        for index, node in enumerate(nodes):
            self.live = lambda name, index=index: last_use.get(name, -1) > index
            self.read_node(node, builder, env, mutated)
        self.live = outer_live
        self.census()
        outputs = []
        for output in _field(graph, "outputs", list, "a graph"):
            outputs.append(self.argument(output, env, "a graph output"))
        return outputs

    def argument(self, data: Any, env: dict[str, Any], what: str) -> Any:
        kind, value = _union(data, what)
        if kind == "as_none":
            return None
        if kind == "as_tensor":
            return self.lookup(env, _field(value, "name", str, what))
        if kind == "as_tensors":
            return [self.lookup(env, _field(v, "name", str, what)) for v in _list(value, what)]
        if kind == "as_optional_tensors":
            return [self.argument(v, env, what) for v in _list(value, what)]
        if kind == "as_optional_tensor":
            return self.argument(value, env, what)
        if kind == "as_float":
            return _float_value(value, what)
        if kind in _CONSTANTS:
            return _constant(kind, value, what)
        if kind in ("as_ints", "as_floats", "as_bools", "as_strings"):
            if kind == "as_floats":
                return [_float_value(v, what) for v in _list(value, what)]
            return [_constant(kind[:-1], v, what) for v in _list(value, what)]
        if kind == "as_sym_int":
            return self.sym_argument(value, env, what)
        if kind == "as_sym_ints":
            return [self.sym_argument(v, env, what) for v in _list(value, what)]
        if kind in ("as_sym_float", "as_sym_bool"):
            return self.sym_argument(value, env, what)
        if kind == "as_scalar_type":
            return formats.dtype_of_code(value)
        if kind == "as_graph":
            return value
        if kind == "as_device":  # kiln programs run where they are run: the device is read and ignored
            return value.get("type", "cpu") if isinstance(value, dict) else "cpu"
        if kind in ("as_layout", "as_memory_format"):
            return None  # kiln has one layout and contiguous values
        raise SerdeError(f"{what} is a {kind}, which kiln does not read", fix="re-export without it")

    def sym_argument(self, data: Any, env: dict[str, Any], what: str) -> Any:
        kind, value = _union(data, what)
        if kind == "as_name":
            return self.lookup(env, value)
        if kind == "as_float":
            return _float_value(value, what)
        if kind in _CONSTANTS:
            return _constant(kind, value, what)
        raise SerdeError(f"malformed program: {what} is a {kind}")

    @staticmethod
    def lookup(env: dict[str, Any], name: Any) -> Any:
        if not isinstance(name, str) or name not in env:
            raise SerdeError(f"malformed program: value {name!r} is used before it is defined")
        return env[name]

    def sym_value(self, name: str) -> Any:
        entry = self.sym_int_values.get(name)
        return None if entry is None else self.dim(entry, f"symbolic value {name}")

    def read_node(self, node: dict[str, Any], builder: GraphBuilder, env: dict[str, Any],
                  mutated: dict[str, SSAValue] | None) -> None:
        target = _field(node, "target", str, "a node")
        inputs = _field(node, "inputs", list, f"node {target}")
        outputs = _field(node, "outputs", list, f"node {target}")
        if target == _ASSERT_SCALAR and not self.unknown:
            self.assert_node(node, env)
            return
        if target in _IGNORED_OPS:
            return
        if self.unknown:  # after the first unknown op only the census continues
            handled = target in _SYM_SIZE_OPS or target in _SYM_OPERATORS or target in _HIGHER_ORDER_OPS
            if not handled and not _known(target) and not _known(target.replace("_.", ".", 1)):
                self.unknown[target[len("torch.ops."):] if target.startswith("torch.ops.aten.") else target] += 1
            return
        arguments = [(_optional(entry, "name", str, f"an input of {target}"),
                      self.argument(_field(entry, "arg", dict, f"an input of {target}"), env, f"an input of {target}"),
                      _optional(entry, "kind", int, f"an input of {target}", 1))
                     for entry in inputs]
        if target in _SYM_SIZE_OPS or target in _SYM_OPERATORS:
            self.sym_node(target, arguments, outputs, env)
            return
        if target == "torch.ops.higher_order.cond":
            self.cond_node(arguments, outputs, builder, env)
            return
        if target in _LOOP_NODES:
            getattr(self, _LOOP_NODES[target])(arguments, outputs, builder, env)
            return
        if target == "torch.ops.higher_order.wrap_with_set_grad_enabled":
            self.inline_node(arguments, outputs, builder, env, mutated)
            return
        if not target.startswith("torch.ops."):
            self.unknown[target] += 1
            return
        name = _ALIASES.get(target[len("torch.ops."):], target[len("torch.ops."):])
        if name in _BATCH_NORM_TRAINING and mutated is not None:
            if self.batch_norm_training(name, arguments, outputs, builder, env, mutated):
                return
        opdef = REGISTRY.get(name)
        inplace_target = None
        if opdef is None and name.startswith("aten.") and name.split(".")[1].endswith("_") and \
                _known(name.replace("_.", ".", 1)):
            opdef = REGISTRY[name.replace("_.", ".", 1)]  # functionalize `x.add_(1)` on buffers and inputs
            if not arguments:
                raise SerdeError(f"malformed program: in-place {name} has no arguments")
            inplace_target = arguments[0][1]
        if opdef is None:
            self.unknown[name if name.startswith("aten.") else target] += 1
            return
        positional = [value for _, value, kind in arguments if kind != 2]
        keywords = {str(key): value for key, value, kind in arguments if kind == 2}
        opdef = _overload_for(opdef, positional, keywords)
        try:
            with builder:
                result = call_op(opdef, tuple(positional), keywords)
        except GuardError:
            # torch proved what kiln's meta rule cannot: take torch's recorded types; runners check them
            result = self.emit_with_recorded_types(opdef, positional, keywords, outputs, builder)
        if inplace_target is not None:
            if mutated is None or not isinstance(inplace_target, SSAValue):
                raise SerdeError(f"in-place {name} inside a cond branch is not supported")
            with builder:  # through a view, the update reaches its bases
                root, latest = self.views.assign(inplace_target, result, env, self.live)
            original = self.origin.pop(root, root)
            if original in builder.block.args:  # in-place on an intermediate needs no mutation output
                mutated[original] = latest
                self.origin[latest] = original
        else:
            self.views.record(opdef.name, positional, keywords, result)
        self.bind_outputs(outputs, result, env, name)

    def emit_with_recorded_types(self, opdef: OpDef, positional: list[Any], keywords: dict[str, Any],
                                 outputs: list[Any], builder: GraphBuilder) -> Any:
        types = []
        for output in outputs:
            kind, data = _union(output, opdef.name)
            entries = [data] if kind == "as_tensor" else data if kind == "as_tensors" else None
            if entries is None:
                raise SerdeError(f"{opdef.name}: kiln cannot derive its result and torch recorded no tensor type")
            for entry in entries:
                name = _field(entry, "name", str, opdef.name)
                if name not in self.tensor_values:
                    raise SerdeError(f"malformed program: {opdef.name}'s result {name!r} has no recorded type")
                types.append(self.tensor_type(self.tensor_values[name], f"{opdef.name}'s result {name!r}"))
        return builder.emit_assumed(opdef, opdef.schema.bind(tuple(positional), keywords), types)

    def batch_norm_training(self, name: str, arguments: list[Any], outputs: list[Any], builder: GraphBuilder,
                            env: dict[str, Any], mutated: dict[SSAValue, SSAValue]) -> bool:
        """Training batch norm updates its running stats: torch's training IR does it inside `batch_norm`,
        its functional IR returns them from `_native_batch_norm_legit_functional`; kiln spells it out."""
        values = REGISTRY[name].schema.bind([v for _, v, kind in arguments if kind != 2],  # checked, in order
                                            {str(key): v for key, v, kind in arguments if kind == 2})
        x, weight, bias, running_mean, running_var = values[:5]
        training, momentum, eps = (values[5], values[6], values[7])
        if not training or running_mean is None or momentum is None:
            return False
        aten = ops.aten
        with builder:
            out = aten.batch_norm.default(x, weight, bias, None, None, True, momentum, eps, True)
            reduce_dims = [d for d in range(len(x.type.shape)) if d != 1]
            variance, mean = aten.var_mean.correction(x, reduce_dims, correction=1)
            new_mean = aten.add.Tensor(aten.mul.Scalar(running_mean, 1 - momentum), aten.mul.Scalar(mean, momentum))
            new_var = aten.add.Tensor(aten.mul.Scalar(running_var, 1 - momentum), aten.mul.Scalar(variance, momentum))
        if name == "aten.batch_norm.default":
            for stat, updated in ((running_mean, new_mean), (running_var, new_var)):
                original = self.origin.pop(stat, stat)
                mutated[original] = updated
                self.origin[updated] = original
                for key, value in list(env.items()):
                    if value is stat:
                        env[key] = updated
            self.bind_outputs(outputs, out, env, name)
        else:  # (out, save_mean, save_rstd, new_running_mean, new_running_var); the saved stats are for backward
            with builder:
                biased, _ = aten.var_mean.correction(x, reduce_dims, correction=0)
                rstd = aten.rsqrt.default(aten.add.Scalar(biased, eps))
            self.bind_outputs(outputs, (out, mean, rstd, new_mean, new_var), env, name)
        return True

    def bind_outputs(self, outputs: list[Any], result: Any, env: dict[str, Any], what: str) -> None:
        flat = [result] if isinstance(result, SSAValue) else list(result)
        if len(outputs) == 1 and _union(outputs[0], what)[0] == "as_tensors":
            flat = [flat] if isinstance(result, SSAValue) else [list(result)]
        if len(outputs) != len(flat):
            raise SerdeError(f"{what} has {len(outputs)} outputs in the file but kiln's schema gives {len(flat)}")
        for output, value in zip(outputs, flat):
            kind, data = _union(output, what)
            if kind == "as_tensor":
                env[_field(data, "name", str, what)] = value
            elif kind == "as_tensors":
                for entry, item in zip(data, value):
                    env[_field(entry, "name", str, what)] = item
            elif kind in ("as_sym_int", "as_sym_float", "as_sym_bool") and "as_name" in data:
                env[data["as_name"]] = self.symbolic_result(data["as_name"], value)
            elif kind != "as_none":
                raise SerdeError(f"{what} has an output of kind {kind}, which kiln does not read")

    def sym_node(self, target: str, arguments: list[Any], outputs: list[Any], env: dict[str, Any]) -> None:
        """Fold a SymInt/SymBool node into a sympy expression, computed from kiln's own values where possible
        (kiln's meta rules name unbacked sizes themselves), else the expression torch recorded."""
        if len(outputs) != 1:
            raise SerdeError(f"malformed program: node {target} has {len(outputs)} outputs, not one")
        name = _field(_union(outputs[0], target)[1], "as_name", str, f"node {target}")
        values = [v for _, v, _ in arguments]
        value = None
        if target == "torch.ops.aten.sym_size.int" and len(values) == 2 and isinstance(values[0], SSAValue) and \
                isinstance(values[0].type, TensorType) and isinstance(values[1], int):
            shape = values[0].type.shape
            if not -len(shape) <= values[1] < len(shape):
                raise SerdeError(f"malformed program: {target} reads dim {values[1]} of a rank-{len(shape)} tensor")
            value = shape[values[1]]
        elif target in _SYM_OPERATORS and not any(isinstance(v, SSAValue) for v in values):
            value = _sym_operator(target, values)
            if isinstance(value, sympy.Expr):
                value = self.shape_env.simplify(value)
        if value is None:
            value = self.sym_value(name)
        if value is None:
            raise SerdeError(f"{target} without a recorded value is not supported")
        env[name] = value

    def assert_node(self, node: dict[str, Any], env: dict[str, Any]) -> None:
        """torch's runtime assertion on SymInts (`u0 <= s0`, from `torch._check`): a fact the meta rules of the
        nodes after it may use, and a check the program keeps for run time, unless the ranges already imply it."""
        inputs = _field(node, "inputs", list, "an _assert_scalar node")
        if not inputs:
            raise SerdeError("malformed program: an _assert_scalar node has no condition")
        condition = self.argument(_field(inputs[0], "arg", dict, "an _assert_scalar condition"), env,
                                  "an _assert_scalar condition")
        if isinstance(condition, bool):
            if not condition:
                raise SerdeError("the program asserts a condition that is false for every input")
            return
        if not isinstance(condition, sympy.Basic):
            raise SerdeError(f"malformed program: _assert_scalar's condition is a {type(condition).__name__}")
        if self.shape_env.assume(condition):
            self.asserts.append(Guard(condition, _node_source(node)))

    def symbolic_result(self, name: str, value: Any) -> Any:
        """An op's SymInt result (`item`): consumers take its expression, as kiln keeps SymInts in properties;
        the value is remembered for a program that returns it. torch's range for it narrows kiln's symbol."""
        if not isinstance(value, SSAValue) or not isinstance(value.type, SymIntType):
            return value
        expr = value.type.expr
        entry = self.sym_int_values.get(name)
        recorded = entry.get("as_expr") if isinstance(entry, dict) else None
        recorded_text = recorded.get("expr_str") if isinstance(recorded, dict) else None
        torch_expr = parse_srepr(recorded_text, {}) if isinstance(recorded_text, str) else None
        if isinstance(expr, sympy.Symbol) and expr in self.shape_env.symbols and isinstance(torch_expr, sympy.Symbol):
            torch_range = self.unbacked_ranges.get(str(torch_expr))
            if torch_range is not None:
                info = self.shape_env.symbols[expr]
                info.range = ValueRange(max(info.range.lower, torch_range.lower),
                                        min(info.range.upper, torch_range.upper))
        if not isinstance(expr, int):
            self.sym_values.setdefault(expr, value)
        return expr

    def materialize(self, value: Any, builder: GraphBuilder) -> SSAValue:
        """A SymInt the program returns, as a value: the op result that computed it, `sym_size.int` of a tensor
        that has it as a dim, or `_operator` arithmetic over those (kiln otherwise keeps SymInts in properties)."""
        if isinstance(value, SSAValue):
            return value
        if isinstance(value, (bool, float)) or (isinstance(value, sympy.Basic) and not isinstance(value, sympy.Expr)):
            raise SerdeError(f"the program returns the {type(value).__name__} {value}, which kiln cannot return "
                             "as a value yet", fix="return it as a tensor (torch.tensor(...)) instead")
        if not isinstance(value, (int, sympy.Expr)):
            raise SerdeError(f"the program returns a {type(value).__name__}, which kiln does not support")
        expr = sympy.sympify(value)
        found = self.sym_values.get(expr)
        if found is not None:
            return found
        operator = ops._operator
        with builder:
            if isinstance(expr, sympy.Symbol):
                defined = [*builder.block.args, *(r for op in builder.block.ops for r in op.results)]
                tensor = next((v for v in defined if isinstance(v.type, TensorType) and expr in v.type.shape), None)
                result = operator.add.default(expr, 0) if tensor is None else \
                    ops.aten.sym_size.int(tensor, list(tensor.type.shape).index(expr))
            elif type(expr) in (sympy.Add, sympy.Mul):
                terms = sorted(expr.args, key=lambda term: bool(term.is_Integer))  # constants as right operands
                handle = operator.add if isinstance(expr, sympy.Add) else operator.mul
                result = handle.default(terms[0], expr.func(*terms[1:]))
            elif isinstance(expr, sympy.Mod):
                result = operator.mod.default(*expr.args)
            elif isinstance(expr, sympy.floor):
                numerator, denominator = expr.args[0].as_numer_denom()
                result = operator.floordiv.default(numerator, denominator)
            else:  # an integer, or an expression kiln's arithmetic ops compute whole
                result = operator.add.default(expr, 0)
        self.sym_values[expr] = result
        return result

    def bool_tensor(self, condition: Any, builder: GraphBuilder) -> SSAValue:
        """A SymBool (`s0 > 2`) as the 0-d bool tensor kiln's cond takes: 0-d int64 tensors of both sides,
        compared."""
        aten = ops.aten
        if isinstance(condition, SSAValue):
            return condition
        with builder:
            if isinstance(condition, (bool, int)) or condition in (sympy.true, sympy.false):
                return aten.scalar_tensor.default(bool(condition), dtype=dtypes.bool_)
            if isinstance(condition, sympy.core.relational.Relational) and condition.rel_op in _COMPARISONS:
                compare = getattr(aten, _COMPARISONS[condition.rel_op]).Tensor
                return compare(aten.scalar_tensor.default(condition.lhs, dtype=dtypes.int64),
                               aten.scalar_tensor.default(condition.rhs, dtype=dtypes.int64))
            if isinstance(condition, sympy.Not):
                return aten.logical_not.default(self.bool_tensor(condition.args[0], builder))
            if isinstance(condition, (sympy.And, sympy.Or)):
                combine = aten.logical_and.default if isinstance(condition, sympy.And) else aten.logical_or.default
                parts = [self.bool_tensor(arg, builder) for arg in condition.args]
                result = parts[0]
                for part in parts[1:]:
                    result = combine(result, part)
                return result
        raise SerdeError(f"cannot read the symbolic condition {condition} as a tensor",
                         fix="make the predicate a tensor (e.g. torch.tensor(x.shape[0] > 2))")

    def cond_node(self, arguments: list[Any], outputs: list[Any], builder: GraphBuilder,
                  env: dict[str, Any]) -> None:
        """`cond(pred, true_graph, false_graph, operands)`: each branch becomes a region of a kiln.cond."""
        values = [v for _, v, _ in arguments]
        if len(values) != 4:
            raise SerdeError("malformed program: cond needs (pred, true_graph, false_graph, operands)")
        pred = self.bool_tensor(values[0], builder)
        operands, region_arguments = _hop_operands(values[3], "cond's operands")
        (true_block, yielded), (false_block, _) = [self.region(branch, region_arguments, f"cond's {label} branch")
                                                   for branch, label in ((values[1], "true"), (values[2], "false"))]
        op = CondOp(pred, operands, [v.type for v in yielded], true_block, false_block)
        self.add_region_op(op, builder, outputs, env, "cond")

    def inline_node(self, arguments: list[Any], outputs: list[Any], builder: GraphBuilder, env: dict[str, Any],
                    mutated: dict[str, SSAValue] | None) -> None:
        """`wrap_with_set_grad_enabled(enabled, submodule, *args)` (a `@torch.no_grad()` forward): grad mode means
        nothing to a kiln program, so the submodule's nodes are read in place."""
        values = [v for _, v, _ in arguments]
        if len(values) < 2 or not isinstance(values[1], dict):
            raise SerdeError("malformed program: wrap_with_set_grad_enabled needs (enabled, submodule, *args)")
        graph = _field(values[1], "graph", dict, "a wrap_with_set_grad_enabled submodule")
        graph_inputs = _field(graph, "inputs", list, "a wrap_with_set_grad_enabled submodule")
        if len(graph_inputs) != len(values) - 2:
            raise SerdeError("malformed program: a wrap_with_set_grad_enabled submodule takes a different number of "
                             "inputs than it is given")
        sub_env: dict[str, Any] = {}
        for entry, value in zip(graph_inputs, values[2:]):
            kind, data = _union(entry, "a submodule input")
            sub_env[_field(data, "as_name" if kind.startswith("as_sym") else "name", str, "a submodule input")] = value
        saved = self.tensor_values, self.sym_int_values
        results = self.read_graph(graph, builder, sub_env, mutated)
        self.tensor_values, self.sym_int_values = saved
        self.bind_outputs(outputs, results[0] if len(results) == 1 else results, env, "wrap_with_set_grad_enabled")

    def map_node(self, arguments: list[Any], outputs: list[Any], builder: GraphBuilder,
                 env: dict[str, Any]) -> None:
        """`map_impl(body, xs, operands)`: the body becomes the region of a kiln.map, typed per slice."""
        values = [v for _, v, _ in arguments]
        if len(values) != 3:
            raise SerdeError("malformed program: map_impl needs (body_graph, xs, operands)")
        xs = _sliced_tensors(values[1], "map_impl")
        operands, operand_arguments = _hop_operands(values[2], "map_impl's operands")
        body, yielded = self.region(values[0], [*_slice_types(xs), *operand_arguments], "the map body")
        op = MapOp(xs, operands, MapOp.stacked_types(xs, [v.type for v in yielded]), body)
        self.add_region_op(op, builder, outputs, env, "map_impl")

    def scan_node(self, arguments: list[Any], outputs: list[Any], builder: GraphBuilder,
                  env: dict[str, Any]) -> None:
        """`scan(combine_graph, init, xs, additional_inputs)`: the combine graph becomes the region of a kiln.scan,
        taking (carries, one slice of each x, operands)."""
        values = [v for _, v, _ in arguments]
        if len(values) != 4:
            raise SerdeError("malformed program: scan needs (combine_graph, init, xs, additional_inputs)")
        init = _tensors(values[1], "scan's init")
        xs = _sliced_tensors(values[2], "scan")
        operands, operand_arguments = _hop_operands(values[3], "scan's additional_inputs")
        body, yielded = self.region(values[0], [*(v.type for v in init), *_slice_types(xs), *operand_arguments],
                                    "scan's combine graph")
        if len(yielded) < len(init):
            raise SerdeError(f"malformed program: scan's combine graph returns {len(yielded)} values, fewer than its "
                             f"{len(init)} carries")
        op = ScanOp(init, xs, operands, ScanOp.result_types_for(init, xs, [v.type for v in yielded]), body)
        self.add_region_op(op, builder, outputs, env, "scan")

    def while_loop_node(self, arguments: list[Any], outputs: list[Any], builder: GraphBuilder,
                        env: dict[str, Any]) -> None:
        """`while_loop(cond_graph, body_graph, carried_inputs, additional_inputs)`: both graphs become regions of a
        kiln.while_loop, taking (carried, operands)."""
        values = [v for _, v, _ in arguments]
        if len(values) != 4:
            raise SerdeError("malformed program: while_loop needs (cond_graph, body_graph, carried_inputs, "
                             "additional_inputs)")
        carried = _tensors(values[2], "while_loop's carried_inputs")
        operands, operand_arguments = _hop_operands(values[3], "while_loop's additional_inputs")
        region_arguments = [*(v.type for v in carried), *operand_arguments]
        cond_block, _ = self.region(values[0], region_arguments, "while_loop's cond graph")
        body, _ = self.region(values[1], region_arguments, "while_loop's body graph")
        self.add_region_op(WhileLoopOp(carried, operands, cond_block, body), builder, outputs, env, "while_loop")

    def region(self, graph_argument: Any, arguments: list[Any], what: str) -> tuple[Block, list[SSAValue]]:
        """A higher-order op's subgraph read as a kiln region: a block argument for each type in `arguments`; a
        symbolic entry (a SymInt torch passes in) is bound to its expression, as kiln keeps SymInts in properties.
        The block ends with a kiln.yield of the subgraph's outputs, which must be tensors."""
        if not isinstance(graph_argument, dict):
            raise SerdeError(f"malformed program: {what} is not a graph")
        graph = _field(graph_argument, "graph", dict, what)
        graph_inputs = _field(graph, "inputs", list, what)
        if len(graph_inputs) != len(arguments):
            raise SerdeError(f"malformed program: {what} takes {len(graph_inputs)} inputs but is given "
                             f"{len(arguments)}")
        sub_builder = GraphBuilder(self.shape_env)
        sub_env: dict[str, Any] = {}
        for entry, argument in zip(graph_inputs, arguments):
            kind, data = _union(entry, f"an input of {what}")
            name = _field(data, "as_name" if kind.startswith("as_sym") else "name", str, f"an input of {what}")
            sub_env[name] = sub_builder.add_input(name, argument) if isinstance(argument, Attribute) else argument
        saved = self.tensor_values, self.sym_int_values  # the subgraph's own tables, while it is read
        yielded = self.read_graph(graph, sub_builder, sub_env, None)
        self.tensor_values, self.sym_int_values = saved
        if not all(isinstance(v, SSAValue) and isinstance(v.type, TensorType) for v in yielded):
            raise SerdeError(f"{what} returns a non-tensor value, which kiln's region ops do not support",
                             fix="return tensors from the function (e.g. torch.tensor(n) for a SymInt)")
        sub_builder.block.add_op(YieldOp(yielded))
        return sub_builder.block, yielded

    def add_region_op(self, op: Any, builder: GraphBuilder, outputs: list[Any], env: dict[str, Any],
                      hint: str) -> None:
        """Check a region op read from the file against its own rules, then record it and bind its results."""
        try:
            op.verify_()
        except KilnError as error:
            raise SerdeError(f"malformed program: {error.cause}", fix=error.fix) from None
        builder.block.add_op(op)
        for result in op.results:
            result.name_hint = hint
        self.bind_outputs(outputs, list(op.results), env, hint)

    def census(self) -> None:
        if self.unknown:
            listing = ", ".join(f"{name} (x{count})" for name, count in sorted(self.unknown.items()))
            raise UnknownOpError(f"the program uses {sum(self.unknown.values())} op(s) kiln does not know: {listing}",
                                 fix=decompose_in_torch_hint(self.unknown))


def _tensors(value: Any, what: str) -> list[SSAValue]:
    if not isinstance(value, list) or \
            not all(isinstance(v, SSAValue) and isinstance(v.type, TensorType) for v in value):
        raise SerdeError(f"malformed program: {what} is not a list of tensors",
                         fix="kiln reads loops that carry tensors (wrap Python numbers with torch.tensor)")
    return list(value)


def _sliced_tensors(value: Any, op_name: str) -> list[SSAValue]:
    """The xs of a map or scan: at least one tensor, each with a leading dim to slice."""
    xs = _tensors(value, f"{op_name}'s xs")
    if not xs or any(x.type.ndim == 0 for x in xs):  # type: ignore[attr-defined]
        raise SerdeError(f"malformed program: {op_name} needs at least one x, each with a dim to slice")
    return xs


def _slice_types(xs: list[SSAValue]) -> list[Attribute]:
    return [x.type.with_shape(x.type.shape[1:]) for x in xs]  # type: ignore[attr-defined]


def _hop_operands(value: Any, what: str) -> tuple[list[SSAValue], list[Any]]:
    """A higher-order op's extra inputs: the tensors, which become the kiln op's operands, and each input's region
    argument (a tensor's type, or a SymInt's expression). torch writes none as an empty tensor list, SymInts alone as
    a SymInt list, and SymInts after tensors inside the tensor list, by name."""
    if value is None:
        return [], []
    operands: list[SSAValue] = []
    arguments: list[Any] = []
    for item in _list(value, what):
        if isinstance(item, SSAValue) and isinstance(item.type, TensorType):
            operands.append(item)
            arguments.append(item.type)
        elif _is(item, (int, sympy.Expr)):
            arguments.append(item)
        else:
            raise SerdeError(f"malformed program: {what} holds a {type(item).__name__}, not a tensor or SymInt")
    return operands, arguments


def _node_source(node: dict[str, Any]) -> str:
    """The user's line a node came from, from torch's stack trace: `"model.py", line 12, in forward`."""
    metadata = node.get("metadata")
    trace = metadata.get("stack_trace") if isinstance(metadata, dict) else None
    if not isinstance(trace, str):
        return ""
    frames = [line.strip() for line in trace.splitlines() if line.strip().startswith("File ")]
    return frames[-1][len("File "):] if frames else ""


def decompose_in_torch_hint(names: Any) -> str:
    """A fix that works for ops kiln lacks: decompose just those in torch (a full run_decompositions() may fail
    inside torch on real models), or convert with kiln.from_torch, which does that."""
    listed = ", ".join(f"torch.ops.{name}" for name in sorted(names) if name.startswith("aten."))
    return ("in torch, decompose just these ops before saving: table = torch.export.default_decompositions(); "
            f"ep = ep.run_decompositions({{op: table[op] for op in [{listed}] if op in table}}); or convert the "
            "module with kiln.from_torch, which does that; or add them to kiln (docs/adding-ops.md)")


_COMPARISONS = {">": "gt", ">=": "ge", "<": "lt", "<=": "le", "==": "eq", "!=": "ne"}


def _is_unbacked_name(name: str) -> bool:
    return name.startswith("u") and name[1:].isdigit()


_SPECIAL_FLOATS = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}


def _sym_operator(target: str, values: list[Any]) -> Any:
    """A SymInt/SymBool node's operator on its (non-tensor) arguments. The file chooses them: the wrong count or
    kind of arguments is a malformed program, and so is an integer result beyond int64 (a chain of squarings would
    otherwise grow without bound)."""
    if target == "_operator.pow" and len(values) == 2 and all(_is(v, int) for v in values) and \
            abs(values[0]) > 1 and values[1] > 64:
        raise SerdeError(f"malformed program: {target}({values[0]}, {values[1]}) is beyond int64")
    try:
        value = _SYM_OPERATORS[target](*values)
    except (TypeError, ValueError, ArithmeticError, AttributeError, sympy.SympifyError) as error:
        raise SerdeError(f"malformed program: {target} of {values!r}: {error}") from None
    if _is(value, int) and not _INT64[0] <= value <= _INT64[1]:
        raise SerdeError(f"malformed program: {target} of {values!r} is beyond int64")
    return value


# A constant argument's union kind -> the JSON type it holds.
_CONSTANTS = {"as_int": int, "as_bool": bool, "as_string": str}
_INT64 = (-2 ** 63, 2 ** 63 - 1)


def _constant(kind: str, value: Any, what: str) -> Any:
    """An int (in int64's range), bool or string argument, checked."""
    if not _is(value, _CONSTANTS[kind]) or (kind == "as_int" and not _INT64[0] <= value <= _INT64[1]):
        raise SerdeError(f"malformed program: {what} is not {'an int64' if kind == 'as_int' else kind[3:]}")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise SerdeError(f"malformed program: {what} is not a list")
    return value


def _float_value(value: Any, what: str) -> float:
    """torch writes non-finite floats as the strings `Infinity`, `-Infinity` and `NaN` (its JSON disallows them)."""
    if isinstance(value, str) and value in _SPECIAL_FLOATS:
        return _SPECIAL_FLOATS[value]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise SerdeError(f"malformed program: {what} is not a float")


def _known(name: str) -> bool:
    name = name.replace("torch.ops.", "", 1)
    return name in REGISTRY or name in _ALIASES


def _tensor_slots_hold_values(opdef: OpDef, positional: list[Any], keywords: dict[str, Any]) -> bool:
    try:
        bound = opdef.schema.bind(positional, keywords)
    except KilnError:
        return False
    for argument, value in zip(opdef.schema.arguments, bound):
        if argument.type.is_tensor and not argument.type.is_list and value is not None and \
                not isinstance(value, SSAValue):
            return False
    return True


def _overload_for(opdef: OpDef, positional: list[Any], keywords: dict[str, Any]) -> OpDef:
    """The overload torch named, unless torch passes Python scalars where it says Tensor (`add.Tensor(x, 1)`):
    then the overload that takes a scalar there (`add.Scalar`)."""
    if _tensor_slots_hold_values(opdef, positional, keywords):
        return opdef
    prefix = f"{opdef.schema.namespace}.{opdef.schema.name}."
    candidates = sorted((d for key, d in REGISTRY.items() if key.startswith(prefix)),
                        key=lambda d: (d.schema.overload != "Scalar", d.schema.overload))
    for candidate in candidates:
        if _tensor_slots_hold_values(candidate, positional, keywords):
            return candidate
    raise SerdeError(f"{opdef.name} is called with a scalar where kiln's overloads need a tensor, and no "
                     "overload of it takes a scalar there")


# ---------------------------------------------------------------------------------------------
# Whole programs and archives

_INPUT_KINDS = {"user_input": InputKind.USER_INPUT, "parameter": InputKind.PARAMETER, "buffer": InputKind.BUFFER,
                "tensor_constant": InputKind.CONSTANT_TENSOR}
_INPUT_TARGETS = {"parameter": "parameter_name", "buffer": "buffer_name", "tensor_constant": "tensor_constant_name"}
_OUTPUT_KINDS = {"user_output": (OutputKind.USER_OUTPUT, None), "buffer_mutation": (OutputKind.BUFFER_MUTATION,
                                                                                     "buffer_name"),
                 "user_input_mutation": (OutputKind.USER_INPUT_MUTATION, "user_input_name"),
                 "loss_output": (OutputKind.LOSS_OUTPUT, None),
                 "gradient_to_parameter": (OutputKind.GRADIENT_TO_PARAMETER, "parameter_name"),
                 "gradient_to_user_input": (OutputKind.GRADIENT_TO_USER_INPUT, "user_input_name")}


def check_schema_version(document: Any) -> None:
    version = document.get("schema_version") if isinstance(document, dict) else None
    major = version.get("major") if isinstance(version, dict) else None
    if major != formats.SCHEMA_VERSION[0]:
        raise SerdeError(f"the program's serde schema major version is {major!r}; kiln reads major "
                         f"{formats.SCHEMA_VERSION[0]} (torch {formats.TORCH_VERSION})",
                         fix="re-export it with torch 2.13, or upgrade kiln")


def program_from_document(document: Any, state_dict: dict[str, np.ndarray], constants: dict[str, np.ndarray],
                          pickled: set[str] = frozenset(),  # type: ignore[assignment]
                          sparse_inputs: dict[str, Any] | None = None) -> ExportedProgram:
    """Build a kiln program from a `models/<name>.json` document and its weights (`sparse_inputs`: the layouts of
    sparse-typed inputs, from kiln's sparse member)."""
    check_schema_version(document)
    reader = _ProgramReader(document)
    reader.sparse_inputs = dict(sparse_inputs or {})
    module = document["graph_module"]
    graph = _field(module, "graph", dict, "the program")
    signature = _field(module, "signature", dict, "the program")
    input_specs = _field(signature, "input_specs", list, "the signature")
    graph_inputs = _field(graph, "inputs", list, "the graph")
    if len(input_specs) != len(graph_inputs):
        raise SerdeError("malformed program: the signature and the graph have different numbers of inputs")
    tensor_values = _field(graph, "tensor_values", dict, "the graph")
    builder = GraphBuilder(reader.shape_env)
    env: dict[str, Any] = {}
    baked: dict[int, Any] = {}  # non-tensor inputs torch specialized on (`constant_input`), by user leaf index
    arg_specs = []  # the specs of the graph's tensor inputs
    for spec_data, arg_data in zip(input_specs, graph_inputs):
        kind, spec = _union(spec_data, "an input spec")
        if kind == "constant_input":
            value = reader.argument(_field(spec, "value", dict, "a constant input"), {}, "a constant input")
            if isinstance(value, (SSAValue, list, dict)):
                raise SerdeError("malformed program: a constant input is not a Python constant")
            baked[len(baked) + sum(1 for s in arg_specs if "user_input" in s)] = value
            continue
        arg_specs.append(spec_data)
        if kind not in _INPUT_KINDS:
            needs = "a pickled custom object" if kind == "custom_obj" else f"a {kind} input"
            raise SerdeError(f"the program needs {needs}, which kiln does not load (it would need unpickling)"
                             if kind == "custom_obj" else f"the program has {needs}, which kiln does not support")
        arg_kind, arg = _union(arg_data, "a graph input")
        name = _field(arg, "name", str, "a graph input")
        if arg_kind != "as_tensor" or name not in tensor_values:
            raise SerdeError(f"input {name!r} is not a tensor; kiln reads tensor inputs only")
        target = _field(spec, _INPUT_TARGETS[kind], str, f"a {kind} input") if kind in _INPUT_TARGETS else None
        if target in pickled:
            raise UnsafeArchiveError(f"the program needs {target!r}, which the file stores as a pickle; kiln never "
                                     "unpickles", fix="save it with torch 2.13's default (raw tensor bytes)")
        value_type = reader.tensor_type(tensor_values[name], f"input {name!r}", name)
        persistent = _optional(spec, "persistent", bool, "a buffer input") if kind == "buffer" else None
        env[name] = builder.add_input(name, value_type, _INPUT_KINDS[kind], target, persistent)
    mutated: dict[SSAValue, SSAValue] = {}
    outputs = reader.read_graph(graph, builder, env, mutated)
    reader.census()
    reader.views.erase_unused()
    returned, output_specs = [], []
    names_by_arg = dict(zip(builder.block.args, arg_specs))
    for original, latest in mutated.items():  # torch's training IR mutates in place: make it a mutation output
        if original not in names_by_arg:  # a value computed in the graph (batch_norm's running stats): no one sees it
            continue
        kind, spec = _union(names_by_arg[original], "an input spec")
        if kind == "tensor_constant":
            # State torch's module keeps in a constant it mutates in place (Hugging Face's static KV caches): a
            # non-persistent buffer, whose update is a mutation output like any buffer's
            builder.set_input_kind(original, InputKind.BUFFER, spec["tensor_constant_name"], False)
            returned.append(latest)
            output_specs.append((OutputKind.BUFFER_MUTATION, spec["tensor_constant_name"]))
        elif kind == "buffer":
            returned.append(latest)
            output_specs.append((OutputKind.BUFFER_MUTATION, spec["buffer_name"]))
        elif kind == "user_input":
            returned.append(latest)
            output_specs.append((OutputKind.USER_INPUT_MUTATION, None))
        else:
            raise SerdeError(f"the program mutates a {kind} in place, which kiln does not support")
    spec_list = _field(signature, "output_specs", list, "the signature")
    if len(spec_list) != len(outputs):
        raise SerdeError("malformed program: the signature and the graph have different numbers of outputs")
    none_outputs = []  # positions among the user outputs of those that are None (a model output's empty field)
    for spec_data, value in zip(spec_list, outputs):
        kind, spec = _union(spec_data, "an output spec")
        if kind not in _OUTPUT_KINDS:
            raise SerdeError(f"the program has a {kind} output, which kiln does not support")
        if value is None and _OUTPUT_KINDS[kind][0] is OutputKind.USER_OUTPUT:
            none_outputs.append(sum(k is OutputKind.USER_OUTPUT for k, _ in output_specs) + len(none_outputs))
            continue
        value = reader.materialize(value, builder)
        output_kind, target_key = _OUTPUT_KINDS[kind]
        returned.append(value)
        output_specs.append((output_kind, _optional(spec, target_key, str, f"a {kind} output") if target_key else None))
    names = value_names(builder.block)
    input_names = {arg: names[arg] for arg in builder.block.args}
    specs = []
    for (kind, target), value in zip(output_specs, returned):
        if kind is OutputKind.USER_INPUT_MUTATION and target is None:
            target = input_names[next(o for o, latest in mutated.items() if latest is value)]
        specs.append(OutputSpec(kind, names[value], target))
    program = builder.build(returned, specs, state_dict, constants, dict(reader.ranges))
    used = _symbols_in(program)  # data-dependent sizes keep their ranges, as in torch's range_constraints
    program.range_constraints.update({sym: info.range for sym, info in reader.shape_env.symbols.items()
                                      if info.unbacked and sym in used})
    program.input_constants = baked
    # torch's assertions, then what kiln's meta rules decided from hints where they could not prove what torch
    # did: the program checks both at run time rather than assume them.
    program.runtime_asserts = reader.asserts + reader.shape_env.guards
    _check_weights(program)
    _read_call_specs(program, module, none_outputs)
    return program


def _symbols_in(program: ExportedProgram) -> set[sympy.Symbol]:
    return {symbol for op in program.graph_module.walk() for result in op.results
            for symbol in type_symbols(result.type)}


def _check_weights(program: ExportedProgram) -> None:
    for spec, arg in zip(program.graph_signature.input_specs, program.body.args):
        if spec.kind is InputKind.USER_INPUT:
            continue
        value = program.stored(spec.target, None)
        if value is None:
            raise SerdeError(f"{spec.kind.value.lower()} {spec.target!r} is missing from the file's weights")
        expected = arg.type
        if list(value.shape) != list(expected.shape) or value.dtype != expected.dtype.numpy:
            raise SerdeError(f"weight {spec.target!r} is {dtypes.dtype(value.dtype).name}{list(value.shape)} but "
                             f"the program expects {expected.short()}")


def _read_call_specs(program: ExportedProgram, module: dict[str, Any], none_outputs: list[int]) -> None:
    """The calling convention: torch's input and output structure. An output that is None (torch keeps it as a
    constant leaf) becomes a None node of the output structure, which kiln's programs return without a value."""
    entries = _optional(module, "module_call_graph", list, "the program", [])
    root = next((e for e in entries if isinstance(e, dict) and e.get("fqn") == ""), None)
    signature = root.get("signature") if root else None
    if not isinstance(signature, dict):
        return
    fields = _optional(module, "treespec_namedtuple_fields", dict, "the program", {})
    in_spec = formats.treespec_from_json(signature.get("in_spec"), fields)
    out_spec = formats.treespec_from_json(signature.get("out_spec"), fields)
    user_inputs = len(program.graph_signature.user_inputs) + len(program.input_constants)
    user_outputs = len(program.graph_signature.user_outputs)
    if in_spec.num_leaves == user_inputs:
        program.in_spec = in_spec
    if none_outputs and out_spec.num_leaves == user_outputs + len(none_outputs):
        out_spec = _leaves_to_none(out_spec, set(none_outputs))
    if out_spec.num_leaves == user_outputs:
        program.out_spec = out_spec
    names = signature.get("forward_arg_names")
    if isinstance(names, list) and all(isinstance(n, str) for n in names):
        program.module_call_graph[0] = ModuleCallEntry("", ModuleCallSignature(
            list(program.graph_signature.user_inputs), list(program.graph_signature.user_outputs),
            program.in_spec, program.out_spec, forward_arg_names=list(names)))


def _leaves_to_none(spec: TreeSpec, positions: set[int]) -> TreeSpec:
    """`spec` with the leaves at `positions` (in leaf order) replaced by None nodes."""
    counter = iter(range(spec.num_leaves))

    def rebuild(node: TreeSpec) -> TreeSpec:
        if node.kind == "leaf":
            return TreeSpec("none") if next(counter) in positions else node
        return dataclasses.replace(node, children=tuple(rebuild(child) for child in node.children))
    return rebuild(spec)


def read_tensors(reader: ArchiveReader, config_path: str, directory: str, limits: Limits
                 ) -> tuple[dict[str, np.ndarray], set[str]]:
    """The tensors a weights/constants config lists, from raw bytes; pickled entries are only named."""
    if not reader.has(config_path):
        return {}, set()
    config = load_json(reader.read(config_path, limits.max_json_bytes), config_path)
    entries = config.get("config") if isinstance(config, dict) else None
    if not isinstance(entries, dict):
        raise SerdeError(f"{config_path} has no 'config' table")
    tensors: dict[str, np.ndarray] = {}
    pickled: set[str] = set()
    raw_cache: dict[str, bytes] = {}
    for fqn, entry in entries.items():
        path_name = _field(entry, "path_name", str, f"weight {fqn!r}")
        if entry.get("use_pickle"):
            pickled.add(fqn)
            continue
        path = directory + path_name
        archive._check_member_name(path)
        meta = _field(entry, "tensor_meta", dict, f"weight {fqn!r}")
        dtype = formats.dtype_of_code(meta.get("dtype"))
        sizes = [_static_int(d, fqn) for d in _field(meta, "sizes", list, f"weight {fqn!r}")]
        strides = [_static_int(d, fqn) for d in _optional(meta, "strides", list, f"weight {fqn!r}", [])] or None
        offset = _static_int(_optional(meta, "storage_offset", dict, f"weight {fqn!r}", {"as_int": 0}), fqn)
        if any(d < 0 for d in sizes) or offset < 0 or (strides is not None and len(strides) != len(sizes)):
            raise UnsafeArchiveError(f"weight {fqn!r} has a malformed shape {sizes}")
        count = math.prod(sizes)
        if count > MAX_TENSOR_ELEMENTS:
            raise UnsafeArchiveError(f"weight {fqn!r} declares shape {sizes} ({count} elements): absurdly large")
        itemsize = dtype.numpy.itemsize
        if strides is None:
            strides = [math.prod(sizes[i + 1:]) for i in range(len(sizes))]
        if any(s < 0 for s in strides):
            raise UnsafeArchiveError(f"weight {fqn!r} has negative strides {strides}")
        needed = 0 if count == 0 else offset + sum((d - 1) * s for d, s in zip(sizes, strides)) + 1
        if not reader.has(path):
            raise SerdeError(f"weight {fqn!r} names member {path!r}, which the archive lacks")
        available = reader.size(path)
        if needed * itemsize > available:
            raise UnsafeArchiveError(f"weight {fqn!r} has shape {sizes} ({dtype.name}), needing {needed * itemsize} "
                                     f"bytes, but {path!r} holds {available}")
        if path not in raw_cache:
            raw_cache[path] = reader.read(path)
        raw = raw_cache[path]
        base = np.frombuffer(raw, dtype=np.dtype(dtype.numpy).newbyteorder("<"), count=available // itemsize)
        view = np.lib.stride_tricks.as_strided(base[offset:], shape=sizes, strides=[s * itemsize for s in strides])
        tensors[fqn] = np.array(view, dtype=dtype.numpy)  # a writable, native-order copy
    return tensors, pickled


def _static_int(data: Any, fqn: str) -> int:
    kind, value = _union(data, f"a size of weight {fqn!r}")
    if kind != "as_int" or not _is(value, int) or not _INT64[0] <= value <= _INT64[1]:
        raise SerdeError(f"weight {fqn!r} has a symbolic or malformed size")
    return value


def skipped_entries(reader: ArchiveReader) -> dict[str, str]:
    """The archive's pickled files kiln does not read, each with why: torch's sample inputs (running the program
    does not need them) and custom objects (a program that needs one is refused when it is read)."""
    skipped = {}
    for name in reader.names():
        if name.startswith(archive.SAMPLE_INPUTS_DIR) and reader.size(name) > 0:
            skipped[name] = "pickled sample inputs: kiln never unpickles, and running the program does not need them"
        elif name.startswith(archive.CONSTANTS_DIR) and "custom_obj" in name:
            skipped[name] = "a pickled custom object: kiln never unpickles, and the program does not use it"
    return skipped


def read_archive(f: FileLike, *, extra_files: dict[str, Any] | None, limits: Limits,
                 model_name: str | None = None) -> ExportedProgram:
    reader = ArchiveReader(f, limits)
    try:
        if reader.read_text(archive.ARCHIVE_FORMAT_PATH).strip() != archive.ARCHIVE_FORMAT_VALUE:
            raise SerdeError("the archive's archive_format is not 'pt2'")
        if reader.has(archive.BYTEORDER_PATH) and reader.read_text(archive.BYTEORDER_PATH).strip() != "little":
            raise SerdeError("the archive stores big-endian weights, which kiln does not read")
        models = sorted(n for n in reader.names() if n.startswith("models/") and n.endswith(".json"))
        if not models:
            raise SerdeError("the archive holds no models/<name>.json program")
        if model_name is None:
            if len(models) > 1 and "models/model.json" not in models:
                raise SerdeError(f"the archive holds {len(models)} programs; name one",
                                 fix=", ".join(m[len('models/'):-len('.json')] for m in models))
            model_name = "model" if "models/model.json" in models else models[0][len("models/"):-len(".json")]
        document = load_json(reader.read(archive.MODELS_FILENAME_FORMAT.format(model_name), limits.max_json_bytes),
                             f"models/{model_name}.json")
        check_schema_version(document)
        state_dict, pickled = read_tensors(reader, archive.WEIGHTS_CONFIG_FILENAME_FORMAT.format(model_name),
                                           archive.WEIGHTS_DIR, limits)
        constants, pickled_constants = read_tensors(
            reader, archive.CONSTANTS_CONFIG_FILENAME_FORMAT.format(model_name), archive.CONSTANTS_DIR, limits)
        sparse: Any = {}
        if reader.has(archive.EXTRA_DIR + formats.KILN_SPARSE_MEMBER):
            sparse = load_json(reader.read(archive.EXTRA_DIR + formats.KILN_SPARSE_MEMBER, limits.max_json_bytes),
                               formats.KILN_SPARSE_MEMBER)
            if not isinstance(sparse, dict):
                raise SerdeError(f"malformed {formats.KILN_SPARSE_MEMBER}: not an object")
            described = _field(sparse, "weights", dict, formats.KILN_SPARSE_MEMBER)
            fold_sparse_constructors(document, described)
            assemble_sparse_weights(described, state_dict, constants)
        program = program_from_document(document, state_dict, constants, pickled | pickled_constants,
                                        sparse.get("inputs") if isinstance(sparse.get("inputs"), dict) else {})
        # Reaching here means the program needed none of them (a needed pickle is refused above): a note, no warning.
        program.metadata["skipped"] = skipped_entries(reader)
        if extra_files is not None:
            for key in list(extra_files):
                path = archive.EXTRA_DIR + key
                extra_files[key] = reader.read(path, limits.max_json_bytes).decode("utf-8", "replace") \
                    if reader.has(path) else None
        return program
    finally:
        reader.close()


def assemble_sparse_weights(described: dict[str, Any], state_dict: dict[str, Any], constants: dict[str, Any]) -> None:
    """Rebuild the sparse weights kiln wrote as their components (`fqn.component` weights), checking torch's
    invariants on them: a hostile file gets a SerdeError, never an out-of-bounds index in a kernel."""
    for fqn, entry in described.items():
        what = f"sparse weight {fqn!r}"
        layout_text = _field(entry, "layout", str, what)
        names = _field(entry, "components", list, what)
        shape = _field(entry, "shape", list, what)
        if not all(_is(d, int) and d >= 0 for d in shape):
            raise SerdeError(f"{what} has a malformed shape {shape!r}")
        if not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
            raise SerdeError(f"{what}: its components {names!r} are not distinct names")
        store = next((s for s in (state_dict, constants) if all(f"{fqn}.{n}" in s for n in names)), None)
        if store is None:
            raise SerdeError(f"{what}: the file lacks its components {names!r}")
        parts = {n: store.pop(f"{fqn}.{n}") for n in names}
        try:
            layout = parse_layout(layout_text)
            value = _sparse_value(layout, shape, parts)
        except (KilnError, KeyError, ValueError, IndexError) as error:
            cause = error.cause if isinstance(error, KilnError) else f"{type(error).__name__}: {error}"
            raise SerdeError(f"{what} is malformed: {cause}") from None
        if value.layout.kind != layout.kind or value.layout.blocksize != layout.blocksize:
            raise SerdeError(f"{what}: its components make a {value.layout} tensor, the file says {layout}")
        store[fqn] = value


def _sparse_value(layout: Any, shape: list[int], parts: dict[str, np.ndarray]) -> Any:
    from kiln.ir import sparse
    if layout.kind == "sparse_coo":
        return sparse.coo(parts["indices"], parts["values"], shape, is_coalesced=layout.coalesced,
                          check_invariants=True)
    if layout.kind == "semi_structured":
        return sparse.semi_structured(parts["values"], parts["metadata"], shape)
    compressed, plain = [n for n in parts if n != "values"]
    return sparse.compressed(layout.kind, parts[compressed], parts[plain], parts["values"], shape,
                             check_invariants=True)


def load_json_document(data: bytes) -> Any:
    """Parse a program document (the bridge hands torch's in-memory serialization here)."""
    return load_json(data, "the program JSON")


__all__ = ["program_from_document", "read_archive", "load_json_document", "skipped_entries"]
