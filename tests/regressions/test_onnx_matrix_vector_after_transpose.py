"""A matrix-vector product of a transposed matrix in ONNX. onnxruntime 1.32 fuses Transpose + MatMul into FusedMatMul
(its MatmulTransposeFusion, from ORT_ENABLE_EXTENDED on), which ignores the transpose when the other operand is 1-D:
A^T v came out as A's elements read as [K, M] times v, and `aten.matmul(A.t(), v)` from kiln's file was wrong in
onnxruntime. kiln writes a 1-D second operand after a matrix as a column [K, 1] and squeezes the result
(kiln/codegen/onnx/composites.py `_matmul`). Found by the differential fuzzer (seed 7373)."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from kiln.testing import assert_close
from tests.fuzz.differential import check_program

aten = ops.aten


def test_onnxruntime_itself_drops_the_transpose_before_a_matrix_vector_product():
    """The fusion's fault, shown on a two-node file (if onnxruntime fixes it, the workaround can go)."""
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["a"], ["t"], perm=[1, 0]), helper.make_node("MatMul", ["t", "v"], ["y"])],
        "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3]),
              helper.make_tensor_value_info("v", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]).SerializeToString()
    a, v = np.arange(6, dtype=np.float32).reshape(2, 3), np.array([1, 10], np.float32)
    fused = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"a": a, "v": v})[0]
    unfused = ort.InferenceSession(model, providers=["CPUExecutionProvider"],
                                   disabled_optimizers=["MatmulTransposeFusion"]).run(None, {"a": a, "v": v})[0]
    np.testing.assert_array_equal(unfused, a.T @ v)
    assert not np.array_equal(fused, a.T @ v)


@pytest.mark.parametrize("shape, perm", [([2, 3], [1, 0]), ([4, 2, 3], [0, 2, 1])], ids=["matrix", "batched"])
def test_transposed_matrix_times_vector_matches_in_onnxruntime(shape, perm):
    builder = GraphBuilder()
    a = builder.add_input("a", TensorType.of(shape, kiln.float32))
    v = builder.add_input("v", TensorType.of([shape[-2]], kiln.float32))
    with builder:
        product = aten.matmul.default(aten.permute.default(a, perm), v)
    program = builder.build([product])
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape[-2]).astype(np.float32)]
    check_program(program, inputs, backends=("onnx",))
    assert_close(kiln.onnx.export(program)(*inputs), np.matmul(inputs[0].transpose(perm), inputs[1]))
