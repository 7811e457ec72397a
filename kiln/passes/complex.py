"""`lower-complex`: complex values as pairs of real ones, for backends without complex types (C, Triton, ONNX as
onnxruntime runs it). A complex tensor of shape S becomes a real tensor of shape S + [2]: its real parts, then its
imaginary parts, along the trailing dim (the layout `view_as_real` gives, so `view_as_complex` and `view_as_real`
become nothing). Products follow (a + bi)(c + di) = (ac - bd) + (ad + bc)i; shape ops act on the leading dims.
Complex values that enter or leave the program, or ops on them outside the rules below, are refused by name."""

from __future__ import annotations

import math
from typing import Any, Callable

from xdsl.dialects import func

from kiln.ir import dtypes
from kiln.ir.dialect import bound_arguments
from kiln.ir.errors import UnsupportedError
from kiln.ir.ops.fft import fft_dims, resized
from kiln.ir.program import ExportedProgram, GraphBuilder, OutputSpec, value_names
from kiln.ir.registry import OpOverload, ops, split_bound
from kiln.ir.retrace import retrace
from kiln.ir.symbolic import active_shape_env, as_dim, floor_div
from kiln.ir.types import TensorType
from kiln.passes.base import Pass, register_pass

aten = ops.aten


def _is_complex(value: Any) -> bool:
    return isinstance(getattr(value, "type", None), TensorType) and value.type.dtype.is_complex


def _rank(value: Any) -> int:
    return len(value.type.shape)


def _part(pair: Any, index: int) -> Any:
    return aten.select.int(pair, -1, index)


def _lift(real: Any) -> Any:
    """A real tensor as a pair: itself and zeros (not real * 0, which a NaN or inf would spoil)."""
    return aten.stack.default([real, aten.full_like.default(real, 0)], -1)


def _times(a: Any, b: Any) -> Any:
    re = aten.sub.Tensor(aten.mul.Tensor(_part(a, 0), _part(b, 0)), aten.mul.Tensor(_part(a, 1), _part(b, 1)))
    im = aten.add.Tensor(aten.mul.Tensor(_part(a, 0), _part(b, 1)), aten.mul.Tensor(_part(a, 1), _part(b, 0)))
    return aten.stack.default([re, im], -1)


def _mul(op: Any, a: Any, b: Any) -> Any:
    first, second = op.operands[0], op.operands[1] if len(op.operands) > 1 else None
    if _is_complex(first) and _is_complex(second):
        return _times(a, b)
    pair, other = (a, b) if _is_complex(first) else (b, a)
    if isinstance(other, (int, float, complex)):
        return aten.mul.Scalar(pair, _real_number(op, other))
    return aten.mul.Tensor(pair, aten.unsqueeze.default(other, -1))  # a real factor scales both parts


def _add(op: Any, a: Any, b: Any, alpha: Any = 1) -> Any:
    first, second = op.operands[0], op.operands[1] if len(op.operands) > 1 else None
    lifted = [v if _is_complex(o) or isinstance(v, (int, float, complex)) else _lift(v)
              for v, o in ((a, first), (b, second))]
    if isinstance(lifted[1], (int, float, complex)):  # a real number adds to the real parts only
        number = _real_number(op, lifted[1])
        lifted[1] = _lift(aten.full.default([], number, dtype=dtypes.complex_to_real(op.results[0].type.dtype)))
    handle = aten.add.Tensor if op.name.startswith("aten.add.") else aten.sub.Tensor
    return handle(lifted[0], lifted[1], alpha=alpha)


def _real_number(op: Any, number: Any) -> Any:
    if isinstance(number, complex):
        raise UnsupportedError(f"{op.name} by the complex number {number} has no real-typed form here",
                               fix="multiply by a complex tensor (torch.polar, or view_as_complex of a pair) instead")
    return number


