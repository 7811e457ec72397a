"""conv2d(padding='same') whose kernel size is symbolic: the padding is then symbolic too, and the C renderer's
direct convolution took it as an int (sympy's TypeError: cannot convert symbols to int). It renders the padding as a
C expression over the symbols now (kiln/codegen/c/render.py)."""

import numpy as np

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


def test_same_padding_with_a_symbolic_kernel_size():
    builder = GraphBuilder()
    s0 = builder.shape_env.create_symbol(3, name='s0', min=1, max=8)
    x = builder.add_input('x', TensorType.of([1, 2, 6, 7], kiln.float32))
    w = builder.add_input('w', TensorType.of([3, 2, s0, s0], kiln.float32))
    with builder:
        y = aten.conv2d.padding(x, w, None, [1, 1], 'same', [1, 2])
    program = builder.build([y])
    rng = np.random.default_rng(0)
    for size in (3, 4):  # odd and even kernels (even: more padding after than before)
        inputs = [rng.standard_normal((1, 2, 6, 7)).astype(np.float32),
                  rng.standard_normal((3, 2, size, size)).astype(np.float32)]
        check_program(program, inputs, backends=("c", "torch"))  # (ONNX has no symbolic pads)
