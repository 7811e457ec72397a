"""One decoding step of a Hugging Face Llama (random weights) exported with a static KV cache: kiln's C package, which
keeps the cache as state, against onnxruntime and torch eager, side by side in one process.

Usage: python benchmarks/static_cache.py [--layers 6] [--cache 512] [--threads 1] [--rounds 15]

The model goes through transformers' ExecuTorch recipe (`TorchExportableModuleForDecoderOnlyLM`): the cache is
buffers the graph updates in place (`index_copy_`), so the exported program is stateful. torch eager is
`ep.module()`, which updates its buffers in place. kiln: `kiln.load` of the saved .pt2, then `kiln.compile`; the
package holds the cache and swaps in its new value after each run (docs/c-backend.md, "State"). onnxruntime runs
kiln's ONNX file, where the cache is graph inputs and outputs: each step feeds the previous step's outputs back, as
kiln's ONNXProgram does. It runs two files: opset 20 (kiln's default), where the key/value heads are repeated per
query head, and opset 23, whose Attention op reads them grouped. Every step is the same token at the same position
after a prefill, so each peer's state stays the same size; each step attends over the whole static cache, as Hugging
Face's static cache does.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from c_realistic import cpu_name  # noqa: E402  (benchmarks/c_realistic.py)
from kiln.codegen.c.build import get_cpu_capability  # noqa: E402
from onnx_quality import ort_session  # noqa: E402
from timing import interleaved_medians  # noqa: E402


def export_llama(torch: Any, transformers: Any, layers: int, cache: int) -> tuple[Any, Any]:
    """(the saved .pt2 in memory, torch's stateful module) of a Llama with hidden size 512 and a static cache."""
    from tests.models.hf_zoo import export_with_static_cache
    torch.manual_seed(0)
    config = transformers.LlamaConfig(num_hidden_layers=layers, hidden_size=512, num_attention_heads=8,
                                      num_key_value_heads=4, intermediate_size=1408, vocab_size=8000,
                                      max_position_embeddings=cache, use_cache=True)
    return export_with_static_cache(transformers.LlamaForCausalLM(config).eval(), cache)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--cache", type=int, default=512, help="static cache positions")
    parser.add_argument("--prompt", type=int, default=32, help="tokens prefilled before the timed steps")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=15)
    options = parser.parse_args()
    logging.disable(logging.WARNING)
    import torch
    import transformers

    import kiln
    torch.set_num_threads(options.threads)
    archive, torch_module = export_llama(torch, transformers, options.layers, options.cache)
    program = kiln.load(archive)
    compiled = kiln.compile(program, num_threads=options.threads)
    prompt = np.arange(3, 3 + options.prompt)[None, :]
    prefill, step = (prompt, np.arange(options.prompt)), (np.array([[11]]), np.array([options.prompt]))
    with torch.no_grad():
        torch_module(input_ids=torch.from_numpy(prefill[0]), cache_position=torch.from_numpy(prefill[1]))
        expected = torch_module(input_ids=torch.from_numpy(step[0]), cache_position=torch.from_numpy(step[1])).numpy()
    compiled(*prefill)
    differences = {"kiln C": float(np.max(np.abs(compiled(*step) - expected)))}

    def ort_runner(opset: int) -> Any:
        """onnxruntime on kiln's ONNX file at `opset`, after the prefill; the cache fed back from step to step."""
        onnx_program = kiln.onnx.export(program, opset_version=opset)
        session = ort_session(onnx_program.model_proto.SerializeToString(), options.threads)
        onnx_program(input_ids=prefill[0], cache_position=prefill[1])
        names = [i.name for i in session.get_inputs()]
        state = dict(onnx_program.state)

        def ort_step() -> Any:
            outputs = session.run(None, dict(zip(names, [*step, *state.values()])))
            state.update(zip(state, outputs[1:]))
            return outputs[0]
        return ort_step

    # opset 20 (kiln's default) repeats the key/value heads; opset 23's Attention reads them grouped
    onnx_peers = {f"onnxruntime {opset}": ort_runner(opset) for opset in (20, 23)}
    for peer, runner in onnx_peers.items():
        differences[peer] = float(np.max(np.abs(runner() - expected)))

    def eager() -> Any:
        with torch.inference_mode():
            return torch_module(input_ids=torch.from_numpy(step[0]), cache_position=torch.from_numpy(step[1]))
    runners = {"kiln C": lambda: compiled(*step), **onnx_peers, "torch eager": eager}
    medians = interleaved_medians(runners, options.rounds)
    cache_bytes = sum(int(np.prod(entry["shape"])) * 4 for entry in compiled.manifest["states"])
    print(f"Llama decode step with a static cache: {options.layers} layers, hidden 512, {options.cache} positions "
          f"({cache_bytes / 1e6:.1f} MB of cache), {options.threads} thread(s), {cpu_name()}, capability "
          f"{get_cpu_capability()}")
    print(f"{'peer (opset)':<16} {'ms':>8} {'/ kiln':>7}  max abs difference from torch eager (first step)")
    for peer, seconds in medians.items():
        print(f"{peer:<16} {seconds * 1e3:8.2f} {seconds / medians['kiln C']:7.2f}  "
              f"{differences.get(peer, 0.0):.1e}")


if __name__ == "__main__":
    main()
