"""Slices whose start is computed from a symbolic size, as ALiBi biases are cut to the sequence (Hugging Face's MPT:
`bias[:, max(0, 1 - s):, max(0, 64 - s):]`; others write `bias[..., -s:]`). Both ran on the interpreter and ONNX
and went wrong in C:

- `-s` is negative for every s in range, so ATen wraps it to `64 - s`; the C scheduler decided that sign without
  the program's ranges, took the start as 0 and read the bias's first columns (kiln/codegen/schedule.py).
- torch computes `max(0, 1 - s)` with `torch.sym_max`; the reader kept `Max(0, 1 - s)`, so the slice's dim was
  `1 - Max(0, 1 - s)`, which is 1 for every s >= 1 but not syntactically, and C added the bias without
  broadcasting it. The reader now folds a Min/Max that the ranges decide (kiln/ir/symbolic.py
  `ShapeEnv.simplify`)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


def _bias() -> np.ndarray:
    return np.arange(4 * 64, dtype=np.float32).reshape(4, 1, 64)


@pytest.mark.parametrize("size", [2, 5, 32])
def test_a_bias_cut_to_the_last_s_columns(size):
    builder = GraphBuilder()
    s0 = builder.shape_env.create_symbol(8, name="s0", min=2, max=32)
    x = builder.add_input("x", TensorType.of([2, 4, s0, s0], kiln.float32))
    bias = builder.add_input("bias", TensorType.of([4, 1, 64], kiln.float32))
    with builder:
        y = aten.add.Tensor(x, aten.slice.Tensor(bias, 2, -s0))
    program = builder.build([y])
    values = np.random.default_rng(size).standard_normal((2, 4, size, size)).astype(np.float32)
    np.testing.assert_array_equal(program(values, _bias()), values + _bias()[:, :, -size:])
    check_program(program, [values, _bias()], backends=("c", "onnx"))


def test_an_alibi_bias_cut_with_sym_max(tmp_path):
    torch = pytest.importorskip("torch")

    class AlibiLike(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("bias", torch.from_numpy(_bias()))

        def forward(self, scores):
            length = scores.shape[-1]
            return scores + self.bias[:, max(0, self.bias.shape[1] - length):, max(0, 64 - length):]

    model = AlibiLike()
    length = torch.export.Dim("length", min=2, max=32)
    exported = torch.export.export(model, (torch.zeros(2, 4, 8, 8),), dynamic_shapes=({2: length, 3: length},))
    torch.export.save(exported, tmp_path / "alibi.pt2")
    program = kiln.load(tmp_path / "alibi.pt2")
    slices = [op for op in program.nodes() if op.name == "aten.slice.Tensor"]
    assert list(slices[-1].results[0].type.shape[:2]) == [4, 1]  # folded: the ranges decide the Max
    compiled = kiln.compile(program, output=tmp_path / "package")
    for size in (3, 8, 32):
        scores = torch.randn(2, 4, size, size)
        torch.testing.assert_close(torch.from_numpy(np.asarray(compiled(scores.numpy()))), model(scores))
