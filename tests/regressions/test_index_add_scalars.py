"""index_add with 0-d tensors and empty indices, as ATen checks them. kiln took a 0-d self and source with no
indices (torch refuses: a 0-d source takes exactly one index), and its decomposition then expanded the empty index
to the source's one element: the ONNX and C backends failed in the `decompose` pass with an expand error. The meta
rule now makes ATen's checks in ATen's order, with its messages (kiln/ir/ops/indexing.py `_index_add_check`).
Found by the differential fuzzer (seed 7373)."""

import numpy as np
import pytest
import torch

from kiln.ir.errors import KilnError
from kiln.ir.registry import ops

aten = ops.aten


@pytest.mark.parametrize("self_shape, dim, index, source_shape", [
    ((), 0, [], ()),
    ((), 0, [0], (1,)),
    ((3,), 0, [1], ()),
    ((2, 3), 1, [1], (2,)),
    ((2, 3), 1, [1, 2], (3, 2)),
    ((2, 3), 0, [1], (1, 3, 1)),
    ((2, 3), 1, [1], (2, 3)),
], ids=["0-d, no index", "0-d self, 1-d source", "0-d source, 1-d self", "source lacks the dim",
        "other shape outside the dim", "source of higher rank", "index count"])
def test_what_torch_refuses_kiln_refuses_with_its_message(self_shape, dim, index, source_shape):
    destination, source = np.zeros(self_shape, np.float32), np.ones(source_shape, np.float32)
    positions = np.array(index, np.int64)
    with pytest.raises((RuntimeError, IndexError)) as refused:
        torch.from_numpy(destination).index_add(dim, torch.from_numpy(positions), torch.from_numpy(source))
    with pytest.raises(KilnError) as kiln_refused:
        aten.index_add.default(destination, dim, positions, source)
    assert str(refused.value).splitlines()[0] in str(kiln_refused.value)


@pytest.mark.parametrize("self_shape, index, source_shape", [
    ((), [0], ()), ((4,), [1, 1], (2,)), ((2, 3), [2], (2, 1))])
def test_what_torch_takes_kiln_computes_alike(self_shape, index, source_shape):
    rng = np.random.default_rng(0)
    destination = rng.standard_normal(self_shape).astype(np.float32)
    source = rng.standard_normal(source_shape).astype(np.float32)
    positions, dim = np.array(index, np.int64), len(self_shape) - 1 if self_shape else 0
    expected = torch.from_numpy(destination).index_add(dim, torch.from_numpy(positions), torch.from_numpy(source))
    torch.testing.assert_close(torch.from_numpy(np.asarray(aten.index_add.default(destination, dim, positions,
                                                                                  source))), expected)
