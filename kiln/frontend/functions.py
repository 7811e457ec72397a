"""Top-level tensor functions: factories (`kiln.zeros`, `kiln.arange`, ...) and `kiln.cat`/`stack`/`where`/...

Factories run eagerly, or are recorded when called inside a trace (their sizes may then be symbolic).
"""

from __future__ import annotations

import builtins
from typing import Any, Sequence

import numpy as np

from kiln.frontend.tensor import Tensor, _as_dtype, _sizes, dispatch
from kiln.ir import dtypes
from kiln.ir.errors import OpArgumentError
from kiln.ir.registry import ops

aten = ops.aten


def _infer_dtype(data: Any) -> dtypes.DType:
    """torch.tensor's inference: bool → bool, int → int64, float → the default float dtype."""
    flat = np.asarray(data, dtype=object).ravel()
    if flat.size == 0 or any(isinstance(v, (float, np.floating)) for v in flat):
        return dtypes.default_float_dtype()
    if all(isinstance(v, (bool, np.bool_)) for v in flat):
        return dtypes.bool_
    return dtypes.int64


def tensor(data: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """A new eager tensor from Python data, a numpy array or another tensor (copied)."""
    if isinstance(data, Tensor):
        data = data.numpy()
    if isinstance(data, np.ndarray):
        array = data.astype(_as_dtype(dtype).numpy if dtype is not None else data.dtype, copy=True)
    else:
        target = _as_dtype(dtype) if dtype is not None else _infer_dtype(data)
        array = np.array(data, dtype=np.float64 if target.is_floating_point else None)
        array = array.astype(target.numpy)
    result = Tensor(array)
    result.requires_grad = requires_grad
    return result


def as_tensor(data: Any, dtype: Any = None) -> Tensor:
    if isinstance(data, Tensor) and (dtype is None or _as_dtype(dtype) is data.dtype):
        return data
    return tensor(data, dtype)


def from_numpy(array: np.ndarray) -> Tensor:
    """Shares memory with `array`, like torch.from_numpy."""
    return Tensor(array)


def full(size: Sequence[Any], fill_value: Any, *, dtype: Any = None, device: Any = None,
         requires_grad: bool = False) -> Tensor:
    result = dispatch(aten.full.default, list(size), fill_value, dtype=None if dtype is None else _as_dtype(dtype))
    if requires_grad:
        result.requires_grad = True
    return result


def _default_float(dtype: Any) -> dtypes.DType:
    return dtypes.default_float_dtype() if dtype is None else _as_dtype(dtype)


def zeros(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    return full(_sizes(size), 0, dtype=_default_float(dtype), requires_grad=requires_grad)


def ones(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    return full(_sizes(size), 1, dtype=_default_float(dtype), requires_grad=requires_grad)


def empty(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    return zeros(*size, dtype=dtype, requires_grad=requires_grad)


def full_like(input: Tensor, fill_value: Any, *, dtype: Any = None) -> Tensor:
    return dispatch(aten.full_like.default, input, fill_value, dtype=None if dtype is None else _as_dtype(dtype))


def zeros_like(input: Tensor, *, dtype: Any = None) -> Tensor:
    return full_like(input, 0, dtype=dtype)


def ones_like(input: Tensor, *, dtype: Any = None) -> Tensor:
    return full_like(input, 1, dtype=dtype)


def empty_like(input: Tensor, *, dtype: Any = None) -> Tensor:
    return full_like(input, 0, dtype=dtype)


def arange(start: Any, end: Any = None, step: Any = 1, *, dtype: Any = None, device: Any = None) -> Tensor:
    if end is None:
        start, end = 0, start
    return dispatch(aten.arange.start_step, start, end, step, dtype=None if dtype is None else _as_dtype(dtype))


def linspace(start: float, end: float, steps: int, *, dtype: Any = None) -> Tensor:
    return dispatch(aten.linspace.default, start, end, steps, dtype=None if dtype is None else _as_dtype(dtype))


def eye(n: int, m: int | None = None, *, dtype: Any = None) -> Tensor:
    if m is None:
        return dispatch(aten.eye.default, n, dtype=_default_float(dtype))
    return dispatch(aten.eye.m, n, m, dtype=_default_float(dtype))


def rand(*size: Any, dtype: Any = None, generator: Any = None) -> Tensor:
    return dispatch(aten.rand.default, _sizes(size), dtype=_default_float(dtype))


def randn(*size: Any, dtype: Any = None, generator: Any = None) -> Tensor:
    return dispatch(aten.randn.default, _sizes(size), dtype=_default_float(dtype))


def rand_like(input: Tensor, *, dtype: Any = None) -> Tensor:
    return rand(list(input.shape), dtype=dtype or input.dtype)


def randn_like(input: Tensor, *, dtype: Any = None) -> Tensor:
    return randn(list(input.shape), dtype=dtype or input.dtype)


def randint(low: int, high: int | None = None, size: Sequence[int] = (), *, dtype: Any = None) -> Tensor:
    """Uniform integers in [low, high) (eager only: kiln records no randint op)."""
    from kiln.frontend.random import default_generator
    if high is None:
        low, high = 0, low
    target = dtypes.int64 if dtype is None else _as_dtype(dtype)
    return Tensor(default_generator().integers(low, high, size=tuple(size)).astype(target.numpy))


def randperm(n: int, *, dtype: Any = None) -> Tensor:
    return dispatch(aten.randperm.default, n, dtype=dtypes.int64 if dtype is None else _as_dtype(dtype))


# -- combining and selecting

def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    return dispatch(aten.cat.default, list(tensors), dim)


concat = concatenate = cat


def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    return dispatch(aten.stack.default, list(tensors), dim)


def where(condition: Tensor, input: Any = None, other: Any = None) -> Any:
    if input is None and other is None:
        return tuple(condition.nonzero().unbind(1))
    input, other = _tensor_pair(input, other)
    return dispatch(aten.where.self, condition, input, other)


def _tensor_pair(a: Any, b: Any) -> tuple[Tensor, Tensor]:
    """Scalars beside a tensor become 0-d tensors of the promoted dtype (torch's where/maximum rules)."""
    if isinstance(a, Tensor) and isinstance(b, Tensor):
        return a, b
    if isinstance(a, Tensor):
        return a, scalar_tensor(b, dtype=_scalar_operand_dtype(a, b))
    if isinstance(b, Tensor):
        return scalar_tensor(a, dtype=_scalar_operand_dtype(b, a)), b
    raise OpArgumentError("where() needs at least one tensor among input and other")


def _scalar_operand_dtype(tensor_value: Tensor, scalar: Any) -> dtypes.DType:
    scalar_dtype = dtypes.scalar_dtype(scalar)
    if scalar_dtype.is_floating_point and not tensor_value.dtype.is_floating_point:
        return dtypes.default_float_dtype()
    if scalar_dtype.is_integral and tensor_value.dtype.is_bool:
        return dtypes.int64
    return tensor_value.dtype


def scalar_tensor(value: Any, *, dtype: Any = None) -> Tensor:
    return dispatch(aten.scalar_tensor.default, value, dtype=_default_float(dtype))


def _unary(op_name: str):
    def function(input: Tensor) -> Tensor:
        return getattr(input, op_name)()
    function.__name__ = op_name
    return function


def clamp(input: Tensor, min: Any = None, max: Any = None) -> Tensor:
    return input.clamp(min, max)


clip = clamp


def maximum(input: Tensor, other: Tensor) -> Tensor:
    return input.maximum(other)


def minimum(input: Tensor, other: Tensor) -> Tensor:
    return input.minimum(other)


def matmul(input: Tensor, other: Tensor) -> Tensor:
    return input.matmul(other)


mm = bmm = matmul


def einsum(equation: str, *operands: Any) -> Tensor:
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    return dispatch(aten.einsum.default, equation, list(operands))


def flatten(input: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    return input.flatten(start_dim, end_dim)


def reshape(input: Tensor, shape: Sequence[Any]) -> Tensor:
    return input.reshape(shape)


def permute(input: Tensor, dims: Sequence[int]) -> Tensor:
    return input.permute(dims)


def transpose(input: Tensor, dim0: int, dim1: int) -> Tensor:
    return input.transpose(dim0, dim1)


def unsqueeze(input: Tensor, dim: int) -> Tensor:
    return input.unsqueeze(dim)


def squeeze(input: Tensor, dim: Any = None) -> Tensor:
    return input.squeeze(dim)


def chunk(input: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    return input.chunk(chunks, dim)


def split(input: Tensor, split_size: Any, dim: int = 0) -> tuple[Tensor, ...]:
    return input.split(split_size, dim)


def unbind(input: Tensor, dim: int = 0) -> tuple[Tensor, ...]:
    return input.unbind(dim)


def masked_fill(input: Tensor, mask: Tensor, value: Any) -> Tensor:
    return input.masked_fill(mask, value)


def sum(input: Tensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:  # noqa: A001
    return input.sum(dim, keepdim, dtype=dtype)


def mean(input: Tensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    return input.mean(dim, keepdim, dtype=dtype)


def max(input: Tensor, dim: Any = None, keepdim: bool = False) -> Any:  # noqa: A001
    return input.max(dim, keepdim)


def min(input: Tensor, dim: Any = None, keepdim: bool = False) -> Any:  # noqa: A001
    return input.min(dim, keepdim)


def amax(input: Tensor, dim: Any = (), keepdim: bool = False) -> Tensor:
    return input.amax(dim, keepdim)


def amin(input: Tensor, dim: Any = (), keepdim: bool = False) -> Tensor:
    return input.amin(dim, keepdim)


def argmax(input: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    return input.argmax(dim, keepdim)


def softmax(input: Tensor, dim: int, dtype: Any = None) -> Tensor:
    return input.softmax(dim, dtype)


def log_softmax(input: Tensor, dim: int, dtype: Any = None) -> Tensor:
    return input.log_softmax(dim, dtype)


def topk(input: Tensor, k: Any, dim: int = -1, largest: bool = True, sorted: bool = True) -> Any:
    return input.topk(k, dim, largest, sorted)


def cumsum(input: Tensor, dim: int, *, dtype: Any = None) -> Tensor:
    return input.cumsum(dim, dtype=dtype)


def diff(input: Tensor, n: int = 1, dim: int = -1, prepend: Tensor | None = None,
         append: Tensor | None = None) -> Tensor:
    return input.diff(n, dim, prepend, append)


def gather(input: Tensor, dim: int, index: Tensor) -> Tensor:
    return input.gather(dim, index)


def numel(input: Tensor) -> Any:
    return input.numel()


def is_tensor(value: Any) -> bool:
    return isinstance(value, Tensor)


def allclose(a: Tensor, b: Tensor, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False) -> bool:
    return builtins.bool(np.allclose(a.numpy(), b.numpy(), rtol=rtol, atol=atol, equal_nan=equal_nan))


def equal(a: Tensor, b: Tensor) -> bool:
    return tuple(a.shape) == tuple(b.shape) and builtins.bool(np.array_equal(a.numpy(), b.numpy()))


_UNARY = ["abs", "neg", "exp", "log", "log2", "log10", "log1p", "expm1", "sqrt", "rsqrt", "sin", "cos", "tan",
          "tanh", "sinh", "cosh", "asin", "acos", "atan", "sigmoid", "relu", "floor", "ceil", "round", "trunc",
          "sign", "reciprocal", "erf", "isnan", "isinf", "logical_not", "square"]
globals().update({name: _unary(name) for name in _UNARY})

def polar(abs: Tensor, angle: Tensor) -> Tensor:
    """abs * (cos(angle) + i sin(angle)), as torch.polar."""
    return dispatch(aten.polar.default, abs, angle)


def view_as_complex(input: Tensor) -> Tensor:
    """A float tensor whose last dim is (real, imaginary), as complex values."""
    return dispatch(aten.view_as_complex.default, input)


def view_as_real(input: Tensor) -> Tensor:
    """A complex tensor as floats with a trailing (real, imaginary) dim."""
    return dispatch(aten.view_as_real.default, input)


def real(input: Tensor) -> Tensor:
    return dispatch(aten.real.default, input)


def imag(input: Tensor) -> Tensor:
    return dispatch(aten.imag.default, input)


__all__ = ["tensor", "as_tensor", "from_numpy", "full", "zeros", "ones", "empty", "full_like", "zeros_like",
           "ones_like", "empty_like", "arange", "linspace", "eye", "rand", "randn", "rand_like", "randn_like",
           "randint", "randperm", "cat", "concat", "concatenate", "stack", "where", "scalar_tensor", "clamp",
           "clip", "maximum", "minimum", "matmul", "mm", "bmm", "einsum", "flatten", "reshape", "permute",
           "transpose", "unsqueeze", "squeeze", "chunk", "split", "unbind", "masked_fill", "sum", "mean", "max",
           "min", "amax", "amin", "argmax", "softmax", "log_softmax", "topk", "cumsum", "diff", "gather", "numel",
           "is_tensor", "allclose", "equal", "polar", "view_as_complex", "view_as_real", "real", "imag", *_UNARY]

