"""One value returned as two outputs, each under its own name (cumsum of a 0-d tensor passes its input on, so both
cumsums are asin's value): the first output took the value's name, renaming the node that produced it, and the
second output's Identity still read the old name, which no node produced any more ("Node input 'asin' is not a graph
input, initializer, or output of a previous node"). Later outputs now read the value under its new name. Found by the
differential fuzzer (seed 9101)."""

import numpy as np

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program

aten = ops.aten


def test_a_value_returned_twice_under_two_names():
    builder = GraphBuilder()
    x0 = builder.add_input("x0", TensorType.of([], kiln.int64))
    with builder:
        v0 = aten.asin.default(x0)
        v1 = aten.cumsum.default(v0, -1)
        v2 = aten.cumsum.default(v0, 0)
    program = builder.build([v1, v2])
    check_program(program, [np.array(6, np.int64)], backends=("onnx",))


def test_a_module_returning_one_tensor_twice_under_given_names():
    """The same through kiln.onnx.export: output_names renames the value's producer for the first output."""
    class Twice(kiln.nn.Module):
        def forward(self, x):
            y = (x * 2).relu()
            return y, y

    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    exported = kiln.onnx.export(Twice(), (kiln.tensor(x),), output_names=["first", "second"])
    assert [o.name for o in exported.model_proto.graph.output] == ["first", "second"]
    report = exported.verify(kiln.Tensor(x))
    assert report.ok, str(report)
