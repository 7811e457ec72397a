"""Every dense op that takes sparse operands (an OpDef with a sparse rule), on every layout, against torch.

Where torch computes the layout combination, kiln must give torch's layout and values. Where torch refuses it,
kiln's result (a superset) must still be the dense op's result, in the layout kiln's rule names.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.ir import dtypes
from kiln.ir import sparse as layouts
from kiln.ir.registry import REGISTRY, OpOverload
from kiln.ir.sparse import SparseArray
from tests.ir.samples import rand
from tests.ir.samples.sparse import sparse_rand
from tests.torch_oracle import assert_close_to_torch, requires_torch, to_torch, torch

import kiln.ir.ops  # noqa: F401

# torch 2.13 returns a CSC addmm result whose to_dense() segfaults; kiln's is checked against the dense op only.
TORCH_CRASHES = {("aten.addmm.default", "sparse_csc")}
# Ops torch refuses on every sparse layout (kiln's superset): checked against torch's op on the densified operands.
TORCH_REFUSES = {"aten.convolution.default", "aten.conv1d.default", "aten.conv2d.default", "aten.conv3d.default"}
RULE_OPS = sorted(name for name, opdef in REGISTRY.items() if opdef.sparse is not None)
KINDS = ("strided", *layouts.SPARSE_KINDS[:-1])


def as_layout(dense: np.ndarray, kind: str):
    if kind == "strided":
        return dense
    options = {"blocksize": (2, 2)} if kind in ("sparse_bsr", "sparse_bsc") else {}
    return layouts.from_dense(dense, kind, **options)


def dense_of(value):
    return value.to_dense() if isinstance(value, SparseArray) else value


def argument_sets(name: str, rng: np.random.Generator):
    """(args, kwargs) per layout combination for op `name`: every sparse layout in every tensor position."""
    opdef = REGISTRY[name]
    if opdef.sparse.mode == "values":
        dense = sparse_rand(rng, 4, 6) * np.float32(0.3)  # inside every function's domain (asin, atanh, erfinv)
        extra = {"aten.mul.Scalar": (2.5,), "aten.div.Scalar": (4.0,)}.get(name, ())
        kwargs = {"dtype": dtypes.float64} if name == "aten._to_copy.default" else {}
        for kind in KINDS[1:]:
            yield (as_layout(dense, kind), *extra), kwargs
        return
    if name in TORCH_REFUSES:  # a weight with its taps as dense dims (hybrid), as `sparsify` stores a conv's
        spatial = {"aten.conv1d.default": 1, "aten.conv3d.default": 3}.get(name, 2)
        x, bias = rand(rng, 2, 4, *[5] * spatial), rand(rng, 6)
        weight = sparse_rand(rng, 6, 4 * 3 ** spatial).reshape(6, 4, *[3] * spatial)
        conv = [[1] * spatial, [1] * spatial, [1] * spatial]
        options = [[2] * spatial, [1] * spatial, [1] * spatial] if name == "aten.convolution.default" else conv
        tail = [False, [0] * spatial, 1] if name == "aten.convolution.default" else [1]
        for kind in KINDS[1:]:
            hybrid = {} if kind == "sparse_coo" else {"dense_dim": spatial}
            if kind in ("sparse_bsr", "sparse_bsc"):
                hybrid["blocksize"] = (2, 2)
            yield [x, layouts.from_dense(weight, kind, **hybrid), bias, *options, *tail], {}
        return
    shapes = {"aten.mm.default": [(4, 6), (6, 8)], "aten.matmul.default": [(4, 6), (6, 8)],
              "aten.addmm.default": [(4, 8), (4, 6), (6, 8)], "aten.linear.default": [(4, 6), (8, 6), (8,)],
              "aten.add.Tensor": [(4, 6), (4, 6)], "aten.sub.Tensor": [(4, 6), (4, 6)],
              "aten.mul.Tensor": [(4, 6), (4, 6)]}[name]
    arrays = [sparse_rand(rng, *shape) if len(shape) == 2 else rand(rng, *shape) for shape in shapes]
    for first in KINDS:
        for second in KINDS:
            kinds = ["strided"] * len(arrays)
            kinds[-2], kinds[-1] = first, second
            if name == "aten.addmm.default":
                kinds = [first if first != "strided" else "strided", first, second]
            if name == "aten.linear.default":
                kinds = ["strided", first, "strided"] if second == "strided" else None
            if kinds is None or all(k == "strided" for k in kinds):
                continue
            yield [as_layout(a, k) if a.ndim == 2 else a for a, k in zip(arrays, kinds)], {}


@requires_torch
@pytest.mark.parametrize("name", RULE_OPS)
def test_sparse_rule_against_torch(name):
    rng = np.random.default_rng(0)
    opdef = REGISTRY[name]
    namespace, op_name, overload = name.split(".")
    torch_op = getattr(getattr(torch.ops.aten, op_name), overload)
    checked_against_torch = 0
    for args, kwargs in argument_sets(name, rng):
        where = f"{name} on ({', '.join(getattr(a, 'layout', 'strided').__str__() for a in args)})"
        first_kind = getattr(args[0], "layout", layouts.STRIDED_LAYOUT).kind
        try:
            if name in TORCH_REFUSES:
                with pytest.raises(RuntimeError):
                    torch_op(*to_torch(list(args)), **to_torch(kwargs))
                args_for_torch = [dense_of(a) for a in args]
            else:
                args_for_torch = args
            expected = None if (name, first_kind) in TORCH_CRASHES else \
                torch_op(*to_torch(list(args_for_torch)), **to_torch(kwargs))
        except (RuntimeError, NotImplementedError):
            expected = None
        try:
            actual = OpOverload(opdef)(*args, **kwargs)
        except kiln.KilnError:
            assert expected is None, f"{where}: kiln refuses what torch computes"
            continue
        if expected is not None:
            assert_close_to_torch(actual, expected, where=where)
            checked_against_torch += 1
        dense_result = OpOverload(opdef)(*[dense_of(a) for a in args], **kwargs)
        np.testing.assert_allclose(dense_of(actual), dense_result, rtol=1.3e-6, atol=1e-5, err_msg=where)
    assert checked_against_torch, f"{name}: no layout combination was compared with torch"

