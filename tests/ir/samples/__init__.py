"""Sample inputs per registered op (like torch's OpInfo sample_inputs), keyed by `aten.<name>.<overload>`.

Each family module registers generators with `@samples("aten.add.Tensor", ...)`. A generator takes a
numpy Generator and yields `Sample`s; the tests run every registered op over its samples against the
meta rule, torch eager and (for composites) the decomposition. An op without samples fails the suite.
"""

from __future__ import annotations

import importlib

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from kiln.ir import dtypes


@dataclass
class Sample:
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    note: str = ""  # what this sample exercises, shown in failures
    # Outputs to compare only by shape and dtype (random values, uninitialized memory, tie-dependent indices).
    check_values: bool = True
    # Extra tolerance for ops whose rounding legitimately differs (e.g. float32 sums of many terms).
    rtol: float | None = None
    atol: float | None = None

    def __repr__(self) -> str:
        def show(v: Any) -> str:
            if isinstance(v, np.ndarray):
                return f"{dtypes.dtype(v.dtype).short}{list(v.shape)}"
            if hasattr(v, "layout") and hasattr(v, "components"):
                return f"{dtypes.dtype(v.dtype).short}{list(v.shape)} {v.layout}"
            if isinstance(v, (list, tuple)):
                return "[" + ", ".join(show(x) for x in v) + "]"
            return repr(v)
        parts = [show(a) for a in self.args] + [f"{k}={show(v)}" for k, v in self.kwargs.items()]
        return f"Sample({', '.join(parts)}{'; ' + self.note if self.note else ''})"


SampleGenerator = Callable[[np.random.Generator], Iterable[Sample]]
SAMPLES: dict[str, SampleGenerator] = {}
# Ops whose torch counterpart cannot be compared on CPU with these samples, with the reason.
TORCH_SKIPS: dict[str, str] = {}
# kiln ops that torch computes as a composition of its ops (kiln's fused integer-kernel ops): name -> a function of
# the torch module that returns the composition, called like the op.
TORCH_EQUIVALENTS: dict[str, Callable[[Any], Callable[..., Any]]] = {}


def samples(*names: str) -> Callable[[SampleGenerator], SampleGenerator]:
    def register(generator: SampleGenerator) -> SampleGenerator:
        for name in names:
            assert name not in SAMPLES, f"samples for {name} registered twice"
            SAMPLES[name] = generator
        return generator
    return register


# -- helpers for writing samples

def rand(rng: np.random.Generator, *shape: int, dtype: str = "float32", low: float = -3, high: float = 3) -> np.ndarray:
    """Random values of a kiln dtype: uniform floats, integers in [low, high), or random bools."""
    dt = dtypes.dtype(dtype)
    if dt.is_bool:
        values = rng.random(shape) < 0.5
    elif dt.is_integral:
        low_int = max(int(low), 0) if dt is dtypes.uint8 else int(low)
        values = rng.integers(low_int, max(int(high), low_int + 1), size=shape)
    elif dt.is_complex:
        values = rng.uniform(low, high, shape) + 1j * rng.uniform(low, high, shape)
    else:
        values = rng.uniform(low, high, size=shape).astype(np.float32)
    return np.asarray(values).astype(dt.numpy)  # np.asarray: a 0-d array, never a numpy scalar


def positive(rng: np.random.Generator, *shape: int, dtype: str = "float32") -> np.ndarray:
    return rand(rng, *shape, dtype=dtype, low=0.1, high=3)


FAMILIES = ("backward", "composite", "factory", "indexing", "linalg", "misc", "nn", "pointwise", "reduction",
            "shape", "symbolic", "quant", "complex", "fft", "sparse")
for _family in FAMILIES:  # registers every family's samples
    importlib.import_module(f"tests.ir.samples.{_family}")
