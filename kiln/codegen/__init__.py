"""Code generators (ONNX, C, Triton) and the kernel scheduler they share.

Each backend (a subpackage named in BACKENDS) registers the ops it lowers in `LOWERINGS[backend]` when imported;
`kiln ops` reads it through `backends_lowering`.
"""

import importlib

BACKENDS = ("onnx", "c", "triton")
COMPILE_TARGETS = {"c": "kiln.codegen.c", "triton": "kiln.codegen.triton"}  # kiln.compile's targets: their backends
LOWERINGS: dict[str, set[str]] = {}


def backends_lowering(op_name: str) -> list[str]:
    """The backends that lower `op_name` directly (others reach it through its decomposition)."""
    for backend in BACKENDS:
        importlib.import_module(f"kiln.codegen.{backend}")
    return sorted(backend for backend, names in LOWERINGS.items() if op_name in names)
