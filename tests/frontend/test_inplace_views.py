"""In-place ops through views in kiln.nn code under kiln.export (`y[:, :2].mul_(2)`): the tracer writes the op's
result back through each tensor the view aliases and makes the other views read them again. Before, only the view
took the write, and the exported program returned `y` unchanged where eager kiln (numpy views) and torch changed it.
Each case: kiln.export, then the interpreter, C and ONNX against torch eager and kiln eager."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from tests.fuzz.differential import check_program
from tests.inplace_view_cases import CASES


class _Wrap(kiln.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


@pytest.mark.parametrize("fn", CASES, ids=lambda fn: fn.__name__.strip("_"))
def test_an_in_place_op_on_a_view_updates_its_base(fn):
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).standard_normal((4, 12)).astype(np.float32)
    program = kiln.export(_Wrap(fn), (kiln.tensor(x),))
    expected = fn(torch.from_numpy(x.copy())).numpy()
    torch.testing.assert_close(torch.from_numpy(np.asarray(program(x))), torch.from_numpy(expected))
    torch.testing.assert_close(torch.from_numpy(fn(kiln.tensor(x.copy())).numpy()),
                               torch.from_numpy(expected))  # eager kiln agrees
    check_program(program, [x], backends=("c", "onnx"))


def test_a_buffers_slice_written_in_place_is_a_buffer_mutation():
    class Counter(kiln.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("seen", kiln.tensor(np.arange(12, dtype=np.float32).reshape(3, 4)))

        def forward(self, x):
            self.seen[:, :2].add_(x)
            return self.seen * 1

    x = np.random.default_rng(1).standard_normal((3, 2)).astype(np.float32)
    program = kiln.export(Counter(), (kiln.tensor(x),))
    kinds = [spec.kind for spec in program.graph_signature.output_specs]
    assert kinds == [kiln.OutputKind.BUFFER_MUTATION, kiln.OutputKind.USER_OUTPUT]
    from kiln.ir.interpreter import run_program
    buffer, output = run_program(program, [x])
    expected = np.arange(12, dtype=np.float32).reshape(3, 4)
    expected[:, :2] += x
    np.testing.assert_array_equal(buffer, expected)
    np.testing.assert_array_equal(output, expected)


def test_views_read_again_only_where_used():
    """After `y.add_(1)` every view made of y is read again from the new y; those nothing reads afterwards leave
    the program (a loop had left 20 dead selects)."""
    class Rows(kiln.nn.Module):
        def forward(self, x):
            y = x.clone()
            total = y[0] * 0
            for i in range(20):
                total = total + y[i % 3]
            y.add_(1)
            return y + total, y[1]

    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    program = kiln.export(Rows(), (kiln.tensor(x),))
    assert program.op_histogram()["aten.select.int"] == 22  # the 21 made before the write, and y[1] after it
    plus_one = x + 1
    total = x[0] * 0 + sum(x[i % 3] for i in range(20))
    got = program(x)
    np.testing.assert_array_equal(got[0], plus_one + total)
    np.testing.assert_array_equal(got[1], plus_one[1])


def test_row_by_row_writes_in_a_loop():
    """`buf[i].copy_(...)` row by row: each temporary view writes through, and (no longer held) is not read again
    after the later writes (300 writes had re-read every earlier row: 45,000 ops made and erased)."""
    class Rows(kiln.nn.Module):
        def forward(self, x):
            buf = x.new_zeros(300, 4)
            for i in range(300):
                buf[i].copy_(x[0] * i)
            return buf

    x = np.random.default_rng(2).standard_normal((2, 4)).astype(np.float32)
    program = kiln.export(Rows(), (kiln.tensor(x),))
    np.testing.assert_array_equal(program(x), x[0] * np.arange(300, dtype=np.float32)[:, None])
    histogram = program.op_histogram()
    assert histogram["aten.select_scatter.default"] == 300 and histogram["aten.select.int"] == 600
