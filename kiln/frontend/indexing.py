"""`tensor[index]` and `tensor[index] = value` in terms of ATen ops, with torch's semantics.

Reading: None/slices/ints become unsqueeze/slice/select; tensor, list and bool-mask indices become one
`aten.index.Tensor` (an int beside them counts as an advanced index, as in torch). Writing is functional:
eagerly numpy's own assignment (same semantics), while tracing an `aten.index_put` whose indices are
built from aranges, so the program stays one op per assignment.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.frontend.symint import SymInt
from kiln.frontend.tensor import Tensor, dispatch
from kiln.ir import dtypes
from kiln.ir.errors import OpArgumentError, ShapeError
from kiln.ir.registry import ops

aten = ops.aten


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer, SymInt)) and not isinstance(value, (bool, np.bool_))


def _as_index_tensor(value: Any) -> Tensor:
    from kiln.frontend.functions import tensor
    if isinstance(value, Tensor):
        if not (value.dtype.is_integral or value.dtype.is_bool):
            raise OpArgumentError(f"tensors used as indices must be long, int, byte or bool tensors, "
                                  f"got {value.dtype.name}")
        return value
    return tensor(value)


def _normalize(tensor: Tensor, index: Any) -> list[Any]:
    items = list(index) if isinstance(index, tuple) else [index]
    consumed = 0
    for item in items:
        if item is None or item is Ellipsis:
            continue
        if isinstance(item, Tensor) and item.dtype.is_bool:
            consumed += item.dim()
        elif isinstance(item, (list, np.ndarray)) and np.asarray(item).dtype == np.bool_:
            consumed += np.asarray(item).ndim
        else:
            consumed += 1
    ellipses = [position for position, item in enumerate(items) if item is Ellipsis]  # `is`: Tensor == is elementwise
    if len(ellipses) > 1:
        raise OpArgumentError("an index can only have a single ellipsis ('...')")
    if consumed > tensor.dim():
        raise ShapeError(f"too many indices for tensor of dimension {tensor.dim()}")
    if ellipses:
        items[ellipses[0]:ellipses[0] + 1] = [slice(None)] * (tensor.dim() - consumed)
    return items


def getitem(tensor: Tensor, index: Any) -> Tensor:
    items = _normalize(tensor, index)
    advanced = any(isinstance(i, (Tensor, list, np.ndarray)) for i in items)
    result = tensor
    dim = 0
    advanced_indices: list[Any] = []  # per dim of `result` after the basic ops, None where not indexed
    for item in items:
        if item is None:
            result = result.unsqueeze(dim)
            advanced_indices.append(None)
            dim += 1
        elif isinstance(item, slice):
            if not (item.start is None and item.stop is None and item.step in (None, 1)):
                step = 1 if item.step is None else item.step
                if isinstance(step, int) and step <= 0:
                    raise OpArgumentError("step must be greater than zero")
                result = dispatch(aten.slice.Tensor, result, dim, item.start, item.stop, step)
            advanced_indices.append(None)
            dim += 1
        elif _is_int(item) and not advanced:
            result = result.select(dim, item)
        else:
            if _is_int(item):  # beside tensor indices an int is a 0-d advanced index, as in torch
                from kiln.frontend.functions import scalar_tensor
                index_tensor = scalar_tensor(item, dtype=dtypes.int64)
            else:
                index_tensor = _as_index_tensor(item)
            advanced_indices.append(index_tensor)
            dim += index_tensor.dim() if index_tensor.dtype.is_bool else 1
    if not advanced:
        return result
    while advanced_indices and advanced_indices[-1] is None:
        advanced_indices.pop()
    return dispatch(aten.index.Tensor, result, advanced_indices)


def setitem(tensor: Tensor, index: Any, value: Any) -> Tensor:
    """The value `tensor` has after `tensor[index] = value`, as a new tensor."""
    if tensor._tracer is None and not (isinstance(value, Tensor) and value._tracer is not None) and not any(
            isinstance(i, Tensor) and i._tracer is not None for i in (index if isinstance(index, tuple) else (index,))):
        array = tensor.numpy().copy()
        numpy_index = _numpy_index(index)
        array[numpy_index] = value.numpy() if isinstance(value, Tensor) else value
        return Tensor(array)
    return _traced_setitem(tensor, index, value)


def _numpy_index(index: Any) -> Any:
    if isinstance(index, tuple):
        return tuple(_numpy_index(i) for i in index)
    if isinstance(index, Tensor):
        return index.numpy()
    return index


def _traced_setitem(tensor: Tensor, index: Any, value: Any) -> Tensor:
    """`index_put` with every indexed dim given explicitly: slices become aranges on their own axes, and
    the tensor indices form one broadcast block placed where the first of them stands (torch's rule for
    adjacent advanced indices)."""
    from kiln.frontend.functions import arange, scalar_tensor
    items = [i for i in _normalize(tensor, index) if i is not None]
    while items and isinstance(items[-1], slice) and items[-1] == slice(None):
        items.pop()  # trailing full slices: index_put covers the remaining dims itself
    entries: list[tuple[str, Tensor]] = []
    dim = 0
    for item in items:
        if isinstance(item, slice):
            size = tensor.shape[dim]
            start, stop, step = item.start, item.stop, item.step or 1
            start = 0 if start is None else start + size if isinstance(start, int) and start < 0 else start
            stop = size if stop is None else stop + size if isinstance(stop, int) and stop < 0 else stop
            if isinstance(stop, int) and isinstance(size, int):
                stop = min(stop, size)
            entries.append(("slice", arange(start, stop, step)))
            dim += 1
        elif _is_int(item):
            if isinstance(item, int) and item < 0:
                item = item + tensor.shape[dim]
            entries.append(("advanced", scalar_tensor(item, dtype=dtypes.int64)))
            dim += 1
        else:
            index_tensor = _as_index_tensor(item)
            if index_tensor.dtype.is_bool and len(items) > 1:
                raise OpArgumentError("assigning through a boolean mask combined with other indices is not "
                                      "supported while tracing", fix="use kiln.where(mask, value, tensor)")
            entries.append(("advanced", index_tensor))
            dim += index_tensor.dim() if index_tensor.dtype.is_bool else 1
    advanced = [t for kind, t in entries if kind == "advanced"]
    block_rank = max((t.dim() for t in advanced), default=0)
    slice_count = sum(1 for kind, _ in entries if kind == "slice")
    axes = slice_count + block_rank
    indices: list[Tensor] = []
    axis = 0
    block_axis = None
    for kind, entry in entries:
        if kind == "slice":
            shape = [1] * axes
            shape[axis] = -1
            indices.append(entry.view(shape) if axes > 1 else entry)
            axis += 1
        else:
            if block_axis is None:
                block_axis = axis
                axis += block_rank
            if entry.dtype.is_bool or axes == entry.dim():
                indices.append(entry)
            else:
                shape = [1] * block_axis + [1] * (block_rank - entry.dim()) + list(entry.shape) + \
                    [1] * (axes - block_axis - block_rank)
                indices.append(entry.view(shape))
    if not isinstance(value, Tensor):
        value = scalar_tensor(value, dtype=tensor.dtype)
    value = value.to(tensor.dtype)
    return dispatch(aten.index_put.default, tensor, indices, value, False)
