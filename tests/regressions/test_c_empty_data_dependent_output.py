"""An output whose shape holds a data-dependent size but whose element count does not: `nonzero` of a 0-d tensor is
[u0, 0], with zero elements whatever u0 is. The C backend allocates such outputs once the run has read their size
(kiln_bound), and found no size to wait for: compiling failed with KeyError: None. kiln_run now allocates them
itself (kiln/codegen/c/render.py `_allocate_while_running`). Found by the differential fuzzer (seed 7373)."""

import numpy as np
import pytest
import torch

import kiln
from kiln.compiler import compile as compile_c
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


def _program():
    builder = GraphBuilder()
    x = builder.add_input("x", TensorType.of([], kiln.float32))
    y = builder.add_input("y", TensorType.of([2, 3], kiln.float32))
    with builder:
        found = aten.nonzero.default(x)
        summed = aten.cumsum.default(aten.unsqueeze.default(found, 1), 2)
        scaled = aten.mul.Scalar(y, 2.0)
    return builder.build([found, summed, scaled])


@pytest.mark.parametrize("value", [2.5, 0.0])
def test_empty_outputs_of_data_dependent_shape_compile_and_run(value, tmp_path):
    x, y = np.array(value, np.float32), np.arange(6, dtype=np.float32).reshape(2, 3)
    compiled = compile_c(_program(), output=tmp_path / "pkg")
    found, summed, scaled = compiled(x, y)
    expected = torch.nonzero(torch.tensor(value))
    assert found.shape == tuple(expected.shape) and found.dtype == np.int64
    assert summed.shape == (expected.shape[0], 1, 0)
    np.testing.assert_array_equal(scaled, 2 * y)


def test_the_fuzzers_program_agrees_on_every_c_capability():
    x, y = np.array(2.5, np.float32), np.arange(6, dtype=np.float32).reshape(2, 3)
    check_program(_program(), [x, y], backends=("c[DEFAULT]", "c[AVX2]"))
