"""Hugging Face decoders exported for generation with a static KV cache (transformers' ExecuTorch recipe,
`TorchExportableModuleForDecoderOnlyLM`: the cache is state the graph updates in place with `index_copy_`), saved,
and loaded by kiln; then a prompt and three decode steps, one call each, on kiln's interpreter module, the C package,
the Triton package and kiln's ONNXProgram, each against torch's `ep.module()` step by step, twice (state reset
between)."""

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


def _has_triton() -> bool:
    import importlib.util
    return importlib.util.find_spec("triton") is not None


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
    if _has_triton():  # through Triton's interpreter (TRITON_INTERPRET=1, tests/conftest.py)
        triton_model = compile_c(program, target="triton", output=tmp_path / "triton")
        runners["triton"] = (triton_model, triton_model.reset_state)
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


@pytest.mark.parametrize("scheme, fused_op", [("weight-only-int8", "quant.linear_weight_only.default"),
                                              ("weight-only-int4", "quant.linear_weight_only.default"),
                                              ("dynamic", "quant.qlinear_pointwise.tensor")])
def test_quantized_generation_keeps_the_cache(scheme, fused_op, tmp_path):
    """The deployment forms of a decoder: quantized (PT2E, as `kiln quantize --scheme` does: weight-only int8 or int4,
    or dynamic int8 activations) with a static cache. The quantized program keeps the caches as state; its C package
    runs every linear layer as one fused quantized kernel and its ONNX file (blocked QDQ for int4) runs in
    onnxruntime; those, the Triton package and torch's module of kiln's saved file generate step by step as kiln's
    interpreter does on the Q/DQ program."""
    from kiln import quantization as kq
    from kiln.cli.quantize import quantizer_for
    from kiln.codegen.onnx.quantized import BLOCKED_QDQ_OPSET
    from kiln.passes import run as run_passes
    archive, _ = export_with_static_cache(ARCHITECTURES["llama"].model(), MAX_CACHE)
    program = kiln.load(archive)
    quantized = kq.convert_pt2e(kq.prepare_pt2e(program, quantizer_for(scheme, group_size=32)))
    assert sorted(quantized.graph_signature.buffers_to_mutate.values()) == \
        sorted(program.graph_signature.buffers_to_mutate.values())
    lowered = run_passes(quantized, "lower-quantized").op_histogram()
    assert lowered[fused_op] == 2 * 7 + 1  # q, k, v, o, gate, up and down per layer; the head
    assert "aten.linear.default" not in lowered
    module = quantized.module()
    expected = [np.asarray(module(input_ids=ids, cache_position=positions)) for ids, positions in _steps()]
    # the oracle itself keeps the cache: the steps wrote it (else stateless backends would agree with it too)
    mutated = set(quantized.graph_signature.buffers_to_mutate.values())
    assert any(not np.array_equal(value, quantized.stored(name)) for name, value in module.named_buffers()
               if name in mutated)
    onnx_program = kiln.onnx.export(quantized, opset_version=BLOCKED_QDQ_OPSET if scheme.endswith("int4") else None)
    runners = {"onnx": lambda ids, positions: onnx_program(input_ids=ids, cache_position=positions)}
    kiln.save(quantized, tmp_path / "quantized.pt2")
    pytest.importorskip("torchao")  # torch reads quantized_decomposed ops once torchao registers them
    import torchao.quantization.pt2e  # noqa: F401
    reloaded = torch.export.load(tmp_path / "quantized.pt2").module()
    runners["torch"] = lambda ids, positions: reloaded(
        input_ids=torch.from_numpy(ids), cache_position=torch.from_numpy(positions)).detach().numpy()
    if shutil.which("cc"):
        runners["c"] = compile_c(quantized, output=tmp_path / "pkg")
    if _has_triton():
        runners["triton"] = compile_c(quantized, target="triton", output=tmp_path / "triton")
    for stage, run in runners.items():
        for step, ((ids, positions), want) in enumerate(zip(_steps(), expected)):
            assert_close(np.asarray(run(ids, positions)), want, msg=lambda m, s=step: f"{stage}, step {s}: {m}")
