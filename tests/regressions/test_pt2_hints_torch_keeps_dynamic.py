"""A symbol whose hint makes a derived size 0 or 1 came back from torch.export.load as a constant: torch's loader
guards on a 0/1 hint (its 0/1 specialization), so a [s0, 1, s0] input sliced `[..., 2::3]` (size s0 // 3, 0 at
the hint 2) was read as [2, 1, 2], and torch refused the run at s0 = 5 ("Expected input at *args[0].shape[0] to be
equal to 2"). The writer now picks hints under which no symbolic size is 0 or 1, keeping the runtime assertions
true. Found by the differential fuzzer (seed 9100, 4 programs)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten
torch = pytest.importorskip("torch")


def _strided_slice_program():
    builder = GraphBuilder()
    s0 = builder.shape_env.create_symbol(2, name='s0', min=2, max=16)
    x0 = builder.add_input('x0', TensorType.of([s0, 1, s0], kiln.int8))
    with builder:
        picked = aten.slice.Tensor(x0, -1, 2, 9223372036854775807, 3)
        negated = aten.neg.default(picked)
    return builder.build([negated])


def test_a_symbol_whose_hint_makes_a_size_zero_stays_dynamic_in_torch(tmp_path):
    program = _strided_slice_program()
    assert program.hints == {next(iter(program.hints)): 2}  # the case needs the 0 hint of s0 // 3
    kiln.save(program, tmp_path / "model.pt2")
    loaded = torch.export.load(tmp_path / "model.pt2")
    placeholder = next(node for node in loaded.graph.nodes if node.op == "placeholder")
    assert all(isinstance(size, torch.SymInt) for size in placeholder.meta["val"].shape[::2])
    for size in (2, 5, 16):
        check_program(program, [np.arange(size * size, dtype=np.int8).reshape(size, 1, size)],
                      backends=("torch", "pt2"))
