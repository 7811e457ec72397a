"""index_copy with a 0-d source. ATen compares the shapes outside the dim, a 0-d tensor's being empty, so a scalar
source fits a 1-D destination only; kiln took one into a [2, n] destination (one index, one element) and the
interpreter then failed to reshape it ("cannot reshape array of size 1 into shape (1,4)"). The meta rule now makes
ATen's checks in ATen's order (kiln/ir/ops/indexing.py `_index_copy_check`). Found by the differential fuzzer
(seed 7373)."""

import numpy as np
import pytest
import torch

from kiln.ir.errors import KilnError
from kiln.ir.registry import ops

aten = ops.aten


@pytest.mark.parametrize("self_shape, index, source_shape", [
    ((2, 4), [1], ()),
    ((3,), [1, 2], ()),
    ((), [0], (1, 1)),
    ((2, 3, 4), [0], (1, 4, 4)),
], ids=["scalar into a matrix", "scalar with two indices", "matrix into a scalar", "other slice shape"])
def test_what_torch_refuses_kiln_refuses_with_its_message(self_shape, index, source_shape):
    destination, source = np.zeros(self_shape, np.float32), np.ones(source_shape, np.float32)
    positions = np.array(index)
    with pytest.raises((RuntimeError, IndexError)) as refused:
        torch.from_numpy(destination).index_copy(0, torch.from_numpy(positions), torch.from_numpy(source))
    with pytest.raises(KilnError) as kiln_refused:
        aten.index_copy.default(destination, 0, positions, source)
    assert str(refused.value).splitlines()[0] in str(kiln_refused.value)
