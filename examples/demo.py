"""kiln demo: build a small MLP program with a symbolic batch dim, print it both ways, run it.

Until the tracing frontend lands (issue 3) the program is built by hand through `kiln.ops` handles
inside a GraphBuilder, exactly as a decomposition or a custom pass would build one.
"""

from __future__ import annotations

import numpy as np

import kiln
from kiln.ir import GraphBuilder, InputKind, ShapeEnv, TensorType
from kiln.ir.errors import KilnError


def build_mlp() -> kiln.ExportedProgram:
    rng = np.random.default_rng(0)
    state = {
        "fc1.weight": rng.standard_normal((32, 16)).astype(np.float32) * 0.25,
        "fc1.bias": np.zeros(32, np.float32),
        "fc2.weight": rng.standard_normal((4, 32)).astype(np.float32) * 0.25,
        "fc2.bias": np.zeros(4, np.float32),
    }
    env = ShapeEnv()
    batch = env.create_symbol(8, name="batch", min=1, max=1024)
    builder = GraphBuilder(env)
    params = {name: builder.add_input("p_" + name.replace(".", "_"), TensorType.of(value.shape, "f32"),
                                      InputKind.PARAMETER, target=name) for name, value in state.items()}
    x = builder.add_input("x", TensorType.of([batch, 16], "f32"))
    aten = kiln.ops.aten
    with builder:
        hidden = aten.relu.default(aten.linear.default(x, params["fc1.weight"], params["fc1.bias"]))
        logits = aten.linear.default(hidden, params["fc2.weight"], params["fc2.bias"])
    program = builder.build([logits], state_dict=state)
    program.verify()
    return program


def main() -> None:
    program = build_mlp()
    print("== torch.export form ==")
    print(program)
    print("== MLIR form (round-trips through xDSL's parser) ==")
    text = program.to_mlir()
    print(text)
    reparsed = kiln.ExportedProgram.from_mlir(text, state_dict=program.state_dict)
    assert reparsed.to_mlir() == text

    print("== reference interpreter ==")
    sd = program.state_dict
    for batch in (1, 7, 1000):
        x = np.random.default_rng(batch).standard_normal((batch, 16)).astype(np.float32)
        out = reparsed(x)
        expected = np.maximum(x @ sd["fc1.weight"].T + sd["fc1.bias"], 0) @ sd["fc2.weight"].T + sd["fc2.bias"]
        print(f"batch={batch:5d}  output {tuple(out.shape)}  max |kiln - numpy| = {np.abs(out - expected).max():.2e}")
    try:
        reparsed(np.zeros((2048, 16), np.float32))
    except KilnError as error:
        print(f"refused as expected: {error.cause}")


if __name__ == "__main__":
    main()
