"""Shape and view ops: view, reshape, permute, expand, squeeze/unsqueeze, cat, split, slice, ..."""

from __future__ import annotations

import numpy as np

from kiln.ir.meta import like, numel, require, shape_of
from kiln.ir.registry import defop
from kiln.ir.symbolic import as_dim, sym_eq


def infer_size(op: str, shape, size):
    """Resolve one -1 in a requested size and check the element count matches (ATen's infer_size)."""
    size = [as_dim(s) for s in size]
    wildcard = [i for i, s in enumerate(size) if isinstance(s, int) and s == -1]
    require(len(wildcard) <= 1, op, "only one dimension can be inferred")
    total = numel(shape)
    if wildcard:
        known = numel([s for i, s in enumerate(size) if i != wildcard[0]])
        import sympy
        inferred = as_dim(sympy.floor(sympy.sympify(total) / known)) if not isinstance(total, int) or not isinstance(
            known, int) else (total // known if known else -1)
        require(known != 0 and sym_eq(inferred * known, total), op,
                f"shape '{[str(s) for s in size]}' is invalid for input of size {total}")
        size[wildcard[0]] = inferred
    for s in size:
        require(not (isinstance(s, int) and s < 0), op, f"invalid shape dimension {s}")
    require(sym_eq(numel(size), total), op,
            f"shape '{[str(s) for s in size]}' is invalid for input of size {total}")
    return size


defop("view(Tensor(a) self, SymInt[] size) -> Tensor(a)",
      lambda self, size: like(self, shape=infer_size("aten.view.default", shape_of(self), size)),
      lambda self, size: np.reshape(self, infer_size("aten.view.default", self.shape, size)),
      tags=("view",))
