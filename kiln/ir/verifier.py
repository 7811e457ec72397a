"""Verification: every op's recorded result types must equal what its meta rule computes.

Meta results are memoized by (op, argument types), since real programs repeat the same shapes.
"""

from __future__ import annotations

from typing import Any

from xdsl.irdl import IRDLOperation

from kiln.ir.errors import GuardError, KilnError, VerificationError
from kiln.ir.types import ScalarType, SymIntType, TensorType

def infer_result_types(op: IRDLOperation) -> list[Any]:
    """Run the op's meta rule on its operand types and properties; flatten to one type per result."""
    from kiln.ir.dialect import bound_arguments

    from kiln.ir.registry import run_meta
    from kiln.ir.symbolic import current_shape_env

    # Ops with the same operand types and properties have the same result types: look those up before
    # decoding any properties (most of a large program repeats a few signatures).
    env = current_shape_env()
    cache = env.meta_cache if env is not None else None
    key = ("verify", op.name, tuple(o.type for o in op.operands), tuple(op.properties.items()))
    if cache is not None and key in cache:
        return cache[key]
    opdef = op.opdef  # type: ignore[attr-defined]
    result = flatten_meta(run_meta(opdef, bound_arguments(op, lambda value: value.type)))
    if cache is not None:
        cache[key] = result
    return result


def flatten_meta(result: Any) -> list[Any]:
    if isinstance(result, (TensorType, SymIntType, ScalarType)):
        return [result]
    flat: list[Any] = []
    for item in result:
        flat.extend(flatten_meta(item))
    return flat


# Marks an op whose result types came from outside (torch's recorded shapes) because its meta rule could not
# decide a question on the symbols: verification accepts them while the rule cannot decide; runners check them.
ASSUMED_TYPES = "kiln.assumed_types"


def check_op_types(op: IRDLOperation) -> None:
    opdef = op.opdef  # type: ignore[attr-defined]
    try:
        expected = infer_result_types(op)
    except KilnError as error:
        if isinstance(error, GuardError) and ASSUMED_TYPES in op.attributes:
            return
        raise VerificationError(f"{opdef.name}: invalid arguments: {error.cause}",
                                source=op.attributes.get("kiln.source") and op.attributes["kiln.source"].data,
                                fix=error.fix) from error
    actual = [r.type for r in op.results]
    if len(expected) != len(actual) or any(not _type_matches(e, a) for e, a in zip(expected, actual)):
        name = op.results[0].name_hint if op.results else None
        raise VerificationError(
            f"{opdef.name}{' (%' + name + ')' if name else ''}: result types "
            f"{', '.join(map(_show, actual))} disagree with the meta rule, which gives "
            f"{', '.join(map(_show, expected))}",
            fix="rebuild the op with its inferred result types")


def _type_matches(expected: Any, actual: Any) -> bool:
    if expected is actual or expected == actual:
        return True
    if isinstance(expected, SymIntType) and isinstance(actual, SymIntType):
        return True  # the expression of a data-dependent scalar is named by the producer
    if isinstance(expected, TensorType) and isinstance(actual, TensorType):
        if expected.dtype is not actual.dtype or expected.ndim != actual.ndim or expected.layout != actual.layout:
            return False
        return all(_dim_equal(a, b) for a, b in zip(expected.shape, actual.shape))
    return expected == actual


def _dim_equal(a: Any, b: Any) -> bool:
    if a == b or isinstance(a, int) and isinstance(b, int):
        return a == b
    import sympy
    if any(str(s).startswith("u") for s in sympy.sympify(a).free_symbols):
        return True  # an unbacked (data-dependent) size: each producer names its own symbol
    return sympy.simplify(sympy.sympify(a) - sympy.sympify(b)) == 0


def _show(t: Any) -> str:
    return t.short() if isinstance(t, TensorType) else str(t)
