"""`kiln.export`: trace a kiln.nn.Module into an ExportedProgram, like torch.export.export.

1. Parameters and buffers become PARAMETER/BUFFER inputs (`p_fc_weight`, `b_bn_running_mean`); user
   tensors become USER_INPUTs whose dims are ints or symbols made from `dynamic_shapes`.
2. forward runs on traced tensors; every op is recorded with its source line and module stack.
3. Buffers rebound by in-place ops become BUFFER_MUTATION outputs (and inputs, USER_INPUT_MUTATION).
4. Guards recorded while tracing are checked against the declared Dims: a narrower range, a
   specialization or a relation between dims raises ConstraintViolationError with torch-style fixes.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import numpy as np
import sympy

from kiln.frontend.dims import DerivedDim, Dim, _DimHint
from kiln.frontend.nn.module import Module
from kiln.frontend.tensor import Tensor
from kiln.frontend.tracing import Tracer, tracing
from kiln.ir import dtypes
from kiln.ir.errors import ConstraintViolationError, KilnError
from kiln.ir.program import ExportedProgram, InputKind, OutputKind, OutputSpec
from kiln.ir.pytree import _DATACLASSES, tree_flatten
from kiln.ir.symbolic import INF, ValueRange
from kiln.ir.types import TensorType


def export(mod: Module, args: tuple = (), kwargs: dict | None = None, *, dynamic_shapes: Any = None,
           strict: bool = True, preserve_module_call_signature: tuple[str, ...] = ()) -> ExportedProgram:
    """Trace `mod(*args, **kwargs)` into a functional ATen program with symbolic shapes."""
    if not isinstance(mod, Module):
        raise KilnError(f"kiln.export expects a kiln.nn.Module, got {type(mod).__name__}",
                        fix="for PyTorch modules use kiln.from_torch(module, args)")
    if not isinstance(args, tuple):
        raise KilnError(f"args must be a tuple, got {type(args).__name__}", fix="write args=(x,) for one input")
    kwargs = dict(kwargs or {})
    tracer = Tracer(strict=strict)
    tracer.module_paths = {id(module): name for name, module in mod.named_modules()}
    unknown = [fqn for fqn in preserve_module_call_signature if fqn not in tracer.module_paths.values()]
    if unknown:
        raise KilnError(f"preserve_module_call_signature names {unknown}, which are not submodules",
                        fix="use qualified names from mod.named_modules(), e.g. 'encoder.layers.0'")
    tracer.preserve = set(preserve_module_call_signature)

    # Parameters and buffers, in torch's order: all parameters, then all buffers.
    lifted: list[tuple[Tensor, Any, Any]] = []  # (tensor object, saved value, saved tracer)
    state: dict[str, np.ndarray] = {}
    constants: dict[str, np.ndarray] = {}
    buffer_inputs: dict[str, Any] = {}
    for name, param in mod.named_parameters(remove_duplicate=True):
        placeholder = tracer.placeholder("p_" + name.replace(".", "_"), _type_of(param), InputKind.PARAMETER, name)
        tracer.example_values[placeholder] = param._value
        state[name] = param._value
        lifted.append((param, param._value, param._tracer))
        param._value, param._tracer = placeholder, tracer
    non_persistent = {f"{prefix}.{b}" if prefix else b for prefix, m in mod.named_modules()
                      for b in m._non_persistent_buffers}
    for name, buffer in mod.named_buffers(remove_duplicate=True):
        persistent = name not in non_persistent
        placeholder = tracer.placeholder("b_" + name.replace(".", "_"), _type_of(buffer), InputKind.BUFFER, name,
                                         persistent)
        tracer.example_values[placeholder] = buffer._value
        (state if persistent else constants)[name] = buffer._value
        buffer_inputs[name] = (buffer, placeholder)
        lifted.append((buffer, buffer._value, buffer._tracer))
        buffer._value, buffer._tracer = placeholder, tracer

    try:
        tracer.begin_user_inputs()
        leaves, in_spec = tree_flatten((args, kwargs))
        names = _leaf_names(mod, args, kwargs)
        leaf_specs = _leaf_dim_specs(mod, args, kwargs, dynamic_shapes)
        symbols = _SymbolMaker(tracer)
        traced_leaves: list[Any] = []
        user_inputs: list[tuple[Tensor, Any]] = []
        input_constants: dict[int, Any] = {}
        for index, (leaf, name) in enumerate(zip(leaves, names)):
            if isinstance(leaf, Tensor):
                shape = symbols.shape_for(name, leaf, leaf_specs.get(id(leaf)))
                placeholder = tracer.placeholder(name, TensorType.of(shape, leaf.dtype,
                                                                     getattr(leaf._value, "layout", None)),
                                                 InputKind.USER_INPUT)
                tracer.example_values[placeholder] = leaf._value
                traced = Tensor._traced(placeholder, tracer)
                user_inputs.append((traced, placeholder))
                traced_leaves.append(traced)
            else:
                input_constants[index] = leaf
                traced_leaves.append(leaf)
        from kiln.ir.pytree import tree_unflatten
        traced_args, traced_kwargs = tree_unflatten(traced_leaves, in_spec)
        with tracing(tracer):
            outputs = mod(*traced_args, **traced_kwargs)

        output_leaves, out_spec = tree_flatten(outputs)
        returned: list[Any] = []
        specs: list[OutputSpec] = []
        for name, (buffer, placeholder) in buffer_inputs.items():
            if buffer._value is not placeholder:
                returned.append(_as_graph_value(buffer, tracer))
                specs.append(OutputSpec(OutputKind.BUFFER_MUTATION, "", name))
        for traced, placeholder in user_inputs:
            if traced._value is not placeholder:
                returned.append(_as_graph_value(traced, tracer))
                specs.append(OutputSpec(OutputKind.USER_INPUT_MUTATION, "", _name_of(tracer, placeholder)))
        for leaf in output_leaves:
            if not isinstance(leaf, Tensor):
                raise KilnError(f"forward returned a {type(leaf).__name__} ({leaf!r}); exported programs return "
                                "tensors", fix="return tensors, or compute the value outside the model")
            returned.append(_as_graph_value(leaf, tracer))
            specs.append(OutputSpec(OutputKind.USER_OUTPUT, ""))
        tracer.erase_unused_views(returned)
    finally:
        for tensor, value, owner in lifted:
            tensor._value, tensor._tracer = value, owner

    symbols.check_constraints()
    program = tracer.builder.build(returned, specs, state_dict=state, constants={**constants, **tracer.constants},
                                   range_constraints=symbols.range_constraints())
    _name_outputs(program)
    program.in_spec, program.out_spec = in_spec, out_spec
    program.input_constants = input_constants
    program.module_call_graph = _module_call_graph(program, tracer, preserve_module_call_signature)
    replacements = symbols.auto_replacements()
    if replacements:  # Dim.AUTO symbols proven equal to others (or constant): one symbol each, like torch
        from kiln.ir.retrace import retrace
        program = retrace(program, substitutions=replacements)
    program.example_inputs = (args, kwargs)  # as torch keeps them; kiln.save writes them for torch's tools
    program.verify()
    return program


# ---------------------------------------------------------------------------------------------


def _module_call_graph(program: ExportedProgram, tracer: Tracer, preserved: tuple[str, ...]) -> list[Any]:
    """torch's module_call_graph: the root's signature, then each preserved submodule's (in call order)."""
    from kiln.ir.program import ModuleCallEntry, ModuleCallSignature, value_names
    names = value_names(program.body)
    signature = program.graph_signature
    entries = [ModuleCallEntry("", ModuleCallSignature(signature.user_inputs, signature.user_outputs,
                                                       program.in_spec, program.out_spec))]
    for fqn in preserved:
        if fqn not in tracer.preserved_calls:
            entries.append(ModuleCallEntry(fqn))  # never called in forward
            continue
        values_in, values_out, in_spec, out_spec = tracer.preserved_calls[fqn]
        entries.append(ModuleCallEntry(fqn, ModuleCallSignature([names[v] for v in values_in],
                                                                [names[v] for v in values_out], in_spec, out_spec)))
    return entries


