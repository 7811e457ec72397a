"""kiln.testing: `assert_close`, with torch.testing.assert_close's semantics, per-dtype defaults and messages, and
`wrong_lowering`, a fault injected into a backend for testing tools that localize faults (`kiln.verify`).

    kiln.testing.assert_close(compiled(x), program(x))           # float32: rtol 1.3e-6, atol 1e-5
    kiln.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from kiln.ir import dtypes
from kiln.ir.closeness import closeness, default_tolerances
from kiln.ir.errors import KilnError

__all__ = ["assert_close", "wrong_lowering"]


class _Mismatch(AssertionError):
    """A failed comparison; `where` is the path of the item inside nested sequences and mappings."""

    def __init__(self, message: str, where: str = ""):
        super().__init__(message + (f"\n\nThe failure occurred for item {where}" if where else ""))


def assert_close(actual: Any, expected: Any, *, rtol: float | None = None, atol: float | None = None,
                 equal_nan: bool = False, check_dtype: bool = True,
                 msg: str | Callable[[str], str] | None = None) -> None:
    """Raise AssertionError unless `actual` and `expected` are close, as torch.testing.assert_close decides.

    Tensor-likes (kiln.Tensor, numpy arrays and scalars) must match in type, shape and (with `check_dtype`) dtype,
    and every element must satisfy |a - e| <= atol + rtol * |e|; the same infinities are close, NaNs only with
    `equal_nan`. Without rtol/atol the defaults are those of the dtypes (float32: 1.3e-6 / 1e-5, float16: 1e-3 /
    1e-5, bfloat16: 1.6e-2 / 1e-5, float64: 1e-7 / 1e-7; integers and bools exactly). Python numbers compare as
    scalars, and sequences and mappings compare item by item. `msg` replaces the message (or maps it, if callable).
    """
    if (rtol is None) != (atol is None):
        raise KilnError(f"both 'rtol' and 'atol' must be either specified or omitted, but got no "
                        f"{'atol' if atol is None else 'rtol'}", fix="pass both, e.g. rtol=1e-4, atol=1e-5")
    try:
        _compare(actual, expected, rtol, atol, equal_nan, check_dtype, "")
    except _Mismatch as mismatch:
        if msg is None:
            raise
        text = msg(str(mismatch)) if callable(msg) else msg
        raise AssertionError(text) from None


def _compare(actual: Any, expected: Any, rtol: float | None, atol: float | None, equal_nan: bool,
             check_dtype: bool, where: str) -> None:
    if isinstance(expected, Mapping) and isinstance(actual, Mapping):
        missing, extra = sorted(set(expected) - set(actual), key=str), sorted(set(actual) - set(expected), key=str)
        if missing or extra:
            raise _Mismatch("The keys of the mappings do not match:\n"
                            + (f"Missing keys in the actual mapping: {missing}\n" if missing else "")
                            + (f"Additional keys in the actual mapping: {extra}" if extra else "").rstrip(), where)
        for key in expected:
            _compare(actual[key], expected[key], rtol, atol, equal_nan, check_dtype, f"{where}[{key!r}]")
        return
    if _is_sequence(expected) and _is_sequence(actual):
        if len(actual) != len(expected):
            raise _Mismatch(f"The length of the sequences mismatch: {len(actual)} != {len(expected)}", where)
        for index, (a, e) in enumerate(zip(actual, expected)):
            _compare(a, e, rtol, atol, equal_nan, check_dtype, f"{where}[{index}]")
        return
    if isinstance(expected, (bool, int, float, complex)) and isinstance(actual, (bool, int, float, complex)):
        _compare_numbers(actual, expected, rtol, atol, equal_nan, where)
        return
    (a_family, a), (e_family, e) = _tensor_like(actual), _tensor_like(expected)
    if a is None or e is None or a_family != e_family:
        raise KilnError(f"no comparison for inputs of type {type(actual).__name__} and {type(expected).__name__}"
                        + (f" (item {where})" if where else ""),
                        fix="compare two kiln Tensors, two numpy arrays, two numbers, or sequences/mappings of them")
    if a.shape != e.shape:
        raise _Mismatch(f"The values for attribute 'shape' do not match: {list(a.shape)} != {list(e.shape)}.", where)
    a_kind, e_kind = dtypes.dtype(a.dtype), dtypes.dtype(e.dtype)
    if check_dtype and a_kind != e_kind:
        raise _Mismatch(f"The values for attribute 'dtype' do not match: kiln.{a_kind.name} != kiln.{e_kind.name}.",
                        where)
    if rtol is None:
        rtol, atol = default_tolerances(a_kind, e_kind)
    result = closeness(a, e, rtol, atol, equal_nan)
    if not result.ok:
        (max_abs, abs_at), (max_rel, rel_at) = result.greatest(mismatches_only=True)
        raise _Mismatch(_mismatch_message("Tensor-likes", f"Mismatched elements: {result.mismatched} / "
                                          f"{result.close.size} ({result.mismatched / result.close.size:.1%})",
                                          max_abs, abs_at, max_rel, rel_at, rtol, atol), where)


def _mismatch_message(what: str, extra: str, max_abs: float, abs_at: tuple | None, max_rel: float,
                      rel_at: tuple | None, rtol: float, atol: float) -> str:
    """torch's wording: the greatest differences (and where, for tensors), with what was allowed."""
    equality = rtol == 0 and atol == 0
    lines = [f"{what} are not {'equal' if equality else 'close'}!", "", extra]
    for kind, value, at, allowed in (("absolute", max_abs, abs_at, atol), ("relative", max_rel, rel_at, rtol)):
        line = (f"{kind.title()} difference: {value}" if at is None
                else f"Greatest {kind} difference: {value} at index {at}")
        lines.append(line + ("" if equality else f" (up to {allowed} allowed)"))
    return "\n".join(lines)


