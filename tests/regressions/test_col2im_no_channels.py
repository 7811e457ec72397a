"""col2im of an input with no columns ([0, L] or [N, 0, L]): ATen refuses it ("non-zero dimensions for input"),
kiln returned an empty [(N,) 0, H, W], which onnxruntime's Col2Im then refused. kiln's meta rule now refuses it
as ATen does; a batch of 0 stays valid in both. Found by a differential fuzz run (seed 9800)."""

import numpy as np
import pytest

import kiln
from kiln.ir import ShapeError
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program
from tests.torch_oracle import requires_torch, torch

aten = ops.aten
ARGS = ([3, 3], [2, 2], [1, 1], [0, 0], [1, 1])


def _program(shape):
    builder = GraphBuilder()
    x = builder.add_input("x", TensorType.of(shape, kiln.float32))
    with builder:
        folded = aten.col2im.default(x, *ARGS)
    return builder.build([folded])


@requires_torch
@pytest.mark.parametrize("shape", [[0, 4], [2, 0, 4]])
def test_col2im_of_no_columns_is_refused_as_in_aten(shape):
    with pytest.raises(RuntimeError, match="non-zero dimensions for input"):
        torch.ops.aten.col2im(torch.zeros(shape), *ARGS)
    with pytest.raises(ShapeError, match="non-zero dimensions for input"):
        _program(shape)


@requires_torch
def test_col2im_of_an_empty_batch_is_empty():
    expected = torch.ops.aten.col2im(torch.zeros([0, 4, 4]), *ARGS)
    program = _program([0, 4, 4])
    values = np.zeros([0, 4, 4], np.float32)
    assert program(values).shape == tuple(expected.shape)
    check_program(program, [values], backends=["onnx"])