def _type_of(tensor: Tensor) -> TensorType:
    value = tensor._value
    return TensorType.of(value.shape, dtypes.dtype(value.dtype), getattr(value, "layout", None))


def _as_graph_value(tensor: Tensor, tracer: Tracer) -> Any:
    if tensor._tracer is tracer:
        return tensor._value
    return tracer.lift_constant(np.asarray(tensor._value))  # an eager tensor returned as is


def _name_of(tracer: Tracer, value: Any) -> str:
    from kiln.ir.program import value_names
    return value_names(tracer.builder.block)[value]


def _name_outputs(program: ExportedProgram) -> None:
    from kiln.ir.program import value_names
    names = value_names(program.body)
    returned = list(program.body.last_op.operands)  # type: ignore[union-attr]
    for spec, value in zip(program.graph_signature.output_specs, returned):
        spec.name = names[value]


def _leaf_names(mod: Module, args: tuple, kwargs: dict) -> list[str]:
    """Input names like torch.export's: the forward parameter name, with `_0`, `_key` for nested leaves."""
    try:
        bound = inspect.signature(mod.forward).bind(*args, **kwargs)
        named = list(bound.arguments.items())
    except TypeError as error:
        raise KilnError(f"the inputs do not match {type(mod).__name__}.forward: {error}") from error
    positional = dict(named[:len(args)]) if len(named) >= len(args) else {}
    names: list[str] = []

    def walk(prefix: str, value: Any) -> None:
        leaves, _ = tree_flatten(value)
        if len(leaves) == 1 and not isinstance(value, (list, tuple, dict)):
            names.append(prefix)
            return
        if isinstance(value, (list, tuple)):
            fields = getattr(value, "_fields", None)  # namedtuples by field name
            for i, item in enumerate(value):
                walk(f"{prefix}_{fields[i] if fields else i}", item)
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}_{key}", item)
        elif type(value) in _DATACLASSES:
            for field_name in _DATACLASSES[type(value)][0]:
                walk(f"{prefix}_{field_name}", getattr(value, field_name))
        else:
            names.extend(f"{prefix}_{i}" for i in range(len(leaves)))

    arg_names = list(positional) if positional else [f"arg{i}" for i in range(len(args))]
    for name, value in zip(arg_names, args):
        walk(name, value)
    for name, value in kwargs.items():
        walk(name, value)
    return names


