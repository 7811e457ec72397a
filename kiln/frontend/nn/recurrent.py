"""Recurrent layers: `RNN`, `LSTM`, `GRU` and their single-step cells, with torch's parameters and semantics.

The time loop of each layer and direction is a `kiln.scan` over the sequence when the sequence length is symbolic
(an export with a dynamic sequence dim: one program, a `kiln.scan` op, for every length), and runs in Python
otherwise, which unrolls an exported program over the example's length as torch.export's decomposition of
`aten.lstm` does. `module.time_loop` picks one: "auto" (the default, as just said), "scan" or "unroll". Every
step goes through `dispatch`, so the same code runs eagerly and traces.
Cell math follows ATen's CPU kernels (RNN.cpp), including the order of additions, so results match torch.
"""

from __future__ import annotations

import math
import warnings
from typing import Any


from kiln.frontend import functions as K
from kiln.frontend.control_flow import scan
from kiln.frontend.nn import functional as F
from kiln.frontend.nn import init
from kiln.frontend.nn.module import Module, check_device, new_parameter
from kiln.frontend.tensor import Parameter, Tensor, dispatch
from kiln.ir.errors import KilnError, ShapeError
from kiln.ir.registry import REGISTRY, ops

__all__ = ["RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell"]

aten = ops.aten

_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


# ---------------------------------------------------------------------------------------------
# One time step. Each cell uses the registered ATen cell op when there is one (one readable node per
# step in exported programs), and otherwise the gate math of ATen's CPU kernel.


def _has_op(name: str) -> bool:
    return name in REGISTRY


def _lstm_step(input_gates: Tensor, hx: Tensor, cx: Tensor, w_hh: Tensor, b_hh: Tensor | None,
               w_hr: Tensor | None) -> tuple[Tensor, Tensor]:
    """One LSTM step given `input_gates = linear(x_t, w_ih, b_ih)` (precomputed for the whole sequence)."""
    gates = F.linear(hx, w_hh, b_hh) + input_gates
    ingate, forgetgate, cellgate, outgate = gates.chunk(4, 1)
    ingate, forgetgate, cellgate, outgate = ingate.sigmoid(), forgetgate.sigmoid(), cellgate.tanh(), outgate.sigmoid()
    cy = forgetgate * cx + ingate * cellgate
    hy = outgate * cy.tanh()
    if w_hr is not None:
        hy = F.linear(hy, w_hr)
    return hy, cy


def _gru_step(input_gates: Tensor, hx: Tensor, w_hh: Tensor, b_hh: Tensor | None) -> Tensor:
    """One GRU step given `input_gates = linear(x_t, w_ih, b_ih)`."""
    hidden_gates = F.linear(hx, w_hh, b_hh)
    input_reset, input_update, input_new = input_gates.chunk(3, 1)
    hidden_reset, hidden_update, hidden_new = hidden_gates.chunk(3, 1)
    reset_gate = (hidden_reset + input_reset).sigmoid()
    update_gate = (hidden_update + input_update).sigmoid()
    new_gate = (input_new + hidden_new * reset_gate).tanh()
    return (hx - new_gate) * update_gate + new_gate


def _rnn_step(input_gates: Tensor, hx: Tensor, w_hh: Tensor, b_hh: Tensor | None, relu: bool) -> Tensor:
    pre_activation = F.linear(hx, w_hh, b_hh) + input_gates
    return pre_activation.relu() if relu else pre_activation.tanh()


def _lstm_cell(input: Tensor, hx: Tensor, cx: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor | None,
               b_hh: Tensor | None) -> tuple[Tensor, Tensor]:
    if _has_op("aten.lstm_cell.default"):
        hy, cy = dispatch(aten.lstm_cell.default, input, [hx, cx], w_ih, w_hh, b_ih, b_hh)
        return hy, cy
    return _lstm_step(F.linear(input, w_ih, b_ih), hx, cx, w_hh, b_hh, None)


def _gru_cell(input: Tensor, hx: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor | None,
              b_hh: Tensor | None) -> Tensor:
    if _has_op("aten.gru_cell.default"):
        return dispatch(aten.gru_cell.default, input, hx, w_ih, w_hh, b_ih, b_hh)
    return _gru_step(F.linear(input, w_ih, b_ih), hx, w_hh, b_hh)


