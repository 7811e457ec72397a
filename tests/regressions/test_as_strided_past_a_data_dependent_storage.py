"""as_strided of nonzero's result (rows known only at run time) with sizes and strides reaching past its storage:
the meta rule cannot decide the bound for a data-dependent size, and the interpreter's kernel took numpy's
as_strided, which read whatever memory lay past the array (the fuzzer's torch and .pt2 backends then disagreed
with it, and onnxruntime's Gather refused the index). The kernel now checks the bound at run time and raises
ShapeError, as torch raises "setStorage: ... out of bounds". Found by the differential fuzzer (seed 9100)."""

import numpy as np
import pytest

import kiln
from kiln.ir.errors import ShapeError
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType

aten = ops.aten


def _program():
    builder = GraphBuilder()
    x0 = builder.add_input("x0", TensorType.of([20], kiln.float32))
    with builder:
        v0 = aten.nonzero.default(x0)
        v1 = aten.as_strided.default(v0, [4], [5], 1)
    return builder.build([v1])


def test_a_window_past_the_storage_raises_like_torch():
    torch = pytest.importorskip("torch")
    x = np.zeros(20, np.float32)
    x[[3, 11]] = 1.0  # two rows of nonzero: a storage of 2 elements, the window reaches element 16
    with pytest.raises(ShapeError, match="reach element 16 of a storage of 2 elements"):
        _program()(x)
    with pytest.raises(RuntimeError, match="out of bounds for storage"):
        torch.as_strided(torch.nonzero(torch.from_numpy(x)), [4], [5], 1)


def test_a_window_inside_the_storage_matches_torch():
    torch = pytest.importorskip("torch")
    x = np.arange(20, dtype=np.float32) % 7  # 17 nonzero rows: element 16 is the last
    expected = torch.as_strided(torch.nonzero(torch.from_numpy(x)), [4], [5], 1).numpy()
    np.testing.assert_array_equal(_program()(x), expected)
