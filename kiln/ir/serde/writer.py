"""kiln ExportedProgram -> torch.export's serde JSON (schema 8.20) plus raw weight bytes.

Symbolic properties (kiln keeps `2*s0` inside an op) become torch's SymInt nodes: `sym_size.int` on an
input that has the symbol as a dim, then `_operator` arithmetic, each named and typed in `sym_int_values`.
"""

from __future__ import annotations

import json
import keyword
import math
from typing import Any

import numpy as np
import sympy
from xdsl.dialects import func
from xdsl.ir import Block, SSAValue

from kiln.ir.control_flow import CondOp, MapOp, ScanOp, WhileLoopOp, YieldOp
from kiln.ir.dialect import bound_arguments
from kiln.ir.program import ExportedProgram, InputKind, OutputKind, value_names
from kiln.ir.registry import REGISTRY
from kiln.ir.schema import Argument, ArgType
from kiln.ir.serde import formats
from kiln.ir.serde.errors import SerdeError
from kiln.ir.serde.symexpr import integral_form, print_srepr
from kiln.ir.symbolic import INF
from kiln.ir.types import ScalarType, SymIntType, TensorType

KILN_SYMBOLS_KEY = "kiln_symbols"  # graph_module.metadata entry: torch symbol name -> kiln symbol name


def _is_expr(value: Any) -> bool:
    return isinstance(value, sympy.Expr) and not value.is_Integer


class _Symbols:
    """torch-style names (`s0`, `u0`) and example values (hints) for the program's symbols."""

    def __init__(self, program: ExportedProgram):
        found: list[sympy.Symbol] = [s for s in program.range_constraints if isinstance(s, sympy.Symbol)]
        sizes: set[sympy.Expr] = set()  # every symbolic tensor size in the program
        for op in program.graph_module.walk():
            for result in [*op.results, *(a for r in op.regions for b in r.blocks for a in b.args)]:
                dims = result.type.shape if isinstance(result.type, TensorType) else \
                    [result.type.expr] if isinstance(result.type, SymIntType) else []
                for dim in dims:
                    if not isinstance(dim, int):
                        found += sorted(dim.free_symbols - set(found), key=str)
                        if isinstance(result.type, TensorType) and not dim.is_Integer:
                            sizes.add(dim)
        self.names: dict[sympy.Symbol, str] = {}
        backed = unbacked = 0
        for sym in found:
            if sym in self.names:
                continue
            if str(sym).startswith("u") and str(sym)[1:].isdigit():
                self.names[sym], unbacked = f"u{unbacked}", unbacked + 1
            else:
                self.names[sym], backed = f"s{backed}", backed + 1
        self.ranges = program.range_constraints
        self.float_names: list[str] = []  # torch names each SymFloat (a float `item()`) `zuf0`, `zuf1`, ...
        self.hints = {}
        for sym in self.names:
            value_range = self.ranges.get(sym)
            lower, upper = (value_range.lower, value_range.upper) if value_range else (2, INF)
            invented = int(min(max(lower, 2), upper)) if upper != INF or lower != -INF else 2
            self.hints[sym] = program.hints.get(sym, invented)
        self.hints.update(_hints_torch_keeps_dynamic(self.hints, self.ranges, sizes, program.runtime_asserts,
                                                     backed=[s for s, n in self.names.items() if n.startswith("s")]))

    def torch_spelling(self, expr: sympy.Basic) -> sympy.Basic:
        """expr with the symbols named as in the file (kiln's `s_batch` is torch's `s0` there)."""
        return expr.xreplace({s: sympy.Symbol(self.names[s], integer=True) for s in expr.free_symbols
                              if s in self.names})

    def hint(self, expr: Any) -> int | None:
        if isinstance(expr, int):
            return expr
        value = expr.xreplace({s: sympy.Integer(v) for s, v in self.hints.items()})
        return int(value) if value.is_Integer else None

    def sym_int(self, dim: Any) -> dict[str, Any]:
        if isinstance(dim, int) or (isinstance(dim, sympy.Expr) and dim.is_Integer):
            return {"as_int": int(dim)}
        expr: dict[str, Any] = {"expr_str": print_srepr(dim, self.names)}
        hint = self.hint(dim)
        if hint is not None and not any(self.names[s].startswith("u") for s in dim.free_symbols):
            expr["hint"] = {"as_int": hint}
        return {"as_expr": expr}

    def range_constraints(self) -> dict[str, dict[str, int | None]]:
        def bound(value: float) -> int | None:
            return None if math.isinf(value) else int(value)
        ranges = {self.names[s]: {"min_val": bound(r.lower), "max_val": bound(r.upper)}
                  for s, r in self.ranges.items() if isinstance(s, sympy.Symbol) and s in self.names}
        for sym, name in self.names.items():  # torch's loader needs a range for every symbol it meets
            ranges.setdefault(name, {"min_val": None, "max_val": None})
        ranges.update({name: {"min_val": None, "max_val": None} for name in self.float_names})
        return ranges

    def sym_float(self) -> dict[str, Any]:
        """A fresh SymFloat symbol: kiln's ScalarType values carry no expression."""
        name = f"zuf{len(self.float_names)}"
        self.float_names.append(name)
        return {"as_expr": {"expr_str": f"Symbol('{name}')", "hint": None}}


