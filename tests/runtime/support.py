"""Helpers for the compiled backends' tests."""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import pytest


def use_capability(capability: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compile at `capability` for the rest of the test, or skip it where this CPU cannot run that code."""
    from kiln.codegen.c import supported_capabilities
    if capability not in supported_capabilities():
        pytest.skip(f"this CPU does not run {capability}")
    monkeypatch.setenv("KILN_CPU_CAPABILITY", capability)


def zoo_inputs(entry: Any) -> Iterator[np.ndarray]:
    """A zoo model's first input at its example size and at each of its dims' examples (random values; token ids
    below the example's largest)."""
    base = np.asarray(entry.args[0].__kiln_array__() if hasattr(entry.args[0], "__kiln_array__") else entry.args[0])
    dims = entry.dynamic_shapes[next(iter(entry.dynamic_shapes))]
    axes = {axis: [base.shape[axis], *entry.dim_examples[dim.__name__]] for axis, dim in dims.items()}
    for sizes in zip(*axes.values()):
        shape = list(base.shape)
        for axis, size in zip(axes, sizes):
            shape[axis] = size
        rng = np.random.default_rng(sum(sizes))
        if base.dtype == np.int64:
            yield rng.integers(0, int(base.max()) + 1, shape).astype(np.int64)
        else:
            yield rng.standard_normal(shape).astype(base.dtype)


def process_memory() -> dict[str, int]:
    """This process's resident memory in bytes (Linux /proc): `anonymous` (heap, copies) and `file` (mapped files,
    e.g. weights read through mmap and libraries)."""
    fields = {}
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(("RssAnon:", "RssFile:")):
                name, value = line.split(":")
                fields[name] = int(value.split()[0]) * 1024
    return {"anonymous": fields["RssAnon"], "file": fields["RssFile"]}


def open_descriptors() -> int:
    """How many file descriptors this process holds (Linux /proc)."""
    import os
    return len(os.listdir("/proc/self/fd"))


def compile_function(fn: Any, arrays: tuple, path: Any, target: str, dynamic: Any = None) -> tuple[Any, Any]:
    """`fn` over kiln tensors made from `arrays`, exported (with `dynamic` shapes) and compiled for `target` into
    `path`: the program and the compiled model."""
    import kiln
    from kiln.compiler import compile as compile_program
    from tests.modules import LambdaModule
    program = kiln.export(LambdaModule(fn), tuple(map(kiln.tensor, arrays)), dynamic_shapes=dynamic)
    return program, compile_program(program, target=target, output=path)


def assert_outputs_close(got: Any, expected: Any) -> None:
    """Each output (one array or a tuple) against the expected ones (arrays or torch tensors), at
    torch.testing.assert_close's default tolerances, NaN where expected."""
    import torch
    got = got if isinstance(got, (tuple, list)) else (got,)
    expected = expected if isinstance(expected, (tuple, list)) else (expected,)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        e = e if isinstance(e, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(np.asarray(e)))
        torch.testing.assert_close(torch.from_numpy(np.ascontiguousarray(g)), e, equal_nan=True)
