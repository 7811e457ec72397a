"""OnnxGraph: the node list being built for one ONNX graph (the main graph or an `If` branch), with helpers
for constants, casts and symbolic dims (sympy expressions turned into Shape/Gather/arithmetic nodes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import ml_dtypes
import numpy as np
import onnx
import sympy
from onnx import TensorProto, helper

from kiln.ir import dtypes
from kiln.ir.dtypes import DType
from kiln.ir.errors import UnsupportedError
from kiln.ir.types import ScalarType, SymIntType, TensorType

ONNX_DTYPES: dict[DType, int] = {
    dtypes.bool_: TensorProto.BOOL, dtypes.uint8: TensorProto.UINT8, dtypes.int8: TensorProto.INT8,
    dtypes.int16: TensorProto.INT16, dtypes.int32: TensorProto.INT32, dtypes.int64: TensorProto.INT64,
    dtypes.float16: TensorProto.FLOAT16, dtypes.bfloat16: TensorProto.BFLOAT16, dtypes.float32: TensorProto.FLOAT,
    dtypes.float64: TensorProto.DOUBLE, dtypes.complex64: TensorProto.COMPLEX64,
    dtypes.complex128: TensorProto.COMPLEX128,
}
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)


def onnx_dtype(dtype: DType) -> int:
    return ONNX_DTYPES[dtype]


@dataclass(frozen=True)
class Value:
    """A kiln SSA value as it exists in the ONNX graph: its ONNX name and its kiln type."""

    name: str
    type: Any  # TensorType, SymIntType or ScalarType

    @property
    def dtype(self) -> DType:
        if isinstance(self.type, SymIntType):
            return dtypes.int64
        if isinstance(self.type, ScalarType):
            return self.type.data
        return self.type.dtype

    @property
    def shape(self) -> tuple[Any, ...]:
        return self.type.shape if isinstance(self.type, TensorType) else ()

    @property
    def rank(self) -> int:
        return len(self.shape)


def value_info(name: str, value_type: Any) -> onnx.ValueInfoProto:
    """A typed graph input/output; symbolic dims become `dim_param`s named after the expression."""
    if isinstance(value_type, SymIntType):
        return helper.make_tensor_value_info(name, TensorProto.INT64, [])
    if isinstance(value_type, ScalarType):
        return helper.make_tensor_value_info(name, onnx_dtype(value_type.data), [])
    shape = [d if isinstance(d, int) else str(d).replace(" ", "") for d in value_type.shape]
    return helper.make_tensor_value_info(name, onnx_dtype(value_type.dtype), shape)


class Model:
    """What the graphs of one model share: unique names, initializers (deduplicated by content)."""

    def __init__(self, sparse_initializers: bool = False) -> None:
        # Mostly-zero float weights (pruned ones) are written sparse (see sparse_constants).
        self.sparse_initializers = sparse_initializers
        self.used_names: set[str] = set()
        self.initializers: list[tuple[str, np.ndarray]] = []  # written into the GraphProto once, at the end
        self._by_layout: dict[tuple[Any, ...], list[tuple[np.ndarray, str]]] = {}
        self._by_identity: dict[int, str] = {}
        self._keep_alive: list[Any] = []
        self.counter = 0

    def fresh(self, hint: str) -> str:
        hint = hint or "v"
        name = hint
        while name in self.used_names:
            self.counter += 1
            name = f"{hint}__{self.counter}"
        self.used_names.add(name)
        return name

    def initializer(self, array: np.ndarray, name: str) -> str:
        """Add a weight or constant; an identical array already added is reused (tied weights, repeats)."""
        found = self._by_identity.get(id(array))
        if found is not None:
            return found
        original = array
        array = np.asarray(array, order="C")  # (ascontiguousarray would turn 0-d arrays into 1-d)
        bucket = self._by_layout.setdefault((array.dtype, array.shape), [])  # (ml_dtypes' str is '<V1')
        for other, other_name in bucket:
            if _same_bytes(array, other):
                return other_name
        name = self.fresh(name)
        bucket.append((array, name))
        self.initializers.append((name, array))
        self._by_identity[id(original)] = name
        self._keep_alive.append(original)  # ids stay unique while we hold the arrays
        return name

    def constant(self, name: str) -> np.ndarray | None:
        """The array of initializer `name`, or None if `name` is computed by the graph."""
        return next((array for other, array in self.initializers if other == name), None)

    def sparse_constants(self) -> list[onnx.NodeProto]:
        """With `sparse_initializers`: the mostly-zero weights taken out of the initializers, as Constant nodes with
        a `sparse_value` (values and flat int64 indices), whose output is the dense tensor. (A graph's
        sparse_initializer would type the weight as a sparse tensor, which no ONNX operator accepts.)"""
        if not self.sparse_initializers:
            return []
        nodes, dense = [], []
        for name, array in self.initializers:
            if not _mostly_zero(array):
                dense.append((name, array))
                continue
            flat = np.flatnonzero(array)
            node = onnx.NodeProto(op_type="Constant", name=f"{name}_sparse", output=[name])
            attribute = node.attribute.add(name="sparse_value", type=onnx.AttributeProto.SPARSE_TENSOR)
            attribute.sparse_tensor.dims.extend(array.shape)
            _fill_tensor(attribute.sparse_tensor.values, name, array.reshape(-1)[flat])
            _fill_tensor(attribute.sparse_tensor.indices, f"{name}_indices", flat.astype(np.int64))
            nodes.append(node)
        self.initializers = dense
        return nodes

    def write_initializers(self, graph: onnx.GraphProto) -> None:
        for name, array in self.initializers:
            _fill_tensor(graph.initializer.add(), name, array)


def _mostly_zero(array: np.ndarray) -> bool:
    """Worth storing sparse: a float array of at least 4096 elements, at least 75% zeros (a nonzero takes its value
    and an int64 index, 12 bytes for float32, against 4 bytes per element dense)."""
    return array.dtype.kind == "f" and array.size >= 4096 and np.count_nonzero(array) <= 0.25 * array.size


def _fill_tensor(tensor: onnx.TensorProto, name: str, array: np.ndarray) -> None:
    tensor.name = name
    tensor.dims.extend(array.shape)
    if array.dtype == dtypes.bfloat16.numpy:
        tensor.data_type = TensorProto.BFLOAT16
        data = array.view(np.uint16)
    elif array.dtype in (ml_dtypes.int4, ml_dtypes.uint4):  # INT4 / UINT4: two values per byte
        tensor.data_type = TensorProto.INT4 if array.dtype == ml_dtypes.int4 else TensorProto.UINT4
        data = dtypes.pack_nibbles(array)
    else:
        tensor.data_type = helper.np_dtype_to_tensor_dtype(array.dtype)
        data = array
    tensor.raw_data = data.astype(data.dtype.newbyteorder("<"), copy=False).tobytes()


def _same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal contents; distinct weights almost always differ in their first values, so check those first."""
    flat_a, flat_b = a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8)
    return bool(np.array_equal(flat_a[:256], flat_b[:256]) and np.array_equal(flat_a, flat_b))


