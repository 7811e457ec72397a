"""_embedding_bag in max mode with NaN rows: ATen scans a bag from its first row and takes each strictly greater one,
so a NaN is the result only where it comes first, and otherwise the bag's largest number wins with its first row.
kiln's interpreter and backends had propagated any NaN (naming the bag's last index, or another bag's), and the
interpreter gave an empty index list's result the wrong shape. Found by a differential fuzz run (seed 9800)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program
from tests.torch_oracle import requires_torch, torch

aten = ops.aten
SPECIALS = [np.nan, -np.inf, np.inf, -0.0, 0.0, 1.0, -1.0, 2.0]


def _bags(rows: int, columns: int, count: int, bags: int, padding_idx: int):
    builder = GraphBuilder()
    weight = builder.add_input("weight", TensorType.of([rows, columns], kiln.float64))
    indices = builder.add_input("indices", TensorType.of([count], kiln.int64))
    offsets = builder.add_input("offsets", TensorType.of([bags], kiln.int64))
    with builder:
        out = aten._embedding_bag.default(weight, indices, offsets, False, 2, False, None, False, padding_idx)
    return builder.build([out[0], out[3]])


@requires_torch
@pytest.mark.parametrize("seed", range(4))
def test_max_bags_with_nan_follow_aten(seed):
    rng = np.random.default_rng(seed)
    for _ in range(40):
        count, bags, padding_idx = int(rng.integers(0, 9)), int(rng.integers(1, 4)), int(rng.choice([-1, 2]))
        weight = rng.choice(SPECIALS, size=(6, 3))
        indices = rng.integers(0, 6, count)
        offsets = np.sort(rng.integers(0, count + 1, bags))
        offsets[0] = 0
        program = _bags(6, 3, count, bags, padding_idx)
        output, max_indices = torch.ops.aten._embedding_bag.default(
            *map(torch.from_numpy, (weight, indices, offsets)), False, 2, False, None, False, padding_idx)[::3]
        got_output, got_indices = program(weight, indices, offsets)
        np.testing.assert_array_equal(got_output, output.numpy())
        np.testing.assert_array_equal(np.signbit(got_output), np.signbit(output.numpy()))
        np.testing.assert_array_equal(got_indices, max_indices.numpy())


@requires_torch
def test_backends_agree_on_max_bags_with_nan():
    weight = np.array([[1.0, 2.0], [np.nan, 5.0], [3.0, np.nan], [0.5, -0.0], [0.0, np.inf]])
    indices, offsets = np.array([0, 1, 2, 2, 3, 1, 3, 4]), np.array([0, 3, 6])
    program = _bags(5, 2, 8, 3, -1)
    output, max_indices = torch.ops.aten._embedding_bag.default(
        *map(torch.from_numpy, (weight, indices, offsets)), False, 2, False, None, False, -1)[::3]
    assert np.isnan(output[1, 1]) and not np.isnan(output[0]).any()  # NaN first in bag 1 only
    np.testing.assert_array_equal(program(weight, indices, offsets)[1], max_indices.numpy())
    check_program(program, [weight, indices, offsets], backends=("c[DEFAULT]", "c", "onnx", "triton"))
