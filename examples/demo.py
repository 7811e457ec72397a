"""kiln demo: export a bundled model with a dynamic batch dim, print the program, run it, check it.

1. Build the zoo's ResNet-style CNN (kiln.nn, PyTorch-style source) and export it with `batch` dynamic.
2. Print the program in torch.export's form (with its range constraints) and check the MLIR text
   round-trips through xDSL's parser.
3. Decompose to Core ATen and run both programs on the reference interpreter at several batch sizes,
   comparing with eager execution.
4. Emit ONNX (run by onnxruntime) and compile the program to C (a shared library run by kiln's runtime), and
   compare both with the reference interpreter, with median latencies.
"""

from __future__ import annotations

import statistics
import tempfile
import time

import numpy as np

import kiln
import kiln.models
import kiln.onnx
import kiln.runtime
from kiln.ir.errors import KilnError


def median_ms(fn, repeat: int = 50) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    entry = kiln.models.get("cnn")
    start = time.perf_counter()
    program = kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes)
    export_ms = (time.perf_counter() - start) * 1000
    print(program)
    text = program.to_mlir()
    assert kiln.ExportedProgram.from_mlir(text, state_dict=program.state_dict).to_mlir() == text
    core = program.run_decompositions()
    ops = sum(1 for _ in program.nodes())
    print(f"exported {entry.name} in {export_ms:.0f} ms: {ops} ops; {sum(1 for _ in core.nodes())} after "
          f"decomposing to Core ATen; MLIR text round-trips ({len(text.splitlines())} lines)\n")

    print(f"{'batch':>5}  {'max |exported - eager|':>22}  {'max |core ATen - eager|':>23}")
    for batch in (1, 2, 7):
        x = kiln.randn(batch, *entry.args[0].shape[1:])
        eager = entry.model(x).numpy()
        exported = program(x).numpy()
        decomposed = core(x).numpy()
        print(f"{batch:>5}  {np.abs(exported - eager).max():>22.2e}  {np.abs(decomposed - eager).max():>23.2e}")
    try:
        program(kiln.randn(1000, 3, 16, 16))
    except KilnError as error:
        print(f"\nrefused as expected: {error.cause}")

    onnx_program = kiln.onnx.export(program)
    with tempfile.TemporaryDirectory() as folder:
        compiled = kiln.compile(program, output=f"{folder}/cnn")
        print(f"\n{'backend':<22} {'batch':>5}  {'max |diff| vs interpreter':>26}  {'median latency':>14}")
        for batch in (1, 4):
            x = np.random.default_rng(batch).standard_normal((batch, *entry.args[0].shape[1:])).astype(np.float32)
            reference = program(x)
            rows = [("reference interpreter", lambda: program(x)),
                    ("onnxruntime", lambda: onnx_program(x)),
                    ("kiln C (compiled)", lambda: compiled(x))]
            for name, run in rows:
                result = run()
                output = np.asarray(result[0] if isinstance(result, (list, tuple)) else result)
                print(f"{name:<22} {batch:>5}  {np.abs(output - reference).max():>26.2e}  "
                      f"{median_ms(run):>11.3f} ms")


if __name__ == "__main__":
    main()
