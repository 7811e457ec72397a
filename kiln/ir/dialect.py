"""The op dialects (`aten`, `quantized_decomposed`, ...), generated from the op registry: one IRDL operation per
overload.

Tensor arguments become operands (optional and list arguments become optional/variadic operands);
every other argument becomes a property, encoded from its Python value by its schema type. Each
generated op verifies its result types against the registry's meta rule.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import sympy
from xdsl.context import Context
from xdsl.dialects import builtin, func
from xdsl.dialects.builtin import (
    ArrayAttr, BoolAttr, DenseArrayBase, FloatAttr, IntegerAttr, StringAttr, f64, i32, i64,
)
from xdsl.ir import Attribute, Dialect
from xdsl.irdl import (
    AttrSizedOperandSegments, IRDLOperation, irdl_op_definition, operand_def, opt_operand_def, opt_prop_def,
    result_def, var_operand_def, var_result_def,
)

from kiln.ir import dtypes
from kiln.ir.errors import VerificationError
from kiln.ir.registry import REGISTRY, OpDef
from kiln.ir.schema import Argument, ArgType
from kiln.ir.types import ScalarType, SymExprAttr, SymIntType, TensorType

PRESENT_SUFFIX = "_present"  # property marking which entries of a `Tensor?[]` argument are given


# ---------------------------------------------------------------------------------------------
# Property encoding, driven by the schema type.

def _encode_scalar(base: str, value: Any) -> Attribute:
    if isinstance(value, bool):
        return BoolAttr.from_bool(value)
    if isinstance(value, sympy.Expr):
        if value.is_Integer:
            return IntegerAttr(int(value), i64)
        return SymExprAttr(value)
    if base == "ScalarType":
        return StringAttr(dtypes.dtype(value).short)
    if isinstance(value, int):
        return IntegerAttr(value, i64)
    if isinstance(value, float):
        return FloatAttr(value, f64)
    if isinstance(value, str):
        return StringAttr(value)
    return StringAttr(str(value))


def encode_property(arg_type: ArgType, value: Any) -> Attribute:
    if arg_type.is_list:
        return ArrayAttr([_encode_scalar(arg_type.base, v) for v in value])
    return _encode_scalar(arg_type.base, value)


def _decode_scalar(base: str, attr: Attribute) -> Any:
    if isinstance(attr, SymExprAttr):
        return attr.data
    if isinstance(attr, IntegerAttr):
        value = attr.value.data
        if attr.type == builtin.i1 or base == "bool":
            return bool(value)
        return float(value) if base == "float" else value
    if isinstance(attr, FloatAttr):
        return float(attr.value.data)
    if isinstance(attr, StringAttr):
        return dtypes.dtype(attr.data) if base == "ScalarType" else attr.data
    raise VerificationError(f"cannot decode property {attr} as {base}")


def decode_property(arg_type: ArgType, attr: Attribute | None, default: Any) -> Any:
    if attr is None:
        return default
    if arg_type.is_list:
        if not isinstance(attr, ArrayAttr):
            raise VerificationError(f"expected a list for a {arg_type} property, got {attr}")
        return [_decode_scalar(arg_type.base, a) for a in attr.data]
    return _decode_scalar(arg_type.base, attr)


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if type(a) is bool or type(b) is bool:
        return type(a) is type(b) and a == b
    try:
        return bool(a == b)
    except TypeError:
        return False


# ---------------------------------------------------------------------------------------------
# Op classes

def _field(name: str) -> str:
    return f"arg_{name}"


def _make_op_class(opdef: OpDef) -> type[IRDLOperation]:
    schema = opdef.schema
    body: dict[str, Any] = {"name": schema.qualified_name}
    variadic = 0
    for argument in schema.arguments:
        arg_type = argument.type
        if arg_type.is_tensor:
            if arg_type.is_list:
                body[_field(argument.name)] = var_operand_def(TensorType)
                variadic += 1
                if arg_type.element_optional:
                    body[_field(argument.name + PRESENT_SUFFIX)] = opt_prop_def(
                        Attribute, prop_name=argument.name + PRESENT_SUFFIX)
            elif arg_type.optional:
                body[_field(argument.name)] = opt_operand_def(TensorType)
                variadic += 1
            else:
                body[_field(argument.name)] = operand_def(TensorType)
        else:
            body[_field(argument.name)] = opt_prop_def(Attribute, prop_name=argument.name)
    for index, ret in enumerate(schema.returns):
        if ret.type.is_list:
            body[f"result_{index}"] = var_result_def(TensorType)
        else:
            body[f"result_{index}"] = result_def(Attribute)
    if variadic > 1:
        body["irdl_options"] = (AttrSizedOperandSegments(as_property=True),)
    body["verify_"] = _verify_with_meta
    class_name = "".join(part.capitalize() for part in schema.qualified_name.split(".")) + "Op"
    op_type = irdl_op_definition(type(class_name, (IRDLOperation,), body))
    op_type.opdef = opdef  # read by the verifier, interpreter and printers
    op_type.has_operand_segments = variadic > 1
    return op_type


def _verify_with_meta(op: IRDLOperation) -> None:
    from kiln.ir.verifier import check_op_types
    check_op_types(op)


_DIALECTS: dict[str, Dialect] = {}
_OPS_BUILT = 0


def op_dialects() -> list[Dialect]:
    """One dialect per op namespace (`aten`, `quantized_decomposed`, ...), each with one op class per registered
    overload (built once, rebuilt if ops were added)."""
    global _OPS_BUILT
    import kiln.ir.ops  # noqa: F401  (registers every op)
    if not _DIALECTS or _OPS_BUILT != len(REGISTRY):
        by_namespace: dict[str, list[type]] = {}
        for opdef in REGISTRY.values():
            if opdef.op_class is None:
                opdef.op_class = _make_op_class(opdef)
            by_namespace.setdefault(opdef.schema.namespace, []).append(opdef.op_class)
        _DIALECTS.clear()
        _DIALECTS.update({name: Dialect(name, classes, []) for name, classes in by_namespace.items()})
        _OPS_BUILT = len(REGISTRY)
    return list(_DIALECTS.values())


def kiln_dialect() -> Dialect:
    from kiln.ir.control_flow import CONTROL_FLOW_OPS
    return Dialect("kiln", CONTROL_FLOW_OPS, [TensorType, SymIntType, ScalarType, SymExprAttr])


def op_class(opdef: OpDef) -> type[IRDLOperation]:
    if opdef.op_class is None:
        op_dialects()
    assert opdef.op_class is not None
    return opdef.op_class


def context() -> Context:
    """An xDSL context that can parse kiln programs."""
    ctx = Context()
    ctx.load_dialect(builtin.Builtin)
    ctx.load_dialect(func.Func)
    ctx.load_dialect(kiln_dialect())
    for dialect in op_dialects():
        ctx.load_dialect(dialect)
    return ctx


# ---------------------------------------------------------------------------------------------
# Building and reading ops: between bound Python arguments and operands/properties.

def build_op(opdef: OpDef, bound: list[Any], result_types: list[Attribute]) -> IRDLOperation:
    """Create the xDSL op for a bound call; tensor arguments in `bound` must be SSA values."""
    operands: list[Any] = []
    segment_sizes: list[int] = []
    properties: dict[str, Attribute] = {}
    for argument, value in zip(opdef.schema.arguments, bound):
        arg_type = argument.type
        if arg_type.is_tensor:
            if arg_type.is_list:
                given = [v for v in value if v is not None]
                operands.extend(given)
                segment_sizes.append(len(given))
                if arg_type.element_optional:
                    properties[argument.name + PRESENT_SUFFIX] = ArrayAttr(
                        [BoolAttr.from_bool(v is not None) for v in value])
            elif arg_type.optional:
                if value is not None:
                    operands.append(value)
                segment_sizes.append(0 if value is None else 1)
            else:
                operands.append(value)
                segment_sizes.append(1)
        elif value is not None and not (argument.has_default and _same_value(value, argument.default)):
            properties[argument.name] = encode_property(arg_type, value)
    op_type = op_class(opdef)
    if op_type.has_operand_segments:  # type: ignore[attr-defined]
        properties[AttrSizedOperandSegments.attribute_name] = DenseArrayBase.from_list(i32, segment_sizes)
    # Operation.create skips IRDL's generic argument packing; verification still checks the structure.
    return op_type.create(operands=operands, properties=properties, result_types=result_types)


def bound_arguments(op: IRDLOperation, resolve: Callable[[Any], Any] | None = None) -> list[Any]:
    """The op's arguments in schema order: operands (passed through `resolve` if given, e.g. to
    look up their runtime values or types) and decoded properties."""
    opdef: OpDef = op.opdef  # type: ignore[attr-defined]
    resolve = resolve or (lambda value: value)
    return [_argument_value(op, argument, resolve) for argument in opdef.schema.arguments]


def _argument_value(op: IRDLOperation, argument: Argument, resolve: Callable[[Any], Any]) -> Any:
    arg_type = argument.type
    if arg_type.is_tensor:
        operand = getattr(op, _field(argument.name))
        if arg_type.is_list:
            given = [resolve(v) for v in operand]
            if arg_type.element_optional:
                mask_attr = op.properties.get(argument.name + PRESENT_SUFFIX)
                mask = [bool(m.value.data) for m in mask_attr.data] if mask_attr else [True] * len(given)
                iterator = iter(given)
                return [next(iterator) if present else None for present in mask]
            return given
        if operand is None:
            return None
        return resolve(operand)
    default = argument.default if argument.has_default else None
    return decode_property(arg_type, op.properties.get(argument.name), default)
