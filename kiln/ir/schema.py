"""ATen function schemas: parse `add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor`.

A FunctionSchema tells which arguments are tensors (IR operands) and which are attributes (IR properties),
their defaults, and the returns. `bind` normalizes a Python call against it, the way the dispatcher does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

import sympy

from kiln.ir.errors import OpArgumentError, ParseError


class _NoDefault:
    def __repr__(self) -> str:
        return "NO_DEFAULT"


NO_DEFAULT: Any = _NoDefault()

BASE_TYPES = {
    "Tensor", "int", "SymInt", "float", "bool", "str", "Scalar", "ScalarType", "Layout", "Device",
    "MemoryFormat", "Generator", "Dimname", "Storage", "Stream", "t", "Any",
}


@dataclass(frozen=True)
class ArgType:
    base: str  # "Tensor", "int", "SymInt", "float", "bool", "str", "Scalar", "ScalarType", ...
    optional: bool = False  # `T?`
    is_list: bool = False  # `T[]` / `T[N]`
    list_size: int | None = None
    element_optional: bool = False  # `Tensor?[]`
    alias: str | None = None  # `Tensor(a)`, `Tensor(a!)`
    mutable: bool = False

    @property
    def is_tensor(self) -> bool:
        return self.base == "Tensor"

    @property
    def is_tensor_list(self) -> bool:
        return self.is_tensor and self.is_list

    def __str__(self) -> str:
        text = self.base
        if self.alias:
            text += f"({self.alias}{'!' if self.mutable else ''})"
        if self.element_optional:
            text += "?"
        if self.is_list:
            text += f"[{self.list_size if self.list_size is not None else ''}]"
        if self.optional:
            text += "?"
        return text


@dataclass(frozen=True)
class Argument:
    name: str
    type: ArgType
    default: Any = NO_DEFAULT
    kwarg_only: bool = False

    @property
    def has_default(self) -> bool:
        return self.default is not NO_DEFAULT


@dataclass(frozen=True)
class Return:
    name: str | None
    type: ArgType


@dataclass(frozen=True)
class FunctionSchema:
    namespace: str
    name: str
    overload: str  # "default" when the schema has none
    arguments: tuple[Argument, ...]
    returns: tuple[Return, ...]
    text: str

    @property
    def qualified_name(self) -> str:
        """`aten.add.Tensor` — the IR op name and the `kiln.ops` path."""
        return f"{self.namespace}.{self.name}.{self.overload}"

    @property
    def tensor_arguments(self) -> tuple[Argument, ...]:
        return tuple(a for a in self.arguments if a.type.is_tensor)

    @property
    def attribute_arguments(self) -> tuple[Argument, ...]:
        return tuple(a for a in self.arguments if not a.type.is_tensor)

    @property
    def is_mutating(self) -> bool:
        return any(a.type.mutable for a in self.arguments)

    def __str__(self) -> str:
        return self.text

    def bind(self, args: Sequence[Any], kwargs: dict[str, Any]) -> list[Any]:
        """Match a call to the schema; return every argument in schema order, defaults filled in."""
        positional = [a for a in self.arguments if not a.kwarg_only]
        if len(args) > len(positional):
            raise OpArgumentError(
                f"{self.qualified_name} takes at most {len(positional)} positional arguments "
                f"but {len(args)} were given", fix=f"the schema is: {self.text}")
        bound: list[Any] = []
        unused = dict(kwargs)
        for index, argument in enumerate(self.arguments):
            if index < len(args) and not argument.kwarg_only:
                if argument.name in unused:
                    raise OpArgumentError(f"{self.qualified_name} got argument '{argument.name}' twice")
                value = args[index]
            elif argument.name in unused:
                value = unused.pop(argument.name)
            elif argument.has_default:
                value = argument.default
            else:
                raise OpArgumentError(f"{self.qualified_name} is missing argument '{argument.name}'",
                                      fix=f"the schema is: {self.text}")
            bound.append(normalize_argument(self, argument, value))
        if unused:
            raise OpArgumentError(
                f"{self.qualified_name} got unexpected argument(s) {', '.join(sorted(unused))}",
                fix=f"the schema is: {self.text}")
        return bound


# ---------------------------------------------------------------------------------------------
# Argument normalization: check Python values against the schema type.

def _is_int(value: Any) -> bool:
    import numpy as np
    return (isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))) or (
        isinstance(value, sympy.Expr) and value.is_integer is not False and not value.is_Float)


def _is_float(value: Any) -> bool:
    import numpy as np
    return _is_int(value) or isinstance(value, (float, np.floating))


def _is_bool(value: Any) -> bool:
    import numpy as np
    return isinstance(value, (bool, np.bool_))


def normalize_argument(schema: FunctionSchema, argument: Argument, value: Any) -> Any:
    arg_type = argument.type
    if value is None:
        if arg_type.optional or (argument.has_default and argument.default is None):
            return None
        raise OpArgumentError(f"{schema.qualified_name}: argument '{argument.name}' ({arg_type}) may not be None")
    if arg_type.is_tensor:
        if arg_type.is_list and not isinstance(value, (list, tuple)):
            raise OpArgumentError(f"{schema.qualified_name}: argument '{argument.name}' must be a list of "
                                  f"tensors ({arg_type}), got {type(value).__name__}")
        return list(value) if arg_type.is_list else value  # tensors are checked by the caller's mode
    if arg_type.is_list:
        if not isinstance(value, (list, tuple)):
            if arg_type.list_size is not None and _fits(arg_type.base, value):
                return [_scalar(arg_type.base, value)] * arg_type.list_size
            raise OpArgumentError(
                f"{schema.qualified_name}: argument '{argument.name}' must be {arg_type}, "
                f"got {type(value).__name__}")
        items = list(value)
        if arg_type.list_size is not None and len(items) == 1 and arg_type.list_size > 1 and arg_type.base in (
                "int", "SymInt"):
            items = items * arg_type.list_size
        for item in items:
            if not _fits(arg_type.base, item):
                raise OpArgumentError(
                    f"{schema.qualified_name}: argument '{argument.name}' must be {arg_type}, "
                    f"but holds {type(item).__name__} {item!r}")
        return [_scalar(arg_type.base, item) for item in items]
    if not _fits(arg_type.base, value):
        raise OpArgumentError(
            f"{schema.qualified_name}: argument '{argument.name}' must be {arg_type}, "
            f"got {type(value).__name__} {value!r}")
    return _scalar(arg_type.base, value)


def _fits(base: str, value: Any) -> bool:
    if base in ("int", "SymInt"):
        return _is_int(value)
    if base == "float":
        return _is_float(value) and not _is_bool(value)
    if base == "bool":
        return _is_bool(value)
    if base == "Scalar":
        return _is_float(value) or _is_bool(value)
    if base == "str":
        return isinstance(value, str)
    if base == "ScalarType":
        from kiln.ir.dtypes import DType
        return isinstance(value, DType) or (isinstance(value, int) and not isinstance(value, bool)) or (
            hasattr(value, "itemsize"))
    return True  # Layout, Device, MemoryFormat: accepted as given and ignored by kernels


def _scalar(base: str, value: Any) -> Any:
    """Python-native scalars: numpy scalars become int/float/bool; sympy integers become ints."""
    import numpy as np
    if base == "ScalarType":
        from kiln.ir.dtypes import dtype
        return dtype(value)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, sympy.Expr) and value.is_Integer:
        return int(value)
    if base == "float" and isinstance(value, int):
        return float(value)
    return value


# ---------------------------------------------------------------------------------------------
# Parsing

_SCHEMA = re.compile(r"^\s*(?:(\w+)::)?([\w]+)(?:\.(\w+))?\((.*)\)\s*->\s*(.+?)\s*$", re.S)


def parse_schema(text: str, namespace: str = "aten") -> FunctionSchema:
    match = _SCHEMA.match(text)
    if match is None:
        raise ParseError(f"malformed schema {text!r}", fix="write it like `name.overload(Tensor self) -> Tensor`")
    ns, name, overload, args_text, returns_text = match.groups()
    arguments: list[Argument] = []
    kwarg_only = False
    for piece in _split_top_level(args_text):
        if piece == "*":
            kwarg_only = True
            continue
        arguments.append(_parse_argument(piece, kwarg_only, text))
    returns_text = returns_text.strip()
    if returns_text.startswith("(") and returns_text.endswith(")"):
        return_pieces = _split_top_level(returns_text[1:-1])
    else:
        return_pieces = [returns_text]
    returns = []
    for piece in return_pieces:
        parts = piece.rsplit(" ", 1)
        if len(parts) == 2 and not parts[1].endswith((")", "]", "?")):
            returns.append(Return(parts[1], _parse_type(parts[0], text)))
        else:
            returns.append(Return(None, _parse_type(piece, text)))
    return FunctionSchema(ns or namespace, name, overload or "default", tuple(arguments), tuple(returns),
                          f"{name}{'.' + overload if overload else ''}({args_text}) -> {returns_text}")


def _split_top_level(text: str) -> list[str]:
    pieces, depth, current = [], 0, []
    for char in text:
        if char in "([":
            depth += 1
        elif char in ")]":
            depth -= 1
        if char == "," and depth == 0:
            pieces.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    tail = "".join(current).strip()
    if tail:
        pieces.append(tail)
    return pieces


_TYPE = re.compile(r"^(\w+)(?:\((\w+)(!?)(?:\s*->\s*\*)?\))?(\?)?(?:\[(\d*)\])?(\?)?$")


def _parse_type(text: str, schema_text: str) -> ArgType:
    match = _TYPE.match(text.strip())
    if match is None or match.group(1) not in BASE_TYPES:
        raise ParseError(f"unknown type {text!r} in schema {schema_text!r}")
    base, alias, bang, element_optional, size, optional = match.groups()
    is_list = match.group(5) is not None or "[" in text
    return ArgType(
        base=base, optional=bool(optional), is_list=is_list,
        list_size=int(size) if size else None, element_optional=bool(element_optional) and is_list,
        alias=alias, mutable=bool(bang),
    ) if is_list else ArgType(base=base, optional=bool(element_optional or optional), alias=alias,
                              mutable=bool(bang))


def _parse_argument(text: str, kwarg_only: bool, schema_text: str) -> Argument:
    default: Any = NO_DEFAULT
    if "=" in text:
        text, default_text = text.split("=", 1)
        text = text.strip()
    else:
        default_text = None
    type_text, name = text.rsplit(" ", 1)
    arg_type = _parse_type(type_text, schema_text)
    if default_text is not None:
        default = _parse_default(default_text.strip(), arg_type)
    return Argument(name, arg_type, default, kwarg_only)


def _parse_default(text: str, arg_type: ArgType) -> Any:
    if text == "None":
        return None
    if text == "True":
        return True
    if text == "False":
        return False
    if text.startswith('"') or text.startswith("'"):
        return text[1:-1]
    if text.startswith("["):
        inner = text[1:-1].strip()
        return [_parse_number(x.strip(), arg_type.base) for x in inner.split(",")] if inner else []
    if text in ("contiguous_format", "preserve_format", "strided", "long"):
        return text
    value = _parse_number(text, arg_type.base)
    if arg_type.is_list and arg_type.list_size:
        return [value] * arg_type.list_size
    if arg_type.base == "ScalarType":
        from kiln.ir.dtypes import dtype
        return dtype(value)
    return value


def _parse_number(text: str, base: str) -> int | float:
    if base in ("float",) or any(c in text for c in ".eE") and not text.lstrip("-").isdigit():
        return float(text)
    return int(text)
