"""kiln's compiled C backend against its peers, side by side: median latency per model and size.

Usage: python benchmarks/c_backend.py [--rows mlp-b1,gpt-s128,...] [--threads N] [--repeat R] [--plot PATH]
Peers: kiln's reference interpreter (numpy kernels), onnxruntime on `kiln.onnx.export` of the same program, the
compiled C package (`kiln.compile`), and, when torch is installed, torch eager and torch.compile on the
same model source (`kiln.models.torch_twin`) with the same weights. Every peer runs with the same thread count.
Each model is exported once with a dynamic batch (and sequence) dim, so the C artifact is the one users get.
Columns: median latency per peer (ms); kiln/onnxruntime (the headline, <= 1 means kiln is as fast); kiln's
GFLOP/s (matmul and convolution FLOPs counted on the decomposed program at the row's sizes); and that as a
percentage of the machine's fp32 GEMM peak, proxied by numpy's 2048^3 float32 matmul measured at start-up.
Each peer's output is compared with the reference interpreter's, so a fast wrong answer shows.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import sympy

import kiln
import kiln.models
import kiln.onnx
import kiln.runtime
from kiln.ir.program import ExportedProgram, InputKind
from kiln.ir.symbolic import evaluate_dim
from timing import median_time  # benchmarks/timing.py (scripts run from their folder)

DEFAULT_PLOT = Path(__file__).resolve().parent / "results" / "c_backend.png"
PEERS = ["reference", "onnxruntime", "kiln C", "torch eager", "torch.compile"]
SETTLE_S = 0.1  # idle time between peers: OpenMP's and onnxruntime's spinning pools would steal each other's CPUs
PEER_BUDGET_S = 3.0  # a slow peer (the reference interpreter) gets fewer repeats, at least MIN_REPEAT
MIN_REPEAT = 3
RTOL, ATOL = 1e-4, 1e-4  # fp32 with different summation orders; beyond this a result is flagged


@dataclass(frozen=True)
class ModelSpec:
    """A model built from its zoo source module (kiln's, or the torch twin: same class names) and its input."""

    module: str
    build: Callable[[Any], Any]  # zoo source module -> model
    shape: Callable[[int, int], tuple[int, ...]]  # (batch, seq) -> input shape
    dynamic: dict[int, tuple[str, int]]  # input axis -> (Dim name, max)
    vocab: int | None = None  # token inputs in [0, vocab); None: float32 activations


MODELS: dict[str, ModelSpec] = {
    "mlp": ModelSpec("kiln.models.mlp", lambda m: m.MLP(1024, hidden=(4096,), out_features=1024),
                     lambda batch, seq: (batch, 1024), {0: ("batch", 4096)}),
    "cnn": ModelSpec("kiln.models.cnn", lambda m: m.ResNet(), lambda batch, seq: (batch, 3, 16, 16),
                     {0: ("batch", 256)}),
    "transformer": ModelSpec("kiln.models.transformer", lambda m: m.TransformerClassifier(max_len=128),
                             lambda batch, seq: (batch, seq), {0: ("batch", 256), 1: ("seq", 128)}, vocab=100),
    "gpt": ModelSpec("kiln.models.gpt", lambda m: m.GPT(m.GPTConfig(block_size=128)),
                     lambda batch, seq: (batch, seq), {0: ("batch", 64), 1: ("seq", 128)}, vocab=256),
}


@dataclass(frozen=True)
class Row:
    name: str
    model: str
    batch: int
    seq: int = 0


ROWS = [Row("mlp-b1", "mlp", 1), Row("mlp-b32", "mlp", 32), Row("cnn-b1", "cnn", 1), Row("cnn-b16", "cnn", 16),
        Row("transformer-s128", "transformer", 1, 128), Row("gpt-s128", "gpt", 1, 128)]


@dataclass
class Result:
    row: Row
    flops: float
    latency_s: dict[str, float] = field(default_factory=dict)
    max_diff: dict[str, float] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)  # peer -> why it has no number

    def ratio(self) -> float | None:
        kiln_s, ort_s = self.latency_s.get("kiln C"), self.latency_s.get("onnxruntime")
        return kiln_s / ort_s if kiln_s and ort_s else None


