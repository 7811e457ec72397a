"""A max pool (values only) whose window holds only -inf inputs: ATen's scan gives -inf, onnxruntime's MaxPool
without indices gave the lowest finite float (-3.4e38). The ONNX lowering now pools a mark of the inputs other
than -inf and sets the windows without one to -inf, except after an op whose result cannot be -inf (a relu),
where it keeps the single MaxPool. Found by the differential fuzzer (seed 9400, 1378 programs)."""

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program
from tests.torch_oracle import requires_torch, torch

aten = ops.aten
inf = np.inf
CASES = [  # (input shape, kernel, stride, padding, dilation, ceil_mode); 3 and 4 dims are max_pool2d, 5 is 3d
    ((5, 4, 1), [3, 3], [2, 2], [1, 1], [1, 1], True),  # the fuzzer's case: unbatched, ceil mode
    ((5, 4, 1), [3, 3], [2, 2], [1, 1], [1, 1], False),
    ((2, 3, 4, 4), [2, 2], [2, 2], [0, 0], [1, 1], False),  # no padding at all
    ((1, 2, 3, 4, 4), [2, 2, 2], [2, 2, 2], [0, 0, 0], [1, 1, 1], False),
]


def _input(shape):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    x.reshape(-1)[::2] = -inf  # every window of two or more along the last dim sees one finite input at most
    x[..., :2, :2] = -inf  # a whole window of -inf in each plane
    return x


@requires_torch
@pytest.mark.parametrize("shape,kernel,stride,padding,dilation,ceil_mode", CASES)
def test_windows_of_minus_inf_are_minus_inf(shape, kernel, stride, padding, dilation, ceil_mode):
    builder = GraphBuilder()
    x = builder.add_input('x', TensorType.of(list(shape), kiln.float32))
    pool = aten.max_pool3d.default if len(shape) == 5 else aten.max_pool2d.default
    with builder:
        values = pool(x, kernel, stride, padding, dilation, ceil_mode)
    program = builder.build([values])
    inputs = [_input(shape)]
    torch_pool = torch.nn.functional.max_pool3d if len(shape) == 5 else torch.nn.functional.max_pool2d
    expected = torch_pool(torch.from_numpy(inputs[0]), kernel, stride, padding, dilation, ceil_mode).numpy()
    assert np.isneginf(expected).any()  # the case this is about
    np.testing.assert_array_equal(program(*inputs), expected)
    check_program(program, inputs, backends=("onnx",))


PRODUCERS = [  # (producer, whether its result may be -inf)
    (aten.relu.default, False),
    (lambda x: aten.clamp.default(x, 0.0, 6.0), False),
    (lambda x: aten.hardtanh.default(x, -1.0, 1.0), False),
    (lambda x: aten.clamp.default(x, None, 6.0), True),  # no lower bound
    (lambda x: aten.clamp.default(x, -inf, 6.0), True),
    (aten.neg.default, True),
]


@pytest.mark.parametrize("producer,may_be_minus_inf", PRODUCERS)
def test_a_pool_after_a_relu_stays_one_max_pool(producer, may_be_minus_inf):
    builder = GraphBuilder()
    x = builder.add_input('x', TensorType.of([2, 3, 6, 6], kiln.float32))
    with builder:
        values = aten.max_pool2d.default(producer(x), [2, 2], [2, 2], [0, 0], [1, 1], False)
    program = builder.build([values])
    model = kiln.onnx.export(program).model_proto
    assert sum(node.op_type == "MaxPool" for node in model.graph.node) == (2 if may_be_minus_inf else 1)
    check_program(program, [_input((2, 3, 6, 6))], backends=("onnx",))
