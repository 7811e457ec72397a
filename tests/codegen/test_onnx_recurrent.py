"""Recurrent layers export to ONNX's own `LSTM`, `GRU` and `RNN` ops where the layer maps exactly.

Every configuration of kiln.nn's recurrent layers is exported once with dynamic sequence and batch dims; the scan
of each layer and direction becomes one ONNX op (gates reordered from torch's layout to ONNX's), except an LSTM
with projections, which ONNX's LSTM cannot express and which stays a `Scan`. onnxruntime must compute torch eager's
output and final states at sequence lengths 1, 7 and 300. Scans whose body is almost a cell stay `Scan`s.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import kiln
from tests.codegen.support import check_model
from tests.frontend.test_recurrent import (HIDDEN, INPUT, NETWORK_CONFIGS, NETWORK_IDS, SEQUENCE_LENGTHS,
                                           _initial_state, _num_states)
from tests.torch_oracle import module_pair

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.filterwarnings("ignore:LSTM with projections is not supported:UserWarning")


def _expected_nodes(name: str, kwargs: dict) -> Counter:
    """(op type, direction) of the recurrent nodes a layer exports to: one ONNX op per layer for both directions,
    or one Scan per layer and direction for what ONNX's ops cannot express (projections)."""
    if kwargs.get("proj_size"):
        return Counter({("Scan", None): _num_states(kwargs)})
    direction = "bidirectional" if kwargs.get("bidirectional") else "forward"
    return Counter({(name, direction): kwargs.get("num_layers", 1)})


def _recurrent_nodes(onnx_program) -> Counter:
    def direction(node) -> str | None:
        if node.op_type == "Scan":
            return None
        given = [a.s.decode() for a in node.attribute if a.name == "direction"]
        return given[0] if given else "forward"
    return Counter((node.op_type, direction(node)) for node in onnx_program.model_proto.graph.node
                   if node.op_type in ("LSTM", "GRU", "RNN", "Scan"))


def _flat(value) -> list:
    if isinstance(value, (tuple, list)):
        return [leaf for item in value for leaf in _flat(item)]
    return [value]


class _WithState(kiln.nn.Module):
    def __init__(self, inner: kiln.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x, *state):
        return self.inner(x, state[0] if len(state) == 1 else tuple(state))


@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "given-state"])
@pytest.mark.parametrize("name,kwargs", NETWORK_CONFIGS, ids=NETWORK_IDS)
def test_layer_exports_to_the_onnx_op_matching_torch(name: str, kwargs: dict, with_state: bool) -> None:
    reference, module = module_pair(name, INPUT, HIDDEN, **kwargs)
    seq_dim, batch_dim = (1, 0) if kwargs.get("batch_first") else (0, 1)
    seq, batch = kiln.Dim("seq", max=1024), kiln.Dim("batch", max=64)

    def inputs(length: int, size: int) -> list["torch.Tensor"]:
        shape = [0, 0, INPUT]
        shape[seq_dim], shape[batch_dim] = length, size
        x = torch.randn(*shape)
        if not with_state:
            return [x]
        torch_state = _initial_state(name, kwargs)
        state = torch_state if isinstance(torch_state, tuple) else (torch_state,)
        return [x, *(torch.randn(s.shape[0], size, s.shape[2]) for s in state)]

    example = inputs(3, 2)
    if with_state:
        module = _WithState(module).eval()
        dynamic = tuple([{seq_dim: seq, batch_dim: batch}] + [{1: batch}] * (len(example) - 1))
    else:
        dynamic = {"input": {seq_dim: seq, batch_dim: batch}}
    program = kiln.export(module, tuple(kiln.Tensor(t.numpy()) for t in example), dynamic_shapes=dynamic)
    onnx_program = kiln.onnx.export(program)
    check_model(onnx_program)
    assert _recurrent_nodes(onnx_program) == _expected_nodes(name, kwargs)

    for length, size in zip(SEQUENCE_LENGTHS, (2, 3, 1)):
        args = inputs(length, size)
        with torch.no_grad():
            want = reference(args[0], None if not with_state else (args[1] if len(args) == 2 else tuple(args[1:])))
        got = onnx_program.run([a.numpy() for a in args])
        for actual, expected in zip(got, _flat(want), strict=True):
            torch.testing.assert_close(torch.from_numpy(actual), expected)


def _lstm_cell(h, c, x, w_hh, b_hh, swap_tanh: bool):
    gates = kiln.nn.functional.linear(h, w_hh, b_hh) + x
    i, f, g, o = gates.chunk(4, 1)
    c_next = f.sigmoid() * c + i.sigmoid() * (g.sigmoid() if swap_tanh else g.tanh())
    h_next = o.sigmoid() * c_next.tanh()
    return h_next, c_next


class _UserScan(kiln.nn.Module):
    """A user's `kiln.scan` over a linear of the input: the LSTM cell exactly, or with the cell gate's tanh
    replaced by a sigmoid (not an LSTM, so it must stay a Scan)."""

    def __init__(self, swap_tanh: bool):
        super().__init__()
        self.lstm = kiln.nn.LSTM(INPUT, HIDDEN)
        self.swap_tanh = swap_tanh

    def forward(self, x):
        w_ih, w_hh, b_ih, b_hh = (self.lstm.weight_ih_l0, self.lstm.weight_hh_l0, self.lstm.bias_ih_l0,
                                  self.lstm.bias_hh_l0)
        zeros = kiln.zeros(x.shape[1], HIDDEN)

        def step(carry, gates):
            h, c = _lstm_cell(*carry, gates, w_hh, b_hh, self.swap_tanh)
            return (h, c), h

        (h, c), ys = kiln.scan(step, (zeros, zeros), kiln.nn.functional.linear(x, w_ih, b_ih))
        return ys, h, c


@pytest.mark.parametrize("swap_tanh,onnx_op", [(False, "LSTM"), (True, "Scan")], ids=["lstm-cell", "not-a-cell"])
def test_user_scans_map_only_when_the_math_is_the_cell(swap_tanh: bool, onnx_op: str) -> None:
    module = _UserScan(swap_tanh).eval()
    program = kiln.export(module, (kiln.randn(5, 2, INPUT),), dynamic_shapes={"x": {0: kiln.Dim("seq")}})
    onnx_program = kiln.onnx.export(program)
    check_model(onnx_program)
    op_types = {node.op_type for node in onnx_program.model_proto.graph.node}
    assert onnx_op in op_types and not op_types & ({"LSTM", "Scan"} - {onnx_op})
    for length in (1, 9):
        x = np.random.default_rng(length).standard_normal((length, 2, INPUT)).astype(np.float32)
        for got, want in zip(onnx_program.run([x]), _flat(module(kiln.Tensor(x))), strict=True):
            torch.testing.assert_close(torch.from_numpy(got), torch.from_numpy(np.asarray(want.numpy())))
