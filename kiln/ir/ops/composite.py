"""Composite ops exported models commonly contain, each with a decomposition into core ATen ops."""

from __future__ import annotations

from kiln.ir.meta import dtype_of, require, shape_of, tensor
from kiln.ir.registry import defop, ops, register_decomposition
from kiln.ir.symbolic import sym_eq


def _linear_meta(input, weight, bias=None):
    op = "aten.linear.default"
    require(len(shape_of(weight)) in (1, 2), op, f"weight must be 1-D or 2-D, got {list(shape_of(weight))}")
    in_features = shape_of(weight)[-1]
    require(len(shape_of(input)) >= 1 and sym_eq(shape_of(input)[-1], in_features), op,
            f"input shape {list(shape_of(input))} does not end with in_features={in_features}")
    out = list(shape_of(input)[:-1]) + ([shape_of(weight)[0]] if len(shape_of(weight)) == 2 else [])
    return tensor(out, dtype_of(input))


def _linear_kernel(input, weight, bias=None):
    from kiln.ir.ops._common import opmath
    result = opmath(input) @ opmath(weight).T
    return result + opmath(bias) if bias is not None else result


defop("linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor", _linear_meta, _linear_kernel,
      tags=("composite",))


@register_decomposition("aten.linear.default")
def _linear_decomposition(input, weight, bias=None):
    aten = ops.aten
    weight_t = aten.permute.default(weight, [1, 0])
    batch = shape_of(input)[:-1]
    flat = aten.view.default(input, [-1, shape_of(input)[-1]]) if len(shape_of(input)) != 2 else input
    if bias is None:
        out = aten.mm.default(flat, weight_t)
    else:
        out = aten.addmm.default(bias, flat, weight_t)
    return aten.view.default(out, [*batch, shape_of(weight)[0]]) if len(shape_of(input)) != 2 else out