HINT_SEARCH = 64  # candidate hints per symbol, from the bottom of its range


def _hints_torch_keeps_dynamic(hints: dict[sympy.Symbol, int], ranges: dict[Any, Any], sizes: set[sympy.Expr],
                               runtime_asserts: list[Any], backed: list[sympy.Symbol]) -> dict[sympy.Symbol, int]:
    """Hints under which no symbolic size of the program is 0 or 1, where the given ones make some so.

    torch's loader guards on a size's hint when that hint is 0 or 1 (its 0/1 specialization), and the guard pins
    the symbols under it: a [s0, 1, s0] input sliced `[..., 2::3]` has a size s0 // 3, 0 at the hint 2, and torch
    then reads s0 as the constant 2. A hint is only an example, so the writer may pick another one from the
    symbol's range, as long as every runtime assertion (the guards kiln decided from the old hints) still holds.
    Coordinate descent over the backed symbols, each trying the bottom of its range; the old hints are kept unless
    the new ones leave strictly fewer 0/1 sizes."""
    sizes = {size for size in sizes if size.free_symbols <= set(backed)}

    def cost(candidate: dict[sympy.Symbol, int]) -> float:
        values = {s: sympy.Integer(v) for s, v in candidate.items()}
        for guard in runtime_asserts:
            if guard.expr.free_symbols <= set(values) and guard.expr.xreplace(values) is not sympy.true:
                return math.inf
        return sum(1 for size in sizes if size.xreplace(values) in (0, 1))

    best, best_cost = hints, cost(hints)
    initial_cost = best_cost
    if not best_cost:
        return hints
    for sym in backed:
        value_range = ranges.get(sym)
        lower = max(int(value_range.lower), 2) if value_range and value_range.lower != -INF else 2
        upper = min(value_range.upper, lower + HINT_SEARCH) if value_range else lower + HINT_SEARCH
        for value in range(lower, int(upper) + 1):
            trial = {**best, sym: value}
            trial_cost = cost(trial)
            if trial_cost < best_cost:
                best, best_cost = trial, trial_cost
            if not best_cost:
                return best
    return best if best_cost < initial_cost else hints


def _contiguous_strides(shape: tuple[Any, ...]) -> list[Any]:
    strides: list[Any] = []
    running: Any = 1
    for dim in reversed(shape):
        strides.append(running)
        running = sympy.expand(running * dim) if not isinstance(running * dim, int) else running * dim
    return [int(s) if isinstance(s, sympy.Expr) and s.is_Integer else s for s in reversed(strides)]


def tensor_meta(value_type: TensorType, symbols: _Symbols, requires_grad: bool = False) -> dict[str, Any]:
    if value_type.layout.is_sparse:  # its sizes; the layout's details are in kiln's sparse member (formats)
        return {
            "dtype": formats.scalar_type_code(value_type.dtype),
            "sizes": [symbols.sym_int(d) for d in value_type.shape],
            "requires_grad": requires_grad,
            "device": {"type": "cpu", "index": None},
            "strides": [],
            "storage_offset": {"as_int": 0},
            "layout": formats.LAYOUT_CODES[value_type.layout.kind],
        }
    return {
        "dtype": formats.scalar_type_code(value_type.dtype),
        "sizes": [symbols.sym_int(d) for d in value_type.shape],
        "requires_grad": requires_grad,
        "device": {"type": "cpu", "index": None},
        "strides": [symbols.sym_int(s) for s in _contiguous_strides(value_type.shape)],
        "storage_offset": {"as_int": 0},
        "layout": formats.LAYOUT_STRIDED,
    }


