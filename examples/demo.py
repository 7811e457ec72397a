"""kiln demo: export a bundled model with a dynamic batch dim, print the program, run it, check it.

1. Build the zoo's ResNet-style CNN (kiln.nn, PyTorch-style source) and export it with `batch` dynamic.
2. Print the program in torch.export's form (with its range constraints) and check the MLIR text
   round-trips through xDSL's parser.
3. Decompose to Core ATen and run both programs on the reference interpreter at several batch sizes,
   comparing with eager execution.
"""

from __future__ import annotations

import time

import numpy as np

import kiln
import kiln.models
from kiln.ir.errors import KilnError


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


if __name__ == "__main__":
    main()
