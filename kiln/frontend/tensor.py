"""kiln.Tensor: a PyTorch-compatible tensor that runs eagerly on numpy or records ops while tracing.

Every method goes through `dispatch(op, ...)` with a `kiln.ops.aten` handle, so eager results and traced
programs come from the same op definitions. In-place methods are functional underneath: they compute a
new value and rebind the tensor to it (and, eagerly, write it back into the array so numpy views see it).
"""

from __future__ import annotations

import builtins
from collections import namedtuple
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from kiln.ir import dtypes
from kiln.ir.dtypes import DType
from kiln.ir.errors import DataDependentError, OpArgumentError, ShapeError
from kiln.ir.registry import OpOverload, ops
from kiln.ir.sparse import SparseArray
from kiln.frontend import autograd

aten = ops.aten

ValuesIndices = namedtuple("ValuesIndices", ["values", "indices"])


class Size(tuple):
    """`x.shape`: a tuple of ints and SymInts, like torch.Size."""

    def numel(self) -> Any:
        result: Any = 1
        for size in self:
            result = result * size
        return result

    def __repr__(self) -> str:
        return f"kiln.Size([{', '.join(map(str, self))}])"


# ---------------------------------------------------------------------------------------------
# Dispatch


def _find_tracer(values: Iterable[Any]) -> Any:
    """The trace that records an op on `values`: their tensors' tracer, the innermost when a region's trace (a loop
    body, a cond branch) mixes its own tensors with its parents' (`context * row` in a scan body records in the body,
    as `row * context` does)."""
    found = None
    for tracer in _tracers(values):
        if found is None or _encloses(found, tracer):
            found = tracer
    return found


def _tracers(values: Iterable[Any]) -> Iterator[Any]:
    for value in values:
        if isinstance(value, Tensor) and value._tracer is not None:
            yield value._tracer
        elif isinstance(value, (list, tuple)):
            yield from _tracers(value)
        elif isinstance(value, dict):
            yield from _tracers(value.values())


def _encloses(outer: Any, inner: Any) -> bool:
    """Whether `inner` traces a region inside `outer`'s trace."""
    while (inner := getattr(inner, "parent", None)) is not None:
        if inner is outer:
            return True
    return False


def _eager(value: Any) -> Any:
    if isinstance(value, Tensor):
        return value._value
    if isinstance(value, (list, tuple)):
        return type(value)(_eager(v) for v in value)
    from kiln.frontend.symint import SymInt
    if isinstance(value, SymInt):
        return int(value)
    return value


def _wrap_eager(value: Any) -> Any:
    if isinstance(value, (np.ndarray, SparseArray)):
        return Tensor(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_wrap_eager(v) for v in value)
    return value


def dispatch(op: OpOverload, *args: Any, **kwargs: Any) -> Any:
    """Run or record `op`: the one path from the user API to the op registry."""
    tracer = _find_tracer(args) or _find_tracer(kwargs.values())
    if tracer is None:
        from kiln.frontend.tracing import active_tracer
        tracer = active_tracer() if not any(isinstance(a, Tensor) for a in args) and _is_factory(op) else None
    if tracer is not None:
        return tracer.call(op, args, kwargs)
    if autograd.requires_grad_anywhere(args) or kwargs and autograd.requires_grad_anywhere(kwargs.values()):
        return autograd.record(op.opdef, args, kwargs)
    return _wrap_eager(op(*[_eager(a) for a in args], **{k: _eager(v) for k, v in kwargs.items()}))


def _is_factory(op: OpOverload) -> bool:
    return not op.opdef.schema.tensor_arguments


def _is_scalar(value: Any) -> bool:
    from kiln.frontend.symint import SymInt
    return isinstance(value, (builtins.bool, builtins.int, builtins.float, SymInt, np.number, np.bool_))


def _as_dtype(value: Any) -> DType:
    return dtypes.dtype(value)


def _sizes(args: Sequence[Any]) -> list[Any]:
    """Accept both `view(2, 3)` and `view((2, 3))`, like torch."""
    if len(args) == 1 and isinstance(args[0], (list, tuple)):
        return list(args[0])
    return list(args)


# ---------------------------------------------------------------------------------------------
# Tensor