class _GraphWriter:
    """One torch Graph (forward, or a region's subgraph): nodes, value metadata and the SymInt nodes it needs."""

    def __init__(self, block: Block, names: dict[SSAValue, str], symbols: _Symbols, used: set[str],
                 parameters: set[str], parent: _GraphWriter | None = None):
        self.block, self.names, self.symbols, self.used = block, names, symbols, used
        self.parameters, self.parent = parameters, parent
        self.imported: dict[sympy.Symbol, str] = {}  # a subgraph's symbols taken as SymInt inputs, by input name
        self.nodes: list[dict[str, Any]] = []
        self.tensor_values: dict[str, Any] = {}
        self.sym_int_values: dict[str, Any] = {}
        self.sym_float_values: dict[str, Any] = {}
        self.sym_nodes: dict[Any, str] = {}  # expression -> the node computing it in this graph
        self.defined: list[SSAValue] = []
        self.sym_bool_values: dict[str, Any] = {}
        self.pending_asserts: list[Any] = []  # runtime assertions, written once their symbols are defined

    # -- names
    def name(self, value: SSAValue) -> str:
        return self.names[value]

    def fresh(self, hint: str) -> str:
        index = 0
        while f"{hint}_{index}" in self.used:
            index += 1
        self.used.add(f"{hint}_{index}")
        return f"{hint}_{index}"

    def define(self, value: SSAValue) -> None:
        self.defined.append(value)
        if isinstance(value.type, TensorType):
            self.tensor_values[self.name(value)] = tensor_meta(value.type, self.symbols,
                                                               self.name(value) in self.parameters)
        elif isinstance(value.type, SymIntType):
            self.sym_int_values[self.name(value)] = self.symbols.sym_int(value.type.expr)
            if _is_expr(value.type.expr):
                self.sym_nodes.setdefault(value.type.expr, self.name(value))
        elif isinstance(value.type, ScalarType):
            self.sym_float_values[self.name(value)] = self.symbols.sym_float()

    # -- symbolic integers
    def sym_argument(self, expr: Any) -> dict[str, Any]:
        if isinstance(expr, int) or (isinstance(expr, sympy.Expr) and expr.is_Integer):
            return {"as_int": int(expr)}
        return {"as_name": self.sym_node(expr)}

    def _operator_node(self, operator: str, left: Any, right: Any, expr: Any) -> str:
        name = self.fresh(f"sym_{operator}")
        self.nodes.append({
            "target": f"torch.sym_{operator}" if operator in ("min", "max") else f"_operator.{operator}",
            "inputs": [{"name": "a", "arg": {"as_sym_int": self.sym_argument(left)}, "kind": 1},
                       {"name": "b", "arg": {"as_sym_int": self.sym_argument(right)}, "kind": 1}],
            "outputs": [{"as_sym_int": {"as_name": name}}], "metadata": {}, "is_hop_single_tensor_return": None,
            "name": name})
        self.sym_int_values[name] = self.symbols.sym_int(expr)
        return name

    def sym_node(self, expr: sympy.Expr) -> str:
        found = self.sym_nodes.get(expr)
        if found is not None:
            return found
        integral = integral_form(expr)
        if integral is not expr:
            name = self.sym_nodes[expr] = self.sym_node(integral)
            return name
        if isinstance(expr, sympy.Symbol):
            name = self._size_node(expr)
        elif isinstance(expr, (sympy.Add, sympy.Mul)):
            operator = "add" if isinstance(expr, sympy.Add) else "mul"
            symbolic = sorted((t for t in expr.args if not t.is_Integer), key=str)
            constants = [t for t in expr.args if t.is_Integer]  # last, so constants are right operands
            accumulated: Any = symbolic[0]
            for term in [*symbolic[1:], *constants]:
                combined = accumulated + term if operator == "add" else accumulated * term
                if combined not in self.sym_nodes:
                    self.sym_nodes[combined] = self._operator_node(operator, accumulated, term, combined)
                accumulated = combined
            name = self.sym_nodes[accumulated]
        elif isinstance(expr, sympy.Pow) and expr.exp.is_Integer and expr.exp > 1:  # s0**2 (flattening [s0, s0])
            name = self._operator_node("mul", expr.base ** (expr.exp - 1), expr.base, expr)
        elif isinstance(expr, sympy.floor):
            numerator, denominator = expr.args[0].as_numer_denom()
            name = self._operator_node("floordiv", numerator, denominator, expr)
        elif isinstance(expr, sympy.ceiling) and expr.args[0].as_numer_denom()[1].is_positive:
            numerator, denominator = expr.args[0].as_numer_denom()  # ceil(n / d) = (n + d - 1) // d for d > 0
            name = self._operator_node("floordiv", numerator + denominator - 1, denominator, expr)
        elif isinstance(expr, sympy.Mod):
            name = self._operator_node("mod", expr.args[0], expr.args[1], expr)
        elif isinstance(expr, (sympy.Min, sympy.Max)):  # torch.sym_min/sym_max take two
            first, *rest = sorted(expr.args, key=str)
            second = rest[0] if len(rest) == 1 else expr.func(*rest)
            name = self._operator_node("min" if isinstance(expr, sympy.Min) else "max", first, second, expr)
        else:
            raise SerdeError(f"cannot write the symbolic value {expr} as torch SymInt arithmetic",
                             fix="simplify the program's shapes")
        self.sym_nodes[expr] = name
        return name

    def _condition_node(self, condition: sympy.Basic) -> str:
        """A SymBool node computing `condition` (`u0 <= s0`) from SymInt nodes."""
        relations = {"==": "eq", "!=": "ne", "<=": "le", "<": "lt", ">=": "ge", ">": "gt"}
        if isinstance(condition, sympy.core.relational.Relational) and condition.rel_op in relations:
            operator, operands = relations[condition.rel_op], [{"as_sym_int": self.sym_argument(side)}
                                                               for side in (condition.lhs, condition.rhs)]
        elif isinstance(condition, (sympy.And, sympy.Or)) and len(condition.args) == 2:
            operator = "and_" if isinstance(condition, sympy.And) else "or_"
            operands = [{"as_sym_bool": {"as_name": self._condition_node(arg)}} for arg in condition.args]
        elif isinstance(condition, (sympy.And, sympy.Or)):  # n-ary: fold pairwise
            first, *rest = condition.args
            return self._condition_node(condition.func(first, condition.func(*rest)))
        elif isinstance(condition, sympy.Not):
            operator, operands = "not_", [{"as_sym_bool": {"as_name": self._condition_node(condition.args[0])}}]
        else:
            raise SerdeError(f"cannot write the runtime assertion {condition} as torch SymBool arithmetic")
        name = self.fresh(f"sym_{operator.rstrip('_')}")
        self.nodes.append({
            "target": f"_operator.{operator}",
            "inputs": [{"name": key, "arg": arg, "kind": 1} for key, arg in zip("ab", operands)],
            "outputs": [{"as_sym_bool": {"as_name": name}}], "metadata": {}, "is_hop_single_tensor_return": None,
            "name": name})
        self.sym_bool_values[name] = {"as_expr": {"expr_str": print_srepr(condition, self.symbols.names)}}
        return name

    def write_ready_asserts(self) -> None:
        """torch's `_assert_scalar` nodes for the runtime assertions whose symbols are now defined."""
        def defined(sym: sympy.Symbol) -> bool:
            return sym in self.sym_nodes or any(isinstance(v.type, TensorType) and sym in v.type.shape
                                                for v in self.defined)
        for guard in [g for g in self.pending_asserts if all(defined(s) for s in g.expr.free_symbols)]:
            self.pending_asserts.remove(guard)
            condition = self._condition_node(guard.expr)
            name = self.fresh("_assert_scalar")
            self.nodes.append({
                "target": "torch.ops.aten._assert_scalar.default",
                "inputs": [{"name": "self", "arg": {"as_sym_bool": {"as_name": condition}}, "kind": 1},
                           {"name": "assert_msg", "arg": {"as_string": "Runtime assertion failed for expression "
                                                                       f"{self.symbols.torch_spelling(guard.expr)}"},
                            "kind": 1}],
                "outputs": [], "metadata": {"stack_trace": f"File {guard.source}"} if guard.source else {},
                "is_hop_single_tensor_return": None, "name": name})

    def _size_node(self, sym: sympy.Symbol) -> str:
        for value in self.defined:
            if isinstance(value.type, TensorType) and sym in value.type.shape:
                axis = list(value.type.shape).index(sym)
                name = self.fresh("sym_size_int")
                self.nodes.append({
                    "target": "torch.ops.aten.sym_size.int",
                    "inputs": [{"name": "self", "arg": {"as_tensor": {"name": self.name(value)}}, "kind": 1},
                               {"name": "dim", "arg": {"as_int": axis}, "kind": 1}],
                    "outputs": [{"as_sym_int": {"as_name": name}}], "metadata": {},
                    "is_hop_single_tensor_return": None, "name": name})
                self.sym_int_values[name] = self.symbols.sym_int(sym)
                return name
        if self.parent is not None:  # a subgraph: torch passes the size in as a SymInt input
            return self.import_symbol(sym)
        raise SerdeError(f"symbol {sym} is used by an op but is not a dim of any tensor defined before it",
                         fix="torch.export needs every symbol to be a size of an input")

    def import_symbol(self, sym: sympy.Symbol) -> str:
        """A SymInt input of this subgraph holding `sym` (appended after the block's arguments)."""
        if sym not in self.imported:
            name = self.fresh("sym_size")
            self.imported[sym] = name
            self.sym_int_values[name] = self.symbols.sym_int(sym)
            self.sym_nodes[sym] = name
        return self.imported[sym]

    # -- op arguments
    def argument(self, arg_type: ArgType, value: Any) -> dict[str, Any]:
        base = arg_type.base
        if value is None:
            return {"as_none": True}
        if arg_type.is_tensor:
            if arg_type.is_list and arg_type.element_optional:
                return {"as_optional_tensors": [
                    {"as_none": True} if v is None else {"as_tensor": {"name": self.name(v)}} for v in value]}
            if arg_type.is_list:
                return {"as_tensors": [{"name": self.name(v)} for v in value]}
            return {"as_tensor": {"name": self.name(value)}}
        if arg_type.is_list:
            if base in ("int", "SymInt"):
                if all(not _is_expr(v) for v in value):
                    return {"as_ints": [int(v) for v in value]}
                return {"as_sym_ints": [self.sym_argument(v) for v in value]}
            if base == "float":
                return {"as_floats": [float(v) for v in value]}
            if base == "bool":
                return {"as_bools": [bool(v) for v in value]}
            if base == "str":
                return {"as_strings": [str(v) for v in value]}
            if base == "Scalar":
                if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                    return {"as_ints": list(value)}
                return {"as_floats": [float(v) for v in value]}
        elif _is_expr(value):
            return {"as_sym_int": self.sym_argument(value)}
        elif base in ("int", "SymInt"):
            return {"as_int": int(value)}
        elif base == "float":
            return {"as_float": float(value)}
        elif base == "bool":
            return {"as_bool": bool(value)}
        elif base == "str":
            return {"as_string": str(value)}
        elif base == "Scalar":
            if isinstance(value, bool):
                return {"as_bool": value}
            if isinstance(value, (int, np.integer)) or (isinstance(value, sympy.Expr) and value.is_Integer):
                return {"as_int": int(value)}
            return {"as_float": float(value)}
        elif base == "ScalarType":
            return {"as_scalar_type": formats.scalar_type_code(value)}
        elif base == "Layout":
            return {"as_layout": formats.LAYOUT_STRIDED}
        elif base == "Device":
            return {"as_device": {"type": "cpu", "index": None}}
        elif base == "MemoryFormat":
            return {"as_memory_format": formats.MEMORY_FORMAT_CODES.get(str(value), 1)}
        raise SerdeError(f"cannot write a {arg_type} argument ({value!r}) for torch")

    # -- ops
    def write(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Write the block's ops; return (graph inputs, graph outputs)."""
        for arg in self.block.args:
            self.define(arg)
        inputs = [self._value_argument(arg) for arg in self.block.args]
        outputs: list[dict[str, Any]] = []
        for op in self.block.ops:
            self.write_ready_asserts()
            if isinstance(op, func.ReturnOp):
                outputs = [self._value_argument(v) for v in op.operands]
            elif isinstance(op, YieldOp):
                outputs = self._region_outputs(op.values)
            elif isinstance(op, CondOp):
                self._cond(op)
            elif isinstance(op, MapOp):
                self._map(op)
            elif isinstance(op, ScanOp):
                self._scan(op)
            elif isinstance(op, WhileLoopOp):
                self._while_loop(op)
            else:
                self._aten(op)
        if self.pending_asserts:
            raise SerdeError(f"the runtime assertion {self.pending_asserts[0].expr} uses a symbol no value of the "
                             "program defines", fix="drop the assertion from program.runtime_asserts")
        return inputs, outputs

    def _region_outputs(self, values: Any) -> list[dict[str, Any]]:
        """A region's outputs. torch refuses a subgraph output that aliases an input or another output (its
        run_decompositions fails: "might be aliasing the input or the output"), so such an output is written as
        a clone, as torch tells its users to write it."""
        outputs: list[dict[str, Any]] = []
        seen: set[SSAValue] = set()
        for value in values:
            if isinstance(value.type, TensorType) and (value in self.block.args or value in seen):
                name = self.fresh("clone")
                self.tensor_values[name] = tensor_meta(value.type, self.symbols)
                self.nodes.append({
                    "target": "torch.ops.aten.clone.default",
                    "inputs": [{"name": "self", "arg": self._value_argument(value), "kind": 1}],
                    "outputs": [{"as_tensor": {"name": name}}], "metadata": {}, "is_hop_single_tensor_return": None,
                    "name": name})
                outputs.append({"as_tensor": {"name": name}})
            else:
                outputs.append(self._value_argument(value))
            seen.add(value)
        return outputs

    def _contiguous_copy(self, value: SSAValue) -> str:
        """`value` copied into a new contiguous tensor. kiln's as_strided indexes its input's elements in row-major
        order (values are contiguous in kiln), torch's indexes the storage under it, which a permute or an
        elementwise op of a permuted tensor leaves in another order; on a fresh contiguous copy the two agree."""
        name = self.fresh("contiguous")
        self.tensor_values[name] = tensor_meta(value.type, self.symbols)
        self.nodes.append({
            "target": "torch.ops.aten.clone.default",
            "inputs": [{"name": "self", "arg": self._value_argument(value), "kind": 1},
                       {"name": "memory_format", "arg": {"as_memory_format": formats.MEMORY_FORMAT_CODES[
                           "contiguous_format"]}, "kind": 2}],
            "outputs": [{"as_tensor": {"name": name}}], "metadata": {}, "is_hop_single_tensor_return": None,
            "name": name})
        return name

    def _value_argument(self, value: SSAValue) -> dict[str, Any]:
        return _value_argument(value.type, self.name(value))

    def _aten(self, op: Any) -> None:
        results = list(op.results)
        if not results:  # an empty list (unbind of a 0-size dim): no one reads it, and torch's reader cannot
            return  # read a node without outputs
        opdef, arguments = _functional_spelling(op.opdef, bound_arguments(op))
        inputs = []
        for argument, value in zip(opdef.schema.arguments, arguments):
            if opdef.name == "aten.view.default" and argument.name == "size":
                argument = Argument("shape", argument.type)
            if argument.kwarg_only and not argument.type.is_tensor and argument.has_default and (
                    value == argument.default):
                continue  # torch omits keyword arguments left at their defaults (one without a default, even None,
                # like div.Scalar_mode's rounding_mode, must be written: torch's reader requires it)
            inputs.append({"name": argument.name, "arg": self.argument(argument.type, value),
                           "kind": 2 if argument.kwarg_only else 1})
        if opdef.name == "aten.as_strided.default":
            inputs[0]["arg"] = {"as_tensor": {"name": self._contiguous_copy(arguments[0])}}
        for result in results:
            self.define(result)
        # a node is named after its value; a node with several (or a list of) outputs needs a name of its own
        single = len(opdef.schema.returns) == 1 and not opdef.schema.returns[0].type.is_list and len(results) == 1
        if len(opdef.schema.returns) == 1 and opdef.schema.returns[0].type.is_list:
            outputs = [{"as_tensors": [{"name": self.name(r)} for r in results]}]
        else:
            outputs = [self._value_argument(r) for r in results]
        # kiln's view accepts any layout (numpy reshapes); torch's needs compatible strides, reshape does not
        target = "aten.reshape.default" if opdef.name == "aten.view.default" else opdef.name
        # Python's operators on SymInts are plain functions to torch (`_operator.add`), not torch.ops
        target = f"_operator.{opdef.schema.name}" if opdef.schema.namespace == "_operator" else f"torch.ops.{target}"
        self.nodes.append({"target": target, "inputs": inputs, "outputs": outputs,
                           "metadata": _metadata(op), "is_hop_single_tensor_return": None,
                           "name": self.name(results[0]) if single else self.fresh(opdef.schema.name)})

    def _cond(self, op: CondOp) -> None:
        (true_graph, false_graph), sizes = self._subgraphs([(op.true_region, "true_graph"),
                                                             (op.false_region, "false_graph")])
        self._higher_order(op, "cond", [{"as_tensor": {"name": self.name(op.pred)}}, true_graph, false_graph,
                                        self._additional_inputs(op.operands_, sizes)])

    def _map(self, op: MapOp) -> None:
        (body,), sizes = self._subgraphs([(op.body, "body_graph")])
        self._higher_order(op, "map_impl", [body, self._tensors(op.xs),
                                            self._additional_inputs(op.operands_, sizes)])

    def _scan(self, op: ScanOp) -> None:
        (body,), sizes = self._subgraphs([(op.body, "scan_combine_graph")])
        self._higher_order(op, "scan", [body, self._tensors(op.init), self._tensors(op.xs),
                                        self._additional_inputs(op.operands_, sizes)])

    def _while_loop(self, op: WhileLoopOp) -> None:
        (cond_graph, body), sizes = self._subgraphs([(op.cond_region, "while_loop_cond_graph"),
                                                     (op.body, "while_loop_body_graph")])
        # torch's cond graph returns its predicate bare, not in a tuple: while_loop tests the value it returns
        cond_graph["as_graph"]["graph"]["is_single_tensor_return"] = True
        self._higher_order(op, "while_loop", [cond_graph, body, self._tensors(op.carried),
                                              self._additional_inputs(op.operands_, sizes)])

    def _tensors(self, values: Any) -> dict[str, Any]:
        # no values are an empty tensor list, as torch writes an empty `additional_inputs` (it cannot tell its type)
        return {"as_tensors": [{"name": self.name(v)} for v in values]}

    def _subgraphs(self, regions: list[tuple[Any, str]]) -> tuple[list[dict[str, Any]], list[Any]]:
        """An op's regions as torch subgraph arguments, named as torch names them (`scan_combine_graph_0`), and the
        symbols they take from this graph. A region that uses a size none of its tensors has takes it as a SymInt
        input after its arguments, as torch does; all of an op's regions take the same inputs, so each takes every
        symbol any of them needs."""
        writers = [_GraphWriter(region.block, self.names, self.symbols, self.used, self.parameters, parent=self)
                   for region, _ in regions]
        written = [writer.write() for writer in writers]
        sizes = list(dict.fromkeys(sym for writer in writers for sym in writer.imported))
        graphs = []
        for writer, (inputs, outputs), (_, hint) in zip(writers, written, regions):
            inputs = [*inputs, *({"as_sym_int": {"as_name": writer.import_symbol(sym)}} for sym in sizes)]
            graphs.append({"as_graph": {"name": self.fresh(hint), "graph": writer.graph(inputs, outputs)}})
        return graphs, sizes

    def _additional_inputs(self, tensors: Any, sizes: list[Any]) -> dict[str, Any]:
        """A higher-order op's extra inputs: its tensor operands, then the sizes its regions take. torch writes
        sizes alone as SymInts, and sizes after tensors as a tensor list that names the SymInt nodes."""
        if sizes and not tensors:
            return {"as_sym_ints": [self.sym_argument(sym) for sym in sizes]}
        names = [self.name(v) for v in tensors] + [self.sym_argument(sym)["as_name"] for sym in sizes]
        return {"as_tensors": [{"name": name} for name in names]}

    def _higher_order(self, op: Any, target: str, arguments: list[dict[str, Any]]) -> None:
        """A `torch.ops.higher_order` node: positional arguments without names, one tensor output per result."""
        for result in op.results:
            self.define(result)
        self.nodes.append({
            "target": f"torch.ops.higher_order.{target}",
            "inputs": [{"name": "", "arg": argument, "kind": 1} for argument in arguments],
            "outputs": [{"as_tensor": {"name": self.name(r)}} for r in op.results], "metadata": _metadata(op),
            "is_hop_single_tensor_return": False, "name": self.fresh(target)})

    def graph(self, inputs: list[dict[str, Any]], outputs: list[dict[str, Any]]) -> dict[str, Any]:
        return {"inputs": inputs, "outputs": outputs, "nodes": self.nodes, "tensor_values": self.tensor_values,
                "sym_int_values": self.sym_int_values, "sym_bool_values": self.sym_bool_values,
                "is_single_tensor_return": False,
                "custom_obj_values": {}, "sym_float_values": self.sym_float_values}


def _functional_spelling(opdef: Any, arguments: list[Any]) -> tuple[Any, list[Any]]:
    """The op as torch should run it to compute what kiln's functional op computes. A training batch norm in kiln
    reads its running statistics from no one and updates none (a program that updates them spells it out); torch's
    updates them in place when they are given, which would change what later readers of those values see."""
    if opdef.name == "aten.batch_norm.default" and arguments[5] is True:
        return opdef, [*arguments[:3], None, None, *arguments[5:]]
    if opdef.name == "aten._native_batch_norm_legit.default" and arguments[5] is True:
        return REGISTRY["aten._native_batch_norm_legit.no_stats"], [*arguments[:3], *arguments[5:]]
    return opdef, arguments


def _metadata(op: Any) -> dict[str, str]:
    source = op.attributes.get("kiln.source")
    return {"stack_trace": f"File {source.data}"} if source is not None else {}


def _torch_names(block: Block) -> dict[SSAValue, str]:
    """kiln's value names, made valid and unique FX node names."""
    names: dict[SSAValue, str] = {}
    used: set[str] = set()
    for value, name in value_names(block).items():
        if not name.isidentifier() or keyword.iskeyword(name):
            name = f"v_{name}"
        while name in used:
            name += "_"
        used.add(name)
        names[value] = name
    return names


def _input_spec(spec: Any, name: str) -> dict[str, Any]:
    kind = spec.kind
    if kind is InputKind.USER_INPUT:
        return {"user_input": {"arg": {"as_tensor": {"name": name}}}}
    if kind is InputKind.PARAMETER:
        return {"parameter": {"arg": {"name": name}, "parameter_name": spec.target}}
    if kind is InputKind.BUFFER:
        return {"buffer": {"arg": {"name": name}, "buffer_name": spec.target,
                           "persistent": True if spec.persistent is None else spec.persistent}}
    if kind is InputKind.CONSTANT_TENSOR:
        return {"tensor_constant": {"arg": {"name": name}, "tensor_constant_name": spec.target}}
    raise SerdeError(f"{kind.value} inputs have no kiln .pt2 encoding yet")


def _value_argument(value_type: Any, name: str) -> dict[str, Any]:
    """How torch names a value where it is used: a tensor, a SymInt, or a SymFloat (a float `item()`)."""
    if isinstance(value_type, SymIntType):
        return {"as_sym_int": {"as_name": name}}
    if isinstance(value_type, ScalarType):
        return {"as_sym_float": {"as_name": name}}
    return {"as_tensor": {"name": name}}


def _output_spec(spec: Any, name: str, value_type: Any = None) -> dict[str, Any]:
    kind = spec.kind
    if kind is OutputKind.USER_OUTPUT:
        return {"user_output": {"arg": _value_argument(value_type, name)}}
    if kind is OutputKind.BUFFER_MUTATION:
        return {"buffer_mutation": {"arg": {"name": name}, "buffer_name": spec.target}}
    if kind is OutputKind.USER_INPUT_MUTATION:
        return {"user_input_mutation": {"arg": {"name": name}, "user_input_name": spec.target}}
    if kind is OutputKind.LOSS_OUTPUT:
        return {"loss_output": {"arg": {"name": name}}}
    if kind is OutputKind.GRADIENT_TO_PARAMETER:
        return {"gradient_to_parameter": {"arg": {"name": name}, "parameter_name": spec.target}}
    if kind is OutputKind.GRADIENT_TO_USER_INPUT:
        return {"gradient_to_user_input": {"arg": {"name": name}, "user_input_name": spec.target}}
    raise SerdeError(f"{kind.value} outputs have no kiln .pt2 encoding yet")


def sparse_input_layouts(program: ExportedProgram) -> dict[str, str]:
    """The layouts of the program's sparse-typed inputs (weights and user inputs), by graph input name."""
    names = _torch_names(program.body)
    return {names[arg]: arg.type.layout.text() for arg in program.body.args
            if isinstance(arg.type, TensorType) and arg.type.is_sparse}


def program_to_json(program: ExportedProgram) -> dict[str, Any]:
    """The `models/<name>.json` document of a program."""
    symbols = _Symbols(program)
    body = program.body
    names = _torch_names(body)
    parameters = {names[arg] for arg, spec in zip(body.args, program.graph_signature.input_specs)
                  if spec.kind is InputKind.PARAMETER}
    writer = _GraphWriter(body, names, symbols, set(names.values()), parameters)
    writer.pending_asserts = list(program.runtime_asserts)
    inputs, outputs = writer.write()
    returned = list(body.last_op.operands) if body.last_op is not None else []
    input_specs = [_input_spec(spec, names[arg]) for spec, arg in zip(program.graph_signature.input_specs, body.args)]
    inputs, input_specs = _with_constant_inputs(program, inputs, input_specs, writer)
    signature = {
        "input_specs": input_specs,
        "output_specs": [_output_spec(spec, names[value], value.type)
                         for spec, value in zip(program.graph_signature.output_specs, returned)],
    }
    user_inputs = [names[arg] for spec, arg in zip(program.graph_signature.input_specs, body.args)
                   if spec.kind is InputKind.USER_INPUT]
    # What torch's module() returns: every output but the in-place updates (a joint program's loss and gradients too).
    user_outputs = sum(1 for spec in program.graph_signature.output_specs
                       if spec.kind not in (OutputKind.BUFFER_MUTATION, OutputKind.USER_INPUT_MUTATION))
    from kiln.ir.pytree import TreeSpec
    in_spec = program.in_spec or TreeSpec("tuple", None, (
        TreeSpec("tuple", None, tuple(TreeSpec("leaf") for _ in user_inputs)), TreeSpec("dict", (), ())))
    out_spec = program.out_spec or TreeSpec("tuple", None, tuple(TreeSpec("leaf") for _ in range(user_outputs)))
    return {
        "graph_module": {
            "graph": writer.graph(inputs, outputs),
            "signature": signature,
            "module_call_graph": [{"fqn": "", "signature": {
                "inputs": [], "outputs": [], "in_spec": formats.treespec_to_json(in_spec),
                "out_spec": formats.treespec_to_json(out_spec),
                "forward_arg_names": _forward_arg_names(program, in_spec, user_inputs)}}],
            "metadata": {KILN_SYMBOLS_KEY: json.dumps({torch_name: str(sym)
                                                       for sym, torch_name in symbols.names.items()})},
            "treespec_namedtuple_fields": _namedtuple_fields(in_spec, out_spec),
        },
        "opset_version": dict(formats.OPSET_VERSION),
        "range_constraints": symbols.range_constraints(),
        "schema_version": {"major": formats.SCHEMA_VERSION[0], "minor": formats.SCHEMA_VERSION[1]},
        "verifiers": ["ATEN"],
        "torch_version": formats.TORCH_VERSION,
        "guards_code": [],
    }


def _constant_argument(value: Any) -> dict[str, Any]:
    if value is None:
        return {"as_none": True}
    for kind, key in ((bool, "as_bool"), (int, "as_int"), (float, "as_float"), (str, "as_string")):
        if isinstance(value, kind):
            return {key: value}
    raise SerdeError(f"the program has the {type(value).__name__} {value!r} baked in as an input; a torch.export "
                     "file can hold only None, bool, int, float or str there",
                     fix="pass that value as a tensor, or close over it in the model")


def _with_constant_inputs(program: ExportedProgram, inputs: list[Any], specs: list[Any], writer: _GraphWriter
                          ) -> tuple[list[Any], list[Any]]:
    """Non-tensor inputs baked in at export are torch's `constant_input`s, at their place among the user inputs."""
    if not program.input_constants:
        return inputs, specs
    merged_inputs, merged_specs = [], []
    leaf = 0

    def bake_pending() -> None:  # the constants before the next tensor input
        nonlocal leaf
        while leaf in program.input_constants:
            value = _constant_argument(program.input_constants[leaf])
            merged_inputs.append(value)
            merged_specs.append({"constant_input": {"name": writer.fresh("constant_input"), "value": value}})
            leaf += 1
    for graph_input, spec, input_spec in zip(inputs, specs, program.graph_signature.input_specs):
        if input_spec.kind is InputKind.USER_INPUT:
            bake_pending()
            leaf += 1
        merged_inputs.append(graph_input)
        merged_specs.append(spec)
    bake_pending()
    return merged_inputs, merged_specs


def _forward_arg_names(program: ExportedProgram, in_spec: Any, user_inputs: list[str]) -> list[str]:
    """The parameter names of the module torch unlifts: the ones the file was read with, else the inputs' names
    when every argument is one tensor, else none (torch then names them `arg_0`, ... and the kwargs' keys)."""
    root = program.module_call_graph[0].signature if program.module_call_graph else None
    if root is not None and root.forward_arg_names is not None:
        return list(root.forward_arg_names)
    args, kwargs = in_spec.children if in_spec.kind == "tuple" and len(in_spec.children) == 2 else (in_spec, None)
    if all(child.kind == "leaf" for child in args.children) and (kwargs is None or not kwargs.children) and \
            len(args.children) == len(user_inputs):
        return user_inputs
    return []


def _namedtuple_fields(*specs: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}

    def visit(spec: Any) -> None:
        if spec.kind == "namedtuple":
            found[spec.context.__name__] = {"field_names": list(spec.context._fields)}
        for child in spec.children:
            visit(child)
    for spec in specs:
        visit(spec)
    return found


def tensor_bytes(array: np.ndarray) -> bytes:
    """Raw little-endian, C-contiguous bytes (what torch's weight files hold)."""
    array = np.ascontiguousarray(array)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return array.tobytes()


def array_meta(array: np.ndarray, requires_grad: bool) -> dict[str, Any]:
    return static_meta(array.dtype, array.shape, requires_grad)


def static_meta(dtype: Any, shape: Any, requires_grad: bool = False) -> dict[str, Any]:
    """torch's TensorMeta of a contiguous tensor of static `shape`."""
    from kiln.ir import dtypes
    shape = [int(d) for d in shape]
    return {
        "dtype": formats.scalar_type_code(dtypes.dtype(dtype)),
        "sizes": [{"as_int": d} for d in shape],
        "requires_grad": requires_grad,
        "device": {"type": "cpu", "index": None},
        "strides": [{"as_int": int(s)} for s in _contiguous_strides(tuple(shape))],
        "storage_offset": {"as_int": 0},
        "layout": formats.LAYOUT_STRIDED,
    }