def _dim(op: Any, dim: int) -> int:
    """A dim of the op's complex operand, counted from the front (the pair has one more, trailing)."""
    rank = _rank(op.operands[0])
    return dim % rank if rank else 0


def _cast(op: Any, x: Any, *_: Any, **__: Any) -> Any:
    """_to_copy, to, type_as: to the result's dtype (device and layout mean nothing here)."""
    source, target = op.operands[0].type.dtype, op.results[0].type.dtype
    if source.is_complex and target.is_complex:
        return aten._to_copy.default(x, dtype=dtypes.complex_to_real(target))
    if target.is_complex:  # a real tensor becomes complex: zero imaginary parts
        return _lift(aten._to_copy.default(x, dtype=dtypes.complex_to_real(target)))
    return aten._to_copy.default(_part(x, 0), dtype=target)  # complex to real keeps the real parts, as ATen


def _pad(op: Any, z: Any, pad: Any, value: Any = 0) -> Any:
    """constant_pad_nd: the value pads the real parts, zeros the imaginary ones."""
    if value == 0:
        return aten.constant_pad_nd.default(z, [0, 0, *pad], 0)
    return aten.stack.default([aten.constant_pad_nd.default(_part(z, 0), pad, _real_number(op, value)),
                               aten.constant_pad_nd.default(_part(z, 1), pad, 0)], -1)


# --- FFTs as DFT matrix products, one transformed dim at a time. O(n^2) per dim where pocketfft is O(n log n): a
# fine trade for the short transforms models mix tokens with (FNet), and it keeps symbolic lengths symbolic.

def _size_tensor(size: Any) -> Any:
    """A [1] int64 tensor holding a size, symbolic or not (arange's bounds may be symbolic; a Scalar may not)."""
    return aten.arange.start_step(size, as_dim(size + 1), 1, dtype=dtypes.int64)


def _phases(rows: Any, columns: Any, length: Any) -> Any:
    """[rows, columns] float64: 2 pi (r c mod length) / length, reduced in integers so no phase loses precision."""
    r = aten.arange.start_step(0, rows, 1, dtype=dtypes.int64)
    c = aten.arange.start_step(0, columns, 1, dtype=dtypes.int64)
    product = aten.mul.Tensor(aten.unsqueeze.default(r, 1), aten.unsqueeze.default(c, 0))
    n = _size_tensor(length)
    turns = aten.div.Tensor(aten._to_copy.default(aten.remainder.Tensor(product, n), dtype=dtypes.float64),
                            aten._to_copy.default(n, dtype=dtypes.float64))
    return aten.mul.Scalar(turns, 2 * math.pi)


def _to_last(x: Any, dim: int, rank: int, pair: bool) -> tuple[Any, list[int]]:
    """x with leading dim `dim` moved behind the other leading dims (a pair's trailing dim stays last), and the
    permutation that undoes it."""
    order = [d for d in range(rank) if d != dim] + [dim] + ([rank] if pair else [])
    inverse = [order.index(d) for d in range(len(order))]
    return aten.permute.default(x, order), inverse


def _parts_flat(z: Any) -> Any:
    """[..., n, 2] -> [..., 2n]: the real parts, then the imaginary ones."""
    return aten.flatten.using_ints(aten.transpose.int(z, -1, -2), -2, -1)


def _pair_from_flat(flat: Any, length: Any) -> Any:
    return aten.transpose.int(aten.unflatten.int(flat, -1, [2, length]), -1, -2)


def _c2c_dim(z: Any, dim: int, rank: int, forward: bool, dtype: dtypes.DType) -> Any:
    """sum_n z_n e^(-+2 pi i nk/N): [a b] @ [[C, sS], [-sS, C]] with s = -1 forward, +1 inverse."""
    moved, inverse = _to_last(z, dim, rank, pair=True)
    length = z.type.shape[dim]
    phases = _phases(length, length, length)
    cos, sin = aten.cos.default(phases), aten.sin.default(phases)
    signed = aten.neg.default(sin) if forward else sin
    matrix = aten.cat.default([aten.cat.default([cos, signed], 1), aten.cat.default([aten.neg.default(signed), cos],
                                                                                    1)], 0)
    flat = aten.matmul.default(_parts_flat(moved), aten._to_copy.default(matrix, dtype=dtype))
    return aten.permute.default(_pair_from_flat(flat, length), inverse)


