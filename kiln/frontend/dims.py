"""Dynamic-shape specifications: `kiln.Dim`, derived dims (`dx + 1`, `2 * dx`), `Dim.AUTO/STATIC/DYNAMIC`,
`kiln.dims(...)` and `kiln.ShapesCollection`, with torch.export's spelling and meaning.
"""

from __future__ import annotations

import math
from typing import Any

from kiln.ir.errors import KilnError


class _DimHint:
    """Dim.AUTO / Dim.DYNAMIC (a symbol whose range export infers) and Dim.STATIC (the example size)."""

    def __init__(self, kind: str):
        self.kind = kind

    def __repr__(self) -> str:
        return f"Dim.{self.kind}"


class Dim:
    """A named dynamic dimension with an inclusive range, like `torch.export.Dim`.

    Unlike torch, the default minimum is 1, and size-1 examples are not specialized: a program valid at
    size 1 exports as such. Pass `min=0` to admit empty tensors.
    """

    AUTO = _DimHint("AUTO")
    DYNAMIC = _DimHint("DYNAMIC")
    STATIC = _DimHint("STATIC")

    def __init__(self, name: str, *, min: int | None = None, max: int | None = None):
        if not name.isidentifier():
            raise KilnError(f"Dim name {name!r} must be a Python identifier")
        self.__name__ = name
        self.min = 1 if min is None else int(min)
        self.max = math.inf if max is None else int(max)
        if self.min > self.max:
            raise KilnError(f"Dim {name!r} has min {self.min} greater than max {self.max}")

    @property
    def name(self) -> str:
        return self.__name__

    def _derive(self, scale: int, offset: int) -> "DerivedDim":
        return DerivedDim(self, scale, offset)

    def __add__(self, other: int) -> "DerivedDim":
        if not isinstance(other, int):
            return NotImplemented
        return self._derive(1, other)

    __radd__ = __add__

    def __sub__(self, other: int) -> "DerivedDim":
        if not isinstance(other, int):
            return NotImplemented
        return self._derive(1, -other)

    def __mul__(self, other: int) -> "DerivedDim":
        if not isinstance(other, int):
            return NotImplemented
        return self._derive(other, 0)

    __rmul__ = __mul__

    def __repr__(self) -> str:
        bounds = []
        if self.min != 1:
            bounds.append(f"min={self.min}")
        if self.max != math.inf:
            bounds.append(f"max={self.max}")
        return f"Dim({self.name!r}{', ' if bounds else ''}{', '.join(bounds)})"


class DerivedDim:
    """`scale * root + offset` for a root Dim; its range follows from the root's."""

    def __init__(self, root: Dim, scale: int, offset: int):
        self.root, self.scale, self.offset = root, scale, offset

    @property
    def name(self) -> str:
        text = self.root.name if self.scale == 1 else f"{self.scale}*{self.root.name}"
        if self.offset:
            text += f" {'+' if self.offset > 0 else '-'} {abs(self.offset)}"
        return text

    @property
    def min(self) -> float:
        return self.scale * self.root.min + self.offset

    @property
    def max(self) -> float:
        return self.scale * self.root.max + self.offset

    def __add__(self, other: int) -> "DerivedDim":
        return DerivedDim(self.root, self.scale, self.offset + other)

    __radd__ = __add__

    def __sub__(self, other: int) -> "DerivedDim":
        return DerivedDim(self.root, self.scale, self.offset - other)

    def __mul__(self, other: int) -> "DerivedDim":
        return DerivedDim(self.root, self.scale * other, self.offset * other)

    __rmul__ = __mul__

    def __repr__(self) -> str:
        return self.name


def dims(*names: str, min: int | None = None, max: int | None = None) -> tuple[Dim, ...]:
    """Several Dims with one range: `batch, seq = kiln.dims("batch", "seq", max=512)`."""
    return tuple(Dim(name, min=min, max=max) for name in names)


class ShapesCollection:
    """Build `dynamic_shapes` by tensor instead of by argument position, like torch's ShapesCollection."""

    def __init__(self) -> None:
        self._shapes: dict[int, tuple[Any, Any]] = {}

    def __setitem__(self, tensor: Any, shape: Any) -> None:
        self._shapes[id(tensor)] = (tensor, shape)

    def __getitem__(self, tensor: Any) -> Any:
        return self._shapes[id(tensor)][1]

    def __contains__(self, tensor: Any) -> bool:
        return id(tensor) in self._shapes

    def dynamic_shapes(self, module: Any, args: tuple, kwargs: dict | None = None) -> Any:
        """The nested `dynamic_shapes` for these inputs (None for tensors without an entry)."""
        from kiln.frontend.tensor import Tensor

        def spec_for(value: Any) -> Any:
            if isinstance(value, Tensor):
                return self._shapes.get(id(value), (None, None))[1]
            if isinstance(value, (list, tuple)):
                return type(value)(spec_for(v) for v in value)
            if isinstance(value, dict):
                return {k: spec_for(v) for k, v in value.items()}
            return None

        specs = tuple(spec_for(a) for a in args)
        if kwargs:
            return {**dict(zip(_argument_names(module, len(args)), specs)),
                    **{k: spec_for(v) for k, v in kwargs.items()}}
        return specs


def _argument_names(module: Any, count: int) -> list[str]:
    import inspect
    parameters = list(inspect.signature(module.forward).parameters)
    return parameters[:count]