# -- FLOPs -------------------------------------------------------------------------------------------------

# Matmul-like ops: which operand's last dim is the contraction (K); FLOPs = 2 * prod(out) * K.
CONTRACTION_OPERAND = {"aten.mm.default": 0, "aten.bmm.default": 0, "aten.matmul.default": 0,
                       "aten.addmm.default": 1, "aten.baddbmm.default": 1, "aten.linear.default": 0}


def count_flops(program: ExportedProgram, inputs: list[np.ndarray]) -> float:
    """Matmul and convolution FLOPs of the decomposed program at the sizes of `inputs` (its user inputs)."""
    user_args = [arg for spec, arg in zip(program.graph_signature.input_specs, program.body.args)
                 if spec.kind is InputKind.USER_INPUT]
    bindings = {}
    for arg, value in zip(user_args, inputs):
        for dim, size in zip(arg.type.shape, value.shape):
            if not isinstance(dim, int) and len(dim.free_symbols) == 1:  # s, or a multiple of s (320 * s samples)
                symbol, = dim.free_symbols
                scale, offset = sympy.Poly(dim, symbol).all_coeffs()
                bindings[symbol] = (int(size) - int(offset)) // int(scale)

    def shape(value: Any) -> list[int]:
        return [evaluate_dim(d, bindings) for d in value.type.shape]

    total = 0
    for op in program.nodes():
        if op.name in CONTRACTION_OPERAND:
            total += 2 * math.prod(shape(op.results[0])) * shape(op.operands[CONTRACTION_OPERAND[op.name]])[-1]
        elif op.name == "aten.convolution.default":  # weight (C_out, C_in / groups, *kernel)
            total += 2 * math.prod(shape(op.results[0])) * math.prod(shape(op.operands[1])[1:])
    return float(total)


def gemm_peak_gflops(threads: int | None = None, size: int = 2048, repeat: int = 7) -> float:
    """numpy's float32 GEMM GFLOP/s with `threads` BLAS threads (default: the BLAS default): the proxy for this
    machine's fp32 peak. Measured in a child process, because the BLAS sizes its thread pool at import, and as the
    best of `repeat` calls: a peak, so noise from the shared machine should not lower it. Under
    KILN_CPU_CAPABILITY=AVX2 the BLAS runs its Haswell (AVX2 + FMA) kernels too, so the peak is the one AVX2 code can
    reach here (about half the AVX-512 one)."""
    import subprocess
    import sys
    code = ("import time, numpy as np; rng = np.random.default_rng(0); "
            f"a, b = (rng.standard_normal(({size}, {size})).astype(np.float32) for _ in range(2)); a @ b; "
            "best = min((lambda s: (a @ b, time.perf_counter() - s)[1])(time.perf_counter()) "
            f"for _ in range({repeat})); print(2 * {size}**3 / best / 1e9)")
    env = dict(os.environ)
    if env.get("KILN_CPU_CAPABILITY") == "AVX2":
        env["OPENBLAS_CORETYPE"] = "Haswell"
    if threads is not None:
        for variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env[variable] = str(threads)
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return float(result.stdout.strip())


# -- peers -------------------------------------------------------------------------------------------------

def onnxruntime_session(program: ExportedProgram, threads: int) -> Callable[[np.ndarray], np.ndarray]:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    model = kiln.onnx.export(program).model_proto
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return lambda x: session.run(None, {name: x})[0]


def torch_model(spec: ModelSpec, kiln_model: Any, torch: Any) -> Any:
    """The torch twin of `kiln_model` (same source, same constructor) carrying its weights."""
    model = spec.build(kiln.models.torch_twin(spec.module)).eval()
    state = {key: torch.from_numpy(np.array(value.numpy())) for key, value in kiln_model.state_dict().items()}
    model.load_state_dict(state, strict=True)
    return model


