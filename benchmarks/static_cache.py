"""One decoding step of a Hugging Face Llama (random weights) exported with a static KV cache: kiln's C package, which
keeps the cache as state, against onnxruntime and torch eager, side by side in one process.

Usage: python benchmarks/static_cache.py [--layers 6] [--cache 512] [--threads 1] [--rounds 15] [--weights int8 int4]

The model goes through transformers' ExecuTorch recipe (`TorchExportableModuleForDecoderOnlyLM`): the cache is
buffers the graph updates in place (`index_copy_`), so the exported program is stateful. torch eager is
`ep.module()`, which updates its buffers in place. kiln: `kiln.load` of the saved .pt2, then `kiln.compile`; the
package holds the cache and swaps in its new value after each run (docs/c-backend.md, "State"). onnxruntime runs
kiln's ONNX file, where the cache is graph inputs and outputs: each step feeds the previous step's outputs back, as
kiln's ONNXProgram does. It runs two files: opset 20 (kiln's default), where the key/value heads are repeated per
query head, and opset 23, whose Attention op reads them grouped. Every step is the same token at the same position
after a prefill, so each peer's state stays the same size; each step attends over the whole static cache, as Hugging
Face's static cache does. `--weights` adds the weight-only quantized forms (kiln's PT2E WeightOnlyQuantizer; int4 in
groups of 32): kiln's C package (integer weights, float activations) and onnxruntime's MatMulNBits, which at its
default accuracy level quantizes the activations too (its difference from torch shows it).
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
    parser.add_argument("--weights", nargs="*", default=["int8", "int4"], choices=["int8", "int4"],
                        help="also time weight-only quantized forms (kiln C and onnxruntime at opset 23)")
    options = parser.parse_args()
    logging.disable(logging.WARNING)
    import torch
    import transformers

    import kiln
    torch.set_num_threads(options.threads)
    archive, torch_module = export_llama(torch, transformers, options.layers, options.cache)
    program = kiln.load(archive)
    programs = {"": program}
    for scheme in options.weights:  # kiln's PT2E weight-only quantizer, int4 in groups of 32
        from kiln import quantization as kq
        prepared = kq.prepare_pt2e(program, kq.WeightOnlyQuantizer(scheme, group_size=32))
        programs[f" {scheme}"] = kq.convert_pt2e(prepared)
    prompt = np.arange(3, 3 + options.prompt)[None, :]
    prefill, step = (prompt, np.arange(options.prompt)), (np.array([[11]]), np.array([options.prompt]))
    with torch.no_grad():
        torch_module(input_ids=torch.from_numpy(prefill[0]), cache_position=torch.from_numpy(prefill[1]))
        expected = torch_module(input_ids=torch.from_numpy(step[0]), cache_position=torch.from_numpy(step[1])).numpy()

    def c_runner(program: Any) -> Any:
        """kiln's C package after the prefill; it keeps the cache."""
        compiled = kiln.compile(program, num_threads=options.threads)
        compiled(*prefill)
        return lambda: compiled(*step)

    def ort_runner(program: Any, opset: int) -> Any:
        """onnxruntime on kiln's ONNX file at `opset` after the prefill, in a session as deployed (MatMulNBits at
        its default accuracy level); the cache fed back from step to step."""
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

    def eager() -> Any:
        with torch.inference_mode():
            return torch_module(input_ids=torch.from_numpy(step[0]), cache_position=torch.from_numpy(step[1]))

    # opset 20 (kiln's default) repeats the key/value heads; opset 23's Attention reads them grouped
    runners = {"kiln C": c_runner(program), "onnxruntime 20": ort_runner(program, 20),
               "onnxruntime 23": ort_runner(program, 23), "torch eager": eager}
    for suffix, quantized in list(programs.items())[1:]:
        runners[f"kiln C{suffix}"] = c_runner(quantized)
        runners[f"onnxruntime 23{suffix}"] = ort_runner(quantized, 23)
    differences = {peer: float(np.max(np.abs(np.asarray(run()) - expected))) for peer, run in runners.items()}
    medians = interleaved_medians(runners, options.rounds)
    cache_bytes = sum(program.stored(target).nbytes for target in program.graph_signature.buffers_to_mutate.values())
    print(f"Llama decode step with a static cache: {options.layers} layers, hidden 512, {options.cache} positions "
          f"({cache_bytes / 1e6:.1f} MB of cache), {options.threads} thread(s), {cpu_name()}, capability "
          f"{get_cpu_capability()}")
    print(f"{'peer (opset, weights)':<22} {'ms':>8} {'/ kiln':>7}  max abs difference from torch eager (first step)")
    for peer, seconds in medians.items():
        print(f"{peer:<22} {seconds * 1e3:8.2f} {seconds / medians['kiln C']:7.2f}  {differences[peer]:.1e}")

if __name__ == "__main__":
    main()
