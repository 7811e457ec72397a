"""Helpers shared by reference kernels: ATen's computation dtype ("opmath") and numpy conveniences."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from kiln.ir import dtypes


def opmath(array: np.ndarray) -> np.ndarray:
    """Upcast float16/bfloat16 to float32 for computation, as ATen kernels do."""
    if array.dtype in (np.float16, dtypes.bfloat16.numpy):
        return array.astype(np.float32)
    return array


def as_compute(array: np.ndarray, target: dtypes.DType) -> np.ndarray:
    """`array` converted to the computation dtype of a result of dtype `target`."""
    return array.astype(dtypes.opmath_dtype(target).numpy, copy=False)


def unary_float_kernel(fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    """Kernel for an int-to-float unary op: integers compute as float32, low-precision floats as float32."""
    def kernel(self: np.ndarray) -> np.ndarray:
        if not np.issubdtype(self.dtype, np.floating) and self.dtype != dtypes.bfloat16.numpy:
            self = self.astype(np.float32)
        with np.errstate(all="ignore"):
            return fn(opmath(self))
    return kernel


def ignore_fp_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    def kernel(*args: Any) -> Any:
        with np.errstate(all="ignore"):
            return fn(*args)
    kernel.__name__ = getattr(fn, "__name__", "kernel")
    return kernel


def checked(meta: Callable[..., Any], kernel: Callable[..., Any]) -> Callable[..., Any]:
    """`kernel` after `meta` on the arrays: a check the meta rule could not decide for a symbolic size (a reduction
    without an identity over a dim that is 0, padding larger than the dim, topk's k past it) raises the meta rule's
    error at run time, as ATen raises it then."""
    def kernel_after_meta(*args: Any, **kwargs: Any) -> Any:
        meta(*args, **kwargs)
        return kernel(*args, **kwargs)
    return kernel_after_meta