def _r2c_dim(x: Any, dim: int, rank: int, onesided: bool) -> Any:
    """A real signal's spectrum, bins 0..N/2 when one-sided: x @ [C, -S]."""
    moved, inverse = _to_last(x, dim, rank, pair=False)
    length = x.type.shape[dim]
    bins = as_dim(floor_div(length, 2) + 1) if onesided else length
    phases = _phases(length, bins, length)
    matrix = aten.cat.default([aten.cos.default(phases), aten.neg.default(aten.sin.default(phases))], 1)
    flat = aten.matmul.default(moved, aten._to_copy.default(matrix, dtype=x.type.dtype))
    return aten.permute.default(_pair_from_flat(flat, bins), inverse + [rank])


def _c2r_dim(z: Any, dim: int, rank: int, length: Any, dtype: dtypes.DType) -> Any:
    """The real signal of length N whose one-sided spectrum is z (bins 0..N/2): sum_k w_k (a_k cos - b_k sin),
    w_k = 1 for bin 0 and (N even) bin N/2, 2 for the bins that stand for their mirror images too."""
    bins = as_dim(floor_div(length, 2) + 1)
    z = resized(z, [dim], [bins])
    moved, inverse = _to_last(z, dim, rank, pair=True)
    phases = _phases(bins, length, length)
    k = aten.arange.start_step(0, bins, 1, dtype=dtypes.int64)
    twice = aten.mul.Scalar(k, 2)
    edges = aten.add.Tensor(aten._to_copy.default(aten.eq.Scalar(k, 0), dtype=dtypes.float64),
                            aten._to_copy.default(aten.eq.Tensor(twice, _size_tensor(length)), dtype=dtypes.float64))
    weights = aten.unsqueeze.default(aten.rsub.Scalar(edges, 2), 1)
    matrix = aten.cat.default([aten.mul.Tensor(aten.cos.default(phases), weights),
                               aten.neg.default(aten.mul.Tensor(aten.sin.default(phases), weights))], 0)
    flat = aten.matmul.default(_parts_flat(moved), aten._to_copy.default(matrix, dtype=dtype))
    return aten.permute.default(flat, inverse[:rank])


def _normalized(x: Any, lengths: list[Any], normalization: int) -> Any:
    """x / prod(lengths) (normalization 2) or / sqrt(prod(lengths)) (1), as ATen scales after the transform."""
    if normalization == 0:
        return x
    count = aten._to_copy.default(_size_tensor(lengths[0]), dtype=dtypes.float64)
    for length in lengths[1:]:
        count = aten.mul.Tensor(count, aten._to_copy.default(_size_tensor(length), dtype=dtypes.float64))
    scale = aten.reciprocal.default(aten.sqrt.default(count) if normalization == 1 else count)
    real = x.type.dtype
    return aten.mul.Tensor(x, aten._to_copy.default(scale, dtype=real))


def _fft_c2c(op: Any, z: Any, dim: Any, normalization: int, forward: bool) -> Any:
    rank = _rank(op.operands[0])
    dims = fft_dims(op.name, dim, rank)
    real = dtypes.complex_to_real(op.results[0].type.dtype)
    for d in dims:
        z = _c2c_dim(z, d, rank, forward, real)
    return _normalized(z, [op.operands[0].type.shape[d] for d in dims], normalization)


