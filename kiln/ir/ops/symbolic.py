"""Ops on symbolic integers: torch's `_operator` SymInt arithmetic, and `aten.item`.

kiln keeps SymInt arithmetic inside the consuming op's properties (`2*s0`); these ops exist for the values a
program hands on as values: a SymInt it returns (`return x.shape[1] + 1`) or a Python number read from a tensor.
Their arguments are SymInt properties, so the interpreter evaluates them from the bound symbols.
"""

from __future__ import annotations

import sympy

from kiln.ir.errors import OpArgumentError
from kiln.ir.ops.misc import _local_scalar_dense, _local_scalar_dense_meta
from kiln.ir.registry import defop, ops, register_decomposition
from kiln.ir.types import SymIntType


def _floordiv(a, b):
    if isinstance(a, int) and isinstance(b, int):
        if b == 0:
            raise OpArgumentError("_operator.floordiv: integer division by zero", fix="check the divisor's range")
        return a // b
    return sympy.floor(sympy.sympify(a) / b)


def _mod(a, b):
    if isinstance(a, int) and isinstance(b, int):
        if b == 0:
            raise OpArgumentError("_operator.mod: integer modulo by zero", fix="check the divisor's range")
        return a % b
    return sympy.Mod(a, b)


# Python's operators on SymInts, with Python's semantics (floor division and modulo round toward -inf).
_ARITHMETIC = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "floordiv": _floordiv,
    "mod": _mod,
}


def _arithmetic(name: str, compute):
    def meta(a, b):
        return SymIntType.of(sympy.expand(compute(a, b)) if name in ("add", "sub", "mul") else compute(a, b))

    def kernel(a, b):
        return int(compute(int(a), int(b)))

    defop(f"_operator::{name}(SymInt a, SymInt b) -> SymInt", meta, kernel,
          doc=f"Python's `operator.{name}` on SymInts, as torch.export records it")


for _name, _compute in _ARITHMETIC.items():
    _arithmetic(_name, _compute)

defop("item(Tensor self) -> Scalar", _local_scalar_dense_meta, _local_scalar_dense,
      doc="`Tensor.item()`: the one element as a Python number (a fresh unbacked SymInt while tracing)")


@register_decomposition("aten.item.default")
def _item_decomposition(self):
    return ops.aten._local_scalar_dense.default(self)
