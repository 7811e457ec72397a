"""Loops in C: kiln.scan, kiln.map and kiln.while_loop compile to loop kernels whose body kernels run once per step
inside the run's one OpenMP region. One package per program serves every sequence length; values match torch
eager (recurrent layers, user scans) and the interpreter, on one thread and on a team."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

import kiln
from kiln.compiler import compile as compile_c
from tests.runtime.support import use_capability

torch = pytest.importorskip("torch")
from tests.torch_oracle import module_pair  # noqa: E402

pytestmark = [pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler"),
              pytest.mark.filterwarnings("ignore:LSTM with projections is not supported:UserWarning")]

LENGTHS = (1, 7, 300)

# Every option of the recurrent layers, each exported once with dynamic sequence and batch dims.
RECURRENT = [
    ("LSTM", {"num_layers": 2, "bidirectional": True, "batch_first": True, "proj_size": 3}),
    ("LSTM", {"bias": False, "dropout": 0.3, "num_layers": 2}),
    ("GRU", {"num_layers": 2, "bidirectional": True}),
    ("GRU", {"bias": False, "batch_first": True}),
    ("RNN", {"nonlinearity": "relu", "num_layers": 2, "bidirectional": True}),
    ("RNN", {"batch_first": True}),
]


def _torch_values(value) -> list[np.ndarray]:
    if isinstance(value, (tuple, list)):
        return [leaf for item in value for leaf in _torch_values(item)]
    return [value.detach().numpy()]


def _close(got, expected) -> None:
    got = list(got) if isinstance(got, (tuple, list)) else [got]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        torch.testing.assert_close(torch.from_numpy(np.asarray(g)), torch.from_numpy(np.asarray(e)))


@pytest.mark.parametrize("name,kwargs", RECURRENT, ids=lambda v: str(v))
def test_recurrent_layer_with_a_dynamic_sequence_matches_torch(name, kwargs, tmp_path):
    check_recurrent_layer(name, kwargs, tmp_path, "c", LENGTHS)


def check_recurrent_layer(name: str, kwargs: dict, tmp_path, target: str, lengths: tuple) -> None:
    """The layer exported once with dynamic sequence and batch dims, compiled for `target`, against torch eager at
    each of `lengths` (batches 2, 3, 1)."""
    reference, module = module_pair(name, 6, 8, **kwargs)
    seq_dim, batch_dim = (1, 0) if kwargs.get("batch_first") else (0, 1)

    def example(length: int, batch: int) -> torch.Tensor:
        shape = [0, 0, 6]
        shape[seq_dim], shape[batch_dim] = length, batch
        return torch.randn(*shape)

    program = kiln.export(module, (kiln.Tensor(example(5, 2).numpy()),),
                          dynamic_shapes={"input": {seq_dim: kiln.Dim("seq"), batch_dim: kiln.Dim("batch")}})
    model = compile_c(program, target=target, output=tmp_path / "pkg")
    for length, batch in zip(lengths, (2, 3, 1)):
        x = example(length, batch)
        _close(model(x.numpy()), _torch_values(reference(x)))


class _Tagger(kiln.nn.Module):
    """The zoo tagger's shape, big enough that a 300-step run takes a team of threads (~0.3 MFLOP a step)."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = kiln.nn.LSTM(32, 64, num_layers=2, batch_first=True, bidirectional=True)
        self.tag = kiln.nn.Linear(128, 5)

    def forward(self, x):
        return self.tag(self.lstm(x)[0]).log_softmax(-1)


@pytest.mark.parametrize("capability", ["DEFAULT", "AVX2"])
def test_threads_share_every_step_and_agree(capability, tmp_path, monkeypatch):
    use_capability(capability, monkeypatch)
    kiln.manual_seed(0)
    module = _Tagger().eval()
    program = kiln.export(module, (kiln.randn(8, 5, 32),), dynamic_shapes={"x": {1: kiln.Dim("seq")}})
    compile_c(program, output=tmp_path / "pkg")
    x = kiln.randn(8, 300, 32)
    expected = module(x).numpy()
    for threads in (1, 2):
        model = kiln.runtime.load(tmp_path / "pkg", num_threads=threads)
        _close(model(x.numpy()), [expected])


# The fused LSTM step (kiln/codegen/c/recurrent.py): hidden sizes that fill the blocks of lanes or leave a partial
# one (10, 24 with AVX-512's 16 lanes), with and without biases, both directions, batch-first.
FUSED_LSTMS = [(10, {}), (24, {"bias": False, "batch_first": True}), (32, {"num_layers": 2, "bidirectional": True})]


