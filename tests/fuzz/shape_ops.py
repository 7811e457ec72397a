"""Arguments for shape-sensitive ops computed from the (symbolic) shape of a value the DAG already has.

A registry sample's sizes only fit a tensor of the sample's shape; these handlers read the shape of an earlier value
instead (views and reshapes, concatenation and splits, broadcasting, matmuls and norms whose weights follow the
input's last dims), so symbolic dims flow through them. Each returns (args, kwargs), or None when the DAG has no
value it applies to; the op's meta rule still decides.
"""

from __future__ import annotations

from typing import Any, Callable

from hypothesis import strategies as st

from kiln.ir import dtypes
from kiln.ir.types import TensorType

from tests.fuzz.programs import DagDrawer, draw_dim

Draw = Callable[[Any], Any]
Call = tuple[tuple[Any, ...], dict[str, Any]] | None
Handler = Callable[[Draw, DagDrawer, str], Call]  # (draw, the DAG being drawn, the op's name)
HANDLERS: dict[str, Handler] = {}


def handles(*names: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        for name in names:
            HANDLERS[name] = fn
        return fn
    return register


def _floating(t: TensorType) -> bool:
    return t.dtype.is_floating_point


def _ranked(least: int) -> Callable[[TensorType], bool]:
    return lambda t: len(t.shape) >= least


def _dim(draw: Draw, rank: int, extra: int = 0) -> int:
    """A dim index of a rank-`rank` tensor (plus `extra` positions), negative half the time."""
    span = max(rank + extra, 1)
    index = draw(st.integers(0, span - 1))
    return index - span if draw(st.booleans()) else index


def _static(dim: Any) -> bool:
    return isinstance(dim, int)


# -- views and reshapes


@handles("aten.view.default", "aten.reshape.default", "aten._unsafe_view.default")
def _reshape(draw: Draw, d: DagDrawer, name: str) -> Call:
    x = d.pick()
    shape = list(d.type(x).shape)
    kind = draw(st.integers(0, 4))
    splittable = [i for i, n in enumerate(shape) if _static(n) and any(n % f == 0 for f in range(2, n))]
    if kind == 1 and len(shape) >= 2:  # merge two adjacent dims
        i = draw(st.integers(0, len(shape) - 2))
        shape[i:i + 2] = [shape[i] * shape[i + 1]]
    elif kind == 2:  # a new unit dim
        shape.insert(draw(st.integers(0, len(shape))), 1)
    elif kind == 3 and 1 in shape:
        shape.remove(1)
    elif kind == 4 and splittable:
        i = splittable[draw(st.integers(0, len(splittable) - 1))]
        factor = next(f for f in range(2, shape[i]) if shape[i] % f == 0)
        shape[i:i + 1] = [factor, shape[i] // factor]
    else:
        shape = [-1]
    if shape != [-1] and shape and draw(st.booleans()):
        shape[draw(st.integers(0, len(shape) - 1))] = -1
    return (x, shape), {}


@handles("aten.expand.default", "aten.broadcast_to.default")
def _expand(draw: Draw, d: DagDrawer, name: str) -> Call:
    x = d.pick()
    shape = [draw_dim(draw, d, (3, 2, 1), bound_only=True) if n == 1 else draw(st.sampled_from((n, -1)))
             for n in d.type(x).shape]
    if draw(st.booleans()):
        shape.insert(0, draw_dim(draw, d, (2, 1), bound_only=True))
    return (x, shape), {}


@handles("aten.permute.default")
def _permute(draw: Draw, d: DagDrawer, name: str) -> Call:
    x = d.pick()
    return (x, list(draw(st.permutations(range(len(d.type(x).shape)))))), {}


@handles("aten.transpose.int", "aten.swapaxes.default", "aten.movedim.int")
def _two_dims(draw: Draw, d: DagDrawer, name: str) -> Call:
    x = d.pick()
    rank = len(d.type(x).shape)
    return (x, _dim(draw, rank), _dim(draw, rank)), {}


@handles("aten.unsqueeze.default")
def _unsqueeze(draw: Draw, d: DagDrawer, name: str) -> Call:
    x = d.pick()
    return (x, _dim(draw, len(d.type(x).shape), extra=1)), {}


@handles("aten.squeeze.dim")
def _squeeze(draw: Draw, d: DagDrawer, name: str) -> Call:
    x = d.pick()
    shape = d.type(x).shape
    units = [i for i, n in enumerate(shape) if n == 1]
    dim = units[draw(st.integers(0, len(units) - 1))] if units and draw(st.booleans()) else _dim(draw, len(shape))
    return (x, dim), {}


@handles("aten.flatten.using_ints")
def _flatten(draw: Draw, d: DagDrawer, name: str) -> Call:
    x = d.pick()
    rank = max(len(d.type(x).shape), 1)
    start = draw(st.integers(0, rank - 1))
    return (x, start, draw(st.integers(start, rank - 1))), {}


@handles("aten.unflatten.int")
def _unflatten(draw: Draw, d: DagDrawer, name: str) -> Call:
    x = d.pick(_ranked(1))
    if x is None:
        return None
    shape = d.type(x).shape
    dim = draw(st.integers(0, len(shape) - 1))
    n = shape[dim]
    factors = [f for f in range(2, n) if n % f == 0] if _static(n) else []
    sizes = [factors[0], -1] if factors and draw(st.booleans()) else draw(st.sampled_from(([-1, 1], [1, -1], [n])))
    return (x, dim, sizes), {}


@handles("aten.slice.Tensor")
def _slice(draw: Draw, d: DagDrawer, name: str) -> Call:
    x = d.pick(_ranked(1))
    if x is None:
        return None
    start = draw(st.sampled_from((None, 0, 1, -1, 2, -3)))
    end = draw(st.sampled_from((None, -1, 2, 1, 4, 2**63 - 1)))
    return (x, _dim(draw, len(d.type(x).shape)), start, end, draw(st.sampled_from((1, 2, 3)))), {}


@handles("aten.select.int")
def _select(draw: Draw, d: DagDrawer, name: str) -> Call:
    x = d.pick(_ranked(1))
    if x is None:
        return None
    dim = _dim(draw, len(d.type(x).shape))
    n = d.type(x).shape[dim]
    index = draw(st.integers(-n, n - 1)) if _static(n) and n > 0 else draw(st.sampled_from((0, -1)))
    return (x, dim, index), {}


@handles("aten.narrow.default")
def _narrow(draw: Draw, d: DagDrawer, name: str) -> Call:
    x = d.pick(_ranked(1))
    if x is None:
        return None
    dim = _dim(draw, len(d.type(x).shape))
    n = d.type(x).shape[dim]
    if not _static(n):
        return (x, dim, 0, 1), {}
    start = draw(st.integers(0, n))
    return (x, dim, start, draw(st.integers(0, n - start))), {}


@handles("aten.repeat.default")
def _repeat(draw: Draw, d: DagDrawer, name: str) -> Call:
    x = d.pick()
    rank = len(d.type(x).shape) + draw(st.integers(0, 1))
    return (x, [draw(st.integers(1, 3)) for _ in range(rank)]), {}


@handles("aten.flip.default")
def _flip(draw: Draw, d: DagDrawer, name: str) -> Call:
    x = d.pick()
    rank = len(d.type(x).shape)
    return (x, sorted(draw(st.sets(st.integers(0, max(rank - 1, 0)), max_size=rank)))), {}


# -- concatenation and splits


def _like(draw: Draw, d: DagDrawer, t: TensorType, dim: int | None = None) -> Any:
    """`t` itself, or a new input of its shape (`dim` resized) and usually its dtype."""
    dtype = draw(st.sampled_from((t.dtype,) * 4 + (dtypes.float32, dtypes.int64, dtypes.float16)))
    shape = list(t.shape)
    if dim is not None:
        shape[dim] = draw_dim(draw, d, (2, 1, 0, 3))
    return d.new_input(dtype, shape)


@handles("aten.cat.default")
def _cat(draw: Draw, d: DagDrawer, name: str) -> Call:
    x = d.pick(_ranked(1))
    if x is None:
        return None
    t = d.type(x)
    dim = _dim(draw, len(t.shape))
    others = [x if draw(st.booleans()) else _like(draw, d, t, dim) for _ in range(draw(st.integers(1, 2)))]
    return ([x, *others], dim), {}


@handles("aten.stack.default")
def _stack(draw: Draw, d: DagDrawer, name: str) -> Call:
    x = d.pick()
    t = d.type(x)
    other = x if draw(st.booleans()) else _like(draw, d, t)
    return ([x, other], _dim(draw, len(t.shape), extra=1)), {}


@handles("aten.split.Tensor", "aten.chunk.default")
def _split(draw: Draw, d: DagDrawer, name: str) -> Call:
    x = d.pick(_ranked(1))
    if x is None:
        return None
    return (x, draw(st.integers(1, 3)), _dim(draw, len(d.type(x).shape))), {}


@handles("aten.split_with_sizes.default")
def _split_with_sizes(draw: Draw, d: DagDrawer, name: str) -> Call:
    x = d.pick(lambda t: any(_static(n) for n in t.shape))
    if x is None:
        return None
    shape = d.type(x).shape
    dims = [i for i, n in enumerate(shape) if _static(n)]
    dim = dims[draw(st.integers(0, len(dims) - 1))]
    sizes, left = [], shape[dim]
    while left:
        sizes.append(draw(st.integers(1, left)))
        left -= sizes[-1]
    return (x, sizes or [0], dim), {}


@handles("aten.unbind.int")
def _unbind(draw: Draw, d: DagDrawer, name: str) -> Call:
    x = d.pick(lambda t: any(_static(n) and 0 < n <= 4 for n in t.shape))
    if x is None:
        return None
    dims = [i for i, n in enumerate(d.type(x).shape) if _static(n) and 0 < n <= 4]
    return (x, dims[draw(st.integers(0, len(dims) - 1))]), {}


# -- reductions over any dims of any rank


@handles("aten.sum.dim_IntList", "aten.mean.dim", "aten.amax.default", "aten.amin.default", "aten.any.dims",
         "aten.var.correction", "aten.std.correction", "aten.logsumexp.default")
def _reduce(draw: Draw, d: DagDrawer, name: str) -> Call:
    x = d.pick()
    rank = len(d.type(x).shape)
    dims = [i - rank if draw(st.booleans()) else i for i in sorted(draw(st.sets(st.integers(0, max(rank - 1, 0)),
                                                                                  min_size=1, max_size=max(rank, 1))))]
    return (x, dims, draw(st.booleans())), {}


@handles("aten.softmax.int", "aten.log_softmax.int", "aten.cumsum.default", "aten.argmax.default",
         "aten.argmin.default", "aten.max.dim", "aten.min.dim", "aten.sort.default")
def _along_dim(draw: Draw, d: DagDrawer, name: str) -> Call:
    x = d.pick()
    return (x, _dim(draw, len(d.type(x).shape))), {}


# -- weights that follow the input's shape


@handles("aten.linear.default")
def _linear(draw: Draw, d: DagDrawer, name: str) -> Call:
    x = d.pick(lambda t: _floating(t) and len(t.shape) >= 1)
    if x is None:
        return None
    t = d.type(x)
    features = draw(st.integers(1, 5))
    weight = d.new_input(t.dtype, [features, t.shape[-1]])
    bias = d.new_input(t.dtype, [features]) if draw(st.booleans()) else None
    return (x, weight, bias), {}


@handles("aten.matmul.default", "aten.mm.default", "aten.bmm.default", "aten.addmm.default")
def _matmul(draw: Draw, d: DagDrawer, name: str) -> Call:
    x = d.pick(lambda t: _floating(t) and len(t.shape) >= 1)
    if x is None:
        return None
    t = d.type(x)
    columns = draw_dim(draw, d, (3, 1, 2))
    if name == "aten.matmul.default":  # a vector, a matrix, or a batch of them broadcasting against x's
        batch = list(t.shape[:-2]) if len(t.shape) >= 3 and draw(st.booleans()) else []
        shape = [*batch, t.shape[-1], columns] if draw(st.integers(0, 3)) else [t.shape[-1]]
    else:
        shape = [*t.shape[:-2], t.shape[-1], columns]
    other = d.new_input(t.dtype, shape)
    if name == "aten.addmm.default":  # the bias broadcasts along rows
        return (d.new_input(t.dtype, [columns]), x, other), {}
    return (x, other), {}


@handles("aten.layer_norm.default", "aten.rms_norm.default")
def _norm(draw: Draw, d: DagDrawer, name: str) -> Call:
    x = d.pick(lambda t: _floating(t) and len(t.shape) >= 1)
    if x is None:
        return None
    t = d.type(x)
    normalized = list(t.shape[-draw(st.integers(1, min(len(t.shape), 2))):])
    weight = d.new_input(t.dtype, normalized) if draw(st.booleans()) else None
    return (x, normalized, weight), {}


@handles("aten.where.self")
def _where(draw: Draw, d: DagDrawer, name: str) -> Call:
    x = d.pick()
    t = d.type(x)
    condition = d.pick(lambda c: c.dtype is dtypes.bool_) if draw(st.booleans()) else None
    condition = condition or d.new_input(dtypes.bool_, list(t.shape))
    other = d.pick(lambda o: o.dtype is t.dtype) if draw(st.booleans()) else None
    other = other or d.new_input(t.dtype, [])
    return (condition, x, other), {}


@handles("aten.scaled_dot_product_attention.default")
def _attention(draw: Draw, d: DagDrawer, name: str) -> Call:
    q = d.pick(lambda t: _floating(t) and len(t.shape) in (3, 4))
    if q is None:
        return None
    t = d.type(q)
    keys = draw_dim(draw, d, (3, 1, 2))
    k = d.new_input(t.dtype, [*t.shape[:-2], keys, t.shape[-1]])
    v = d.new_input(t.dtype, [*t.shape[:-2], keys, draw_dim(draw, d, (4, 2))])
    return (q, k, v), {"is_causal": draw(st.booleans())}
