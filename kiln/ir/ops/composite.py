"""Composite ops exported models commonly contain, each with a decomposition into core ATen ops."""

from __future__ import annotations

from kiln.ir.meta import broadcast_shapes, dtype_of, numel, require, require_dtype, shape_of, tensor
from kiln.ir.registry import defop, ops, register_decomposition
from kiln.ir.symbolic import sym_eq


def _linear_meta(input, weight, bias=None):
    op = "aten.linear.default"
    require(len(shape_of(weight)) in (1, 2), op, f"weight must be 1-D or 2-D, got {list(shape_of(weight))}")
    in_features = shape_of(weight)[-1]
    require(len(shape_of(input)) >= 1 and sym_eq(shape_of(input)[-1], in_features), op,
            f"input shape {list(shape_of(input))} does not end with in_features={in_features}")
    others = [dtype_of(weight)] + ([] if bias is None else [dtype_of(bias)])
    require_dtype(all(d is dtype_of(input) for d in others), op,
                  f"input, weight and bias must have the same dtype, got {dtype_of(input)} and "
                  f"{', '.join(map(str, others))}", fix="convert them to one dtype first")
    require(not (len(shape_of(input)) == 2 and len(shape_of(weight)) == 1 and bias is not None), op,
            "mat2 must be a matrix, got 1-D tensor (ATen takes addmm for a 2-D input with a bias)",
            fix="give the weight a leading dim of 1 and squeeze the result's last dim")
    out = list(shape_of(input)[:-1]) + ([shape_of(weight)[0]] if len(shape_of(weight)) == 2 else [])
    if bias is not None:  # the bias broadcasts to the result without growing it (ATen adds or expands it)
        grown = broadcast_shapes(op, out, shape_of(bias))
        require(len(grown) == len(out) and all(sym_eq(a, b) for a, b in zip(grown, out)), op,
                f"bias of shape {list(shape_of(bias))} does not broadcast to the result's shape {out}")
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
    if len(shape_of(weight)) == 1:  # ATen's input.matmul(weight.t()): a 1-D weight gives one value per row
        out = aten.matmul.default(input, weight)
        return out if bias is None else aten.add.Tensor(out, bias)
    weight_t = aten.permute.default(weight, [1, 0])
    batch = shape_of(input)[:-1]
    # the row count spelled out: with 0 in_features, -1 would be ambiguous
    flat = aten.view.default(input, [numel(batch), shape_of(input)[-1]]) if len(shape_of(input)) != 2 else input
    if bias is None or len(shape_of(bias)) > 1:  # a bias of more dims broadcasts to the output, not to the rows
        out = aten.mm.default(flat, weight_t)
    else:
        out = aten.addmm.default(bias, flat, weight_t)
    out = aten.view.default(out, [*batch, shape_of(weight)[0]]) if len(shape_of(input)) != 2 else out
    return out if bias is None or len(shape_of(bias)) <= 1 else aten.add.Tensor(out, bias)
