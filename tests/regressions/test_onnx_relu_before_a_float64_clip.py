"""A relu before a hardtanh (or clamp) in float64: onnxruntime's load-time FuseReluClip rule raised "Unexpected data
type for Clip 'min' input of 11" and the session did not load. kiln's ONNX cleanup now folds the Relu into the
Clip's lower bound itself, for every dtype. Found by the differential fuzzer (seed 9400, 2080 programs)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten
CLAMPS = [  # after a relu: the Clip's lower bound becomes max(bound, 0)
    lambda x: aten.hardtanh.default(x, 0, 5),
    lambda x: aten.hardtanh.default(x, -1.0, 1.0),
    lambda x: aten.clamp.default(x, None, 2.0),
    lambda x: aten.clamp.default(x, 0.5, None),
    lambda x: aten.clamp.default(x, 3.0, 1.0),  # crossed bounds: ATen gives the upper one everywhere
]


@pytest.mark.parametrize("dtype", [kiln.float64, kiln.float32])
@pytest.mark.parametrize("clamp", CLAMPS)
def test_relu_then_clip_loads_and_computes_aten(dtype, clamp):
    builder = GraphBuilder()
    x = builder.add_input('x', TensorType.of([3, 4], dtype))
    with builder:
        result = aten.unsqueeze.default(clamp(aten.relu.default(x)), 0)
    program = builder.build([result])
    assert [node.op_type for node in kiln.onnx.export(program).model_proto.graph.node] == ["Clip", "Unsqueeze"]
    x = np.random.default_rng(0).standard_normal((3, 4)) * 3
    x[0, :3] = [np.nan, np.inf, -np.inf]
    check_program(program, [x.astype(dtype.numpy)], backends=("onnx",))


def test_a_relu_read_elsewhere_stays():
    builder = GraphBuilder()
    x = builder.add_input('x', TensorType.of([3, 4], kiln.float64))
    with builder:
        relu = aten.relu.default(x)
        clipped = aten.hardtanh.default(relu, 0, 5)
    program = builder.build([relu, clipped])
    assert sorted(node.op_type for node in kiln.onnx.export(program).model_proto.graph.node) == ["Clip", "Relu"]
    check_program(program, [np.random.default_rng(1).standard_normal((3, 4)) * 4], backends=("onnx",))
