"""replication_pad / reflection_pad over a symbolic size: the meta rule can only check what the symbol's range
decides, and the interpreter's kernel did not check again, so a size that was 0 at run time (replication) or not
larger than the padding (reflection) ran in the interpreter while ATen and onnxruntime refuse it. The kernel runs
the meta rule's checks on the concrete shape now (kiln/ir/ops/nn.py)."""

import numpy as np
import pytest
import torch

import kiln
from kiln.ir.errors import InputError, ShapeError
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType

aten = ops.aten


@pytest.mark.parametrize("kind,size,padding", [("replication", 0, [1, 1, 1, 1]), ("reflection", 2, [0, 2, 0, 0]),
                                               ("reflection", 3, [0, 2, 1, 1])])
def test_padding_checks_the_run_time_size(kind, size, padding):
    builder = GraphBuilder()
    s0 = builder.shape_env.create_symbol(4, name='s0', min=0, max=8)
    x = builder.add_input('x', TensorType.of([1, 2, 3, s0], kiln.float32))
    with builder:
        y = getattr(aten, f"{kind}_pad2d").default(x, padding)
    program = builder.build([y])
    values = np.arange(6 * size, dtype=np.float32).reshape(1, 2, 3, size)
    try:
        expected = getattr(torch.ops.aten, f"{kind}_pad2d")(torch.from_numpy(values), padding).numpy()
    except RuntimeError:
        with pytest.raises((ShapeError, InputError)):  # (reflection narrows the range of s0 instead)
            program(values)
        return
    np.testing.assert_array_equal(program(values), expected)
