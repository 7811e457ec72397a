"""Buffers a program mutates are state, as in torch's `ep.module()`: a static KV cache written with index_copy_ and a
step counter bumped with add_. kiln's `program.module()`, the C package (which keeps the state in the model,
kiln.h's kiln_state_data) and kiln's ONNXProgram (state as graph inputs whose updates are graph outputs) all carry it
from call to call; each is checked step by step against torch's module, and the program itself stays a function."""

from __future__ import annotations

import io
import shutil

import numpy as np
import pytest

import kiln
from kiln.compiler import compile as compile_c
from kiln.ir.errors import KilnError, UnsupportedError
from kiln.ir.program import OutputKind
from kiln.testing import assert_close

torch = pytest.importorskip("torch")
needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
POSITIONS = 6


class CachedSum(torch.nn.Module):
    """Writes each step's projected rows into a cache at their positions and counts its calls; returns the cache's
    column sums scaled by the count, so a lost update shows in every output."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)
        self.register_buffer("cache", torch.zeros(POSITIONS, 3))
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def forward(self, x, position):
        self.cache.index_copy_(0, position, self.linear(x))
        self.steps.add_(1)
        return self.cache.sum(0) * self.steps


# (rows, their positions) per call: a two-row prefill, then a row at a time
STEPS = [(2, [0, 1]), (1, [2]), (1, [3]), (2, [4, 5])]


def _export():
    """The torch module's exported program (saved and read by kiln) and torch's stateful module for the oracle."""
    torch.manual_seed(0)
    rows = torch.export.Dim("rows", max=POSITIONS)
    exported = torch.export.export(CachedSum(), (torch.randn(2, 3), torch.tensor([0, 1])),
                                   dynamic_shapes=({0: rows}, {0: rows}))
    buffer = io.BytesIO()
    torch.export.save(exported, buffer)
    buffer.seek(0)
    return kiln.load(buffer), exported.module()


def _inputs():
    rng = np.random.default_rng(1)
    return [(rng.standard_normal((rows, 3)).astype(np.float32), np.array(positions)) for rows, positions in STEPS]


def _torch_steps(module) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
    with torch.no_grad():
        outputs = [module(torch.from_numpy(x), torch.from_numpy(p)).numpy() for x, p in _inputs()]
    return outputs, {name: buffer.numpy() for name, buffer in module.named_buffers()}


def _check_steps(run, expected: list[np.ndarray]) -> None:
    for step, ((x, position), want) in enumerate(zip(_inputs(), expected)):
        assert_close(np.asarray(run(x, position)), want, msg=lambda m, s=step: f"step {s}: {m}")


@pytest.fixture(scope="module")
def exported():
    program, torch_module = _export()
    return program, _torch_steps(torch_module)


def test_load_makes_the_updates_mutation_outputs(exported):
    program, _ = exported
    mutated = {spec.target for spec in program.graph_signature.output_specs
               if spec.kind is OutputKind.BUFFER_MUTATION}
    assert mutated == {"cache", "steps"}


def test_program_module_keeps_the_updates_like_torch(exported):
    program, (expected, buffers) = exported
    module = program.module()
    _check_steps(module, expected)
    for name, value in module.named_buffers():
        assert_close(value, buffers[name])
    module.reset_state()
    _check_steps(module, expected)  # from the exported values again
    with pytest.raises(KilnError, match=r"buffer 'cache' has shape \[6, 3\], got \[3, 6\]"):
        module.load_state_dict({"cache": np.zeros((3, 6), np.float32)})
    with pytest.raises(KilnError, match="'linear.weight' is not a buffer the program mutates"):
        module.load_state_dict({"linear.weight": np.zeros((3, 3), np.float32)})


def test_the_program_itself_is_a_function(exported):
    program, (expected, _) = exported
    x, position = _inputs()[0]
    for _ in range(2):  # each call starts from the stored buffers
        assert_close(program(x, position), expected[0])


@needs_cc
def test_c_package_keeps_the_state(exported, tmp_path):
    program, (expected, buffers) = exported
    _check_a_package_keeps_the_state(compile_c(program, output=tmp_path / "pkg"), expected, buffers)


def _check_a_package_keeps_the_state(compiled, expected: list[np.ndarray], buffers: dict[str, np.ndarray]) -> None:
    """The updates are state, not outputs: step by step as torch's module, its buffers after them, and again after
    a reset."""
    assert [entry["name"] for entry in compiled.manifest["states"]] == ["cache", "steps"]
    assert len(compiled.manifest["outputs"]) == 1
    _check_steps(compiled, expected)
    state = dict(compiled.named_buffers())
    for name in ("cache", "steps"):
        assert_close(state[name], buffers[name])
    compiled.reset_state()
    _check_steps(compiled, expected)


@needs_cc
def test_kiln_inspect_lists_the_state(exported, tmp_path, capsys):
    from kiln.cli.main import main
    program, _ = exported
    compile_c(program, output=tmp_path / "pkg")
    assert main(["inspect", str(tmp_path / "pkg")]) == 0
    shown = capsys.readouterr().out
    assert "state (buffers the model keeps from run to run):\n  cache: f32[6, 3]\n  steps: i64[]" in shown


@needs_cc
def test_c_state_is_set_by_load_state_dict_and_left_by_a_failed_run_as_torch_leaves_it(exported, tmp_path):
    """The cache is updated in place (its scatter writes over the state: no copy per run), so a run that fails on an
    out-of-range position has written the rows before it, as torch's index_copy_ has; the counter's new value is
    written beside it and swapped in only after a successful run, and torch never reached its add_."""
    program, (expected, _) = exported
    _check_a_failed_run_and_bad_state(program, compile_c(program, output=tmp_path / "pkg"), expected)


def _check_a_failed_run_and_bad_state(program, compiled, expected: list[np.ndarray]) -> None:
    """From the state before the last step: the last step as torch's; a run failing on an out-of-range position
    leaves the state as torch's failing module leaves its buffers; load_state_dict refuses other names and shapes."""
    x, position = _inputs()[-1]
    before_last = _state_before_last_step(program)
    compiled.load_state_dict(before_last)
    assert_close(compiled(x, position), expected[-1])
    compiled.load_state_dict(before_last)
    _, torch_module = _export()
    torch_module.load_state_dict({**torch_module.state_dict(), **{k: torch.from_numpy(v) for k, v in
                                                                  before_last.items()}})
    bad_position = np.array([4, POSITIONS])
    with pytest.raises(IndexError):
        torch_module(torch.from_numpy(x), torch.from_numpy(bad_position))
    with pytest.raises(KilnError, match="out of bounds"):
        compiled(x, bad_position)
    left = dict(compiled.named_buffers())
    for name, value in torch_module.named_buffers():
        assert_close(left[name], value.numpy())
    with pytest.raises(KilnError, match="'linear.weight' is not a buffer this package keeps"):
        compiled.load_state_dict({"linear.weight": np.zeros((3, 3), np.float32)})
    with pytest.raises(KilnError, match=r"state 'cache' has shape \[6, 3\], got \[2, 3\]"):
        compiled.load_state_dict({"cache": np.zeros((2, 3), np.float32)})


