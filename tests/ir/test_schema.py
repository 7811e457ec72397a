"""ATen schema parsing and argument binding."""

from __future__ import annotations

import pathlib

import pytest

from kiln.ir.errors import OpArgumentError, ParseError
from kiln.ir.schema import NO_DEFAULT, parse_schema

CORE_SCHEMAS = [line for line in pathlib.Path(__file__).with_name("core_schemas_2_13.txt").read_text().split("\n")
                if line]


@pytest.mark.parametrize("text", CORE_SCHEMAS)
def test_every_core_schema_parses(text):
    schema = parse_schema(text)
    assert text.endswith(schema.text)
    assert schema.qualified_name.startswith("aten.")


def test_parsed_structure():
    schema = parse_schema("aten::max_pool2d_with_indices(Tensor self, int[2] kernel_size, int[2] stride=[], "
                          "int[2] padding=0, int[2] dilation=1, bool ceil_mode=False) -> (Tensor, Tensor)")
    assert schema.qualified_name == "aten.max_pool2d_with_indices.default"
    kernel, padding, dilation = schema.arguments[1], schema.arguments[3], schema.arguments[4]
    assert kernel.type.is_list and kernel.type.list_size == 2 and kernel.default is NO_DEFAULT
    assert padding.default == [0, 0] and dilation.default == [1, 1]
    assert len(schema.returns) == 2

    index = parse_schema("index.Tensor(Tensor self, Tensor?[] indices) -> Tensor")
    assert index.arguments[1].type.element_optional and index.arguments[1].type.is_tensor_list

    add = parse_schema("add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor")
    assert add.arguments[2].kwarg_only and add.arguments[2].default == 1

    split = parse_schema("split_with_sizes(Tensor(a -> *) self, SymInt[] split_sizes, int dim=0) -> Tensor(a)[]")
    assert split.returns[0].type.is_list and split.arguments[0].type.alias == "a"


def test_bind_fills_defaults_and_expands_int_lists():
    schema = parse_schema("avg_pool2d(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0, "
                          "bool ceil_mode=False, bool count_include_pad=True, int? divisor_override=None) -> Tensor")
    bound = schema.bind(("x", 3), {"padding": 1})
    assert bound == ["x", [3, 3], [], [1, 1], False, True, None]


def test_bind_errors_name_the_argument():
    schema = parse_schema("add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor")
    with pytest.raises(OpArgumentError, match="missing argument 'other'"):
        schema.bind(("x",), {})
    with pytest.raises(OpArgumentError, match="unexpected argument"):
        schema.bind(("x", "y"), {"beta": 2})
    with pytest.raises(OpArgumentError, match="at most 2 positional"):
        schema.bind(("x", "y", 3), {})
    with pytest.raises(OpArgumentError, match="'alpha' must be Scalar"):
        schema.bind(("x", "y"), {"alpha": "two"})


@pytest.mark.parametrize("text", ["add.Tensor(Tensor self", "add(Blob self) -> Tensor", "-> Tensor"])
def test_malformed_schemas(text):
    with pytest.raises(ParseError):
        parse_schema(text)
