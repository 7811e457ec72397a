"""Bad input raises KilnError subclasses with a clear cause, never AssertionError/IndexError."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import kiln
from kiln.ir import KilnError, OpArgumentError, ShapeError, UnknownOpError, lookup
from kiln.ir.registry import REGISTRY, OpOverload
from tests.ir.samples import SAMPLES

aten = kiln.ops.aten


def test_unknown_op_suggests_close_names():
    with pytest.raises(UnknownOpError, match="unknown op 'aten.relux.default'") as info:
        lookup("aten.relux.default")
    assert "aten.relu.default" in str(info.value)
    with pytest.raises(UnknownOpError):
        aten.definitely_not_an_op
    with pytest.raises(UnknownOpError):
        aten.relu.no_such_overload


def test_wrong_argument_types():
    x = np.ones((2, 3), np.float32)
    with pytest.raises(OpArgumentError, match="'other' must be a tensor"):
        aten.add.Tensor(x, [1, 2, 3])
    with pytest.raises(OpArgumentError, match="'other' must be Scalar"):
        aten.add.Scalar(x, "2")
    with pytest.raises(OpArgumentError, match="'size' must be SymInt"):
        aten.view.default(x, 6)
    with pytest.raises(OpArgumentError, match="missing argument"):
        aten.mm.default(x)
    with pytest.raises(KilnError, match="unsupported dtype"):
        aten.relu.default(np.array(["a", "b"]))


def test_incompatible_shapes():
    broadcast = r"(?s)aten.add.Tensor: shapes \[\[3\], \[4\]\] cannot be broadcast.*fix: make the sizes equal"
    with pytest.raises(ShapeError, match=broadcast):
        aten.add.Tensor(np.ones(3, np.float32), np.ones(4, np.float32))
    with pytest.raises(ShapeError, match="cannot be multiplied"):
        aten.mm.default(np.ones((2, 3), np.float32), np.ones((4, 5), np.float32))
    with pytest.raises(ShapeError, match="invalid for input of size 6"):
        aten.view.default(np.ones((2, 3), np.float32), [4, -1])


def test_overload_resolution():
    x = np.ones(3, np.float32)
    np.testing.assert_array_equal(aten.add(x, x), np.full(3, 2, np.float32))
    np.testing.assert_array_equal(aten.add(x, 2), np.full(3, 3, np.float32))
    with pytest.raises(OpArgumentError, match="no overload of aten.add"):
        aten.add(x, x, x, x)


class _Junk:
    pass


@pytest.mark.parametrize("name", sorted(n for n in REGISTRY if n in SAMPLES))
def test_every_op_refuses_junk_arguments_with_kiln_errors(name):
    """Swap each argument of an op's first sample for a junk object: a KilnError, never a Python crash."""
    opdef = REGISTRY[name]
    sample = next(iter(SAMPLES[name](np.random.default_rng(0))))
    bound = opdef.schema.bind(copy.deepcopy(sample.args), copy.deepcopy(sample.kwargs))
    for index, argument in enumerate(opdef.schema.arguments):
        if argument.type.base in ("Layout", "Device", "MemoryFormat", "Generator"):
            continue  # accepted as given and ignored, like torch on CPU
        broken = list(copy.deepcopy(bound))
        broken[index] = _Junk()
        with pytest.raises(KilnError):
            try:
                OpOverload(opdef)(*broken)
            except (AssertionError, IndexError) as crash:  # pragma: no cover - the failure we look for
                pytest.fail(f"{name}: junk for '{argument.name}' raised {type(crash).__name__}: {crash}")

