"""cat of legacy 1-D empty tensors only, along a dim past their rank (ATen skips such inputs, so any dim goes): the
C scheduler indexed the dim into each input's shape (IndexError). With every input skipped, the [0] result takes
no copy (kiln/codegen/schedule.py)."""

import numpy as np

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


def test_cat_of_legacy_empty_tensors_along_a_later_dim():
    builder = GraphBuilder()
    a = builder.add_input('a', TensorType.of([0], kiln.int32))
    b = builder.add_input('b', TensorType.of([0], kiln.int64))
    with builder:
        y = aten.cat.default([a, b], 3)
    program = builder.build([y])
    inputs = [np.zeros(0, np.int32), np.zeros(0, np.int64)]
    result = program(*inputs)
    assert result.shape == (0,) and result.dtype == np.int64
    check_program(program, inputs, backends=("c", "onnx", "torch"))
