"""Every op's meta rule on symbolic shapes: replace the sample's sizes by symbols (hints = the sizes) and
check the symbolic result, evaluated at the hints, equals the meta result on the concrete shapes."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from kiln.ir import dtypes
from kiln.ir.registry import REGISTRY, run_meta
from kiln.ir.sparse import SparseArray
from kiln.ir.symbolic import ShapeEnv, active_shape_env, evaluate_dim
from kiln.ir.types import TensorType
from kiln.ir.verifier import flatten_meta
from tests.ir.samples import SAMPLES


def _typed(value, size_of):
    if isinstance(value, (np.ndarray, SparseArray)):
        return TensorType.of([size_of(d) for d in value.shape], dtypes.dtype(value.dtype),
                             getattr(value, "layout", None))
    if isinstance(value, list):
        return [_typed(v, size_of) for v in value]
    return value


@pytest.mark.parametrize("name", sorted(n for n in REGISTRY if n in SAMPLES))
def test_meta_rule_is_correct_on_symbolic_shapes(name):
    opdef = REGISTRY[name]
    for sample in list(SAMPLES[name](np.random.default_rng(0)))[:3]:
        bound = opdef.schema.bind(copy.deepcopy(sample.args), copy.deepcopy(sample.kwargs))
        tensor_args = [a.type.is_tensor for a in opdef.schema.arguments]
        concrete = [_typed(v, int) if is_tensor else v for is_tensor, v in zip(tensor_args, bound)]
        try:
            expected = flatten_meta(opdef.meta(*concrete))
        except Exception:  # samples that exercise errors are covered by the eager tests
            continue
        env = ShapeEnv()
        symbols: dict[int, object] = {}

        def size_of(size: int) -> object:
            if size <= 1:  # 0 and 1 stay static: broadcasting and emptiness are decided by them
                return size
            if size not in symbols:
                symbols[size] = env.create_symbol(size, min=2)
            return symbols[size]

        symbolic = [_typed(v, size_of) if is_tensor else v for is_tensor, v in zip(tensor_args, bound)]
        with active_shape_env(env):
            got = flatten_meta(run_meta(opdef, symbolic))
        bindings = {sym: size for size, sym in symbols.items()}
        for result, reference in zip(got, expected):
            if not isinstance(reference, TensorType):
                continue
            assert result.dtype is reference.dtype, f"{name} {sample}: {result} vs {reference}"
            for dim, want in zip(result.shape, reference.shape):
                if isinstance(dim, int) or not any(str(s).startswith("u") for s in dim.free_symbols):
                    assert evaluate_dim(dim, bindings) == want, f"{name} {sample}: {result} vs {reference}"