def _leaf_dim_specs(mod: Module, args: tuple, kwargs: dict, dynamic_shapes: Any) -> dict[int, Any]:
    """id(tensor) -> its dim spec, matching `dynamic_shapes` against the inputs as torch does."""
    result: dict[int, Any] = {}
    if dynamic_shapes is None:
        return result
    if isinstance(dynamic_shapes, dict):
        signature = inspect.signature(mod.forward)
        bound = signature.bind(*args, **kwargs).arguments
        unknown = [k for k in dynamic_shapes if k not in bound]
        if unknown:
            raise KilnError(f"dynamic_shapes names {unknown}, which are not inputs of forward "
                            f"({', '.join(bound)})", fix="key dynamic_shapes by forward's argument names")
        pairs = [(bound[k], v) for k, v in dynamic_shapes.items()]
    elif isinstance(dynamic_shapes, (list, tuple)):
        if len(dynamic_shapes) != len(args) + len(kwargs):
            raise KilnError(f"dynamic_shapes has {len(dynamic_shapes)} entries for {len(args) + len(kwargs)} inputs",
                            fix="give one entry (None for static) per input, nested like the inputs")
        pairs = list(zip([*args, *kwargs.values()], dynamic_shapes))
    else:
        raise KilnError("dynamic_shapes must be a dict keyed by argument name, or a tuple/list like args")

    def walk(value: Any, spec: Any) -> None:
        if spec is None:
            return
        if isinstance(value, Tensor):
            result[id(value)] = spec
        elif isinstance(value, (list, tuple)) and isinstance(spec, (list, tuple)):
            for v, s in zip(value, spec):
                walk(v, s)
        elif isinstance(value, dict) and isinstance(spec, dict):
            for key in value:
                walk(value[key], spec.get(key))
    for value, spec in pairs:
        walk(value, spec)
    return result


