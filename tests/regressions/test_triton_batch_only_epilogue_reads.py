"""Triton: a GEMM or convolution epilogue that reads a tensor varying only with the batch entry (bmm(a, b) +
c[:, None, None], a per-image scale after a convolution) rendered a masked block load through a scalar pointer,
which Triton refuses ("Mask argument cannot be block type if pointer argument is not a block"). The batch and image
indices now count as scalars in those epilogues (render.matmul_kernel / conv_kernel, attention.py). Found by the
fuzzer."""

import numpy as np

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


def test_bmm_and_conv_epilogues_read_per_batch_values():
    builder = GraphBuilder()
    a = builder.add_input('a', TensorType.of([3, 4, 5], kiln.float32))
    b = builder.add_input('b', TensorType.of([3, 5, 6], kiln.float32))
    c = builder.add_input('c', TensorType.of([3, 1, 1], kiln.float32))
    x = builder.add_input('x', TensorType.of([2, 3, 6, 6], kiln.float32))
    w = builder.add_input('w', TensorType.of([4, 3, 3, 3], kiln.float32))
    s = builder.add_input('s', TensorType.of([2, 1, 1, 1], kiln.float32))
    with builder:
        v0 = aten.add.Tensor(aten.bmm.default(a, b), c)
        v1 = aten.mul.Tensor(aten.convolution.default(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1), s)
    program = builder.build([v0, v1])
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(shape).astype(np.float32)
              for shape in ((3, 4, 5), (3, 5, 6), (3, 1, 1), (2, 3, 6, 6), (4, 3, 3, 3), (2, 1, 1, 1))]
    check_program(program, inputs)