class Tensor:
    """A tensor: a numpy array (eager) or a value in a program being traced."""

    __array_priority__ = 1000  # numpy scalars defer to Tensor's reflected operators

    def __init__(self, data: Any, dtype: Any = None):
        array = data._value if isinstance(data, Tensor) else data if isinstance(data, SparseArray) else \
            np.asarray(data)
        if dtype is not None and isinstance(array, SparseArray):
            array = array.with_values(array.values.astype(_as_dtype(dtype).numpy))
        elif dtype is not None:
            array = array.astype(_as_dtype(dtype).numpy)
        dtypes.dtype(array.dtype)  # refuses unsupported dtypes with a KilnError
        self._value: Any = array
        self._tracer: Any = None
        self._init_autograd()

    def _init_autograd(self) -> None:
        self._requires_grad = False
        self._grad_fn: Any = None  # (Node, output index) for a result of a recorded op; None for a leaf
        self._grad: Tensor | None = None
        self._hooks: list[Any] = []
        self._saved = False  # a recorded op keeps this array: in-place updates must rebind, not overwrite

    @classmethod
    def _traced(cls, value: Any, tracer: Any) -> "Tensor":
        tensor = cls.__new__(cls)
        tensor._value, tensor._tracer = value, tracer
        tensor._init_autograd()
        return tensor

    # -- autograd (kiln/frontend/autograd.py)
    @property
    def requires_grad(self) -> builtins.bool:
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value: builtins.bool) -> None:
        value = builtins.bool(value)
        if self._grad_fn is not None and not value:
            raise OpArgumentError(
                "you can only change requires_grad flags of leaf variables",
                fix="use var.detach() to get a tensor outside the graph")
        if value and self._tracer is None and not (self.dtype.is_floating_point or self.dtype.is_complex):
            raise OpArgumentError(f"only Tensors of floating point and complex dtype can require gradients, "
                                  f"this one is {self.dtype.name}", fix="convert it with .float() first")
        self._requires_grad = value

    @property
    def grad(self) -> "Tensor | None":
        """The gradient accumulated by backward() (leaves, and tensors that called retain_grad())."""
        return self._grad

    @grad.setter
    def grad(self, value: "Tensor | None") -> None:
        if value is not None and not isinstance(value, Tensor):
            raise OpArgumentError(f"assigned grad must be a Tensor or None, got {type(value).__name__}")
        if value is not None and tuple(value.shape) != tuple(self.shape):
            raise ShapeError(f"assigned grad has shape {list(value.shape)} but the tensor has {list(self.shape)}")
        self._grad = value

    @property
    def real(self) -> "Tensor":
        """The real parts (a complex tensor's view; a real tensor itself), as torch's Tensor.real."""
        return dispatch(aten.real.default, self)

    @property
    def imag(self) -> "Tensor":
        return dispatch(aten.imag.default, self)

    @property
    def grad_fn(self) -> Any:
        return None if self._grad_fn is None else self._grad_fn[0]

    @property
    def is_leaf(self) -> builtins.bool:
        return self._grad_fn is None

    def backward(self, gradient: "Tensor | None" = None, retain_graph: builtins.bool | None = None,
                 create_graph: builtins.bool = False, inputs: Any = None) -> None:
        """Accumulate the gradient of this tensor with respect to the graph's leaves into their `.grad`."""
        from kiln.frontend import autograd
        autograd.backward(self, gradient, retain_graph, create_graph, inputs)

    def register_hook(self, hook: Any) -> Any:
        from kiln.frontend import autograd
        return autograd.register_hook(self, hook)

    def retain_grad(self) -> None:
        from kiln.frontend import autograd
        autograd.retain_grad(self)

    @property
    def retains_grad(self) -> builtins.bool:
        return self._grad_fn is not None and self._grad_fn[1] in self._grad_fn[0].retained

    def __kiln_array__(self) -> np.ndarray:
        return self._eager_array("converting to numpy")

    # -- metadata
    @property
    def is_traced(self) -> builtins.bool:
        return self._tracer is not None

    @property
    def shape(self) -> Size:
        if self._tracer is None:
            return Size(self._value.shape)
        from kiln.frontend.symint import SymInt
        return Size(SymInt.wrap(d, self._tracer.shape_env) for d in self._value.type.shape)

    def size(self, dim: builtins.int | None = None) -> Any:
        shape = self.shape
        if dim is None:
            return shape
        from kiln.ir.meta import canonical_dim
        return shape[canonical_dim("size", dim, len(shape))]

    @property
    def dtype(self) -> DType:
        if self._tracer is None:
            return dtypes.dtype(self._value.dtype)
        return self._value.type.dtype

    @property
    def device(self) -> str:
        return "cpu"

    @property
    def layout(self) -> str:
        """`strided`, or the sparse layout's kind (`sparse_csr`, ...), comparable with kiln.sparse_csr."""
        value_type = self._value.type if self._tracer is not None else self._value
        layout = getattr(value_type, "layout", None)
        return layout.kind if layout is not None else "strided"

    # -- sparse layouts (kiln/ir/sparse.py); the accessors read an eager sparse tensor's components
    @property
    def is_sparse(self) -> builtins.bool:
        return self.layout == "sparse_coo"

    @property
    def is_sparse_csr(self) -> builtins.bool:
        return self.layout == "sparse_csr"

    def to_dense(self, dtype: Any = None, *, masked_grad: Any = None) -> "Tensor":
        return dispatch(aten._to_dense.default, self, None if dtype is None else _as_dtype(dtype))

    def to_sparse(self, sparse_dim: Any = None, *, layout: Any = None, blocksize: Any = None,
                  dense_dim: Any = None) -> "Tensor":
        if sparse_dim is not None:
            return dispatch(aten._to_sparse.sparse_dim, self, sparse_dim)
        return dispatch(aten._to_sparse.default, self, layout=layout,
                        blocksize=None if blocksize is None else list(blocksize), dense_dim=dense_dim)

    def to_sparse_coo(self) -> "Tensor":
        return self.to_sparse()

    def to_sparse_csr(self, dense_dim: Any = None) -> "Tensor":
        return dispatch(aten._to_sparse_csr.default, self, dense_dim)

    def to_sparse_csc(self, dense_dim: Any = None) -> "Tensor":
        return dispatch(aten._to_sparse_csc.default, self, dense_dim)

    def to_sparse_bsr(self, blocksize: Any, dense_dim: Any = None) -> "Tensor":
        return dispatch(aten._to_sparse_bsr.default, self, list(blocksize), dense_dim)

    def to_sparse_bsc(self, blocksize: Any, dense_dim: Any = None) -> "Tensor":
        return dispatch(aten._to_sparse_bsc.default, self, list(blocksize), dense_dim)

    def to_sparse_semi_structured(self) -> "Tensor":
        """2:4 semi-structured (torch.sparse.to_sparse_semi_structured): at most two nonzeros in every group of 4."""
        return dispatch(aten._to_sparse.default, self, layout="semi_structured")

    def _sparse_value(self, what: str) -> SparseArray:
        value = self._eager_array(what)
        if not isinstance(value, SparseArray):
            raise OpArgumentError(f"{what} expected a sparse tensor, got layout strided",
                                  fix="convert it with .to_sparse() (or to_sparse_csr(), ...) first")
        return value

    def _component(self, name: str) -> "Tensor":
        return Tensor(self._sparse_value(f"Tensor.{name}()").component(name))

    def _coalesced_component(self, name: str) -> "Tensor":
        value = self._sparse_value(f"Tensor.{name}()")
        if value.layout.kind == "sparse_coo" and not value.layout.coalesced:
            raise OpArgumentError(f"Cannot get {name} on an uncoalesced tensor, please call .coalesce() first")
        return Tensor(value.component(name))

    def indices(self) -> "Tensor":
        return self._coalesced_component("indices")

    def values(self) -> "Tensor":
        return self._coalesced_component("values")

    def _indices(self) -> "Tensor":
        return self._component("indices")

    def _values(self) -> "Tensor":
        return self._component("values")

    def crow_indices(self) -> "Tensor":
        return self._component("crow_indices")

    def col_indices(self) -> "Tensor":
        return self._component("col_indices")

    def ccol_indices(self) -> "Tensor":
        return self._component("ccol_indices")

    def row_indices(self) -> "Tensor":
        return self._component("row_indices")

    def _nnz(self) -> builtins.int:
        return self._sparse_value("Tensor._nnz()").nnz

    def sparse_dim(self) -> builtins.int:
        value = self._eager_array("Tensor.sparse_dim()")
        return value.sparse_dim if isinstance(value, SparseArray) else 0

    def dense_dim(self) -> builtins.int:
        value = self._eager_array("Tensor.dense_dim()")
        return value.layout.dense_dim if isinstance(value, SparseArray) else value.ndim

    def coalesce(self) -> "Tensor":
        from kiln.ir.sparse import coalesce
        return Tensor(coalesce(self._sparse_value("Tensor.coalesce()")))

    def is_coalesced(self) -> builtins.bool:
        value = self._sparse_value("Tensor.is_coalesced()")
        if value.layout.kind != "sparse_coo":
            raise OpArgumentError(f"is_coalesced expected sparse coordinate tensor layout but got {value.layout.kind}")
        return value.layout.coalesced

    def dim(self) -> builtins.int:
        return len(self.shape)

    ndimension = dim

    @property
    def ndim(self) -> builtins.int:
        return self.dim()

    def numel(self) -> Any:
        return self.shape.numel()

    nelement = numel

    def element_size(self) -> builtins.int:
        return self.dtype.itemsize

    def is_floating_point(self) -> builtins.bool:
        return self.dtype.is_floating_point

    def is_contiguous(self, memory_format: Any = None) -> builtins.bool:
        return True

    # -- leaving the graph: needs concrete data
    def _eager_array(self, what: str) -> np.ndarray:
        if self._tracer is not None and not self._tracer.strict:
            return self._tracer.specialize(self, what)
        if self._tracer is not None:
            from kiln.frontend.tracing import user_source_line
            raise DataDependentError(
                f"{what} needs the tensor's value, which is not known while tracing",
                source=user_source_line(),
                fix="keep the computation in tensor ops (e.g. kiln.where), use kiln.cond for branches, "
                    "or export with strict=False to specialize on the example value")
        return self._value

    def numpy(self) -> np.ndarray:
        return self._eager_array("Tensor.numpy()")

    def item(self) -> Any:
        array = self._eager_array("Tensor.item()")
        if array.size != 1:
            raise ShapeError(f"a Tensor with {array.size} elements cannot be converted to a Python scalar")
        return array.reshape(()).item()

    def tolist(self) -> Any:
        return self._eager_array("Tensor.tolist()").tolist()

    def __bool__(self) -> builtins.bool:
        array = self._eager_array("bool(tensor)")
        if array.size != 1:
            raise ShapeError(f"the truth value of a Tensor with {array.size} elements is ambiguous",
                             fix="use .any() or .all()")
        return builtins.bool(array.reshape(()).item())

    def __float__(self) -> builtins.float:
        return builtins.float(self.item())

    def __int__(self) -> builtins.int:
        return builtins.int(self.item())

    def __index__(self) -> builtins.int:
        if self.dtype.is_floating_point:
            raise OpArgumentError("only integer tensors of a single element can be converted to an index")
        return builtins.int(self.item())

    def __len__(self) -> Any:
        if self.dim() == 0:
            raise OpArgumentError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self) -> Any:
        if self.dim() == 0:
            raise OpArgumentError("iteration over a 0-d tensor")
        return iter(self.unbind(0))

    def __hash__(self) -> builtins.int:
        return id(self)

    def __repr__(self) -> str:
        if self._tracer is not None:
            return f"TracedTensor({self._value.type.short()})"
        if isinstance(self._value, SparseArray):
            return repr(self._value)
        body = np.array2string(np.asarray(self._value, dtype=np.float32) if self.dtype is dtypes.bfloat16
                               else self._value, separator=", ", precision=4, prefix="tensor(")
        suffix = "" if self.dtype in (dtypes.float32, dtypes.int64, dtypes.bool_) else f", dtype=kiln.{self.dtype}"
        return f"tensor({body}{suffix})"

    # -- conversion
    def to(self, *args: Any, **kwargs: Any) -> "Tensor":
        target = kwargs.get("dtype")
        for arg in args:
            if isinstance(arg, Tensor):
                target = arg.dtype
            elif isinstance(arg, str) and arg in ("cpu",):
                continue
            elif arg is not None and not isinstance(arg, str):
                target = arg
        if target is None or _as_dtype(target) is self.dtype:
            return self
        return dispatch(aten._to_copy.default, self, dtype=_as_dtype(target))

    def type(self, dtype: Any = None) -> Any:
        return str(self.dtype) if dtype is None else self.to(dtype)

    def type_as(self, other: "Tensor") -> "Tensor":
        return self.to(other.dtype)

    def float(self) -> "Tensor":
        return self.to(dtypes.float32)

    def double(self) -> "Tensor":
        return self.to(dtypes.float64)

    def half(self) -> "Tensor":
        return self.to(dtypes.float16)

    def bfloat16(self) -> "Tensor":
        return self.to(dtypes.bfloat16)

    def int(self) -> "Tensor":
        return self.to(dtypes.int32)

    def long(self) -> "Tensor":
        return self.to(dtypes.int64)

    def bool(self) -> "Tensor":
        return self.to(dtypes.bool_)

    def cpu(self) -> "Tensor":
        return self

    def detach(self) -> "Tensor":
        """The same values, outside the autograd graph (shares the array, as torch shares storage)."""
        return Tensor._traced(self._value, self._tracer)

    def detach_(self) -> "Tensor":
        self._grad_fn, self._requires_grad = None, False
        return self

    @property
    def data(self) -> "Tensor":
        """The same values as a plain tensor (torch's `.data`): in-place ops on it change this tensor."""
        return Tensor._traced(self._value, self._tracer)

    @data.setter
    def data(self, value: "Tensor") -> None:
        """Swap in `value`'s values, whatever their shape and dtype, as `param.data = t` does in torch."""
        if not isinstance(value, Tensor):
            raise OpArgumentError(f"data must be a Tensor, got {type(value).__name__}")
        self._value, self._tracer = value._value, value._tracer

    def requires_grad_(self, requires_grad: builtins.bool = True) -> "Tensor":
        self.requires_grad = requires_grad
        return self

    def clone(self, *, memory_format: Any = None) -> "Tensor":
        return dispatch(aten.clone.default, self)

    def contiguous(self, memory_format: Any = None) -> "Tensor":
        return self

    # -- arithmetic
    def _binary(self, tensor_op: OpOverload, scalar_op: OpOverload | None, other: Any, **kwargs: Any) -> "Tensor":
        if isinstance(other, Tensor):
            return dispatch(tensor_op, self, other, **kwargs)
        if scalar_op is not None and _is_scalar(other):
            return dispatch(scalar_op, self, other, **kwargs)
        if not (_is_scalar(other) or isinstance(other, (list, tuple, np.ndarray))):
            return NotImplemented  # type: ignore[return-value]
        return dispatch(tensor_op, self, _as_tensor_like(other, self), **kwargs)

    def _reflected(self, op: OpOverload, other: Any) -> "Tensor":
        """`scalar <op> tensor`: the scalar becomes a 0-d tensor of the promoted dtype (exact promotion)."""
        if not _is_scalar(other):
            return NotImplemented
        from kiln.frontend.symint import SymInt
        scalar = other.expr if isinstance(other, SymInt) else other
        result_dtype = dtypes.result_type(_DTypeProbe(self), scalar if not isinstance(other, SymInt) else 0)
        left = dispatch(aten.scalar_tensor.default, other if isinstance(other, SymInt) else scalar, dtype=result_dtype)
        return dispatch(op, left, self)

    def add(self, other: Any, *, alpha: Any = 1) -> "Tensor":
        return self._binary(aten.add.Tensor, aten.add.Scalar, other, alpha=alpha)

    def sub(self, other: Any, *, alpha: Any = 1) -> "Tensor":
        return self._binary(aten.sub.Tensor, aten.sub.Scalar, other, alpha=alpha)

    def mul(self, other: Any) -> "Tensor":
        return self._binary(aten.mul.Tensor, aten.mul.Scalar, other)

    def div(self, other: Any, *, rounding_mode: str | None = None) -> "Tensor":
        if rounding_mode is None:
            return self._binary(aten.div.Tensor, aten.div.Scalar, other)
        return self._binary(aten.div.Tensor_mode, aten.div.Scalar_mode, other, rounding_mode=rounding_mode)

    def floor_divide(self, other: Any) -> "Tensor":
        return self.div(other, rounding_mode="floor")

    def remainder(self, other: Any) -> "Tensor":
        return self._binary(aten.remainder.Tensor, aten.remainder.Scalar, other)

    def fmod(self, other: Any) -> "Tensor":
        return self._binary(aten.fmod.Tensor, aten.fmod.Scalar, other)

    def pow(self, exponent: Any) -> "Tensor":
        return self._binary(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, exponent)

    def maximum(self, other: "Tensor") -> "Tensor":
        return dispatch(aten.maximum.default, self, other)

    def minimum(self, other: "Tensor") -> "Tensor":
        return dispatch(aten.minimum.default, self, other)

    def atan2(self, other: "Tensor") -> "Tensor":
        return dispatch(aten.atan2.default, self, other)

    def matmul(self, other: "Tensor") -> "Tensor":
        return dispatch(aten.matmul.default, self, other)

    mm = matmul

    def bmm(self, other: "Tensor") -> "Tensor":
        return dispatch(aten.bmm.default, self, other)

    __add__ = add
    __sub__ = sub
    __mul__ = mul
    __truediv__ = div
    __floordiv__ = floor_divide
    __mod__ = remainder
    __pow__ = pow
    __matmul__ = matmul

    def __radd__(self, other: Any) -> "Tensor":
        return self._reflected(aten.add.Tensor, other)

    def __rsub__(self, other: Any) -> "Tensor":
        return self._reflected(aten.sub.Tensor, other)

    def __rmul__(self, other: Any) -> "Tensor":
        return self._reflected(aten.mul.Tensor, other)

    def __rtruediv__(self, other: Any) -> "Tensor":
        return self._reflected(aten.div.Tensor, other)

    def __rfloordiv__(self, other: Any) -> "Tensor":
        if not _is_scalar(other):
            return NotImplemented
        return _reflected_mode(self, other, "floor")

    def __rmod__(self, other: Any) -> "Tensor":
        return self._reflected(aten.remainder.Tensor, other)

    def __rpow__(self, other: Any) -> "Tensor":
        if not _is_scalar(other):
            return NotImplemented
        return dispatch(aten.pow.Scalar, other, self)

    def __rmatmul__(self, other: Any) -> "Tensor":
        return NotImplemented

    def __neg__(self) -> "Tensor":
        return dispatch(aten.neg.default, self)

    def __pos__(self) -> "Tensor":
        return self

    def __abs__(self) -> "Tensor":
        return dispatch(aten.abs.default, self)

    def __invert__(self) -> "Tensor":
        return dispatch(aten.bitwise_not.default, self)

    def __and__(self, other: Any) -> "Tensor":
        return self._binary(aten.bitwise_and.Tensor, aten.bitwise_and.Scalar, other)

    def __or__(self, other: Any) -> "Tensor":
        return self._binary(aten.bitwise_or.Tensor, aten.bitwise_or.Scalar, other)

    def __xor__(self, other: Any) -> "Tensor":
        return self._binary(aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar, other)

    __rand__ = __and__
    __ror__ = __or__
    __rxor__ = __xor__

    # -- comparisons
    def eq(self, other: Any) -> "Tensor":
        return self._binary(aten.eq.Tensor, aten.eq.Scalar, other)

    def ne(self, other: Any) -> "Tensor":
        return self._binary(aten.ne.Tensor, aten.ne.Scalar, other)

    def lt(self, other: Any) -> "Tensor":
        return self._binary(aten.lt.Tensor, aten.lt.Scalar, other)

    def le(self, other: Any) -> "Tensor":
        return self._binary(aten.le.Tensor, aten.le.Scalar, other)

    def gt(self, other: Any) -> "Tensor":
        return self._binary(aten.gt.Tensor, aten.gt.Scalar, other)

    def ge(self, other: Any) -> "Tensor":
        return self._binary(aten.ge.Tensor, aten.ge.Scalar, other)

    __eq__ = eq  # type: ignore[assignment]
    __ne__ = ne  # type: ignore[assignment]
    __lt__ = lt
    __le__ = le
    __gt__ = gt
    __ge__ = ge

    def logical_and(self, other: "Tensor") -> "Tensor":
        return dispatch(aten.logical_and.default, self, other)

    def logical_or(self, other: "Tensor") -> "Tensor":
        return dispatch(aten.logical_or.default, self, other)

    def logical_xor(self, other: "Tensor") -> "Tensor":
        return dispatch(aten.logical_xor.default, self, other)

    def logical_not(self) -> "Tensor":
        return dispatch(aten.logical_not.default, self)

    # -- elementwise with arguments
    def clamp(self, min: Any = None, max: Any = None) -> "Tensor":
        if isinstance(min, Tensor) or isinstance(max, Tensor):
            return dispatch(aten.clamp.Tensor, self, min, max)
        return dispatch(aten.clamp.default, self, min, max)

    clip = clamp

    def clamp_min(self, min: Any) -> "Tensor":
        return self.clamp(min=min)

    def clamp_max(self, max: Any) -> "Tensor":
        return self.clamp(max=max)

    def masked_fill(self, mask: "Tensor", value: Any) -> "Tensor":
        if isinstance(value, Tensor):
            return dispatch(aten.masked_fill.Tensor, self, mask, value)
        return dispatch(aten.masked_fill.Scalar, self, mask, value)

    def where(self, condition: "Tensor", other: Any) -> "Tensor":
        from kiln.frontend.functions import where
        return where(condition, self, other)

    def lerp(self, end: "Tensor", weight: Any) -> "Tensor":
        if isinstance(weight, Tensor):
            return dispatch(aten.lerp.Tensor, self, end, weight)
        return dispatch(aten.lerp.Scalar, self, end, weight)

    def addcmul(self, tensor1: "Tensor", tensor2: "Tensor", *, value: Any = 1) -> "Tensor":
        return dispatch(aten.addcmul.default, self, tensor1, tensor2, value=value)

    def addcdiv(self, tensor1: "Tensor", tensor2: "Tensor", *, value: Any = 1) -> "Tensor":
        return dispatch(aten.addcdiv.default, self, tensor1, tensor2, value=value)

    # -- shape
    def view(self, *shape: Any) -> "Tensor":
        if len(shape) == 1 and not isinstance(shape[0], (list, tuple)) and not _is_scalar(shape[0]):
            return self.to(shape[0])  # view(dtype) of same itemsize is not supported; treat as cast
        return dispatch(aten.view.default, self, _sizes(shape))

    def reshape(self, *shape: Any) -> "Tensor":
        return dispatch(aten.view.default, self, _sizes(shape))

    def view_as(self, other: "Tensor") -> "Tensor":
        return self.view(list(other.shape))

    reshape_as = view_as

    def permute(self, *dims: Any) -> "Tensor":
        return dispatch(aten.permute.default, self, _sizes(dims))

    def transpose(self, dim0: builtins.int, dim1: builtins.int) -> "Tensor":
        return dispatch(aten.transpose.int, self, dim0, dim1)

    swapaxes = transpose

    def t(self) -> "Tensor":
        return dispatch(aten.t.default, self)

    @property
    def T(self) -> "Tensor":
        return self.permute(list(range(self.dim() - 1, -1, -1)))

    @property
    def mT(self) -> "Tensor":
        return self.transpose(-2, -1)

    def flatten(self, start_dim: builtins.int = 0, end_dim: builtins.int = -1) -> "Tensor":
        return dispatch(aten.flatten.using_ints, self, start_dim, end_dim)

    def unflatten(self, dim: builtins.int, sizes: Sequence[Any]) -> "Tensor":
        return dispatch(aten.unflatten.int, self, dim, list(sizes))

    def unsqueeze(self, dim: builtins.int) -> "Tensor":
        return dispatch(aten.unsqueeze.default, self, dim)

    def squeeze(self, dim: Any = None) -> "Tensor":
        if dim is None:
            dims = [i for i, s in enumerate(self.shape) if builtins.isinstance(s, builtins.int) and s == 1]
            return dispatch(aten.squeeze.dims, self, dims)
        if isinstance(dim, (list, tuple)):
            return dispatch(aten.squeeze.dims, self, list(dim))
        return dispatch(aten.squeeze.dim, self, dim)

    def expand(self, *sizes: Any) -> "Tensor":
        return dispatch(aten.expand.default, self, _sizes(sizes))

    def expand_as(self, other: "Tensor") -> "Tensor":
        return self.expand(list(other.shape))

    def repeat(self, *sizes: Any) -> "Tensor":
        return dispatch(aten.repeat.default, self, _sizes(sizes))

    def repeat_interleave(self, repeats: builtins.int, dim: builtins.int | None = None) -> "Tensor":
        return dispatch(aten.repeat_interleave.self_int, self, repeats, dim)

    def chunk(self, chunks: builtins.int, dim: builtins.int = 0) -> tuple["Tensor", ...]:
        return tuple(dispatch(aten.chunk.default, self, chunks, dim))

    def split(self, split_size: Any, dim: builtins.int = 0) -> tuple["Tensor", ...]:
        if isinstance(split_size, (list, tuple)):
            return tuple(dispatch(aten.split_with_sizes.default, self, list(split_size), dim))
        return tuple(dispatch(aten.split.Tensor, self, split_size, dim))

    def unbind(self, dim: builtins.int = 0) -> tuple["Tensor", ...]:
        return tuple(dispatch(aten.unbind.int, self, dim))

    def narrow(self, dim: builtins.int, start: Any, length: Any) -> "Tensor":
        return dispatch(aten.slice.Tensor, self, dim, start, start + length)

    def select(self, dim: builtins.int, index: Any) -> "Tensor":
        return dispatch(aten.select.int, self, dim, index)

    def flip(self, *dims: Any) -> "Tensor":
        return dispatch(aten.flip.default, self, _sizes(dims))

    def movedim(self, source: Any, destination: Any) -> "Tensor":
        return dispatch(aten.movedim.int, self, source, destination)

    def diagonal(self, offset: builtins.int = 0, dim1: builtins.int = 0, dim2: builtins.int = 1) -> "Tensor":
        return dispatch(aten.diagonal.default, self, offset, dim1, dim2)

    # -- reductions
    def sum(self, dim: Any = None, keepdim: builtins.bool = False, *, dtype: Any = None) -> "Tensor":
        return dispatch(aten.sum.dim_IntList, self, _dims(dim), keepdim, dtype=_opt_dtype(dtype))

    def mean(self, dim: Any = None, keepdim: builtins.bool = False, *, dtype: Any = None) -> "Tensor":
        return dispatch(aten.mean.dim, self, _dims(dim), keepdim, dtype=_opt_dtype(dtype))

    def prod(self, dim: Any = None, keepdim: builtins.bool = False, *, dtype: Any = None) -> "Tensor":
        if dim is None:
            return dispatch(aten.prod.default, self, dtype=_opt_dtype(dtype))
        return dispatch(aten.prod.dim_int, self, dim, keepdim, dtype=_opt_dtype(dtype))

    def amax(self, dim: Any = (), keepdim: builtins.bool = False) -> "Tensor":
        return dispatch(aten.amax.default, self, _dims(dim) or [], keepdim)

    def amin(self, dim: Any = (), keepdim: builtins.bool = False) -> "Tensor":
        return dispatch(aten.amin.default, self, _dims(dim) or [], keepdim)

    def max(self, dim: Any = None, keepdim: builtins.bool = False) -> Any:
        if isinstance(dim, Tensor):
            return self.maximum(dim)
        if dim is None:
            return dispatch(aten.amax.default, self, [], False)
        return ValuesIndices(*dispatch(aten.max.dim, self, dim, keepdim))

    def min(self, dim: Any = None, keepdim: builtins.bool = False) -> Any:
        if isinstance(dim, Tensor):
            return self.minimum(dim)
        if dim is None:
            return dispatch(aten.amin.default, self, [], False)
        return ValuesIndices(*dispatch(aten.min.dim, self, dim, keepdim))

    def argmax(self, dim: Any = None, keepdim: builtins.bool = False) -> "Tensor":
        return dispatch(aten.argmax.default, self, dim, keepdim)

    def argmin(self, dim: Any = None, keepdim: builtins.bool = False) -> "Tensor":
        return dispatch(aten.argmin.default, self, dim, keepdim)

    def var(self, dim: Any = None, unbiased: builtins.bool = True, keepdim: builtins.bool = False, *,
            correction: Any = None) -> "Tensor":
        correction = (1 if unbiased else 0) if correction is None else correction
        return dispatch(aten.var.correction, self, _dims(dim), correction=correction, keepdim=keepdim)

    def std(self, dim: Any = None, unbiased: builtins.bool = True, keepdim: builtins.bool = False, *,
            correction: Any = None) -> "Tensor":
        return dispatch(aten.sqrt.default, self.var(dim, unbiased, keepdim, correction=correction))

    def any(self, dim: Any = None, keepdim: builtins.bool = False) -> "Tensor":
        if dim is None:
            return dispatch(aten.any.default, self)
        return dispatch(aten.any.dims, self, _dims(dim), keepdim)

    def all(self, dim: Any = None, keepdim: builtins.bool = False) -> "Tensor":
        inverted = dispatch(aten.logical_not.default, self)
        return dispatch(aten.logical_not.default, inverted.any(dim, keepdim))

    def cumsum(self, dim: builtins.int, *, dtype: Any = None) -> "Tensor":
        return dispatch(aten.cumsum.default, self, dim, dtype=_opt_dtype(dtype))

    def diff(self, n: builtins.int = 1, dim: builtins.int = -1, prepend: "Tensor | None" = None,
             append: "Tensor | None" = None) -> "Tensor":
        return dispatch(aten.diff.default, self, n, dim, prepend, append)

    def softmax(self, dim: builtins.int, dtype: Any = None) -> "Tensor":
        return dispatch(aten.softmax.int, self, dim, _opt_dtype(dtype))

    def log_softmax(self, dim: builtins.int, dtype: Any = None) -> "Tensor":
        return dispatch(aten.log_softmax.int, self, dim, _opt_dtype(dtype))

    def logsumexp(self, dim: Any, keepdim: builtins.bool = False) -> "Tensor":
        return dispatch(aten.logsumexp.default, self, _dims(dim), keepdim)

    def norm(self, p: Any = 2, dim: Any = None, keepdim: builtins.bool = False) -> "Tensor":
        return dispatch(aten.linalg_vector_norm.default, self, p, _dims(dim), keepdim)

    def topk(self, k: Any, dim: builtins.int = -1, largest: builtins.bool = True,
             sorted: builtins.bool = True) -> Any:
        return ValuesIndices(*dispatch(aten.topk.default, self, k, dim, largest, sorted))

    def sort(self, dim: builtins.int = -1, descending: builtins.bool = False) -> Any:
        return ValuesIndices(*dispatch(aten.sort.default, self, dim, descending))

    def argsort(self, dim: builtins.int = -1, descending: builtins.bool = False) -> "Tensor":
        return self.sort(dim, descending).indices

    # -- indexing ops
    def gather(self, dim: builtins.int, index: "Tensor") -> "Tensor":
        return dispatch(aten.gather.default, self, dim, index)

    def index_select(self, dim: builtins.int, index: "Tensor") -> "Tensor":
        return dispatch(aten.index_select.default, self, dim, index)

    def scatter(self, dim: builtins.int, index: "Tensor", src: Any) -> "Tensor":
        if isinstance(src, Tensor):
            return dispatch(aten.scatter.src, self, dim, index, src)
        return dispatch(aten.scatter.value, self, dim, index, src)

    def scatter_add(self, dim: builtins.int, index: "Tensor", src: "Tensor") -> "Tensor":
        return dispatch(aten.scatter_add.default, self, dim, index, src)

    def nonzero(self) -> "Tensor":
        return dispatch(aten.nonzero.default, self)

    def __getitem__(self, index: Any) -> "Tensor":
        from kiln.frontend.indexing import getitem
        return getitem(self, index)

    def __setitem__(self, index: Any, value: Any) -> None:
        from kiln.frontend.indexing import setitem
        self._assign(setitem(self, index, value))

    # -- new tensors like this one
    def new_zeros(self, *size: Any, dtype: Any = None) -> "Tensor":
        return self.new_full(_sizes(size), 0, dtype=dtype)

    def new_ones(self, *size: Any, dtype: Any = None) -> "Tensor":
        return self.new_full(_sizes(size), 1, dtype=dtype)

    def new_full(self, size: Sequence[Any], fill_value: Any, *, dtype: Any = None) -> "Tensor":
        return dispatch(aten.full.default, list(size), fill_value, dtype=_as_dtype(dtype or self.dtype))

    def new_empty(self, *size: Any, dtype: Any = None) -> "Tensor":
        return self.new_full(_sizes(size), 0, dtype=dtype)

    def new_tensor(self, data: Any, dtype: Any = None) -> "Tensor":
        from kiln.frontend.functions import tensor
        return tensor(data, dtype=dtype or self.dtype)

    # -- in place: functional underneath
    def _assign(self, result: "Tensor") -> "Tensor":
        """Make `self` hold `result` (cast to self's dtype), as torch's in-place ops do."""
        if result.dtype is not self.dtype:
            if not _can_cast(result.dtype, self.dtype):
                raise OpArgumentError(f"result type {result.dtype.name} can't be cast to the desired output "
                                      f"type {self.dtype.name} of an in-place op")
            result = result.to(self.dtype)
        if self._tracer is None and result._tracer is None:
            if tuple(result._value.shape) != tuple(self._value.shape):
                raise ShapeError(f"output with shape {list(self._value.shape)} doesn't match the broadcast "
                                 f"shape {list(result._value.shape)}")
            if self._requires_grad and self._grad_fn is None and autograd.is_grad_enabled():
                raise autograd.AutogradError(
                    "a leaf Variable that requires grad is being used in an in-place operation",
                    fix="update it inside `with kiln.no_grad():`, or use the out-of-place op")
            if result._grad_fn is not None or self._saved:
                # The autograd graph keeps the old array (a saved input or output): give this tensor the new one.
                self._value, self._saved = result._value, result._saved
                if result._grad_fn is not None:
                    self._grad_fn, self._requires_grad = result._grad_fn, True
                return self
            np.copyto(self._value, result._value)  # numpy views of this array see the update
        else:
            self._value, self._tracer = result._value, result._tracer
            if self._tracer is not None:  # through a view, the write reaches what it aliases
                self._tracer.write_through(self)
        return self

    def add_(self, other: Any, *, alpha: Any = 1) -> "Tensor":
        return self._assign(self.add(other, alpha=alpha))

    def sub_(self, other: Any, *, alpha: Any = 1) -> "Tensor":
        return self._assign(self.sub(other, alpha=alpha))

    def mul_(self, other: Any) -> "Tensor":
        return self._assign(self.mul(other))

    def div_(self, other: Any, *, rounding_mode: str | None = None) -> "Tensor":
        return self._assign(self.div(other, rounding_mode=rounding_mode))

    def pow_(self, exponent: Any) -> "Tensor":
        return self._assign(self.pow(exponent))

    def clamp_(self, min: Any = None, max: Any = None) -> "Tensor":
        return self._assign(self.clamp(min, max))

    clip_ = clamp_

    def lerp_(self, end: "Tensor", weight: Any) -> "Tensor":
        return self._assign(self.lerp(end, weight))

    def addcmul_(self, tensor1: "Tensor", tensor2: "Tensor", *, value: Any = 1) -> "Tensor":
        return self._assign(self.addcmul(tensor1, tensor2, value=value))

    def addcdiv_(self, tensor1: "Tensor", tensor2: "Tensor", *, value: Any = 1) -> "Tensor":
        return self._assign(self.addcdiv(tensor1, tensor2, value=value))

    def masked_fill_(self, mask: "Tensor", value: Any) -> "Tensor":
        return self._assign(self.masked_fill(mask, value))

    def fill_(self, value: Any) -> "Tensor":
        if isinstance(value, Tensor):
            return self._assign(dispatch(aten.expand.default, value.to(self.dtype), list(self.shape)))
        return self._assign(dispatch(aten.fill.Scalar, self, value))

    def zero_(self) -> "Tensor":
        return self.fill_(0)

    def copy_(self, src: "Tensor", non_blocking: builtins.bool = False) -> "Tensor":
        return self._assign(dispatch(aten.copy.default, self, src))

    def __iadd__(self, other: Any) -> "Tensor":
        return self.add_(other)

    def __isub__(self, other: Any) -> "Tensor":
        return self.sub_(other)

    def __imul__(self, other: Any) -> "Tensor":
        return self.mul_(other)

    def __itruediv__(self, other: Any) -> "Tensor":
        return self.div_(other)

    # Initializers used by kiln.nn.init work on eager tensors only.
    def uniform_(self, a: builtins.float = 0.0, b: builtins.float = 1.0, generator: Any = None) -> "Tensor":
        from kiln.frontend.random import default_generator
        if a > b:
            raise OpArgumentError(f"uniform_ expects to return a [from, to) range, but found from={a} > to={b}")
        return self._assign(Tensor(default_generator().uniform(a, b, self._value.shape).astype(self.dtype.numpy)))

    def normal_(self, mean: builtins.float = 0.0, std: builtins.float = 1.0, generator: Any = None) -> "Tensor":
        from kiln.frontend.random import default_generator
        values = default_generator().normal(mean, std, self._value.shape)
        return self._assign(Tensor(values.astype(self.dtype.numpy)))


