"""Writing kiln's functional ops as ops torch runs the same way. (1) A training batch norm whose running statistics
are values the program reads again: kiln's op updates nothing, but kiln wrote it as torch's `batch_norm` with the
statistics, which torch (and kiln's reader, as it must for torch's files) runs as an in-place update, so the later
reader got the updated values (NaN, against sigmoid's 0.73). The writer now leaves the statistics out of a training
batch norm (kiln/ir/serde/writer.py _functional_spelling). (2) An unbind of a 0-size dim has no outputs, and
torch's reader fails on a node without outputs; the writer leaves it out. Found by the differential fuzzer (seed
900, seed 800)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


@pytest.mark.parametrize("op", ["batch_norm", "_native_batch_norm_legit"])
def test_training_batch_norm_leaves_its_statistics_alone(op):
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of([4, 3, 5], kiln.float32))
    x1 = builder.add_input('x1', TensorType.of([3], kiln.float32))
    with builder:
        stats = aten.silu.default(x1)
        if op == "batch_norm":
            out = aten.batch_norm.default(x0, stats, stats, stats, stats, True, 0.1, 1e-05, True)
        else:
            out = aten._native_batch_norm_legit.default(x0, stats, stats, stats, stats, True, 0.1, 1e-05)[0]
        later = aten.transpose.int(stats, 0, 0)
    program = builder.build([out, later])
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((4, 3, 5)).astype(np.float32), np.array([1.0, -0.5, 2.0], np.float32)]
    check_program(program, inputs, backends=("pt2", "torch"))


def test_unbind_of_an_empty_dim_round_trips():
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of([0, 3], kiln.float32))
    with builder:
        parts = aten.unbind.int(x0, 0)
        out = aten.relu.default(x0)
    assert list(parts) == []
    program = builder.build([out])
    check_program(program, [np.zeros((0, 3), np.float32)], backends=("pt2", "torch"))
