"""Code generators (ONNX, C, Triton) and the kernel scheduler they share.

Each backend registers the ops it lowers in `LOWERINGS[backend]`; `kiln ops` reads it.
"""

LOWERINGS: dict[str, set[str]] = {}


def backends_lowering(op_name: str) -> list[str]:
    """The backends that lower `op_name` directly (others reach it through its decomposition)."""
    return sorted(backend for backend, names in LOWERINGS.items() if op_name in names)