@pytest.mark.parametrize("capability", ["native", "AVX2", "DEFAULT"])
@pytest.mark.parametrize("hidden,kwargs", FUSED_LSTMS, ids=lambda v: str(v))
def test_fused_lstm_step_gives_the_bits_of_its_three_kernels(hidden, kwargs, capability, tmp_path, monkeypatch):
    """Each step one kernel (the gates' GEMM with the cell in its epilogue, on gate-interleaved weight panels): the
    same bits as the GEMM and two pointwise kernels it replaces, at every capability, and torch eager's values."""
    from kiln.codegen.c import recurrent
    if capability != "native":
        use_capability(capability, monkeypatch)
    monkeypatch.setattr(recurrent, "FUSE_MIN_HIDDEN", 1)  # every size fuses
    reference, module = module_pair("LSTM", 6, hidden, **kwargs)
    seq_dim, batch_dim = (1, 0) if kwargs.get("batch_first") else (0, 1)
    shape = [0, 0, 6]
    shape[seq_dim], shape[batch_dim] = 5, 2
    program = kiln.export(module, (kiln.randn(*shape),),
                          dynamic_shapes={"input": {seq_dim: kiln.Dim("seq"), batch_dim: kiln.Dim("batch")}})
    outputs = {}
    for fuse in (True, False):
        monkeypatch.setattr(recurrent, "FUSE", fuse)
        model = compile_c(program, output=tmp_path / f"pkg_{fuse}")
        kernels = re.findall(r"static void (kernel_\w+)\(", (tmp_path / f"pkg_{fuse}" / "model.c").read_text())
        scans = kwargs.get("num_layers", 1) * (2 if kwargs.get("bidirectional") else 1)
        assert len([k for k in kernels if "lstm_cell" in k]) == (scans if fuse else 0)
        shape[seq_dim], shape[batch_dim] = 33, 3
        x = np.random.default_rng(hidden).standard_normal(shape).astype(np.float32)
        outputs[fuse] = model(x)
    for fused, unfused in zip(outputs[True], outputs[False], strict=True):
        np.testing.assert_array_equal(fused, unfused)
    _close(outputs[True], _torch_values(reference(torch.from_numpy(x))))


