"""Sizes used as values, as SmolVLM uses them: a pointwise op whose scalar operand is a size (`counts == 256 * u1`,
its check of the patch count; `x + x.shape[1]`), and a tensor sized by the rows a mask picked (`full([u0], ...)`).
C rendered every scalar operand as a literal and ONNX converted it to a number for type promotion, both crashing
on the symbol ("Cannot convert symbols to int"); and ONNX found a data-dependent size only in an `item()` result,
not in the shape of the tensor that has it (nonzero's rows). An integer size expression is now the C expression
over the run's symbols and an int for ONNX's promotion, and ONNX reads a data-dependent dim from the shape of the
first tensor that has it."""

import numpy as np
import pytest

import kiln
from kiln.compiler import compile as compile_c
from kiln.frontend.tensor import dispatch as call
from tests.modules import LambdaModule

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
aten = kiln.ops.aten


def _sized(x, mask):
    width = x.shape[1]
    picked = call(aten.nonzero.default, mask)
    ones = call(aten.full.default, [picked.shape[0]], 3, dtype=kiln.int64)
    return (call(aten.eq.Scalar, call(aten.sum.dim_IntList, x, [1]), width),
            call(aten.add.Scalar, x, width),
            call(aten.mul.Scalar, call(aten.arange.default, 4), 2 * width),
            call(aten.sum.default, ones))


def _expected(x, mask):
    t = torch.from_numpy(x)
    columns = x.shape[1]
    return (t.sum(1) == columns, t + columns, torch.arange(4) * (2 * columns), torch.tensor(3 * int(mask.sum())))


def test_sizes_as_values(tmp_path):
    width = kiln.Dim("width", max=16)
    examples = (kiln.tensor(np.ones((3, 4), np.int64)), kiln.tensor(np.array([True, False, True])))
    program = kiln.export(LambdaModule(_sized), examples, dynamic_shapes=({1: width}, None))
    model = compile_c(program, output=tmp_path / "pkg")
    session = ort.InferenceSession(kiln.onnx.export(program).model_proto.SerializeToString())
    names = [i.name for i in session.get_inputs()]
    for columns, mask in ((1, [True, True, True]), (4, [False, False, False]), (16, [False, True, False])):
        x = np.ones((3, columns), np.int64)
        x[0, 0] = 2
        mask = np.array(mask)
        for got in (model(x, mask), session.run(None, dict(zip(names, (x, mask))))):
            for value, want in zip(got, _expected(x, mask)):
                torch.testing.assert_close(torch.from_numpy(np.asarray(value)), want)
