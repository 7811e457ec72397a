"""Max pool windows with no input other than -inf, where ATen's window scan leaves its -inf start and onnxruntime's
MaxPool gave the lowest finite float (-3.4e38):

- a dilated (or ceil-mode) pool over padding whose window holds padding only (a matmul of it then gave 0 where
  ATen's -inf x 0 is NaN). Found by the differential fuzzer (seed 10100, 23 programs);
- a values-only pool whose window holds only -inf inputs. Found by the differential fuzzer (seed 9400, 1378
  programs).

The ONNX lowering pools a mark of the inputs other than -inf (or, after an op whose result cannot be -inf such as a
relu, ones over one plane, for the padding alone) and sets the windows without one to -inf."""

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


def _pool(shape, kernel, stride, padding, dilation, ceil_mode, with_indices):
    """A program of one max pool (2d, or 3d for 5 dims) over an input of `shape`: its values, and with
    `with_indices` also the values of the pool that returns indices."""
    builder = GraphBuilder()
    x = builder.add_input('x', TensorType.of(list(shape), kiln.float32))
    pool = aten.max_pool3d.default if len(shape) == 5 else aten.max_pool2d.default
    indexed = aten.max_pool3d_with_indices.default if len(shape) == 5 else aten.max_pool2d_with_indices.default
    with builder:
        results = [pool(x, kernel, stride, padding, dilation, ceil_mode)]
        if with_indices:
            results.append(indexed(x, kernel, stride, padding, dilation, ceil_mode)[0])
    return builder.build(results)


def _torch_pool(x, shape, *pool):
    torch_pool = torch.nn.functional.max_pool3d if len(shape) == 5 else torch.nn.functional.max_pool2d
    return torch_pool(torch.from_numpy(x), *pool).numpy()


PADDING_CASES = [  # (input shape, kernel, stride, padding, dilation, ceil_mode)
    ((5, 5, 1, 1, 1), [3, 2, 3], [2, 1, 2], [1, 1, 1], [1, 2, 1], True),
    ((2, 3, 1, 2), [2, 2], [1, 1], [1, 1], [2, 2], False),
    ((1, 2, 3, 3), [3, 3], [2, 2], [1, 1], [1, 1], True),
]
MINUS_INF_CASES = [  # the same; 3 and 4 dims are max_pool2d (3: unbatched)
    ((5, 4, 1), [3, 3], [2, 2], [1, 1], [1, 1], True),  # the fuzzer's case: unbatched, ceil mode
    ((5, 4, 1), [3, 3], [2, 2], [1, 1], [1, 1], False),
    ((2, 3, 4, 4), [2, 2], [2, 2], [0, 0], [1, 1], False),  # no padding at all
    ((1, 2, 3, 4, 4), [2, 2, 2], [2, 2, 2], [0, 0, 0], [1, 1, 1], False),
]


def _minus_inf_input(shape):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    x.reshape(-1)[::2] = -inf  # every window of two or more along the last dim sees one finite input at most
    x[..., :2, :2] = -inf  # a whole window of -inf in each plane
    return x


@requires_torch
@pytest.mark.parametrize("shape,kernel,stride,padding,dilation,ceil_mode", PADDING_CASES)
def test_windows_of_padding_only_are_minus_inf(shape, kernel, stride, padding, dilation, ceil_mode):
    pool = (kernel, stride, padding, dilation, ceil_mode)
    program = _pool(shape, *pool, with_indices=True)
    inputs = [np.random.default_rng(0).standard_normal(shape).astype(np.float32)]
    expected = _torch_pool(inputs[0], shape, *pool)
    for got in program(*inputs):
        np.testing.assert_array_equal(got, expected)
    check_program(program, inputs, backends=("onnx",))


@requires_torch
@pytest.mark.parametrize("shape,kernel,stride,padding,dilation,ceil_mode", MINUS_INF_CASES)
def test_windows_of_minus_inf_are_minus_inf(shape, kernel, stride, padding, dilation, ceil_mode):
    pool = (kernel, stride, padding, dilation, ceil_mode)
    program = _pool(shape, *pool, with_indices=False)
    inputs = [_minus_inf_input(shape)]
    expected = _torch_pool(inputs[0], shape, *pool)
    assert np.isneginf(expected).any()  # the case this is about
    np.testing.assert_array_equal(program(*inputs), expected)
    check_program(program, inputs, backends=("onnx",))


INDEX_CASES = PADDING_CASES + [  # the fuzzer's (seed 9191): unbatched 3d, every window of padding only along H
    ((3, 2, 1, 1), [3, 2, 3], [2, 1, 2], [1, 1, 1], [1, 2, 1], True),
    ((2, 3, 5, 4), [3, 3], [2, 2], [1, 1], [1, 1], True),  # -inf windows with inputs, and a NaN
]


@requires_torch
@pytest.mark.parametrize("shape,kernel,stride,padding,dilation,ceil_mode", INDEX_CASES)
def test_the_index_of_an_empty_window_is_its_first_tap(shape, kernel, stride, padding, dilation, ceil_mode):
    """ATen's index of a window without a maximum (padding only, or -inf inputs) is where its scan started: each
    dim's o * stride - pad moved on by dilations past the padding, even past the image's end. onnxruntime's MaxPool
    gave its own (found by the differential fuzzer, seed 9191, 1500 programs: 1 where ATen says 2)."""
    pool = (kernel, stride, padding, dilation, ceil_mode)
    builder = GraphBuilder()
    x = builder.add_input('x', TensorType.of(list(shape), kiln.float32))
    indexed = aten.max_pool3d_with_indices.default if len(kernel) == 3 else aten.max_pool2d_with_indices.default
    with builder:
        values, indices = indexed(x, *pool)
    program = builder.build([values, indices])
    inputs = [_minus_inf_input(shape)]
    inputs[0].reshape(-1)[1] = np.nan
    torch_pool = torch.nn.functional.max_pool3d if len(kernel) == 3 else torch.nn.functional.max_pool2d
    expected = torch_pool(torch.from_numpy(inputs[0]), *pool, return_indices=True)
    for got, want in zip(program(*inputs), expected):
        np.testing.assert_array_equal(got, want.numpy())
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
    check_program(program, [_minus_inf_input((2, 3, 6, 6))], backends=("onnx",))


@requires_torch
@pytest.mark.parametrize("height,width", [(1, 1), (3, 2), (6, 7)])
def test_the_index_of_an_empty_window_with_symbolic_sizes(height, width):
    """The first taps are computed in the graph from the run's sizes: one file, several image sizes."""
    builder = GraphBuilder()
    h = builder.shape_env.create_symbol(3, name='h', min=1, max=16)
    w = builder.shape_env.create_symbol(3, name='w', min=1, max=16)
    x = builder.add_input('x', TensorType.of([2, 3, h, w], kiln.float32))
    pool = ([3, 2], [2, 1], [1, 1], [1, 2], True)
    with builder:
        values, indices = aten.max_pool2d_with_indices.default(x, *pool)
    program = builder.build([values, indices])
    inputs = [_minus_inf_input((2, 3, height, width))]
    expected = torch.nn.functional.max_pool2d(torch.from_numpy(inputs[0]), *pool, return_indices=True)
    for got, want in zip(program(*inputs), expected):
        np.testing.assert_array_equal(got, want.numpy())
    check_program(program, inputs, backends=("onnx",))
