"""Loops in Triton: kiln.scan, kiln.map and kiln.while_loop compile to Python loops in the launcher around their
regions' kernels, each step pointing the body's windows at the step's slices and carry slots (module.py). One
package serves every sequence length; values match torch eager and the interpreter, as the C loop tests check
(tests/runtime/test_c_loops.py, whose models these reuse), through Triton's interpreter."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")
torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import kiln  # noqa: E402
from kiln.compiler import compile as compile_program  # noqa: E402
from tests.runtime.test_c_loops import (  # noqa: E402
    RECURRENT, Accumulate, Doubling, KilnAccumulate, NestedLoops, _close, _torch_values, check_recurrent_layer,
)

pytestmark = pytest.mark.filterwarnings("ignore:LSTM with projections is not supported:UserWarning")

# The interpreter runs each kernel launch in Python, so the long sequence runs once, on the smallest layer.
LENGTHS = (1, 7, 40)


def _compile(program, path):
    return compile_program(program, target="triton", output=path)


@pytest.mark.parametrize("name,kwargs", RECURRENT, ids=lambda v: str(v))
def test_recurrent_layer_with_a_dynamic_sequence_matches_torch(name, kwargs, tmp_path):
    lengths = (1, 7, 300) if name == "RNN" and kwargs == {"batch_first": True} else LENGTHS
    check_recurrent_layer(name, kwargs, tmp_path, "triton", lengths)


def test_user_scan_matches_torch(tmp_path):
    torch.manual_seed(0)
    reference, module = Accumulate(), KilnAccumulate()
    module.load_state_dict({k: kiln.Tensor(v.detach().numpy()) for k, v in reference.state_dict().items()})
    seq, batch = kiln.Dim("seq"), kiln.Dim("batch")
    example = (kiln.randn(3, 5, 4), kiln.randn(3, 5, 4), kiln.randn(3, 4))
    program = kiln.export(module, example, dynamic_shapes={"xs": {0: batch, 1: seq}, "ys": {0: batch, 1: seq},
                                                           "h": {0: batch}})
    model = _compile(program, tmp_path / "pkg")
    for length in LENGTHS:
        inputs = [torch.randn(2, length, 4), torch.randn(2, length, 4), torch.randn(2, 4)]
        _close(model(*(t.numpy() for t in inputs)), _torch_values(reference(*inputs)))


def test_while_loop_matches_torch(tmp_path):
    from torch._higher_order_ops.while_loop import while_loop
    module = Doubling()
    scale = torch.from_numpy(module.scale.numpy())
    program = kiln.export(module, (kiln.randn(2, 3), kiln.tensor([10.0])), dynamic_shapes={"x": {0: kiln.Dim("b")},
                                                                                           "limit": None})
    model = _compile(program, tmp_path / "pkg")
    for rows, limit in ((1, 0.0), (2, 10.0), (5, 1e5)):  # zero, a few, and many iterations
        x, bound = torch.randn(rows, 3), torch.tensor([limit])
        expected = while_loop(lambda i, y: y.abs().sum() < bound.sum(), lambda i, y: (i + 1, y * scale + 0.25),
                              (torch.tensor(0), x))
        _close(model(x.numpy(), bound.numpy()), _torch_values(expected))


def test_nested_loops_match_the_interpreter(tmp_path):
    program = kiln.export(NestedLoops(), (kiln.randn(2, 5, 3, 4), kiln.randn(3, 4)),
                          dynamic_shapes={"xs": {0: kiln.Dim("rows"), 1: kiln.Dim("seq")}, "h": None})
    model = _compile(program, tmp_path / "pkg")
    for rows, length in ((1, 1), (3, 7), (2, 12)):
        inputs = (kiln.randn(rows, length, 3, 4).numpy(), kiln.randn(3, 4).numpy())
        _close(model(*inputs), [np.asarray(v) for v in program(*inputs)])
    source = (tmp_path / "pkg" / "model.py").read_text()
    # three loops, each with its own step counter, nested in the launcher
    counters = re.findall(r"^( +)(?:for (sym_\w+_step) in range|(sym_\w+_step) = 0$)", source, re.M)
    assert len(counters) == 3 and len({c[1] or c[2] for c in counters}) == 3
    assert sorted(len(c[0]) for c in counters) == [4, 8, 12]


def test_inspect_lists_the_loop_after_its_step_kernels(tmp_path, capsys):
    from kiln.cli.main import main
    program = kiln.export(kiln.nn.RNN(4, 8).eval(), (kiln.randn(5, 2, 4),),
                          dynamic_shapes={"input": {0: kiln.Dim("seq")}})
    _compile(program, tmp_path / "pkg")
    assert main(["inspect", str(tmp_path / "pkg")]) == 0
    listed = [line.split(". ", 1)[1] for line in capsys.readouterr().out.splitlines() if re.match(r"  \d+\. ", line)]
    loop = listed.index("loop: kiln.scan")
    assert listed[loop - 1] == "matmul: aten.addmm.default, aten.add.Tensor, aten.tanh.default"