@dataclass(frozen=True)
class DimSource:
    """Where a graph finds a symbol's value: input `name`'s size along `axis` is scale * symbol + offset (a
    waveform exported with a length of 320 * frames gives frames as its length / 320); with axis None, `name` is a
    0-d int64 value holding the symbol (a data-dependent size, `item()` of a count)."""

    name: str
    axis: int | None
    scale: int = 1
    offset: int = 0


class OnnxGraph:
    """Nodes of one graph; `dim_sources` maps each program symbol to the input dim that holds it."""

    def __init__(self, model: Model, dim_sources: dict[sympy.Symbol, DimSource],
                 parent: "OnnxGraph | None" = None):
        self.model = model
        self.dim_sources = dim_sources
        self.nodes: list[onnx.NodeProto] = []
        # Cached dim computations; a branch starts from its parent's (outer names are visible inside it).
        self._dim_cache: dict[Any, str] = dict(parent._dim_cache) if parent is not None else {}
        # choose_qparams lowered with a DynamicQuantizeLinear: its scale (the kiln value) -> (its input, the kiln
        # value; the quantized, scale and zero point ONNX names), which the quantize and dequantize of that input
        # reuse (the pattern onnxruntime fuses)
        self.dynamic_quantized: dict[Any, tuple[Any, str, str, str]] = (
            dict(parent.dynamic_quantized) if parent is not None else {})
        self.hint = "v"
        # names of float32 copies of float16/bfloat16 values, with their IR dtype
        self.widened: dict[str, DType] = dict(parent.widened) if parent is not None else {}

    # -- nodes
    def node(self, op_type: str, inputs: Sequence[str], outputs: int = 1, **attributes: Any) -> Any:
        """Append a node; returns its output name (or the list of names when `outputs` > 1)."""
        names = [self.model.fresh(f"{self.hint}_{op_type.lower()}") for _ in range(outputs)]
        attributes = {k: v for k, v in attributes.items() if v is not None}
        if op_type == "Reshape":  # ATen's 0 is an empty dim, never ONNX's default "copy the input's dim"
            attributes.setdefault("allowzero", 1)
        self.nodes.append(helper.make_node(op_type, list(inputs), names, name=names[0], **attributes))
        return names[0] if outputs == 1 else names

    def rename(self, old: str, new: str, since: int = 0) -> None:
        """Rename value `old` to `new` in the nodes from index `since` on (including `If` branches that read it from
        the outer scope) and in the caches that hand it out again (a cast made once is read by later ops)."""
        _rename(self.nodes[since:], old, new)
        self._dim_cache = {key: new if name == old else name for key, name in self._dim_cache.items()}
        self.dynamic_quantized = {key: tuple(new if part == old else part for part in entry)
                                  for key, entry in self.dynamic_quantized.items()}
        if old in self.widened:
            self.widened[new] = self.widened.pop(old)

    def const(self, value: Any, dtype: DType | None = None) -> str:
        array = np.asarray(value, dtype=None if dtype is None else dtype.numpy)
        return self.model.initializer(array, "const")

    def ints(self, values: Sequence[int]) -> str:
        return self.const(np.asarray(list(values), dtype=np.int64))

    def memo(self, key: Any, build: Any) -> str:
        """The value `build()` makes, made once per key in this graph (e.g. what several layers derive from one
        attention mask)."""
        if key not in self._dim_cache:
            self._dim_cache[key] = build()
        return self._dim_cache[key]

    def cast(self, name: str, source: DType, target: DType) -> str:
        if source is target:
            return name
        key = ("cast", name, target)
        if key not in self._dim_cache:
            self._dim_cache[key] = self.node("Cast", [name], to=onnx_dtype(target))
        return self._dim_cache[key]

    # -- symbolic dims
    def dim(self, expr: Any) -> str:
        """A 1-element int64 tensor holding `expr` (an int or a sympy expression over the program's symbols)."""
        if isinstance(expr, (int, np.integer)) or (isinstance(expr, sympy.Expr) and expr.is_Integer):
            return self.ints([int(expr)])
        key = ("dim", expr)
        if key not in self._dim_cache:
            self._dim_cache[key] = self._lower_expr(expr)
        return self._dim_cache[key]

    def dim_scalar(self, expr: Any) -> str:
        """A 0-d int64 tensor holding `expr`."""
        if isinstance(expr, (int, np.integer)) or (isinstance(expr, sympy.Expr) and expr.is_Integer):
            return self.const(np.asarray(int(expr), dtype=np.int64))
        key = ("scalar", expr)
        if key not in self._dim_cache:
            self._dim_cache[key] = self.node("Squeeze", [self.dim(expr), self.ints([0])])
        return self._dim_cache[key]

    def dims(self, exprs: Sequence[Any]) -> str:
        """A 1-D int64 tensor of sizes, e.g. a Reshape/Expand target; static lists become one constant."""
        exprs = list(exprs)
        if all(_is_int(e) for e in exprs):
            return self.ints([int(e) for e in exprs])
        key = ("dims", tuple(exprs))
        if key not in self._dim_cache:
            self._dim_cache[key] = self.node("Concat", [self.dim(e) for e in exprs], axis=0)
        return self._dim_cache[key]

    def _lower_expr(self, expr: sympy.Expr) -> str:
        if isinstance(expr, sympy.Symbol):
            source = self.dim_sources.get(expr)
            if source is None:
                raise UnsupportedError(f"symbol {expr} is not the size of any input dimension, so the ONNX graph "
                                       "cannot compute it", fix="make the dim a plain Dim of some input")
            if source.axis is None:
                return self.node("Reshape", [source.name, self.ints([1])])
            size = self.node("Shape", [source.name], start=source.axis, end=source.axis + 1)
            if source.offset:
                size = self.node("Sub", [size, self.ints([source.offset])])
            return size if source.scale == 1 else self.node("Div", [size, self.ints([source.scale])])
        if expr.is_Integer:
            return self.ints([int(expr)])
        if isinstance(expr, sympy.Add):
            return self._fold("Add", expr.args)
        if isinstance(expr, sympy.Mul):
            if any(a.is_Rational and not a.is_Integer for a in expr.args):
                return self._divide(expr, ceil=False)
            return self._fold("Mul", expr.args)
        if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and int(expr.exp) > 0:
            return self._fold("Mul", [expr.base] * int(expr.exp))
        if isinstance(expr, sympy.floor):
            return self._divide(expr.args[0], ceil=False)
        if isinstance(expr, sympy.ceiling):
            return self._divide(expr.args[0], ceil=True)
        if isinstance(expr, sympy.Max):
            return self._fold("Max", expr.args)
        if isinstance(expr, sympy.Min):
            return self._fold("Min", expr.args)
        if isinstance(expr, sympy.Mod):
            return self.node("Mod", [self.dim(expr.args[0]), self.dim(expr.args[1])])
        if isinstance(expr, sympy.Abs):
            return self.node("Abs", [self.dim(expr.args[0])])
        name = type(expr).__name__
        if name == "FloorDiv":
            return self.node("Div", [self.dim(expr.args[0]), self.dim(expr.args[1])])
        raise UnsupportedError(f"cannot compute the symbolic size {expr} inside an ONNX graph")

    def _fold(self, op_type: str, args: Sequence[Any]) -> str:
        result = self.dim(args[0])
        for arg in args[1:]:
            result = self.node(op_type, [result, self.dim(arg)])
        return result

    def _divide(self, expr: sympy.Expr, ceil: bool) -> str:
        """floor/ceil of a rational expression `numerator / denominator` (sizes are non-negative)."""
        numerator, denominator = sympy.fraction(sympy.together(expr))
        if not denominator.is_Integer:
            raise UnsupportedError(f"cannot compute the symbolic size {expr} inside an ONNX graph")
        top = self.dim(sympy.expand(numerator) + (int(denominator) - 1 if ceil else 0))
        # ONNX integer Div truncates; floor division needs the Python-style remainder subtracted first.
        bottom = self.ints([int(denominator)])
        remainder = self.node("Mod", [top, bottom])
        return self.node("Div", [self.node("Sub", [top, remainder]), bottom])


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) or (isinstance(value, sympy.Expr) and bool(value.is_Integer))


__all__ = ["OnnxGraph", "Model", "Value", "onnx_dtype", "value_info", "ONNX_DTYPES", "INT64_MAX", "INT64_MIN"]


def _rename(nodes: Any, old: str, new: str) -> None:
    """Rename a value in `nodes`, including `If` branches that read it from the outer scope."""
    for node in nodes:
        node.output[:] = [new if o == old else o for o in node.output]
        node.input[:] = [new if i == old else i for i in node.input]
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                _rename(attribute.g.node, old, new)
                for output in attribute.g.output:
                    if output.name == old:
                        output.name = new
