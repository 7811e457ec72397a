"""Complex tensors as models build them: rotary embeddings as complex products (Llama 4, DeepSeek-V2:
`view_as_real(view_as_complex(x) * polar(1, angle))`). The reference kernels compute in numpy's complex types;
backends without complex tensors run the `lower-complex` pass (kiln/passes/complex.py), which carries each
complex value as its real and imaginary parts along a trailing dim of 2."""

from __future__ import annotations

import numpy as np

from kiln.ir import dtypes
from kiln.ir.meta import broadcast_shapes, dtype_of, require, require_dtype, shape_of, tensor
from kiln.ir.registry import defop, ops, register_decomposition
from kiln.ir.symbolic import sym_eq

_PARTS = (dtypes.float32, dtypes.float64)  # kiln has no complex32, the complex type of float16 parts


def _polar_meta(abs, angle):
    op = "aten.polar.default"
    require_dtype(dtype_of(abs) in _PARTS and dtype_of(angle) in _PARTS, op,
                  f"Expected both inputs to be Float or Double tensors but got {dtype_of(abs).name} and "
                  f"{dtype_of(angle).name}")
    require_dtype(dtype_of(abs) is dtype_of(angle), op,
                  f"Expected object of scalar type {dtype_of(abs).name} but got scalar type "
                  f"{dtype_of(angle).name} for second argument")
    shape = broadcast_shapes(op, shape_of(abs), shape_of(angle))
    return tensor(shape, dtypes.real_to_complex(dtype_of(abs)))


def _polar(abs, angle):
    """abs * cos(angle) + i * abs * sin(angle), each part rounded in the parts' dtype as ATen computes them."""
    abs, angle = np.broadcast_arrays(abs, angle)
    result = np.empty(abs.shape, dtypes.real_to_complex(dtypes.dtype(abs.dtype)).numpy)
    result.real = abs * np.cos(angle)
    result.imag = abs * np.sin(angle)
    return result


defop("polar(Tensor abs, Tensor angle) -> Tensor", _polar_meta, _polar, tags=("complex_prim",))


def _view_as_complex_meta(self):
    op = "aten.view_as_complex.default"
    require_dtype(dtype_of(self) in _PARTS, op, f"view_as_complex is only supported for float and double tensors "
                                                 f"in kiln, but got a tensor of scalar type: {dtype_of(self).name}")
    shape = list(shape_of(self))
    require(len(shape) > 0, op, "Input tensor must have one or more dimensions")
    require(sym_eq(shape[-1], 2), op, "Tensor must have a last dimension of size 2")
    return tensor(shape[:-1], dtypes.real_to_complex(dtype_of(self)))


def _view_as_complex(self):
    _view_as_complex_meta(self)
    complex_type = dtypes.real_to_complex(dtypes.dtype(self.dtype)).numpy
    return np.ascontiguousarray(self).view(complex_type).reshape(self.shape[:-1])


defop("view_as_complex(Tensor(a) self) -> Tensor(a)", _view_as_complex_meta, _view_as_complex,
      tags=("view", "complex_prim"))


def _view_as_real_meta(self):
    require_dtype(dtype_of(self).is_complex, "aten.view_as_real.default",
                  "view_as_real is only supported for complex tensors")
    return tensor([*shape_of(self), 2], dtypes.complex_to_real(dtype_of(self)))


def _view_as_real(self):
    _view_as_real_meta(self)
    return np.stack([self.real, self.imag], axis=-1)


defop("view_as_real(Tensor(a) self) -> Tensor(a)", _view_as_real_meta, _view_as_real, tags=("view", "complex_prim"))


def _real_meta(self):
    return tensor(shape_of(self), dtypes.complex_to_real(dtype_of(self)) if dtype_of(self).is_complex
                  else dtype_of(self))


def _real(self):
    return np.ascontiguousarray(self.real) if np.iscomplexobj(self) else self


defop("real(Tensor(a) self) -> Tensor(a)", _real_meta, _real, tags=("view", "composite"),
      doc="The real parts of a complex tensor; a real tensor itself.")


def _imag_meta(self):
    require_dtype(dtype_of(self).is_complex, "aten.imag.default",
                  "imag is not implemented for tensors with non-complex dtypes.")
    return tensor(shape_of(self), dtypes.complex_to_real(dtype_of(self)))


def _imag(self):
    _imag_meta(self)
    return np.ascontiguousarray(self.imag)


defop("imag(Tensor(a) self) -> Tensor(a)", _imag_meta, _imag, tags=("view", "composite"),
      doc="The imaginary parts of a complex tensor.")


@register_decomposition("aten.real.default")
def _real_decomposition(self):
    if not dtype_of(self).is_complex:
        return ops.aten.alias.default(self)
    return ops.aten.select.int(ops.aten.view_as_real.default(self), -1, 0)


@register_decomposition("aten.imag.default")
def _imag_decomposition(self):
    _imag_meta(self)
    return ops.aten.select.int(ops.aten.view_as_real.default(self), -1, 1)
