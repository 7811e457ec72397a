"""IR types and attributes: `!kiln.tensor<["s0", 64], f32>` and `#kiln.sym<"s0 + 1">`.

TensorType is also what meta rules compute with: it has `.shape` (ints and sympy expressions),
`.dtype` and `.layout`, so one object describes a value in the IR and in shape inference.
"""

from __future__ import annotations

from typing import Sequence

import sympy
from xdsl.ir import Data, TypeAttribute
from xdsl.irdl import irdl_attr_definition
from xdsl.parser import AttrParser
from xdsl.printer import Printer

from kiln.ir import dtypes
from kiln.ir.dtypes import DType
from kiln.ir.sparse import STRIDED_LAYOUT, Layout, as_layout, parse_layout
from kiln.ir.symbolic import SymInt, as_dim, format_dim, parse_dim


def _parse_dim_token(parser: AttrParser, allow_negative: bool = False) -> SymInt:
    """A dim (never negative) or, with `allow_negative`, a SymInt value: an integer or a quoted expression."""
    number = parser.parse_optional_integer(allow_boolean=False, allow_negative=allow_negative)
    if number is not None:
        return number
    return parse_dim(parser.parse_str_literal())


def _print_dim(dim: SymInt) -> str:
    return str(dim) if isinstance(dim, int) else f'"{format_dim(dim)}"'


def _layout_text(parser: AttrParser) -> str:
    """A layout's spelling, `sparse_bsr<block=[16, 16], index=i32>`, read token by token."""
    text = parser.parse_identifier()
    if parser.parse_optional_punctuation("<") is None:
        return text
    depth, pieces = 1, [text, "<"]
    while depth:
        if parser.parse_optional_punctuation("<"):
            depth += 1
            pieces.append("<")
        elif parser.parse_optional_punctuation(">"):
            depth -= 1
            pieces.append(">")
        elif (punctuation := parser.parse_optional_punctuation("[")) or \
                (punctuation := parser.parse_optional_punctuation("]")) or \
                (punctuation := parser.parse_optional_punctuation(",")) or \
                (punctuation := parser.parse_optional_punctuation("=")):
            pieces.append(punctuation)
        elif (number := parser.parse_optional_integer(allow_boolean=False)) is not None:
            pieces.append(str(number))
        else:
            pieces.append(parser.parse_identifier())
    return "".join(pieces)


@irdl_attr_definition
class TensorType(Data[tuple], TypeAttribute):
    """A tensor value: (shape, dtype, layout). Shape entries are ints or sympy expressions; the layout is
    `strided` or a sparse one (kiln/ir/sparse.py), printed after the dtype: `<[64, 128], f32, sparse_csr>`."""

    name = "kiln.tensor"

    @staticmethod
    def of(shape: Sequence[SymInt], dtype: DType | str, layout: Layout | str | None = None) -> "TensorType":
        return TensorType((tuple(as_dim(d) for d in shape), dtypes.dtype(dtype), as_layout(layout)))

    @property
    def shape(self) -> tuple[SymInt, ...]:
        return self.data[0]

    @property
    def dtype(self) -> DType:
        return self.data[1]

    @property
    def layout(self) -> Layout:
        return self.data[2]

    @property
    def is_sparse(self) -> bool:
        return self.data[2].is_sparse

    @property
    def ndim(self) -> int:
        return len(self.data[0])

    def with_shape(self, shape: Sequence[SymInt]) -> "TensorType":
        return TensorType.of(shape, self.dtype, self.layout)

    def with_dtype(self, dtype: DType) -> "TensorType":
        return TensorType.of(self.shape, dtype, self.layout)

    def with_layout(self, layout: Layout | str | None) -> "TensorType":
        return TensorType.of(self.shape, self.dtype, layout)

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    def short(self) -> str:
        """torch.export's annotation form: `f32[s0, 64]`."""
        return f"{self.dtype.short}[{', '.join(format_dim(d) for d in self.shape)}]"

    @classmethod
    def parse_parameter(cls, parser: AttrParser) -> tuple:
        with parser.in_angle_brackets():
            shape = parser.parse_comma_separated_list(parser.Delimiter.SQUARE, lambda: _parse_dim_token(parser))
            parser.parse_punctuation(",")
            dtype_name = parser.parse_identifier()
            layout = STRIDED_LAYOUT
            if parser.parse_optional_punctuation(","):
                layout = parse_layout(_layout_text(parser))
        return (tuple(shape), dtypes.dtype(dtype_name), layout)

    def print_parameter(self, printer: Printer) -> None:
        dims = ", ".join(_print_dim(d) for d in self.shape)
        layout = f", {self.layout.text()}" if self.layout.is_sparse else ""
        printer.print_string(f"<[{dims}], {self.dtype.short}{layout}>")


@irdl_attr_definition
class SymIntType(Data[object], TypeAttribute):
    """A symbolic integer value (`aten.sym_size.int`'s result); carries its expression when known."""

    name = "kiln.symint"

    @staticmethod
    def of(expr: SymInt) -> "SymIntType":
        return SymIntType(as_dim(expr))

    @property
    def expr(self) -> SymInt:
        return self.data

    @classmethod
    def parse_parameter(cls, parser: AttrParser) -> object:
        with parser.in_angle_brackets():
            return _parse_dim_token(parser, allow_negative=True)  # a SymInt value may be negative (`a - b`)

    def print_parameter(self, printer: Printer) -> None:
        printer.print_string(f"<{_print_dim(self.data)}>")


@irdl_attr_definition
class ScalarType(Data[DType], TypeAttribute):
    """A non-integer scalar value (a float read from a tensor by `_local_scalar_dense`)."""

    name = "kiln.scalar"

    @classmethod
    def parse_parameter(cls, parser: AttrParser) -> DType:
        with parser.in_angle_brackets():
            return dtypes.dtype(parser.parse_identifier())

    def print_parameter(self, printer: Printer) -> None:
        printer.print_string(f"<{self.data.short}>")


@irdl_attr_definition
class SymExprAttr(Data[sympy.Expr]):
    """A symbolic integer inside an op property: `#kiln.sym<"s0 + 1">`."""

    name = "kiln.sym"

    @classmethod
    def parse_parameter(cls, parser: AttrParser) -> sympy.Expr:
        with parser.in_angle_brackets():
            return sympy.sympify(parse_dim(parser.parse_str_literal()))

    def print_parameter(self, printer: Printer) -> None:
        printer.print_string(f'<"{format_dim(self.data)}">')


def type_symbols(value_type: object) -> set[sympy.Symbol]:
    """The free symbols of a tensor type's sizes or of a symbolic integer's expression (none for other types)."""
    if isinstance(value_type, TensorType):
        dims = value_type.shape
    elif isinstance(value_type, SymIntType):
        dims = [value_type.expr]
    else:
        return set()
    return {symbol for dim in dims if isinstance(dim, sympy.Basic) for symbol in dim.free_symbols}