@needs_cc
def test_c_updates_the_cache_in_place_and_swaps_the_counter(exported, tmp_path):
    """A state whose new value is a scatter over all of it (the cache) is written in place: the model allocates it
    once and its scatter copies nothing; the counter (add_) gets a second buffer that a successful run swaps in."""
    program, _ = exported
    compile_c(program, output=tmp_path / "pkg")
    source = (tmp_path / "pkg" / "model.c").read_text()
    assert "static const unsigned char STATE_SWAPPED[] = {0, 1};" in source


def _state_before_last_step(program) -> dict[str, np.ndarray]:
    """The interpreter's state after every step but the last."""
    module = program.module()
    for x, position in _inputs()[:-1]:
        module(x, position)
    return {name: value for name, value in module.named_buffers() if name in ("cache", "steps")}


def test_onnx_carries_the_state_as_inputs_and_outputs(exported):
    import onnxruntime
    program, (expected, _) = exported
    onnx_program = kiln.onnx.export(program)
    graph = onnx_program.model_proto.graph
    assert [i.name for i in graph.input][-2:] == ["cache", "steps"]
    assert [o.name for o in graph.output][-2:] == ["cache_updated", "steps_updated"]
    _check_steps(onnx_program, expected)
    before = dict(onnx_program.state)
    x, position = _inputs()[0]
    assert onnx_program.verify(x, position).ok  # against the interpreter from the same state, which it keeps
    assert all(np.array_equal(before[name], value) for name, value in onnx_program.state.items())
    onnx_program.reset_state()
    _check_steps(onnx_program, expected)
    # onnxruntime alone: the caller feeds the updates back
    session = onnxruntime.InferenceSession(onnx_program.model_proto.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    state = {"cache": np.zeros((POSITIONS, 3), np.float32), "steps": np.array(0)}
    names = [i.name for i in session.get_inputs()]
    for (x, position), want in zip(_inputs(), expected):
        output, state["cache"], state["steps"] = session.run(None, dict(zip(names, [x, position, state["cache"],
                                                                                   state["steps"]])))
        assert_close(output, want)


def test_triton_package_keeps_the_state(exported, tmp_path):
    """The Triton package (here through Triton's interpreter) keeps the state as the C package does: the cache is
    updated in place by its scatter (no copy kernel), the counter beside it and swapped in after a successful run;
    a run that fails on an out-of-range position leaves both as torch leaves them."""
    pytest.importorskip("triton")
    program, (expected, buffers) = exported
    compiled = compile_c(program, target="triton", output=tmp_path / "pkg")
    source = (tmp_path / "pkg" / "model.py").read_text()
    assert "_copy" not in source and "return [b" in source and "{'steps': b" in source
    _check_a_package_keeps_the_state(compiled, expected, buffers)
    _check_a_failed_run_and_bad_state(program, compiled, expected)


def test_a_target_that_keeps_no_state_refuses_the_program(exported):
    """A backend declares whether its packages keep state (Target.keeps_state); one that does not refuses a stateful
    program by name instead of dropping the updates."""
    import dataclasses

    from kiln.codegen.driver import DEFAULT_PIPELINE
    from kiln.codegen.legalize import legalize
    from kiln.codegen.schedule import schedule
    from kiln.codegen.triton.target import TARGET
    from kiln.passes import run as run_passes
    program, _ = exported
    stateless = dataclasses.replace(TARGET, name="Stateless", keeps_state=False)
    legal = legalize(run_passes(program, DEFAULT_PIPELINE), stateless)
    with pytest.raises(UnsupportedError, match=r"mutates buffers \(cache, steps\), and Stateless packages keep no "
                                               r"state between runs"):
        schedule(legal, stateless)


@needs_cc
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_sanitized_runs_keep_the_state(exported, tmp_path):
    """The deploy runner linked with the package under ASan + UBSan, three runs on the same inputs: the state's
    allocation, its in-place update and its swap stay in bounds and are freed, and the last run's output is the
    interpreter module's third."""
    from tests.runtime.test_sanitizers import (
        SANITIZER_ENV, SANITIZER_ERRORS, build_sanitized, run_runner, sanitizer_missing,
    )
    from tests.runtime.test_deploy import parse_outputs
    reason = sanitizer_missing(tmp_path)
    if reason:
        pytest.skip(reason)
    program, _ = exported
    package = tmp_path / "pkg"
    compile_c(program, output=package)
    binary = [str(build_sanitized(package, tmp_path))]
    x, position = _inputs()[0]
    values = dict(zip(program.graph_signature.user_inputs, (x, position)))
    result = run_runner(binary, package, values, tmp_path, SANITIZER_ENV, ("--runs=3",))
    assert not any(marker in result.stderr for marker in SANITIZER_ERRORS), result.stderr[-8000:]
    assert result.returncode == 0, result.stderr[-8000:]
    module = program.module()
    for _ in range(3):
        expected = module(x, position)
    got, = parse_outputs(result.stdout).values()
    assert_close(got, expected)
