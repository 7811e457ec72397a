"""LoweringContext: what a lowering function sees while it translates one kiln op into ONNX nodes."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import sympy

from kiln.ir import dtypes
from kiln.ir.dtypes import DType
from kiln.ir.types import ScalarType, TensorType

from kiln.codegen.onnx.graph import OnnxGraph, Value

# A lowering takes the context and the op's arguments in schema order (tensors as `Value`s, SymInts as ints
# or sympy expressions) and returns the ONNX name of each result (one name, or a list for several results).
Lowering = Callable[..., Any]


class LoweringContext:
    def __init__(self, graph: OnnxGraph, op: Any, opset: int):
        self.graph = graph
        self.op = op
        self.opset = opset
        self.result_types: list[Any] = [r.type for r in op.results]
        # The IR's result types; `result_types` may be widened (float16/bfloat16 compute in float32).
        self.declared_types: list[Any] = list(self.result_types)
        self.values: dict[Any, Value] = {}  # kiln value -> its ONNX Value, for lowerings that look at producers

    @property
    def out(self) -> TensorType:
        return self.result_types[0]

    @property
    def out_dtype(self) -> DType:
        result = self.result_types[0]
        if isinstance(result, ScalarType):
            return result.data
        return result.dtype if isinstance(result, TensorType) else dtypes.int64

    # -- shorthands over the graph
    def node(self, op_type: str, inputs: Sequence[str], outputs: int = 1, **attributes: Any) -> Any:
        return self.graph.node(op_type, inputs, outputs, **attributes)

    def const(self, value: Any, dtype: DType | None = None) -> str:
        return self.graph.const(value, dtype)

    def ints(self, values: Sequence[int]) -> str:
        return self.graph.ints(values)

    def dims(self, exprs: Sequence[Any]) -> str:
        return self.graph.dims(exprs)

    def dim(self, expr: Any) -> str:
        return self.graph.dim(expr)

    def scalar(self, expr: Any) -> str:
        return self.graph.dim_scalar(expr)

    def as_dtype(self, value: Any, dtype: DType) -> str:
        """`value` (a Value, a Python number or a symbolic int) as an ONNX tensor of `dtype`."""
        if isinstance(value, Value):
            return self.graph.cast(value.name, value.dtype, dtype)
        if isinstance(value, sympy.Expr) and not value.is_number:
            return self.graph.cast(self.graph.dim_scalar(value), dtypes.int64, dtype)
        if isinstance(value, sympy.Expr):
            value = int(value) if value.is_Integer else float(value)
        return self.const(np.asarray(value).astype(dtype.numpy))

    @property
    def declared_dtype(self) -> DType:
        result = self.declared_types[0]
        return result.dtype if isinstance(result, TensorType) else self.out_dtype

    def original_dtype(self, value: Value) -> DType:
        """The IR dtype of `value` (before float16/bfloat16 inputs were widened to float32)."""
        return self.graph.widened.get(value.name, value.dtype)

    def operand(self, value: Any, semantic: DType, compute: DType) -> str:
        """`value` converted as ATen converts operands: to the op's dtype `semantic` (integers wrap, floats
        round), then to the kernel's dtype `compute`."""
        if isinstance(value, Value):
            if self.original_dtype(value) is semantic:
                return self.as_dtype(value, compute)
            return self.graph.cast(self.as_dtype(value, semantic), semantic, compute)
        if isinstance(value, sympy.Expr) and not value.is_number:
            return self.graph.cast(self.as_dtype(value, semantic), semantic, compute)
        if isinstance(value, sympy.Expr):
            value = int(value) if value.is_Integer else float(value)
        with np.errstate(all="ignore"):
            return self.const(np.asarray(value).astype(semantic.numpy).astype(compute.numpy))

    def shape(self, value: Value) -> str:
        """The runtime shape of `value` (a constant when its type is static)."""
        return self.dims(value.shape)

    def sizes(self, value: Value, axes: Sequence[int]) -> Any:
        """The product of `value`'s sizes along `axes`, as an int or sympy expression."""
        total: Any = 1
        for axis in axes:
            total = total * value.shape[axis]
        return sympy.sympify(total) if not isinstance(total, int) else total


def normalize_axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def normalize_axes(axes: Sequence[int] | None, rank: int) -> list[int]:
    if axes is None or len(axes) == 0:
        return list(range(rank))
    return sorted({normalize_axis(a, max(rank, 1)) for a in axes})


__all__ = ["LoweringContext", "Lowering", "normalize_axis", "normalize_axes"]