class _SymbolMaker:
    """Turns Dim specs into symbols, then checks the guards traced code recorded against them."""

    def __init__(self, tracer: Tracer):
        self.tracer = tracer
        self.env = tracer.shape_env
        self.roots: dict[str, tuple[Dim, sympy.Symbol, str]] = {}  # Dim name -> (Dim, symbol, first use)
        self.derived: dict[str, tuple[DerivedDim, sympy.Expr]] = {}
        self.auto: list[sympy.Symbol] = []
        self.input_symbols: list[sympy.Symbol] = []

    def shape_for(self, name: str, tensor: Tensor, spec: Any) -> list[Any]:
        shape = list(tensor.shape)
        per_dim: dict[int, Any] = {}
        if isinstance(spec, dict):
            per_dim = dict(spec)
        elif isinstance(spec, (list, tuple)):
            if len(spec) != len(shape):
                raise KilnError(f"dynamic_shapes for '{name}' has {len(spec)} entries but the tensor has rank "
                                f"{len(shape)}", fix="give one entry per dim (None or Dim.STATIC for static dims)")
            per_dim = dict(enumerate(spec))
        elif spec is not None:
            raise KilnError(f"dynamic_shapes for '{name}' must be a dict {{dim: Dim}} or a tuple of per-dim specs")
        result: list[Any] = []
        for axis, size in enumerate(shape):
            entry = per_dim.get(axis)
            where = f"{name}.size()[{axis}]"
            if entry is None or entry is Dim.STATIC:
                result.append(int(size))
            elif isinstance(entry, _DimHint):
                sym = self.env.create_symbol(int(size), min=1, max=INF, source=where)
                self.auto.append(sym)
                result.append(sym)
            elif isinstance(entry, Dim):
                result.append(self._root(entry, int(size), where))
            elif isinstance(entry, DerivedDim):
                root_size, remainder = divmod(int(size) - entry.offset, entry.scale)
                if remainder:
                    raise ConstraintViolationError(
                        f"{where} = {size} cannot be written as {entry.name}",
                        fix=f"pass an input whose {where} has the form {entry.name}")
                root = self._root(entry.root, root_size, where)
                expr = entry.scale * root + entry.offset
                hint = self.env.hint(expr)
                if hint is not None and hint != size:
                    raise ConstraintViolationError(
                        f"{where} = {size} does not equal {entry.name} = {hint}",
                        fix=f"pass inputs with {where} == {entry.name}, or declare it with its own Dim")
                self.derived[entry.name] = (entry, expr)
                result.append(expr)
            else:
                raise KilnError(f"unknown dynamic-shape entry {entry!r} for {where}",
                                fix="use kiln.Dim(...), a derived dim, Dim.AUTO, Dim.STATIC or None")
        return result

    def _root(self, dim: Dim, size: int | None, where: str) -> sympy.Symbol:
        found = self.roots.get(dim.name)
        if found is not None:
            if found[0] is not dim and (found[0].min, found[0].max) != (dim.min, dim.max):
                raise KilnError(f"two different Dims are both named {dim.name!r}", fix="give each Dim its own name")
            sym = found[1]
            if size is not None and self.env.hint(sym) is not None and self.env.hint(sym) != size:
                raise ConstraintViolationError(
                    f"{where} = {size} but {found[2]} = {self.env.hint(sym)}, and both use Dim {dim.name!r}",
                    fix="pass inputs whose sizes agree, or use different Dims")
            if size is not None and self.env.hint(sym) is None:
                self.env.symbols[sym].hint = size
            return sym
        if size is not None and not dim.min <= size <= dim.max:
            raise ConstraintViolationError(
                f"{where} = {size} is outside the range of Dim {dim.name!r}: [{dim.min}, {dim.max}]",
                fix="pass an example input inside the range, or widen the Dim")
        sym = self.env.create_symbol(size, name=dim.name, min=dim.min, max=dim.max, source=where)
        self.roots[dim.name] = (dim, sym, where)
        self.input_symbols.append(sym)
        return sym

    def _check_every_dim_has_a_value(self) -> None:
        for dim, sym, _ in self.roots.values():
            if self.env.hint(sym) is None:
                raise KilnError(f"Dim {dim.name!r} is only used through derived dims; use it directly on some input")

    def check_constraints(self) -> None:
        """Raise ConstraintViolationError listing every way the traced code narrowed a declared Dim."""
        self._check_every_dim_has_a_value()
        problems: list[str] = []
        fixes: dict[str, str] = {}
        declared = {sym: dim for dim, sym, _ in self.roots.values()}
        order = list(declared)
        for guard in self.env.guards:
            expr = guard.expr
            involved = sorted(expr.free_symbols & set(declared), key=order.index)
            if not involved or expr.free_symbols - set(declared):
                continue
            at = f" (at {guard.source})" if guard.source else ""
            if isinstance(expr, sympy.Eq) and len(involved) == 2:
                base, dependent = involved
                solved = _solve(expr, dependent)
                if len(solved) == 1 and str(dependent) not in fixes:
                    problems.append(f"the traced code requires {dependent} == {solved[0]}{at}, but Dims "
                                    f"{dependent!s} and {base!s} were declared independent")
                    fixes[str(dependent)] = f"{dependent} = {_format_relation(solved[0])}"
                    continue
            if isinstance(expr, sympy.Eq) and len(involved) == 1:
                sym = involved[0]
                modulus = _divisibility(expr, sym)
                if modulus is not None:
                    refined = self.env.symbols[sym].range
                    low = -(-int(refined.lower) // modulus)
                    high = INF if refined.upper == INF else int(refined.upper) // modulus
                    problems.append(f"the traced code requires {sym} to be a multiple of {modulus}{at}")
                    fixes[f"_{sym}"] = _dim_constructor(f"_{sym}", ValueRange(max(low, 1), high))
                    fixes[str(sym)] = f"{sym} = {modulus}*_{sym}"
                    continue
                solved = _solve(expr, sym)
                if len(solved) == 1 and solved[0].is_Integer:
                    problems.append(f"the traced code specialized {sym} to the constant {solved[0]}{at}")
                    fixes[str(sym)] = f"{sym} = {solved[0]}"
                    continue
            if isinstance(expr, sympy.core.relational.Relational) and len(involved) == 1:
                continue  # a bound on one Dim: reported below from the refined range
            problems.append(f"the traced code requires {expr}{at}, which the declared Dims do not guarantee")
        for sym, dim in declared.items():
            if str(sym) in fixes:
                continue
            refined = self.env.symbols[sym].range
            cause = next((g for g in self.env.guards if sym in g.expr.free_symbols and g.source), None)
            at = f" (at {cause.source})" if cause is not None else ""
            if refined.is_singleton:
                problems.append(f"the traced code specialized {sym} to the constant {int(refined.lower)}{at}")
                fixes[str(sym)] = f"{sym} = {int(refined.lower)}"
            elif (refined.lower, refined.upper) != (dim.min, dim.max):
                problems.append(f"the traced code only works for {sym} in [{_bound(refined.lower)}, "
                                f"{_bound(refined.upper)}]{at}, but Dim {dim.name!r} allows "
                                f"[{_bound(dim.min)}, {_bound(dim.max)}]")
                fixes[str(sym)] = _dim_constructor(str(sym), refined)
        if problems:
            message = "Constraints violated!\n" + "\n".join(f"  - {p}" for p in problems)
            suggested = "\n".join(f"  {fix}" for fix in fixes.values())
            raise ConstraintViolationError(
                message, fix=f"Suggested fixes:\n{suggested}\n  (kiln.refine_dynamic_shapes_from_suggested_fixes "
                             "applies them)")

    def auto_replacements(self) -> dict[sympy.Symbol, Any]:
        """Dim.AUTO symbols that guards tied to another symbol or a constant, and what replaces them."""
        replacements: dict[sympy.Symbol, Any] = {}
        for sym in self.auto:
            if self.env.symbols[sym].range.is_singleton:
                replacements[sym] = sympy.Integer(int(self.env.symbols[sym].range.lower))
        for guard in self.env.guards:
            expr = guard.expr
            if not isinstance(expr, sympy.Eq):
                continue
            for sym in sorted(expr.free_symbols & set(self.auto), key=lambda s: -self.auto.index(s)):
                if sym in replacements:
                    continue
                solved = _solve(expr, sym)
                if len(solved) == 1 and solved[0].free_symbols.isdisjoint({sym}):
                    replacements[sym] = solved[0]
                    break
        for sym, value in list(replacements.items()):  # resolve chains like s2 -> s1 -> s0
            for _ in range(len(replacements)):
                value = value.xreplace(replacements)
            replacements[sym] = value
        return replacements

    def range_constraints(self) -> dict[Any, ValueRange]:
        ranges: dict[Any, ValueRange] = {}
        for sym in [*self.input_symbols, *self.auto]:
            info = self.env.symbols[sym]
            if not info.range.is_singleton:
                ranges[sym] = info.range
        for _, expr in self.derived.values():
            bound = self.env.bound(expr)
            ranges[expr] = ValueRange(bound.lower, bound.upper)
        return ranges


def _divisibility(expr: sympy.Basic, sym: sympy.Symbol) -> int | None:
    """k when the guard says `sym` is a multiple of k: `Eq(Mod(sym, k), 0)`, `Eq(k*floor(sym/k), sym)`, ..."""
    candidates = {int(atom.args[1]) for atom in expr.atoms(sympy.Mod)
                  if atom.args[0] == sym and atom.args[1].is_Integer}
    for atom in expr.atoms(sympy.floor):
        ratio = atom.args[0] / sym
        if ratio.is_Rational and ratio.p == 1 and ratio.q > 1:
            candidates.add(int(ratio.q))
    whole = sympy.Symbol("_whole", integer=True)
    for k in sorted(candidates):
        holds = expr.subs(sym, k * whole)
        fails = expr.subs(sym, k * whole + 1)
        if sympy.simplify(holds) is sympy.true and sympy.simplify(fails) is sympy.false:
            return k
    return None


def _solve(expr: sympy.Basic, sym: sympy.Symbol) -> list[Any]:
    try:
        return list(sympy.solve(expr, sym))
    except NotImplementedError:
        return []


def _bound(value: float) -> str:
    return "inf" if value == INF else str(int(value))


def _format_relation(expr: sympy.Expr) -> str:
    return str(expr).replace("*", " * ") if "*" in str(expr) else str(expr)


def _dim_constructor(name: str, value_range: ValueRange) -> str:
    args = [f"'{name}'"]
    if value_range.lower != 1:
        args.append(f"min={int(value_range.lower)}")
    if value_range.upper != INF:
        args.append(f"max={int(value_range.upper)}")
    return f"{name} = Dim({', '.join(args)})"


_FIX_LINE = re.compile(r"^\s*(\w+)\s*=\s*(.+?)\s*$")


def refine_dynamic_shapes_from_suggested_fixes(msg: str, dynamic_shapes: Any) -> Any:
    """Apply the fixes listed in a ConstraintViolationError to `dynamic_shapes` (by Dim name)."""
    text = str(msg)
    if "Suggested fixes:" not in text:
        raise KilnError("the message has no 'Suggested fixes:' section")
    section = text.split("Suggested fixes:", 1)[1]
    roots: dict[str, Dim] = {}
    replacements: dict[str, Any] = {}
    lines = [line for line in section.splitlines() if _FIX_LINE.match(line) and "refine_dynamic" not in line]
    # First the new Dims (so relations can refer to them), then constants and relations.
    for line in lines:
        name, value = _FIX_LINE.match(line).groups()  # type: ignore[union-attr]
        constructor = re.fullmatch(r"Dim\('(\w+)'(?:, min=(\d+))?(?:, max=(\d+))?\)", value)
        if constructor:
            _, low, high = constructor.groups()
            roots[name] = Dim(name, min=int(low) if low else None, max=int(high) if high else None)
            replacements[name] = roots[name]

    def existing(name: str) -> Dim:
        if name in roots:
            return roots[name]
        found = _find_dim(dynamic_shapes, name)
        if found is None:
            raise KilnError(f"suggested fix refers to unknown Dim {name!r}")
        roots[name] = found
        return found

    for line in lines:
        name, value = _FIX_LINE.match(line).groups()  # type: ignore[union-attr]
        if name in replacements:
            continue
        if value.isdigit():
            replacements[name] = int(value)
            continue
        relation = re.fullmatch(r"(?:(\d+)\s*\*\s*)?(\w+)(?:\s*([+-])\s*(\d+))?", value)
        if relation is None:
            raise KilnError(f"cannot apply suggested fix {line.strip()!r}")
        scale, base, sign, offset = relation.groups()
        derived: Any = existing(base)
        if scale:
            derived = derived * int(scale)
        if offset:
            derived = derived + (int(offset) if sign == "+" else -int(offset))
        replacements[name] = derived

    def rewrite(spec: Any) -> Any:
        if isinstance(spec, (Dim, DerivedDim)):
            root = spec if isinstance(spec, Dim) else spec.root
            if root.name not in replacements:
                return spec
            new_root = replacements[root.name]
            if isinstance(spec, Dim):
                return None if isinstance(new_root, int) else new_root
            if isinstance(new_root, int):
                return None
            return DerivedDim(new_root, spec.scale, spec.offset) if isinstance(new_root, Dim) else new_root
        if isinstance(spec, dict):
            return {k: rewrite(v) for k, v in spec.items()}
        if isinstance(spec, (list, tuple)):
            return type(spec)(rewrite(v) for v in spec)
        return spec

    return rewrite(dynamic_shapes)


def _find_dim(spec: Any, name: str) -> Dim | None:
    if isinstance(spec, Dim) and spec.name == name:
        return spec
    if isinstance(spec, DerivedDim):
        return _find_dim(spec.root, name)
    values = spec.values() if isinstance(spec, dict) else spec if isinstance(spec, (list, tuple)) else []
    for value in values:
        found = _find_dim(value, name)
        if found is not None:
            return found
    return None

