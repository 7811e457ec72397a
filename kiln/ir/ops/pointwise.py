"""Elementwise ops: arithmetic, comparisons, logic, unary math, activations. Broadcast + ATen promotion."""

from __future__ import annotations

import numpy as np

from kiln.ir.meta import Promotion, dtype_of, elementwise_dtype, pointwise
from kiln.ir.ops._common import as_compute, ignore_fp_errors, unary_float_kernel
from kiln.ir.registry import defop


def _add(self, other, alpha=1):
    result_dtype = elementwise_dtype(Promotion.DEFAULT, self, other)
    a, b = as_compute(np.asarray(self), result_dtype), as_compute(np.asarray(other), result_dtype)
    if result_dtype.is_bool:
        return np.logical_or(a, b) if alpha else a
    return a + b * alpha if alpha != 1 else a + b


defop("add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor", pointwise(), ignore_fp_errors(_add))
defop("add.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor", pointwise(), ignore_fp_errors(_add))


def _mul(self, other):
    result_dtype = elementwise_dtype(Promotion.DEFAULT, self, other)
    a, b = as_compute(np.asarray(self), result_dtype), as_compute(np.asarray(other), result_dtype)
    return np.logical_and(a, b) if result_dtype.is_bool else a * b


defop("mul.Tensor(Tensor self, Tensor other) -> Tensor", pointwise(), ignore_fp_errors(_mul))
defop("mul.Scalar(Tensor self, Scalar other) -> Tensor", pointwise(), ignore_fp_errors(_mul))

defop("relu(Tensor self) -> Tensor", pointwise(operands=1),
      lambda self: np.maximum(self, np.zeros((), self.dtype)) if self.dtype != np.bool_ else self)
defop("sin(Tensor self) -> Tensor", pointwise(Promotion.INT_TO_FLOAT, 1), unary_float_kernel(np.sin))
defop("exp(Tensor self) -> Tensor", pointwise(Promotion.INT_TO_FLOAT, 1), unary_float_kernel(np.exp))


def _compare(fn):
    def kernel(self, other):
        common = elementwise_dtype(Promotion.DEFAULT, self, other)
        return fn(as_compute(np.asarray(self), common), as_compute(np.asarray(other), common))
    return ignore_fp_errors(kernel)


defop("eq.Tensor(Tensor self, Tensor other) -> Tensor", pointwise(Promotion.ALWAYS_BOOL), _compare(np.equal))
defop("eq.Scalar(Tensor self, Scalar other) -> Tensor", pointwise(Promotion.ALWAYS_BOOL), _compare(np.equal))


def _where_meta(condition, self, other):
    from kiln.ir.meta import broadcast_shapes, require_dtype, shape_of, tensor
    require_dtype(dtype_of(condition).is_bool, "aten.where.self",
                  f"condition must be a bool tensor, got {dtype_of(condition).name}")
    shape = broadcast_shapes("aten.where.self", shape_of(condition), shape_of(self), shape_of(other))
    return tensor(shape, elementwise_dtype(Promotion.DEFAULT, self, other))


def _where(condition, self, other):
    result_dtype = elementwise_dtype(Promotion.DEFAULT, self, other)
    return np.where(condition, self.astype(result_dtype.numpy), other.astype(result_dtype.numpy))


defop("where.self(Tensor condition, Tensor self, Tensor other) -> Tensor", _where_meta, _where)