Tensor.output_class = Tensor  # type: ignore[attr-defined]  # what programs called with tensors return


class _DTypeProbe:
    """Just enough of a tensor (dtype and rank) for dtypes.result_type."""

    def __init__(self, tensor: Tensor):
        self.dtype, self.shape = tensor.dtype, tuple(tensor.shape)


def _reflected_mode(tensor: Tensor, scalar: Any, mode: str) -> Tensor:
    result_dtype = dtypes.result_type(_DTypeProbe(tensor), scalar)
    left = dispatch(aten.scalar_tensor.default, scalar, dtype=result_dtype)
    return dispatch(aten.div.Tensor_mode, left, tensor, rounding_mode=mode)


def _as_tensor_like(value: Any, like: Tensor) -> Tensor:
    from kiln.frontend.functions import tensor
    return tensor(value)


def _dims(dim: Any) -> list[Any] | None:
    if dim is None:
        return None
    if isinstance(dim, (list, tuple)):
        return list(dim)
    return [dim]


def _opt_dtype(dtype: Any) -> DType | None:
    return None if dtype is None else _as_dtype(dtype)


def _can_cast(source: DType, target: DType) -> builtins.bool:
    """torch's canCast: no float→integral, no non-bool→bool category demotion."""
    if source.is_floating_point and not target.is_floating_point:
        return False
    if not source.is_bool and target.is_bool:
        return False
    return True