def _rnn_cell(input: Tensor, hx: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor | None,
              b_hh: Tensor | None, relu: bool) -> Tensor:
    return _rnn_step(F.linear(input, w_ih, b_ih), hx, w_hh, b_hh, relu)


# ---------------------------------------------------------------------------------------------
# Shared helpers


def _check_positive_int(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise KilnError(f"{name} should be of type int, got: {type(value).__name__}")
    if value <= 0:
        raise KilnError(f"{name} must be greater than zero, got {value}")


_check_device = check_device
_new_parameter = new_parameter


def _same_size(actual: Any, expected: tuple[Any, ...]) -> bool:
    return len(actual) == len(expected) and all(a == e for a, e in zip(actual, expected))


def _size_text(size: Any) -> str:
    return "[" + ", ".join(str(s) for s in size) + "]"


# ---------------------------------------------------------------------------------------------
# Multi-layer recurrent networks


TIME_LOOPS = ("auto", "scan", "unroll")


class RNNBase(Module):
    """What RNN, LSTM and GRU share: torch's parameters (`weight_ih_l0`, `bias_hh_l1_reverse`, ...),
    initialization (uniform in ±1/sqrt(hidden_size)), argument checks and the layer/direction loop."""

    time_loop = "auto"  # "auto": a scan when the sequence length is symbolic, else unrolled; or "scan", "unroll"

    def __init__(self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 proj_size: int = 0, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        if mode not in _GATES:
            raise KilnError(f"unrecognized RNN mode: {mode}", fix="use one of " + ", ".join(_GATES))
        _check_device(device)
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout <= 1:
            raise KilnError("dropout should be a number in range [0, 1] representing the probability of an "
                            "element being zeroed")
        if dropout > 0 and num_layers == 1:
            warnings.warn("dropout option adds dropout after all but last recurrent layer, so non-zero dropout "
                          f"expects num_layers greater than 1, but got dropout={dropout} and "
                          f"num_layers={num_layers}", stacklevel=2)
        for name, value in (("bias", bias), ("batch_first", batch_first)):
            if not isinstance(value, bool):
                raise KilnError(f"{name} should be of type bool, got: {type(value).__name__}")
        _check_positive_int("input_size", input_size)
        _check_positive_int("hidden_size", hidden_size)
        _check_positive_int("num_layers", num_layers)
        if not isinstance(proj_size, int) or proj_size < 0:
            raise KilnError("proj_size should be a positive integer or zero to disable projections")
        if proj_size >= hidden_size:
            raise KilnError("proj_size has to be smaller than hidden_size")
        if proj_size and mode != "LSTM":
            raise KilnError("proj_size argument is only supported for LSTM, not RNN or GRU")

        self.mode = mode
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bias = bias
        self.batch_first = batch_first
        self.dropout = float(dropout)
        self.bidirectional = bidirectional
        self.proj_size = proj_size
        num_directions = 2 if bidirectional else 1
        gate_size = _GATES[mode] * hidden_size
        real_hidden_size = proj_size if proj_size > 0 else hidden_size

        self._flat_weights_names: list[str] = []
        self._all_weights: list[list[str]] = []
        for layer in range(num_layers):
            for direction in range(num_directions):
                layer_input_size = input_size if layer == 0 else real_hidden_size * num_directions
                suffix = "_reverse" if direction == 1 else ""
                shapes = [("weight_ih_l{}{}", (gate_size, layer_input_size)),
                          ("weight_hh_l{}{}", (gate_size, real_hidden_size))]
                if bias:
                    shapes += [("bias_ih_l{}{}", (gate_size,)), ("bias_hh_l{}{}", (gate_size,))]
                if proj_size > 0:
                    shapes += [("weight_hr_l{}{}", (proj_size, hidden_size))]
                names = []
                for pattern, shape in shapes:
                    name = pattern.format(layer, suffix)
                    setattr(self, name, _new_parameter(shape, dtype))
                    names.append(name)
                self._flat_weights_names.extend(names)
                self._all_weights.append(names)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for weight in self.parameters():
            init.uniform_(weight, -stdv, stdv)

    def flatten_parameters(self) -> None:
        """Accepted for API compatibility: kiln keeps no flattened (cuDNN) weight buffer."""

    @property
    def _flat_weights(self) -> list[Parameter | None]:
        return [getattr(self, name, None) for name in self._flat_weights_names]

    @property
    def all_weights(self) -> list[list[Parameter]]:
        return [[getattr(self, name) for name in names] for names in self._all_weights]

    def extra_repr(self) -> str:
        s = "{input_size}, {hidden_size}"
        if self.proj_size != 0:
            s += ", proj_size={proj_size}"
        if self.num_layers != 1:
            s += ", num_layers={num_layers}"
        if self.bias is not True:
            s += ", bias={bias}"
        if self.batch_first is not False:
            s += ", batch_first={batch_first}"
        if self.dropout != 0:
            s += ", dropout={dropout}"
        if self.bidirectional is not False:
            s += ", bidirectional={bidirectional}"
        return s.format(**self.__dict__)

    # -- argument checks (torch's messages)
    def check_input(self, input: Tensor, batch_sizes: Any = None) -> None:
        weight_dtype = self._flat_weights[0].dtype  # type: ignore[union-attr]
        if input.dtype is not weight_dtype:
            raise KilnError(f"RNN input dtype ({input.dtype}) does not match weight dtype ({weight_dtype})",
                            fix=f"convert the input: input.to(kiln.{weight_dtype}), or the model: "
                                f"model.to(kiln.{input.dtype})")
        if input.dim() != 3:
            raise ShapeError(f"input must have 3 dimensions, got {input.dim()}")
        if self.input_size != input.size(-1):
            raise ShapeError(f"input.size(-1) must be equal to input_size. Expected {self.input_size}, "
                             f"got {input.size(-1)}")

    def get_expected_hidden_size(self, input: Tensor, batch_sizes: Any = None) -> tuple[Any, Any, Any]:
        mini_batch = input.size(0) if self.batch_first else input.size(1)
        num_directions = 2 if self.bidirectional else 1
        size = self.proj_size if self.proj_size > 0 else self.hidden_size
        return (self.num_layers * num_directions, mini_batch, size)

    def check_hidden_size(self, hx: Tensor, expected_hidden_size: tuple[Any, ...],
                          msg: str = "Expected hidden size {}, got {}") -> None:
        if not _same_size(hx.size(), expected_hidden_size):
            raise ShapeError(msg.format(tuple(expected_hidden_size), _size_text(hx.size())))

    def check_forward_args(self, input: Tensor, hidden: Tensor, batch_sizes: Any = None) -> None:
        self.check_input(input, batch_sizes)
        self.check_hidden_size(hidden, self.get_expected_hidden_size(input, batch_sizes))

    # -- the layer/direction loop
    def _unbatched_or_batched(self, input: Any) -> tuple[Tensor, bool, int]:
        if not isinstance(input, Tensor):
            raise KilnError(f"{type(self).__name__} expects a kiln.Tensor input, got {type(input).__name__}",
                            fix="packed sequences are not supported; pad the batch and pass a tensor")
        if input.dim() not in (2, 3):
            raise ShapeError(f"{type(self).__name__}: Expected input to be 2D or 3D, got {input.dim()}D instead")
        is_batched = input.dim() == 3
        batch_dim = 0 if self.batch_first else 1
        if not is_batched:
            input = input.unsqueeze(batch_dim)
        return input, is_batched, batch_dim

    def _run(self, input: Tensor, states: list[tuple[Tensor, ...]]) -> tuple[Tensor, list[tuple[Tensor, ...]]]:
        """Run all layers over time-major `input` (T, B, F); `states[k]` is layer/direction k's initial state."""
        num_directions = 2 if self.bidirectional else 1
        sequence_length = input.shape[0]
        if self.time_loop not in TIME_LOOPS:
            raise KilnError(f"{type(self).__name__}.time_loop must be one of {', '.join(TIME_LOOPS)}, got "
                            f"{self.time_loop!r}")
        if self.time_loop == "unroll" and not isinstance(sequence_length, int):
            raise KilnError(f"{type(self).__name__}.time_loop is 'unroll', so the sequence length must be static "
                            f"when exporting (got the symbolic size {sequence_length})",
                            fix="leave the sequence dim out of dynamic_shapes, or set time_loop = 'auto' to export "
                                "a scan over the sequence")
        if isinstance(sequence_length, int) and sequence_length == 0:
            raise ShapeError(f"{type(self).__name__} got an empty sequence", fix="pass at least one time step")
        layer_input = input
        finals: list[tuple[Tensor, ...]] = []
        for layer in range(self.num_layers):
            outputs = []
            for direction in range(num_directions):
                index = layer * num_directions + direction
                weights = [getattr(self, name) for name in self._all_weights[index]]
                sequence, final = self._run_direction(layer_input, states[index], weights, reverse=direction == 1)
                outputs.append(sequence)
                finals.append(final)
            layer_output = outputs[0] if num_directions == 1 else K.cat(outputs, 2)
            # torch applies dropout to every layer's output but the last.
            if self.dropout > 0 and self.training and layer < self.num_layers - 1:
                layer_output = F.dropout(layer_output, p=self.dropout, training=True)
            layer_input = layer_output
        return layer_input, finals

    def _run_direction(self, input: Tensor, state: tuple[Tensor, ...], weights: list[Tensor],
                       reverse: bool) -> tuple[Tensor, tuple[Tensor, ...]]:
        w_ih, w_hh = weights[0], weights[1]
        b_ih, b_hh = (weights[2], weights[3]) if self.bias else (None, None)
        w_hr = weights[-1] if self.proj_size > 0 else None
        # Like ATen, project the whole sequence's inputs with one matmul before the time loop.
        input_gates = F.linear(input, w_ih, b_ih)
        if self.time_loop == "scan" or (self.time_loop == "auto" and not isinstance(input.shape[0], int)):
            def step(carry: tuple[Tensor, ...], gates: Tensor) -> tuple[tuple[Tensor, ...], Tensor]:
                carry = self._step(gates, carry, w_hh, b_hh, w_hr)
                return carry, carry[0]
            final, sequence = scan(step, tuple(state), input_gates, reverse=reverse)
            return sequence, tuple(final)
        input_gates = input_gates.unbind(0)
        steps = range(len(input_gates) - 1, -1, -1) if reverse else range(len(input_gates))
        outputs: list[Tensor | None] = [None] * len(input_gates)
        for step in steps:
            state = self._step(input_gates[step], state, w_hh, b_hh, w_hr)
            outputs[step] = state[0]
        return K.stack(outputs, 0), state  # type: ignore[arg-type]

    def _step(self, input_gates: Tensor, state: tuple[Tensor, ...], w_hh: Tensor, b_hh: Tensor | None,
              w_hr: Tensor | None) -> tuple[Tensor, ...]:
        raise NotImplementedError


class RNN(RNNBase):
    """Elman RNN with tanh or relu: h_t = act(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if "proj_size" in kwargs:
            raise KilnError("proj_size argument is only supported for LSTM, not RNN or GRU")
        if len(args) > 3:  # torch's positional order: input_size, hidden_size, num_layers, nonlinearity, ...
            nonlinearity = args[3]
            args = args[:3] + args[4:]
        else:
            nonlinearity = kwargs.pop("nonlinearity", "tanh")
        if nonlinearity == "tanh":
            mode = "RNN_TANH"
        elif nonlinearity == "relu":
            mode = "RNN_RELU"
        else:
            raise KilnError(f"Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' or 'relu'.")
        super().__init__(mode, *args, **kwargs)
        self.nonlinearity = nonlinearity

    def _step(self, input_gates: Tensor, state: tuple[Tensor, ...], w_hh: Tensor, b_hh: Tensor | None,
              w_hr: Tensor | None) -> tuple[Tensor, ...]:
        return (_rnn_step(input_gates, state[0], w_hh, b_hh, self.mode == "RNN_RELU"),)

    def forward(self, input: Tensor, hx: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return _single_state_forward(self, input, hx)


class LSTM(RNNBase):
    """Long short-term memory; returns `(output, (h_n, c_n))` like torch.nn.LSTM (proj_size supported)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__("LSTM", *args, **kwargs)

    def get_expected_cell_size(self, input: Tensor, batch_sizes: Any = None) -> tuple[Any, Any, Any]:
        mini_batch = input.size(0) if self.batch_first else input.size(1)
        num_directions = 2 if self.bidirectional else 1
        return (self.num_layers * num_directions, mini_batch, self.hidden_size)

    def check_forward_args(self, input: Tensor, hidden: Any, batch_sizes: Any = None) -> None:  # type: ignore[override]
        self.check_input(input, batch_sizes)
        self.check_hidden_size(hidden[0], self.get_expected_hidden_size(input, batch_sizes),
                               "Expected hidden[0] size {}, got {}")
        self.check_hidden_size(hidden[1], self.get_expected_cell_size(input, batch_sizes),
                               "Expected hidden[1] size {}, got {}")

    def _step(self, input_gates: Tensor, state: tuple[Tensor, ...], w_hh: Tensor, b_hh: Tensor | None,
              w_hr: Tensor | None) -> tuple[Tensor, ...]:
        return _lstm_step(input_gates, state[0], state[1], w_hh, b_hh, w_hr)

    def forward(self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        input, is_batched, batch_dim = self._unbatched_or_batched(input)
        num_directions = 2 if self.bidirectional else 1
        real_hidden_size = self.proj_size if self.proj_size > 0 else self.hidden_size
        max_batch_size = input.size(0) if self.batch_first else input.size(1)
        if hx is None:
            h_zeros = K.zeros(self.num_layers * num_directions, max_batch_size, real_hidden_size, dtype=input.dtype)
            c_zeros = K.zeros(self.num_layers * num_directions, max_batch_size, self.hidden_size, dtype=input.dtype)
            hx = (h_zeros, c_zeros)
        else:
            if not isinstance(hx, (tuple, list)) or len(hx) != 2:
                raise KilnError("LSTM expects hx to be a tuple (h_0, c_0)")
            wanted = 3 if is_batched else 2
            if hx[0].dim() != wanted or hx[1].dim() != wanted:
                kind = "batched 3-D" if is_batched else "unbatched 2-D"
                raise ShapeError(f"For {kind} input, hx and cx should also be {wanted}-D but got "
                                 f"({hx[0].dim()}-D, {hx[1].dim()}-D) tensors")
            if not is_batched:
                hx = (hx[0].unsqueeze(1), hx[1].unsqueeze(1))
        self.check_forward_args(input, hx)
        time_major = input.transpose(0, 1) if self.batch_first else input
        h0, c0 = hx[0].unbind(0), hx[1].unbind(0)
        output, finals = self._run(time_major, list(zip(h0, c0)))
        if self.batch_first:
            output = output.transpose(0, 1)
        h_n = K.stack([final[0] for final in finals], 0)
        c_n = K.stack([final[1] for final in finals], 0)
        if not is_batched:
            return output.squeeze(batch_dim), (h_n.squeeze(1), c_n.squeeze(1))
        return output, (h_n, c_n)


class GRU(RNNBase):
    """Gated recurrent unit; returns `(output, h_n)` like torch.nn.GRU."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if "proj_size" in kwargs:
            raise KilnError("proj_size argument is only supported for LSTM, not RNN or GRU")
        super().__init__("GRU", *args, **kwargs)

    def _step(self, input_gates: Tensor, state: tuple[Tensor, ...], w_hh: Tensor, b_hh: Tensor | None,
              w_hr: Tensor | None) -> tuple[Tensor, ...]:
        return (_gru_step(input_gates, state[0], w_hh, b_hh),)

    def forward(self, input: Tensor, hx: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return _single_state_forward(self, input, hx)


def _single_state_forward(module: RNNBase, input: Tensor, hx: Tensor | None) -> tuple[Tensor, Tensor]:
    """forward of RNN and GRU, whose state is one tensor h."""
    input, is_batched, batch_dim = module._unbatched_or_batched(input)
    if hx is not None:
        wanted = 3 if is_batched else 2
        if hx.dim() != wanted:
            kind = "batched 3-D" if is_batched else "unbatched 2-D"
            raise ShapeError(f"For {kind} input, hx should also be {wanted}-D but got {hx.dim()}-D tensor")
        if not is_batched:
            hx = hx.unsqueeze(1)
    else:
        num_directions = 2 if module.bidirectional else 1
        max_batch_size = input.size(0) if module.batch_first else input.size(1)
        hx = K.zeros(module.num_layers * num_directions, max_batch_size, module.hidden_size, dtype=input.dtype)
    module.check_forward_args(input, hx)
    time_major = input.transpose(0, 1) if module.batch_first else input
    output, finals = module._run(time_major, [(h,) for h in hx.unbind(0)])
    if module.batch_first:
        output = output.transpose(0, 1)
    h_n = K.stack([final[0] for final in finals], 0)
    if not is_batched:
        return output.squeeze(batch_dim), h_n.squeeze(1)
    return output, h_n


# ---------------------------------------------------------------------------------------------
# Single-step cells


class RNNCellBase(Module):
    """What the cells share: `weight_ih`, `weight_hh`, `bias_ih`, `bias_hh` and torch's initialization."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool, num_chunks: int, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        _check_device(device)
        _check_positive_int("input_size", input_size)
        _check_positive_int("hidden_size", hidden_size)
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.bias = bias
        self.weight_ih = _new_parameter((num_chunks * hidden_size, input_size), dtype)
        self.weight_hh = _new_parameter((num_chunks * hidden_size, hidden_size), dtype)
        if bias:
            self.bias_ih = _new_parameter((num_chunks * hidden_size,), dtype)
            self.bias_hh = _new_parameter((num_chunks * hidden_size,), dtype)
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()

    def extra_repr(self) -> str:
        s = "{input_size}, {hidden_size}"
        if "bias" in self.__dict__ and self.bias is not True:
            s += ", bias={bias}"
        if "nonlinearity" in self.__dict__ and self.nonlinearity != "tanh":
            s += ", nonlinearity={nonlinearity}"
        return s.format(**self.__dict__)

    def reset_parameters(self) -> None:
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for weight in self.parameters():
            init.uniform_(weight, -stdv, stdv)

    def _batched(self, input: Tensor) -> tuple[Tensor, bool]:
        """`input` with a batch dim (added when unbatched) and whether it had one; rejects other ranks."""
        if input.dim() not in (1, 2):
            raise ShapeError(f"{type(self).__name__}: Expected input to be 1D or 2D, got {input.dim()}D instead")
        is_batched = input.dim() == 2
        return (input if is_batched else input.unsqueeze(0)), is_batched

    def _zeros(self, input: Tensor) -> Tensor:
        return K.zeros(input.size(0), self.hidden_size, dtype=input.dtype)


def _check_state_rank(cell: str, what: str, value: Tensor) -> None:
    if value.dim() not in (1, 2):
        raise ShapeError(f"{cell}: Expected {what} to be 1D or 2D, got {value.dim()}D instead")


class RNNCell(RNNCellBase):
    """One Elman RNN step: h' = act(x W_ih^T + b_ih + h W_hh^T + b_hh)."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, nonlinearity: str = "tanh",
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__(input_size, hidden_size, bias, num_chunks=1, device=device, dtype=dtype)
        if nonlinearity not in ("tanh", "relu"):
            raise KilnError(f"Unknown nonlinearity: {nonlinearity}", fix="use 'tanh' or 'relu'")
        self.nonlinearity = nonlinearity

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        input, is_batched = self._batched(input)
        if hx is not None:
            _check_state_rank("RNNCell", "hidden", hx)
        hx = self._zeros(input) if hx is None else (hx if is_batched else hx.unsqueeze(0))
        result = _rnn_cell(input, hx, self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh,
                           self.nonlinearity == "relu")
        return result if is_batched else result.squeeze(0)


class LSTMCell(RNNCellBase):
    """One LSTM step; returns `(h', c')`."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__(input_size, hidden_size, bias, num_chunks=4, device=device, dtype=dtype)

    def forward(self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        input, is_batched = self._batched(input)
        if hx is not None:
            for index, value in enumerate(hx):
                _check_state_rank("LSTMCell", f"hx[{index}]", value)
        if hx is None:
            zeros = self._zeros(input)
            hx = (zeros, zeros)
        elif not is_batched:
            hx = (hx[0].unsqueeze(0), hx[1].unsqueeze(0))
        hy, cy = _lstm_cell(input, hx[0], hx[1], self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh)
        return (hy, cy) if is_batched else (hy.squeeze(0), cy.squeeze(0))


class GRUCell(RNNCellBase):
    """One GRU step; returns h'."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__(input_size, hidden_size, bias, num_chunks=3, device=device, dtype=dtype)

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        input, is_batched = self._batched(input)
        if hx is not None:
            _check_state_rank("GRUCell", "hidden", hx)
        hx = self._zeros(input) if hx is None else (hx if is_batched else hx.unsqueeze(0))
        result = _gru_cell(input, hx, self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh)
        return result if is_batched else result.squeeze(0)