def _fft_r2c(op: Any, x: Any, dim: Any, normalization: int, onesided: bool) -> Any:
    rank = _rank(op.operands[0])
    dims = fft_dims(op.name, dim, rank)
    real = dtypes.complex_to_real(op.results[0].type.dtype)
    z = _r2c_dim(x, dims[-1], rank, onesided)
    for d in dims[:-1]:
        z = _c2c_dim(z, d, rank, True, real)
    return _normalized(z, [op.operands[0].type.shape[d] for d in dims], normalization)


def _fft_c2r(op: Any, z: Any, dim: Any, normalization: int, last_dim_size: Any) -> Any:
    rank = _rank(op.operands[0])
    dims = fft_dims(op.name, dim, rank)
    real = op.results[0].type.dtype
    for d in dims[:-1]:
        z = _c2c_dim(z, d, rank, False, real)
    x = _c2r_dim(z, dims[-1], rank, last_dim_size, real)
    return _normalized(x, [op.results[0].type.shape[d] for d in dims], normalization)


def _abs(op: Any, z: Any) -> Any:
    """|z| = sqrt(a^2 + b^2) (ATen's hypot avoids the overflow of squaring parts above ~1e19 in float32)."""
    return aten.sqrt.default(aten.add.Tensor(aten.mul.Tensor(_part(z, 0), _part(z, 0)),
                                             aten.mul.Tensor(_part(z, 1), _part(z, 1))))


# op -> rule(op, *its arguments with complex values as pairs) -> the result as a pair (or real)
RULES: dict[str, Callable[..., Any]] = {
    "aten.view_as_complex.default": lambda op, x: x,
    "aten.view_as_real.default": lambda op, z: z,
    "aten.polar.default": lambda op, abs, angle: aten.stack.default(
        [aten.mul.Tensor(abs, aten.cos.default(angle)), aten.mul.Tensor(abs, aten.sin.default(angle))], -1),
    "aten.mul.Tensor": _mul,
    "aten.mul.Scalar": lambda op, z, other: aten.mul.Scalar(z, _real_number(op, other)),
    **dict.fromkeys(("aten.add.Tensor", "aten.sub.Tensor", "aten.add.Scalar", "aten.sub.Scalar"), _add),
    "aten.neg.default": lambda op, z: aten.neg.default(z),
    "aten.clone.default": lambda op, z, **_: z,
    "aten.alias.default": lambda op, z: z,
    **dict.fromkeys(("aten._to_copy.default", "aten.to.dtype", "aten.to.dtype_layout", "aten.to.device",
                     "aten.type_as.default"), _cast),
    "aten.contiguous.default": lambda op, z, **_: z,
    "aten.view.default": lambda op, z, size: aten.reshape.default(z, [*size, 2]),
    "aten.reshape.default": lambda op, z, size: aten.reshape.default(z, [*size, 2]),
    "aten._unsafe_view.default": lambda op, z, size: aten.reshape.default(z, [*size, 2]),
    "aten.unsqueeze.default": lambda op, z, dim: aten.unsqueeze.default(z, dim % (_rank(op.operands[0]) + 1)),
    "aten.squeeze.dim": lambda op, z, dim: aten.squeeze.dims(z, [_dim(op, dim)]),
    "aten.squeeze.dims": lambda op, z, dims: aten.squeeze.dims(z, [_dim(op, d) for d in dims]),
    "aten.slice.Tensor": lambda op, z, dim=0, start=None, end=None, step=1: aten.slice.Tensor(
        z, _dim(op, dim), start, end, step),
    "aten.select.int": lambda op, z, dim, index: aten.select.int(z, _dim(op, dim), index),
    "aten.permute.default": lambda op, z, dims: aten.permute.default(
        z, [_dim(op, d) for d in dims] + [_rank(op.operands[0])]),
    "aten.transpose.int": lambda op, z, a, b: aten.transpose.int(z, _dim(op, a), _dim(op, b)),
    "aten.expand.default": lambda op, z, size, implicit=False: aten.expand.default(z, [*size, 2]),
    "aten.flatten.using_ints": lambda op, z, start=0, end=-1: aten.flatten.using_ints(z, _dim(op, start),
                                                                                       _dim(op, end)),
    "aten.unflatten.int": lambda op, z, dim, sizes: aten.unflatten.int(z, _dim(op, dim), sizes),
    "aten.constant_pad_nd.default": _pad,
    "aten.real.default": lambda op, z: _part(z, 0) if _is_complex(op.operands[0]) else z,
    "aten.imag.default": lambda op, z: _part(z, 1),
    "aten.abs.default": _abs,
    "aten._fft_c2c.default": _fft_c2c,
    "aten._fft_r2c.default": _fft_r2c,
    "aten._fft_c2r.default": _fft_c2r,
}