def torch_runner(model: Any, torch: Any) -> Callable[[np.ndarray], np.ndarray]:
    def run(x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return model(torch.from_numpy(x)).numpy()
    return run


# -- the benchmark -----------------------------------------------------------------------------------------

def make_input(spec: ModelSpec, row: Row) -> np.ndarray:
    rng = np.random.default_rng(0)
    shape = spec.shape(row.batch, row.seq)
    if spec.vocab is not None:
        return rng.integers(0, spec.vocab, shape, dtype=np.int64)
    return rng.standard_normal(shape).astype(np.float32)


def time_peer(run: Callable[[np.ndarray], Any], x: np.ndarray, repeat: int) -> tuple[float, np.ndarray]:
    """(median seconds, output): one untimed warm-up call, then as many repeats as the budget allows."""
    time.sleep(SETTLE_S)
    start = time.perf_counter()
    run(x)
    first = time.perf_counter() - start
    repeat = max(MIN_REPEAT, min(repeat, int(PEER_BUDGET_S / max(first, 1e-9))))
    seconds, output = median_time(lambda: run(x), repeat)
    return seconds, np.asarray(output)


def benchmark_model(name: str, rows: list[Row], threads: int, repeat: int, torch: Any, folder: str) -> list[Result]:
    spec = MODELS[name]
    kiln.manual_seed(0)
    model = spec.build(importlib.import_module(spec.module)).eval()
    example = make_input(spec, Row("example", name, 2, 8))
    dynamic = {axis: kiln.Dim(dim_name, max=upper) for axis, (dim_name, upper) in spec.dynamic.items()}
    program = kiln.export(model, (kiln.from_numpy(example),), dynamic_shapes=(dynamic,))
    decomposed = program.run_decompositions()

    runners: dict[str, Callable[[np.ndarray], Any]] = {"reference": program}
    problems: dict[str, str] = {}
    runners["onnxruntime"] = onnxruntime_session(program, threads)
    runners["kiln C"] = kiln.compile(program, output=os.path.join(folder, name), num_threads=threads)
    if torch is None:
        problems["torch eager"] = problems["torch.compile"] = "torch is not installed"
    else:
        eager = torch_model(spec, model, torch)
        runners["torch eager"] = torch_runner(eager, torch)

    results = []
    for row in rows:
        x = make_input(spec, row)
        result = Result(row, count_flops(decomposed, [x]), unavailable=dict(problems))
        row_runners = dict(runners)
        if torch is not None:
            try:
                torch._dynamo.reset()  # a fresh, shape-specialized compile per row: torch.compile's best case
                compiled = torch.compile(eager)
                start = time.perf_counter()
                torch_runner(compiled, torch)(x)
                print(f"  torch.compile of {row.name}: {time.perf_counter() - start:.1f} s")
                row_runners["torch.compile"] = torch_runner(compiled, torch)
            except Exception as error:  # inductor needs a working C++ toolchain and may not support every op
                result.unavailable["torch.compile"] = f"{type(error).__name__}: {str(error).splitlines()[0][:100]}"
        reference = None
        for peer in PEERS:
            if peer not in row_runners:
                continue
            seconds, output = time_peer(row_runners[peer], x, repeat)
            result.latency_s[peer] = seconds
            if peer == "reference":
                reference = output
            else:
                result.max_diff[peer] = float(np.abs(output.astype(np.float64) - reference).max())
                if not np.allclose(output, reference, rtol=RTOL, atol=ATOL):
                    print(f"  MISMATCH: {peer} on {row.name} differs from the reference interpreter")
        print(f"  {row.name}: " + ", ".join(f"{p} {s * 1e3:.3f} ms" for p, s in result.latency_s.items()))
        results.append(result)
    return results


# -- reporting ---------------------------------------------------------------------------------------------

def markdown_table(results: list[Result], peak_gflops: float) -> str:
    header = ["row", *(f"{p} (ms)" for p in PEERS), "kiln/onnxruntime", "kiln GFLOP/s", "% of peak"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for result in results:
        cells = [result.row.name]
        cells += [f"{result.latency_s[p] * 1e3:.3f}" if p in result.latency_s else "n/a" for p in PEERS]
        ratio = result.ratio()
        cells.append(f"{ratio:.2f}" if ratio is not None else "n/a")
        kiln_s = result.latency_s.get("kiln C")
        gflops = result.flops / kiln_s / 1e9 if kiln_s else None
        cells.append(f"{gflops:.2f}" if gflops is not None else "n/a")
        cells.append(f"{100 * gflops / peak_gflops:.1f}%" if gflops is not None else "n/a")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def accuracy_table(results: list[Result]) -> str:
    peers = PEERS[1:]
    header = ["row", "GFLOP", *(f"max abs diff {p}" for p in peers)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for result in results:
        cells = [result.row.name, f"{result.flops / 1e9:.4f}"]
        cells += [f"{result.max_diff[p]:.1e}" if p in result.max_diff else "n/a" for p in peers]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: list[Result], path: Path, threads: int) -> None:
    plot_latencies([r.row.name for r in results], [r.latency_s for r in results], [r.ratio() for r in results],
                   f"kiln C backend vs peers ({threads} thread{'s' if threads != 1 else ''})", path)


def plot_latencies(names: list[str], latencies: list[dict[str, float]], ratios: list[float | None], title: str,
                   path: Path) -> None:
    """Grouped log-scale latency bars (seconds in, ms shown), one group per row, annotated with kiln/onnxruntime."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[dev]'): skipping the plot")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    peers = list(dict.fromkeys(p for row in latencies for p in row))
    width = 0.8 / len(peers)
    figure, axes = plt.subplots(figsize=(max(8.0, 1.6 * len(names)), 5))
    for index, peer in enumerate(peers):
        positions = [i + (index - (len(peers) - 1) / 2) * width for i, row in enumerate(latencies) if peer in row]
        values = [row[peer] * 1e3 for row in latencies if peer in row]
        axes.bar(positions, values, width, label=peer)
    axes.set_yscale("log")
    axes.set_xticks(range(len(names)), names)
    axes.set_ylabel("median latency (ms, log scale)")
    axes.set_title(title)
    top = max(v for row in latencies for v in row.values()) * 1e3
    axes.set_ylim(top=top * 60)  # headroom for the ratios and the legend
    for i, ratio in enumerate(ratios):
        if ratio is not None:
            axes.annotate(f"kiln/ORT {ratio:.2f}x", (i, top * 2), ha="center", fontsize=8)
    axes.legend(fontsize=8, loc="upper left", ncol=len(peers))
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    print(f"plot written to {path}")


def warn_if_busy(when: str) -> None:
    """Other processes on the CPUs make every peer slower, OpenMP's barriers most of all: say so."""
    load = os.getloadavg()[0]
    if load > 0.5:
        print(f"warning: 1-minute load average {load:.1f} at the {when} (other processes are running): "
              "latencies are inflated and noisy")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=",".join(r.name for r in ROWS), help="comma-separated row names")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="threads for every peer")
    parser.add_argument("--repeat", type=int, default=50, help="timed calls per peer (fewer for slow peers)")
    parser.add_argument("--plot", type=Path, default=DEFAULT_PLOT, help="PNG path for the bar chart")
    options = parser.parse_args()
    known = {r.name: r for r in ROWS}
    unknown = [n for n in options.rows.split(",") if n not in known]
    if unknown:
        parser.error(f"unknown rows {', '.join(unknown)}; choose from {', '.join(known)}")
    rows = [known[n] for n in options.rows.split(",")]
    try:
        import torch
        torch.set_num_threads(options.threads)
    except ImportError:
        torch = None
    warnings.filterwarnings("ignore")

    warn_if_busy("start")
    start = time.perf_counter()
    peak = gemm_peak_gflops(options.threads)
    print(f"fp32 GEMM peak proxy (numpy 2048^3 float32 matmul): {peak:.1f} GFLOP/s; threads: {options.threads}")
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="kiln_bench_") as folder:
        for name in dict.fromkeys(r.model for r in rows):  # one export and compile per model, in row order
            print(f"{name}:")
            results += benchmark_model(name, [r for r in rows if r.model == name], options.threads,
                                       options.repeat, torch, folder)
    print()
    print(markdown_table(results, peak))
    print()
    print(accuracy_table(results))
    for result in results:
        for peer, why in result.unavailable.items():
            print(f"{result.row.name}: {peer} n/a ({why})")
    print(f"\ntotal {time.perf_counter() - start:.0f} s")
    warn_if_busy("end")
    plot(results, options.plot, options.threads)


if __name__ == "__main__":
    main()
