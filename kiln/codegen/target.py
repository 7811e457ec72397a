"""What a code generator's kernels can do: each backend declares a `Target` (its dtypes, the ops it lowers and
the argument forms they take, and its cost model), and the shared scheduler consults it before grouping ops."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from kiln.ir.types import TensorType


def _tensor(value: Any) -> bool:
    return hasattr(value, "type") and isinstance(value.type, TensorType)


@dataclass(frozen=True)
class Target:
    """A backend's capabilities.

    `ops` are the op names its renderer lowers; `dtypes` the element types its kernels read and write;
    `unsupported_arguments(op)` says why an op's argument forms fall outside its kernels (None when they fit), and
    `unsupported_sparse(op, name, layouts)` the same for ops with sparse operands. `work(kernel)` is its cost model:
    a kernel's operation count, which sizes thread teams and launch grids.
    """

    name: str    # as messages say it: "C", "Triton"
    folder: str  # kiln/codegen/<folder>
    dtypes: frozenset
    ops: frozenset
    unsupported_arguments: Callable[[Any], str | None]
    unsupported_sparse: Callable[[Any, str, list[str]], str | None]
    work: Callable[[Any], Any]

    @property
    def no_lowering(self) -> str:
        return f"no {self.name} lowering"

    def unsupported(self, op: Any, name: str) -> str | None:
        """Why this target cannot run `op` (None when it can)."""
        sparse = [v.type.layout.kind for v in op.operands if _tensor(v) and v.type.is_sparse]
        if sparse:
            return self.unsupported_sparse(op, name, sparse)
        if name not in self.ops:
            return self.no_lowering
        for value in list(op.operands) + list(op.results):
            if _tensor(value) and value.type.dtype not in self.dtypes:
                return f"dtype {value.type.dtype.name} is not supported"
        return self.unsupported_arguments(op)


BACKENDS: dict[str, str] = {"c": "kiln.codegen.c", "triton": "kiln.codegen.triton"}  # compile targets -> packages