def complex_boundary(program: ExportedProgram) -> bool:
    """Whether a complex value enters or leaves the program (which no real-typed form can stand for)."""
    return any(_is_complex(v) for v in (*program.body.args, *program.body.last_op.operands))


def _decompose_composites(program: ExportedProgram) -> ExportedProgram:
    """The program with every op on complex values that has no rule here but a decomposition (torch.fft's
    functions: fft_fftn, fft_rfft, ...) decomposed, until the ops left have rules or nothing to decompose into."""
    while True:
        table = {OpOverload(op.opdef): op.opdef.decomposition for op in program.nodes()
                 if hasattr(op, "opdef") and op.name not in RULES and op.opdef.decomposition is not None
                 and any(_is_complex(v) for v in (*op.operands, *op.results))}
        if not table:
            return program
        program = retrace(program, table)


@register_pass
class LowerComplex(Pass):
    """Carry complex values as (real, imaginary) pairs along a trailing dim, for backends without complex types."""

    name = "lower-complex"

    def apply_program(self, program: ExportedProgram) -> ExportedProgram:
        if not any(_is_complex(v) for op in program.nodes() for v in (*op.operands, *op.results)):
            return program
        if complex_boundary(program):
            raise UnsupportedError("a complex program input or output has no real-typed form for this backend",
                                   fix="return view_as_real(z) instead, and take complex inputs as pairs")
        program = _decompose_composites(program)
        builder = GraphBuilder(program.shape_env())
        mapping: dict[Any, Any] = {}
        for arg, spec in zip(program.body.args, program.graph_signature.input_specs):
            mapping[arg] = builder.add_input(spec.name, arg.type, spec.kind, spec.target, spec.persistent)
        outputs: list[Any] = []
        with builder, active_shape_env(builder.shape_env):
            for op in program.body.ops:
                if isinstance(op, func.ReturnOp):
                    outputs = [mapping[v] for v in op.operands]
                    break
                self._lower(op, mapping, builder)
        specs = [OutputSpec(s.kind, s.name, s.target) for s in program.graph_signature.output_specs]
        new = builder.build(outputs, specs, program.state_dict, program.constants, dict(program.range_constraints))
        names = value_names(new.body)
        for spec, value in zip(new.graph_signature.output_specs, outputs):
            spec.name = names[value]
        new.copy_annotations_from(program)
        return new

    @staticmethod
    def _lower(op: Any, mapping: dict[Any, Any], builder: GraphBuilder) -> None:
        if not hasattr(op, "opdef"):  # a loop or cond: its body is not replayed here
            raise UnsupportedError(f"lower-complex cannot rewrite a program with complex values and {op.name}")
        bound = bound_arguments(op, mapping.__getitem__)
        if not any(_is_complex(v) for v in (*op.operands, *op.results)):
            result = builder.emit(op.opdef, bound)
        else:
            rule = RULES.get(op.name)
            if rule is None:
                raise UnsupportedError(f"{op.name} on complex values has no real-typed form for this backend",
                                       fix="compute it on view_as_real(z) instead")
            args, kwargs = split_bound(op.opdef, bound)
            result = rule(op, *args, **kwargs)
        flat = result if isinstance(result, (list, tuple)) else [result]
        for old, new in zip(op.results, flat):
            mapping[old] = new
