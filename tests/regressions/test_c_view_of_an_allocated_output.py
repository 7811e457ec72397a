"""An output sized while running that is a view of its buffer in another shape (`x[mask].reshape(-1, 2, 2, 5)`):
the C package handed the caller the buffer's shape, [u0, 4, 5], where the output is [u0, 2, 2, 5], so Python read
a rank-4 array of shape [2, 4, 5, 0]. kiln_run now reports the output's own shape (kiln/codegen/c/render.py,
_hand_over). Found by the differential fuzzer (seed 12121)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from tests.fuzz.differential import check_program
from tests.torch_oracle import requires_torch, torch
from kiln.ir.types import TensorType

aten = ops.aten

VIEWS = {
    "reshape": lambda v: aten.reshape.default(v, [v.type.shape[0], 2, 2, 5]),
    "unsqueeze": lambda v: aten.unsqueeze.default(v, 0),
    "flatten": lambda v: aten.reshape.default(v, [-1]),
}
TORCH_VIEWS = {"reshape": lambda t: t.reshape(-1, 2, 2, 5), "unsqueeze": lambda t: t.unsqueeze(0),
               "flatten": lambda t: t.reshape(-1)}


def _program(view):
    builder = GraphBuilder()
    x = builder.add_input('x', TensorType.of([3, 4, 5], kiln.float32))
    mask = builder.add_input('mask', TensorType.of([3], kiln.bool))
    with builder:
        selected = aten.index.Tensor(x, [mask])
        result, other = VIEWS[view](selected), aten.relu.default(selected)
    return builder.build([result, other])


@requires_torch
@pytest.mark.parametrize("view", sorted(VIEWS))
@pytest.mark.parametrize("mask", [[True, True, False], [False, False, False], [True, True, True]])
def test_a_view_of_an_output_sized_while_running_keeps_its_shape(view, mask):
    x = np.random.default_rng(0).standard_normal((3, 4, 5)).astype(np.float32)
    mask = np.array(mask)
    program = _program(view)
    expected = TORCH_VIEWS[view](torch.from_numpy(x)[torch.from_numpy(mask)])
    np.testing.assert_array_equal(program(x, mask)[0], expected.numpy())  # the interpreter is torch's
    check_program(program, [x, mask], backends=["c[DEFAULT]"])