def test_lstm_steps_fuse_from_the_measured_hidden_size(tmp_path):
    from kiln.codegen.c import recurrent
    for hidden in (recurrent.FUSE_MIN_HIDDEN // 2, recurrent.FUSE_MIN_HIDDEN):
        program = kiln.export(kiln.nn.LSTM(4, hidden).eval(), (kiln.randn(3, 1, 4),),
                              dynamic_shapes={"input": {0: kiln.Dim("seq")}})
        compile_c(program, output=tmp_path / f"pkg{hidden}")
        fused = "lstm_cell" in (tmp_path / f"pkg{hidden}" / "model.c").read_text()
        assert fused == (hidden >= recurrent.FUSE_MIN_HIDDEN)


class Accumulate(torch.nn.Module):
    """torch's scan over dim 1, reversed, with two carries, two xs and a parameter in the body."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 4) * 0.3)

    def forward(self, xs, ys, h):
        from torch._higher_order_ops.scan import scan

        def step(carry, inputs):
            h, total = carry
            x, y = inputs
            h = torch.tanh(x @ self.weight + h * y)
            return (h, total + h.sum(-1, keepdim=True)), h.relu() * 2
        return scan(step, (h, torch.zeros(h.shape[0], 1)), (xs, ys), dim=1, reverse=True)


class KilnAccumulate(kiln.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = kiln.nn.Parameter(kiln.zeros(4, 4))

    def forward(self, xs, ys, h):
        def step(carry, inputs):
            h, total = carry
            x, y = inputs
            h = kiln.tanh(x @ self.weight + h * y)
            return (h, total + h.sum(-1, keepdim=True)), h.relu() * 2
        return kiln.scan(step, (h, kiln.zeros(h.shape[0], 1)), (xs, ys), dim=1, reverse=True)


def test_user_scan_matches_torch(tmp_path):
    torch.manual_seed(0)
    reference, module = Accumulate(), KilnAccumulate()
    module.load_state_dict({k: kiln.Tensor(v.detach().numpy()) for k, v in reference.state_dict().items()})
    seq, batch = kiln.Dim("seq"), kiln.Dim("batch")
    example = (kiln.randn(3, 5, 4), kiln.randn(3, 5, 4), kiln.randn(3, 4))
    program = kiln.export(module, example, dynamic_shapes={"xs": {0: batch, 1: seq}, "ys": {0: batch, 1: seq},
                                                           "h": {0: batch}})
    model = compile_c(program, output=tmp_path / "pkg")
    for length in LENGTHS:
        inputs = [torch.randn(2, length, 4), torch.randn(2, length, 4), torch.randn(2, 4)]
        _close(model(*(t.numpy() for t in inputs)), _torch_values(reference(*inputs)))


class Doubling(kiln.nn.Module):
    """A data-dependent trip count, a captured parameter, and a counter carried beside the tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = kiln.nn.Parameter(kiln.tensor([1.5, 2.0, 2.5]))

    def forward(self, x, limit):
        def cond(i, y):
            return y.abs().sum() < limit.sum()

        def body(i, y):
            return i + 1, y * self.scale + 0.25
        return kiln.while_loop(cond, body, (kiln.tensor(0), x))


def test_while_loop_matches_torch(tmp_path):
    from torch._higher_order_ops.while_loop import while_loop
    module = Doubling()
    scale = torch.from_numpy(module.scale.numpy())
    program = kiln.export(module, (kiln.randn(2, 3), kiln.tensor([10.0])), dynamic_shapes={"x": {0: kiln.Dim("b")},
                                                                                           "limit": None})
    model = compile_c(program, output=tmp_path / "pkg")
    for rows, limit in ((1, 0.0), (2, 10.0), (5, 1e5)):  # zero, a few, and many iterations
        x, bound = torch.randn(rows, 3), torch.tensor([limit])
        expected = while_loop(lambda i, y: y.abs().sum() < bound.sum(), lambda i, y: (i + 1, y * scale + 0.25),
                              (torch.tensor(0), x))
        _close(model(x.numpy(), bound.numpy()), _torch_values(expected))


class NestedLoops(kiln.nn.Module):
    """A scan inside a map, whose step runs a while loop: windows of an outer loop feed the inner ones."""

    def forward(self, xs, h):
        def per_row(row, h):
            def step(carry, x):
                def cond(c):
                    return c.abs().amax() < 4.0

                (grown,) = kiln.while_loop(cond, lambda c: (c * 2.0 + 0.5,), (carry + x,))
                return grown * 0.25, grown.sum(-1)
            return kiln.scan(step, h, row)
        return kiln.map(per_row, xs, h)


def test_nested_loops_match_the_interpreter(tmp_path):
    program = kiln.export(NestedLoops(), (kiln.randn(2, 5, 3, 4), kiln.randn(3, 4)),
                          dynamic_shapes={"xs": {0: kiln.Dim("rows"), 1: kiln.Dim("seq")}, "h": None})
    model = compile_c(program, output=tmp_path / "pkg")
    for rows, length in ((1, 1), (3, 7), (2, 40)):
        inputs = (kiln.randn(rows, length, 3, 4).numpy(), kiln.randn(3, 4).numpy())
        _close(model(*inputs), [np.asarray(v) for v in program(*inputs)])


def test_loop_kernel_source_runs_its_body_inside_the_parallel_region(tmp_path):
    kiln.manual_seed(0)
    module = kiln.nn.LSTM(4, 8).eval()
    program = kiln.export(module, (kiln.randn(5, 2, 4),), dynamic_shapes={"input": {0: kiln.Dim("seq")}})
    compile_c(program, output=tmp_path / "pkg")
    source = (tmp_path / "pkg" / "model.c").read_text()
    loop = re.search(r"/\* loop: kiln\.scan \*/\n/\* each step runs the (\d+) kernels? above \*/\nstatic void (\w+)\(",
                     source)
    assert loop, "no loop kernel"
    function = source.split(f"static void {loop.group(2)}(")[1].split("\n}")[0]
    steps = re.findall(r"^        (kernel_\w+)\(ctx\);$", function, re.M)
    assert len(steps) == int(loop.group(1)) and "omp parallel" not in function
    # the hidden state's GEMM (w_hh, packed when the model is created) adds the step's input gates in its epilogue
    gemm = re.search(rf"/\* matmul: aten\.addmm\.default, aten\.add\.Tensor \*/\nstatic void {steps[0]}\(.*ctx->packed",
                     source)
    assert gemm, source


def test_inspect_lists_the_loop_after_its_step_kernels(tmp_path, capsys):
    from kiln.cli.main import main
    program = kiln.export(kiln.nn.RNN(4, 8).eval(), (kiln.randn(5, 2, 4),),
                          dynamic_shapes={"input": {0: kiln.Dim("seq")}})
    compile_c(program, output=tmp_path / "pkg")
    assert main(["inspect", str(tmp_path / "pkg")]) == 0
    listed = [line.split(". ", 1)[1] for line in capsys.readouterr().out.splitlines() if re.match(r"  \d+\. ", line)]
    loop = listed.index("loop: kiln.scan")
    # an RNN step is one kernel: the GEMM on the hidden state, the input's projection added and tanh applied in its
    # epilogue, written straight into the stacked output (which is also the carry)
    assert listed[loop - 1] == "matmul: aten.addmm.default, aten.add.Tensor, aten.tanh.default"
    assert "each step runs the 1 kernel above" in (tmp_path / "pkg" / "model.c").read_text()

