"""kiln.nn.RNN / LSTM / GRU and their cells against torch: parameters, reprs, outputs, states and export.

Each configuration is built in both libraries, torch's weights are copied into kiln with load_state_dict,
and eval-mode outputs must match under assert_close defaults. Exported programs with a static sequence length
unroll the time loop and must equal kiln eager at several batch sizes; with a dynamic sequence dim each layer's
time loop is a `kiln.scan`, and one program must match torch eager at sequence lengths 1, 7 and 300.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import kiln
from kiln.ir.errors import KilnError
from tests.torch_oracle import module_pair

torch = pytest.importorskip("torch")

# torch's note that oneDNN has no projected LSTM (it falls back to its default kernel)
pytestmark = pytest.mark.filterwarnings("ignore:LSTM with projections is not supported:UserWarning")

INPUT, HIDDEN, SEQ, BATCH = 4, 5, 3, 2


def _kiln(array: "torch.Tensor") -> kiln.Tensor:
    return kiln.Tensor(array.detach().numpy().copy())


def _close(kiln_value: kiln.Tensor, torch_value: "torch.Tensor") -> None:
    torch.testing.assert_close(torch.from_numpy(np.asarray(kiln_value.numpy())), torch_value.detach())


def _num_states(kwargs: dict) -> int:
    return kwargs.get("num_layers", 1) * (2 if kwargs.get("bidirectional") else 1)


NETWORK_CONFIGS = [
    ("LSTM", {}),
    ("LSTM", {"batch_first": True}),
    ("LSTM", {"num_layers": 2}),
    ("LSTM", {"bidirectional": True}),
    ("LSTM", {"num_layers": 2, "bidirectional": True, "batch_first": True}),
    ("LSTM", {"bias": False}),
    ("LSTM", {"proj_size": 3}),
    ("LSTM", {"proj_size": 2, "num_layers": 2, "bidirectional": True}),
    ("LSTM", {"num_layers": 2, "dropout": 0.5}),  # eval mode: no dropout
    ("GRU", {}),
    ("GRU", {"batch_first": True}),
    ("GRU", {"num_layers": 2}),
    ("GRU", {"bidirectional": True}),
    ("GRU", {"num_layers": 2, "bidirectional": True, "batch_first": True, "bias": False}),
    ("RNN", {}),
    ("RNN", {"nonlinearity": "relu", "num_layers": 2, "bidirectional": True}),
]
NETWORK_IDS = [f"{name}-{'-'.join(f'{k}={v}' for k, v in kw.items()) or 'default'}" for name, kw in NETWORK_CONFIGS]


def _input(kwargs: dict, batched: bool = True) -> "torch.Tensor":
    if not batched:
        return torch.randn(SEQ, INPUT)
    return torch.randn(BATCH, SEQ, INPUT) if kwargs.get("batch_first") else torch.randn(SEQ, BATCH, INPUT)


def _initial_state(name: str, kwargs: dict, batched: bool = True):
    batch = (BATCH,) if batched else ()
    out_size = kwargs.get("proj_size") or HIDDEN
    h0 = torch.randn(_num_states(kwargs), *batch, out_size)
    if name == "LSTM":
        return h0, torch.randn(_num_states(kwargs), *batch, HIDDEN)
    return h0


def _to_kiln_state(state):
    return tuple(_kiln(s) for s in state) if isinstance(state, tuple) else _kiln(state)


def _compare_outputs(kiln_out, torch_out) -> None:
    _close(kiln_out[0], torch_out[0])
    if isinstance(torch_out[1], tuple):
        assert isinstance(kiln_out[1], tuple) and len(kiln_out[1]) == 2
        _close(kiln_out[1][0], torch_out[1][0])
        _close(kiln_out[1][1], torch_out[1][1])
    else:
        _close(kiln_out[1], torch_out[1])


@pytest.mark.parametrize("name,kwargs", NETWORK_CONFIGS, ids=NETWORK_IDS)
def test_network_structure_matches_torch(name: str, kwargs: dict) -> None:
    reference, module = module_pair(name, INPUT, HIDDEN, **kwargs)
    assert repr(module) == repr(reference)
    assert [(k, tuple(v.shape)) for k, v in module.state_dict().items()] == \
        [(k, tuple(v.shape)) for k, v in reference.state_dict().items()]
    assert module._flat_weights_names == reference._flat_weights_names


@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "initial-state"])
@pytest.mark.parametrize("name,kwargs", NETWORK_CONFIGS, ids=NETWORK_IDS)
def test_network_matches_torch(name: str, kwargs: dict, with_state: bool) -> None:
    reference, module = module_pair(name, INPUT, HIDDEN, **kwargs)
    x = _input(kwargs)
    if with_state:
        state = _initial_state(name, kwargs)
        expected = reference(x, state)
        actual = module(_kiln(x), _to_kiln_state(state))
    else:
        expected = reference(x)
        actual = module(_kiln(x))
    _compare_outputs(actual, expected)


@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "initial-state"])
@pytest.mark.parametrize("name,kwargs", [NETWORK_CONFIGS[0], NETWORK_CONFIGS[4], NETWORK_CONFIGS[10],
                                         NETWORK_CONFIGS[15]], ids=lambda v: str(v))
def test_unbatched_input_matches_torch(name: str, kwargs: dict, with_state: bool) -> None:
    reference, module = module_pair(name, INPUT, HIDDEN, **kwargs)
    x = _input(kwargs, batched=False)
    if with_state:
        state = _initial_state(name, kwargs, batched=False)
        expected, actual = reference(x, state), module(_kiln(x), _to_kiln_state(state))
    else:
        expected, actual = reference(x), module(_kiln(x))
    _compare_outputs(actual, expected)


def test_parameters_are_initialized_like_torch() -> None:
    module = kiln.nn.LSTM(INPUT, 16, num_layers=2, bidirectional=True)
    bound = 1.0 / math.sqrt(16)
    for name, param in module.named_parameters():
        values = param.numpy()
        assert np.all(np.abs(values) <= bound), name
        assert values.std() > bound / 4, name  # uniform(-b, b) has std b/sqrt(3)


def test_training_dropout_between_layers() -> None:
    module = kiln.nn.GRU(INPUT, HIDDEN, num_layers=2, dropout=0.5)
    x = kiln.randn(SEQ, BATCH, INPUT)
    module.eval()
    deterministic = module(x)[0].numpy()
    module.train()
    kiln.manual_seed(0)
    trained = module(x)[0].numpy()
    assert trained.shape == deterministic.shape
    assert not np.array_equal(trained, deterministic)
    # dropout=0 in training mode is the eval computation
    no_dropout = kiln.nn.GRU(INPUT, HIDDEN, num_layers=2)
    no_dropout.load_state_dict(module.state_dict())
    np.testing.assert_array_equal(no_dropout.train()(x)[0].numpy(), deterministic)


# ---------------------------------------------------------------------------------------------
# Cells

CELL_CONFIGS = [
    ("LSTMCell", {}),
    ("LSTMCell", {"bias": False}),
    ("GRUCell", {}),
    ("GRUCell", {"bias": False}),
    ("RNNCell", {}),
    ("RNNCell", {"nonlinearity": "relu", "bias": False}),
]


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "unbatched"])
@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "initial-state"])
@pytest.mark.parametrize("name,kwargs", CELL_CONFIGS, ids=lambda v: str(v))
def test_cell_matches_torch(name: str, kwargs: dict, with_state: bool, batched: bool) -> None:
    reference, module = module_pair(name, INPUT, HIDDEN, **kwargs)
    assert repr(module) == repr(reference)
    assert [(k, tuple(v.shape)) for k, v in module.state_dict().items()] == \
        [(k, tuple(v.shape)) for k, v in reference.state_dict().items()]
    batch = (BATCH,) if batched else ()
    x = torch.randn(*batch, INPUT)
    if with_state:
        state = torch.randn(*batch, HIDDEN)
        if name == "LSTMCell":
            state = (state, torch.randn(*batch, HIDDEN))
        expected, actual = reference(x, state), module(_kiln(x), _to_kiln_state(state))
    else:
        expected, actual = reference(x), module(_kiln(x))
    if name == "LSTMCell":
        _close(actual[0], expected[0])
        _close(actual[1], expected[1])
    else:
        _close(actual, expected)


# ---------------------------------------------------------------------------------------------
# Export: a dynamic batch dim; the unrolled sequence length is static.

EXPORT_CONFIGS = [NETWORK_CONFIGS[i] for i in (0, 4, 6, 10, 13, 15)]


class _WithState(kiln.nn.Module):
    """Passes an explicit initial state, so export sees it as an input."""

    def __init__(self, inner: kiln.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x, h0, c0=None):
        return self.inner(x, h0 if c0 is None else (h0, c0))


def _assert_same(program_out, eager_out) -> None:
    flat_program, flat_eager = _flatten(program_out), _flatten(eager_out)
    assert len(flat_program) == len(flat_eager)
    for got, want in zip(flat_program, flat_eager):
        torch.testing.assert_close(torch.from_numpy(got.numpy()), torch.from_numpy(want.numpy()))


def _flatten(value) -> list:
    if isinstance(value, (tuple, list)):
        return [leaf for item in value for leaf in _flatten(item)]
    return [value]


@pytest.mark.parametrize("name,kwargs", EXPORT_CONFIGS, ids=lambda v: str(v))
def test_export_with_dynamic_batch(name: str, kwargs: dict) -> None:
    _, module = module_pair(name, INPUT, HIDDEN, **kwargs)
    batch_dim = 0 if kwargs.get("batch_first") else 1
    batch = kiln.Dim("batch")

    def make(size: int) -> kiln.Tensor:
        return kiln.randn(size, SEQ, INPUT) if batch_dim == 0 else kiln.randn(SEQ, size, INPUT)

    program = kiln.export(module, (make(BATCH),), dynamic_shapes={"input": {batch_dim: batch}})
    for size in (BATCH, 1, 5):
        x = make(size)
        _assert_same(program(x), module(x))


@pytest.mark.parametrize("name,kwargs", [NETWORK_CONFIGS[4], NETWORK_CONFIGS[13]], ids=lambda v: str(v))
def test_export_with_initial_state(name: str, kwargs: dict) -> None:
    _, inner = module_pair(name, INPUT, HIDDEN, **kwargs)
    module = _WithState(inner).eval()
    batch = kiln.Dim("batch")

    def inputs(size: int) -> tuple:
        x = kiln.randn(size, SEQ, INPUT) if kwargs.get("batch_first") else kiln.randn(SEQ, size, INPUT)
        h0 = kiln.randn(_num_states(kwargs), size, HIDDEN)
        return (x, h0, kiln.randn(_num_states(kwargs), size, HIDDEN)) if name == "LSTM" else (x, h0)

    example = inputs(BATCH)
    specs = [{0 if kwargs.get("batch_first") else 1: batch}] + [{1: batch}] * (len(example) - 1)
    program = kiln.export(module, example, dynamic_shapes=tuple(specs))
    for size in (BATCH, 1, 4):
        args = inputs(size)
        _assert_same(program(*args), module(*args))


@pytest.mark.parametrize("name", ["LSTMCell", "GRUCell", "RNNCell"])
def test_cell_export_with_dynamic_batch(name: str) -> None:
    _, module = module_pair(name, INPUT, HIDDEN)
    program = kiln.export(module, (kiln.randn(BATCH, INPUT),), dynamic_shapes={"input": {0: kiln.Dim("batch")}})
    for size in (BATCH, 1, 6):
        x = kiln.randn(size, INPUT)
        _assert_same(program(x), module(x))


def test_unroll_refuses_a_dynamic_sequence_length() -> None:
    module = kiln.nn.LSTM(INPUT, HIDDEN).eval()
    module.time_loop = "unroll"
    with pytest.raises(KilnError, match="sequence length must be static"):
        kiln.export(module, (kiln.randn(SEQ, BATCH, INPUT),), dynamic_shapes={"input": {0: kiln.Dim("seq")}})


SEQUENCE_LENGTHS = (1, 7, 300)


def _scan_count(program) -> int:
    from kiln.ir.control_flow import ScanOp
    return sum(isinstance(op, ScanOp) for op in program.body.walk())


@pytest.mark.parametrize("name,kwargs", NETWORK_CONFIGS, ids=NETWORK_IDS)
def test_dynamic_sequence_exports_a_scan_matching_torch(name: str, kwargs: dict) -> None:
    """One program with a symbolic sequence length: a scan per layer and direction, torch's values at every
    length (and at another batch size, the batch dim being dynamic too)."""
    reference, module = module_pair(name, INPUT, HIDDEN, **kwargs)
    seq_dim, batch_dim = (1, 0) if kwargs.get("batch_first") else (0, 1)
    program = kiln.export(module, (_kiln(_input(kwargs)),),
                          dynamic_shapes={"input": {seq_dim: kiln.Dim("seq"), batch_dim: kiln.Dim("batch")}})
    assert _scan_count(program) == _num_states(kwargs)
    for length, batch in zip(SEQUENCE_LENGTHS, (BATCH, 3, 1)):
        shape = [0, 0, INPUT]
        shape[seq_dim], shape[batch_dim] = length, batch
        x = torch.randn(*shape)
        _compare_outputs(program(_kiln(x)), reference(x))


@pytest.mark.parametrize("name,kwargs", [NETWORK_CONFIGS[7], NETWORK_CONFIGS[13]], ids=lambda v: str(v))
def test_dynamic_sequence_with_initial_state(name: str, kwargs: dict) -> None:
    reference, inner = module_pair(name, INPUT, HIDDEN, **kwargs)
    module = _WithState(inner).eval()
    seq_dim = 1 if kwargs.get("batch_first") else 0
    out_size = kwargs.get("proj_size") or HIDDEN

    def inputs(length: int) -> tuple:
        shape = [BATCH, BATCH, INPUT]
        shape[seq_dim] = length
        states = [torch.randn(_num_states(kwargs), BATCH, out_size)]
        if name == "LSTM":
            states.append(torch.randn(_num_states(kwargs), BATCH, HIDDEN))
        return (torch.randn(*shape), *states)

    example = inputs(SEQ)
    specs = ({seq_dim: kiln.Dim("seq")},) + (None,) * (len(example) - 1)
    program = kiln.export(module, tuple(map(_kiln, example)), dynamic_shapes=specs)
    for length in SEQUENCE_LENGTHS:
        args = inputs(length)
        state = tuple(args[1:]) if name == "LSTM" else args[1]
        _compare_outputs(program(*map(_kiln, args)), reference(args[0], state))


def test_time_loop_scan_on_a_static_length_matches_the_unrolled_program() -> None:
    module = kiln.nn.GRU(INPUT, HIDDEN, num_layers=2, bidirectional=True).eval()
    x = kiln.randn(SEQ, BATCH, INPUT)
    unrolled = kiln.export(module, (x,))
    module.time_loop = "scan"
    scanned = kiln.export(module, (x,))
    assert _scan_count(unrolled) == 0 and _scan_count(scanned) == 4
    _assert_same(scanned(x), unrolled(x))
    module.time_loop = "sideways"
    with pytest.raises(KilnError, match="time_loop must be one of"):
        module(x)


# ---------------------------------------------------------------------------------------------
# Errors


def test_invalid_configurations_raise_kiln_errors() -> None:
    with pytest.raises(KilnError, match="proj_size argument is only supported for LSTM"):
        kiln.nn.GRU(INPUT, HIDDEN, proj_size=2)
    with pytest.raises(KilnError, match="proj_size has to be smaller than hidden_size"):
        kiln.nn.LSTM(INPUT, HIDDEN, proj_size=HIDDEN)
    with pytest.raises(KilnError, match="dropout should be a number"):
        kiln.nn.LSTM(INPUT, HIDDEN, dropout=1.5)
    with pytest.raises(KilnError, match="Unknown nonlinearity"):
        kiln.nn.RNN(INPUT, HIDDEN, nonlinearity="gelu")
    with pytest.raises(KilnError, match="hidden_size must be greater than zero"):
        kiln.nn.GRU(INPUT, 0)


def test_invalid_inputs_raise_kiln_errors() -> None:
    module = kiln.nn.LSTM(INPUT, HIDDEN)
    with pytest.raises(KilnError, match="input.size\\(-1\\) must be equal to input_size"):
        module(kiln.randn(SEQ, BATCH, INPUT + 1))
    with pytest.raises(KilnError, match="Expected input to be 2D or 3D"):
        module(kiln.randn(SEQ))
    with pytest.raises(KilnError, match="does not match weight dtype"):
        module(kiln.randn(SEQ, BATCH, INPUT, dtype=kiln.float64))
    with pytest.raises(KilnError, match="Expected hidden\\[0\\] size"):
        module(kiln.randn(SEQ, BATCH, INPUT), (kiln.randn(1, BATCH + 1, HIDDEN), kiln.randn(1, BATCH, HIDDEN)))
    with pytest.raises(KilnError, match="hx should also be 3-D"):
        kiln.nn.GRU(INPUT, HIDDEN)(kiln.randn(SEQ, BATCH, INPUT), kiln.randn(BATCH, HIDDEN))
    with pytest.raises(KilnError, match="Expected input to be 1D or 2D"):
        kiln.nn.GRUCell(INPUT, HIDDEN)(kiln.randn(1, BATCH, INPUT))