class Parameter(Tensor):
    """A Tensor that a Module registers as a parameter."""

    def __init__(self, data: Any = None, requires_grad: builtins.bool = True):
        if data is None:
            data = np.zeros((0,), np.float32)
        super().__init__(data)
        self.requires_grad = requires_grad

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()



def _unary_method(op_name: str) -> Any:
    def method(self: Tensor) -> Tensor:
        return dispatch(getattr(aten, op_name).default, self)

    def method_(self: Tensor) -> Tensor:
        return self._assign(method(self))
    method.__name__, method_.__name__ = op_name, op_name + "_"
    method.__doc__ = f"`aten.{op_name}.default` applied elementwise."
    return method, method_


# Elementwise methods without arguments, each with its in-place twin (`x.exp()`, `x.exp_()`).
UNARY_METHODS = (
    "abs", "neg", "exp", "log", "log2", "log10", "log1p", "expm1", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh",
    "sinh", "cosh", "asin", "acos", "atan", "asinh", "acosh", "atanh", "sigmoid", "relu", "floor", "ceil",
    "round", "trunc", "sign", "reciprocal", "erf", "isnan", "isinf", "bitwise_not", "square",
)
for _name in UNARY_METHODS:
    _method, _method_ = _unary_method(_name)
    setattr(Tensor, _name, _method)
    setattr(Tensor, _name + "_", _method_)
Tensor.negative = Tensor.neg  # type: ignore[attr-defined]
