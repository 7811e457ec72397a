"""Quantized inference side by side: onnxruntime int8 (kiln's QDQ ONNX) against fp32 peers, and GPT-2's accuracy.

Usage: python benchmarks/quantized.py [--rows mlp,cnn] [--threads T] [--rounds R] [--peers WORDS] [--gpt2]

Rows (torch modules, random weights, calibrated on 8 random batches):
  mlp  Linear 1024→4096, GELU, Linear 4096→1024 at batch 32
  mlp1 the same at batch 1 (matrix-vector products: reading the weights bounds them)
  cnn  3×(conv3x3-ReLU-maxpool) 3→32→64→128, global average pool, Linear 128→10, 16×3×64×64
Peers, one process, T threads each (default 2), medians of interleaved rounds: onnxruntime fp32 (kiln's ONNX),
onnxruntime int8 static (kiln's QDQ ONNX of the X86 static program, with float biases as torch's recipe keeps them
and with int32 biases as `kiln quantize -o x.onnx` writes them: onnxruntime fuses QLinearConv, and QGemm only with
int32 biases),
onnxruntime int8 dynamic (kiln's ONNX of the dynamic program: DynamicQuantizeLinear, linear layers as MatMulInteger,
which onnxruntime fuses into DynamicQuantizeMatMul; and onnxruntime's own quantize_dynamic of the fp32 model),
torch eager fp32, torch
dynamic int8 Linear (torch.ao.quantization.quantize_dynamic, mlp only), kiln fp32 C, and kiln int8 C (the static and
dynamic programs compiled to int8 kernels; for the MLPs also weight-only int8 and int4, and onnxruntime's MatMulNBits
on kiln's opset-21 ONNX of the int4 program, at its default accuracy level (activations quantized to 8 bits) and at
float32 accuracy). The static program with
reduce_range (7-bit activations) runs in onnxruntime and kiln C too, and the dynamic one in kiln C: on CPUs without
VNNI both multiply those with vpmaddubsw, which saturates on full 8-bit activations in onnxruntime. Each quantized
peer's SQNR against the fp32 model is printed beside its time.

--gpt2 adds GPT-2 small (transformers, random weights, batch 1, seq 128): the time to prepare, calibrate in C on
32 batches and convert, the logits SQNR of each scheme (static, dynamic, each also with reduce_range's 7-bit
activations, weight-only int8 and int4) on 2
held-out batches, and each scheme's latency compiled to C against kiln's fp32 C.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from c_realistic import cpu_name  # noqa: E402  (benchmarks/c_realistic.py)
from onnx_quality import ort_session  # noqa: E402
from timing import interleaved_medians  # noqa: E402


def _sqnr(reference: np.ndarray, actual: np.ndarray) -> float:
    reference, actual = np.asarray(reference, np.float64), np.asarray(actual, np.float64)
    noise = np.sum((actual - reference) ** 2)
    return math.inf if noise == 0 else 10 * math.log10(np.sum(reference ** 2) / noise)


def _mlp(torch: Any) -> tuple[Any, tuple]:
    nn = torch.nn
    return nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)), (32, 1024)


def _cnn(torch: Any) -> tuple[Any, tuple]:
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(128, 10)), (16, 3, 64, 64)


def _mlp_one_row(torch: Any) -> tuple[Any, tuple]:
    """The MLP on one row: matrix-vector products, bound by reading the weights (decoding's shape)."""
    return _mlp(torch)[0], (1, 1024)


ROWS: dict[str, Callable[[Any], tuple[Any, tuple]]] = {"mlp": _mlp, "mlp1": _mlp_one_row, "cnn": _cnn}


def _quantized(kiln: Any, program: Any, dynamic: bool, batches: list[np.ndarray], int32_bias: bool = False,
               reduce_range: bool = False) -> Any:
    from kiln import quantization as kq
    config = kq.get_default_x86_inductor_quantization_config(is_dynamic=dynamic, int32_bias=int32_bias,
                                                             reduce_range=reduce_range)
    prepared = kq.prepare_pt2e(program, kq.X86InductorQuantizer().set_global(config))
    if not dynamic:
        kq.calibrate(prepared, [(batch,) for batch in batches], backend="c")
    return kq.convert_pt2e(prepared)


def _ort(kiln: Any, program: Any, x: np.ndarray, threads: int, opset: int | None = None,
         config: dict[str, str] | None = None) -> Callable[[], Any]:
    model = kiln.onnx.export(program, (x,), opset_version=opset).model_proto
    session = ort_session(model.SerializeToString(), threads, config)
    feeds = {session.get_inputs()[0].name: x}
    return lambda: session.run(None, feeds)[0]


def _ort_own_dynamic(kiln: Any, program: Any, x: np.ndarray, threads: int, folder: Path) -> Callable[[], Any]:
    from onnxruntime.quantization import QuantType, quantize_dynamic
    float_path, int8_path = folder / "fp32.onnx", folder / "int8_dynamic.onnx"
    kiln.onnx.export(program, (x,)).save(float_path)
    quantize_dynamic(str(float_path), str(int8_path), weight_type=QuantType.QInt8)
    session = ort_session(int8_path.read_bytes(), threads)
    feeds = {session.get_inputs()[0].name: x}
    return lambda: session.run(None, feeds)[0]


def _kiln_int8(kiln: Any, program: Any, x: np.ndarray, threads: int) -> Callable[[], Any]:
    """The quantized program compiled to C: its linear layers as int8 kernels (lower-quantized), the rest in float."""
    package = kiln.compile(program, num_threads=threads)
    return lambda: package(x)


def run_row(name: str, threads: int, rounds: int, folder: Path, peers: list[str]) -> None:
    import torch

    import kiln
    torch.manual_seed(0)
    torch.set_num_threads(threads)
    module, shape = ROWS[name](torch)
    module.eval()
    rng = np.random.default_rng(0)
    batches = [rng.standard_normal(shape).astype(np.float32) for _ in range(8)]
    x = rng.standard_normal(shape).astype(np.float32)
    tx = torch.from_numpy(x)
    program = kiln.from_torch(module, (torch.from_numpy(batches[0]),))
    static, dynamic = _quantized(kiln, program, False, batches), _quantized(kiln, program, True, batches)
    static_int32_bias = _quantized(kiln, program, False, batches, int32_bias=True)
    # 7-bit activations: exact in onnxruntime's u8s8 kernels on CPUs without VNNI, and kiln's narrow AVX2 kernels
    static_7bit_int32_bias = _quantized(kiln, program, False, batches, int32_bias=True, reduce_range=True)
    static_7bit = _quantized(kiln, program, False, batches, reduce_range=True)
    dynamic_7bit = _quantized(kiln, program, True, batches, reduce_range=True)
    package = kiln.compile(program, num_threads=threads)
    runners: dict[str, Callable[[], Any]] = {
        "onnxruntime fp32": _ort(kiln, program, x, threads),
        "onnxruntime int8 static (kiln QDQ)": _ort(kiln, static, x, threads),
        "onnxruntime int8 static (kiln QDQ, int32 bias)": _ort(kiln, static_int32_bias, x, threads),
        "onnxruntime int8 static reduce_range (int32 bias)": _ort(kiln, static_7bit_int32_bias, x, threads),
        "onnxruntime int8 dynamic (kiln)": _ort(kiln, dynamic, x, threads),
        "onnxruntime int8 dynamic (ORT's quantizer)": _ort_own_dynamic(kiln, program, x, threads, folder),
        "torch eager fp32": lambda: module(tx),
        "kiln C fp32": lambda: package(x),
        "kiln C int8 static": _kiln_int8(kiln, static, x, threads),
        "kiln C int8 dynamic": _kiln_int8(kiln, dynamic, x, threads),
        "kiln C int8 static reduce_range": _kiln_int8(kiln, static_7bit, x, threads),
        "kiln C int8 dynamic reduce_range": _kiln_int8(kiln, dynamic_7bit, x, threads),
    }
    if name.startswith("mlp"):
        from kiln import quantization as kq
        for label, quantizer in (("int8", kq.WeightOnlyQuantizer("int8")),
                                 ("int4 g32", kq.WeightOnlyQuantizer("int4", group_size=32))):
            weight_only = kq.convert_pt2e(kq.prepare_pt2e(program, quantizer))
            runners[f"kiln C weight-only {label}"] = _kiln_int8(kiln, weight_only, x, threads)
            if label == "int4 g32":  # opset 21's INT4 weights: onnxruntime's MatMulNBits, by default (accuracy
                # level 4) on activations quantized to 8 bits per block, at level 0 in float32 as kiln computes
                runners["onnxruntime weight-only int4 g32 (MatMulNBits)"] = _ort(kiln, weight_only, x, threads, 21)
                runners["onnxruntime weight-only int4 g32, float32 accuracy"] = _ort(
                    kiln, weight_only, x, threads, 21, {"session.qdq_matmulnbits_accuracy_level": "0"})
    if name == "mlp":
        dynamic_torch = torch.ao.quantization.quantize_dynamic(module, {torch.nn.Linear}, dtype=torch.qint8)
        runners["torch dynamic int8 Linear"] = lambda: dynamic_torch(tx)
    if peers:  # a focused comparison: fewer peers, less noise between them
        runners = {label: run for label, run in runners.items()
                   if label == "onnxruntime fp32" or any(word in label for word in peers)}
    with torch.no_grad():
        reference = module(tx).numpy()
        medians = interleaved_medians(runners, rounds)
        outputs = {peer: np.asarray(run().detach() if hasattr(run(), "detach") else run())
                   for peer, run in runners.items()}
    base = medians["onnxruntime fp32"]
    from kiln.codegen.c import get_cpu_capability
    print(f"\n{name}: {shape}, {threads} thread(s), {cpu_name()}, kiln C at {get_cpu_capability()}")
    print(f"{'peer':<48} {'ms':>9} {'/ ORT fp32':>11} {'SQNR dB':>9}")
    for peer, seconds in medians.items():
        print(f"{peer:<48} {seconds * 1e3:9.3f} {seconds / base:11.2f} {_sqnr(reference, outputs[peer]):9.1f}")
    print(f"kiln reference programs' SQNR: static {_sqnr(reference, static(x)):.1f} dB, "
          f"dynamic {_sqnr(reference, dynamic(x)):.1f} dB")


def run_gpt2() -> None:
    import torch
    import transformers

    import kiln
    from kiln import quantization as kq
    config = transformers.GPT2Config(use_cache=False)
    torch.manual_seed(0)
    module = transformers.GPT2LMHeadModel(config).eval()
    rng = np.random.default_rng(0)
    batches = [(rng.integers(0, config.vocab_size, (1, 128)).astype(np.int64),) for _ in range(34)]
    program = kiln.from_torch(module, (torch.from_numpy(batches[0][0]),))
    print(f"\nGPT-2 small (124M, random weights), batch 1, seq 128, {cpu_name()}")
    schemes = {
        "static": kq.X86InductorQuantizer().set_global(kq.get_default_x86_inductor_quantization_config()),
        "dynamic": kq.X86InductorQuantizer().set_global(
            kq.get_default_x86_inductor_quantization_config(is_dynamic=True)),
        "static reduce_range": kq.X86InductorQuantizer().set_global(
            kq.get_default_x86_inductor_quantization_config(reduce_range=True)),
        "dynamic reduce_range": kq.X86InductorQuantizer().set_global(
            kq.get_default_x86_inductor_quantization_config(is_dynamic=True, reduce_range=True)),
        "weight-only int8": kq.WeightOnlyQuantizer("int8"),
        "weight-only int4 (group 32)": kq.WeightOnlyQuantizer("int4", group_size=32),
    }
    held_out = batches[32:]
    expected = [program(*batch)["logits"] for batch in held_out]
    runners = {"kiln C fp32": _kiln_int8(kiln, program, held_out[0][0], 2)}
    for name, quantizer in schemes.items():
        start = time.perf_counter()
        prepared = kq.prepare_pt2e(program, quantizer)
        prepared_at = time.perf_counter()
        if name.startswith("static"):
            kq.calibrate(prepared, batches[:32], backend="c")
        calibrated_at = time.perf_counter()
        quantized = kq.convert_pt2e(prepared)
        done = time.perf_counter()
        sqnr = _sqnr(np.concatenate(expected), np.concatenate([quantized(*batch)["logits"] for batch in held_out]))
        print(f"{name:<28} prepare {prepared_at - start:5.1f} s, calibrate {calibrated_at - prepared_at:5.1f} s, "
              f"convert {done - calibrated_at:5.1f} s (total {done - start:5.1f} s); logits SQNR {sqnr:5.1f} dB")
        runners[f"kiln C {name}"] = _kiln_int8(kiln, quantized, held_out[0][0], 2)
    medians = interleaved_medians(runners, 7)
    base = medians["kiln C fp32"]
    from kiln.codegen.c import get_cpu_capability
    print(f"\nGPT-2 small in C, batch 1, seq 128, 2 threads ({cpu_name()}, {get_cpu_capability()})")
    for peer, seconds in medians.items():
        print(f"{peer:<40} {seconds * 1e3:9.2f} ms {seconds / base:6.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--peers", default="", help="only the peers whose labels contain one of these "
                        "comma-separated words (and onnxruntime fp32), e.g. 'reduce_range'")
    parser.add_argument("--gpt2", action="store_true", help="add the GPT-2 small section (with --rows '' alone)")
    options = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(options.threads))
    logging.getLogger("torchao").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    import tempfile
    with tempfile.TemporaryDirectory() as folder:
        for name in filter(None, options.rows.split(",")):
            run_row(name, options.threads, options.rounds, Path(folder), options.peers.split(",") if options.peers
                    else [])
    if options.gpt2:
        run_gpt2()


if __name__ == "__main__":
    main()
