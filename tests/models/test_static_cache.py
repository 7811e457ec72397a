"""Hugging Face decoders exported for generation with a static KV cache (transformers' ExecuTorch recipe,
`TorchExportableModuleForDecoderOnlyLM`: the cache is state the graph updates in place with `index_copy_`), saved,
and loaded by kiln; then a prompt and three decode steps, one call each, on kiln's interpreter module, the C package
and kiln's ONNXProgram, each against torch's `ep.module()` step by step, twice (state reset between)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.models.hf_zoo import ARCHITECTURES, export_with_static_cache  # noqa: E402

import kiln  # noqa: E402
from kiln.compiler import compile as compile_c  # noqa: E402
from kiln.testing import assert_close  # noqa: E402

MAX_CACHE = 16
PROMPT, DECODED = [5, 6, 7, 8], [9, 10, 11]
# a plain decoder, grouped-query attention with QK norms, sliding-window layers (the hybrid cache), a fused QKV
# projection, and a mixture of experts
DECODERS = ["llama", "qwen3", "gemma2", "phi3", "mixtral"]


def _steps() -> list[tuple[np.ndarray, np.ndarray]]:
    return [(np.array([PROMPT]), np.arange(len(PROMPT)))] + [
        (np.array([[token]]), np.array([len(PROMPT) + k])) for k, token in enumerate(DECODED)]


@pytest.mark.parametrize("name", DECODERS)
def test_generation_with_a_static_cache_matches_torch(name, tmp_path):
    model = ARCHITECTURES[name].model()
    archive, torch_module = export_with_static_cache(model, MAX_CACHE)
    with torch.no_grad():
        expected = [torch_module(input_ids=torch.from_numpy(ids), cache_position=torch.from_numpy(positions)).numpy()
                    for ids, positions in _steps()]
        # the cached steps compute what the whole sequence does without a cache
        whole = model(torch.tensor([PROMPT + DECODED]), use_cache=False).logits.numpy()
    assert_close(expected[-1][0, -1], whole[0, -1])
    program = kiln.load(archive)
    module = program.module()
    runners = {"interpreter": (lambda ids, positions: module(input_ids=ids, cache_position=positions),
                               module.reset_state)}
    onnx_program = kiln.onnx.export(program)
    runners["onnx"] = (lambda ids, positions: onnx_program(input_ids=ids, cache_position=positions),
                       onnx_program.reset_state)
    if shutil.which("cc"):
        compiled = compile_c(program, output=tmp_path / "pkg")
        runners["c"] = (compiled, compiled.reset_state)
    for stage, (run, reset) in runners.items():
        for attempt in range(2):
            for step, ((ids, positions), want) in enumerate(zip(_steps(), expected)):
                assert_close(np.asarray(run(ids, positions)), want,
                             msg=lambda m, s=step, a=attempt: f"{name} {stage}, sequence {a}, step {s}: {m}")
            reset()


def test_kiln_saves_the_stateful_program_for_torch():
    """The caches kiln read as buffers (torch's file mutates them as lifted constants) are written back as buffers
    with mutation outputs: torch's module of kiln's file generates as the original does, and kiln reads it again."""
    import io
    archive, torch_module = export_with_static_cache(ARCHITECTURES["llama"].model(), MAX_CACHE)
    saved = io.BytesIO()
    kiln.save(kiln.load(archive), saved)
    saved.seek(0)
    reloaded = torch.export.load(saved).module()
    again = kiln.load(io.BytesIO(saved.getvalue())).module()
    with torch.no_grad():
        for ids, positions in _steps():
            expected = torch_module(input_ids=torch.from_numpy(ids), cache_position=torch.from_numpy(positions))
            assert_close(reloaded(input_ids=torch.from_numpy(ids), cache_position=torch.from_numpy(positions)).numpy(),
                         expected.numpy())
            assert_close(np.asarray(again(input_ids=ids, cache_position=positions)), expected.numpy())
