"""amax / amin / argmax / max.dim of int16 in ONNX: onnxruntime's ReduceMax, ReduceMin, ArgMax and ArgMin have no
int16 kernels, and the model was refused as invalid ("Type 'tensor(int16)' of input parameter ... of operator
(ReduceMax) ... is invalid"). They now compute in int32 (kiln/codegen/onnx/lowerings.py _ordered_compute_dtype).
Found by the differential fuzzer (seed 900)."""

import numpy as np

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


def test_int16_extremes():
    builder = GraphBuilder()
    x0 = builder.add_input('x0', TensorType.of([3, 4], kiln.int16))
    with builder:
        results = [aten.amax.default(x0, [1]), aten.amin.default(x0), aten.argmax.default(x0, 0),
                   aten.argmin.default(x0), *aten.max.dim(x0, 1), *aten.min.dim(x0, 0, True)]
    program = builder.build(results)
    x = np.array([[-32768, 7, 3, 32767], [5, 5, -2, 0], [1, 9, 9, -300]], np.int16)
    check_program(program, [x], backends=("onnx", "torch"))