def _compare_numbers(actual: Any, expected: Any, rtol: float | None, atol: float | None, equal_nan: bool,
                     where: str) -> None:
    if isinstance(expected, bool) or isinstance(actual, bool):
        if actual is not expected:
            raise _Mismatch(f"Booleans mismatch: {actual} is not {expected}", where)
        return
    kind = (dtypes.complex128 if isinstance(expected, complex) or isinstance(actual, complex)
            else dtypes.float64 if isinstance(expected, float) or isinstance(actual, float) else dtypes.int64)
    if rtol is None:
        rtol, atol = default_tolerances(kind)
    if closeness(np.asarray(actual), np.asarray(expected), rtol, atol, equal_nan).ok:
        return
    difference = abs(actual - expected)
    relative = float("inf") if expected == 0 else difference / abs(expected)
    raise _Mismatch(_mismatch_message("Scalars", f"Expected {expected} but got {actual}.", difference, None,
                                      relative, None, rtol, atol), where)


def _is_sequence(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def _tensor_like(value: Any) -> tuple[str, np.ndarray | None]:
    """(family, values): a kiln Tensor compares only with a kiln Tensor, numpy data only with numpy data."""
    if hasattr(value, "__kiln_array__"):
        return "kiln", np.asarray(value.__kiln_array__())
    if isinstance(value, (np.ndarray, np.generic)):
        return "numpy", np.asarray(value)
    return "", None


# Where each backend keeps the tables `wrong_lowering` edits: (module, table of op -> lowering or rule, overrides that
# take precedence for some dtypes and are dropped while the fault is in).
_LOWERING_TABLES = {
    "onnx": ("kiln.codegen.onnx.export", "LOWERING_TABLE", None),
    "c": ("kiln.codegen.c.pointwise", "POINTWISE_RULES", "FLOAT32_RULES"),
    "triton": ("kiln.codegen.triton.render", "POINTWISE_RULES", None),
}


@contextlib.contextmanager
def wrong_lowering(target: str, op: str, like: str | Any) -> Iterator[None]:
    """For tests only: inside the block, `target` ("onnx", "c", "triton") lowers every `op` as it lowers `like`
    (an op name: relu as clone, add as sub), or with `like` itself (an ONNX lowering function, a C or Triton
    pointwise rule). C and Triton can swap pointwise ops only. The table is restored on exit.

        with kiln.testing.wrong_lowering("c", "aten.relu.default", like="aten.clone.default"):
            assert kiln.verify(program, target="c").op_name == "aten.relu.default"
    """
    if target not in _LOWERING_TABLES:
        raise KilnError(f"unknown target {target!r}", fix="one of " + ", ".join(_LOWERING_TABLES))
    module_name, table_name, overrides_name = _LOWERING_TABLES[target]
    module = importlib.import_module(module_name)
    table = getattr(module, table_name)
    overrides = getattr(module, overrides_name) if overrides_name else {}
    for name in (op, like) if isinstance(like, str) else (op,):
        if name not in table:
            kind = "ONNX lowering" if target == "onnx" else f"{target} pointwise rule"
            raise KilnError(f"{name} has no {kind} to swap", fix=f"choose an op in {module_name}.{table_name}")
    saved, saved_override = table[op], overrides.get(op)
    table[op] = table[like] if isinstance(like, str) else like
    overrides.pop(op, None)
    if isinstance(like, str) and like in overrides:
        overrides[op] = overrides[like]
    try:
        yield
    finally:
        table[op] = saved
        overrides.pop(op, None)
        if saved_override is not None:
            overrides[op] = saved_override
