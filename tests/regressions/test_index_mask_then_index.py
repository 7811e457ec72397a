"""index.Tensor with a 2-D mask and then one more index on a 2-D tensor: the mask indexes two dims, so three are
needed, and ATen refuses it; kiln's meta rule counted one dim per index and the interpreter then crashed
(IndexError). The meta rule counts the dims masks take (kiln/ir/ops/indexing.py)."""

import pytest

import kiln
from kiln.ir.errors import ShapeError
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType

aten = ops.aten


@pytest.mark.parametrize("shape", [[5, 0], [2, 3]])
def test_a_mask_and_an_index_past_the_rank_are_refused(shape):
    builder = GraphBuilder()
    x = builder.add_input('x', TensorType.of(shape, kiln.float32))
    mask = builder.add_input('mask', TensorType.of(shape, kiln.bool))
    index = builder.add_input('index', TensorType.of([1], kiln.int64))
    with builder, pytest.raises(ShapeError, match="too many indices for tensor of dimension 2 \\(got 3\\)"):
        aten.index.Tensor(x, [mask, index])
