"""A case as a readable pytest test: the program built op by op with `kiln.ops` handles, its inputs as literals, and
a check_program call. The fuzz runner prints this for each shrunk failure; tests/regressions/ keeps them."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import sympy

from kiln.ir import dtypes
from kiln.ir.registry import REGISTRY, split_bound

from tests.fuzz.programs import Case, Ref


def literal(value: Any) -> str:
    if isinstance(value, Ref):
        return value.name
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, sympy.Basic):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    if isinstance(value, tuple):
        return "(" + ", ".join(literal(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, np.generic):
        return literal(value.item())
    return repr(value)  # None, bools, ints, strings, kiln dtypes (kiln.float32)


def array_literal(array: np.ndarray) -> str:
    kind = dtypes.dtype(array.dtype)
    name = "np.bool_" if kind.is_bool else f"np.{kind.name}" if kind is not dtypes.bfloat16 else "np.float32"
    if array.size == 0:
        text = f"np.zeros({tuple(array.shape)}, {name})"
    else:
        values = array.astype(np.float32) if kind is dtypes.bfloat16 else array
        text = f"np.array({literal(values.tolist())}, {name})"
    return text + (".astype(kiln.bfloat16.numpy)" if kind is dtypes.bfloat16 else "")


def _same(value: Any, default: Any) -> bool:
    try:
        return type(value) is type(default) and bool(value == default)
    except Exception:  # noqa: BLE001  (arrays, sympy relations)
        return False


def call_source(op: str, bound: list[Any]) -> str:
    """`aten.add.Tensor(x0, v1, alpha=2)`, leaving out arguments at their defaults."""
    opdef = REGISTRY[op]
    args, kwargs = split_bound(opdef, bound)
    arguments = [a for a in opdef.schema.arguments if not a.kwarg_only]
    while args and arguments[len(args) - 1].has_default and _same(args[-1], arguments[len(args) - 1].default):
        args.pop()
    defaults = {a.name: a.default for a in opdef.schema.arguments if a.kwarg_only and a.has_default}
    keywords = [f"{k}={literal(v)}" for k, v in kwargs.items() if not (k in defaults and _same(v, defaults[k]))]
    namespace, name, overload = op.split(".")
    return f"{namespace}.{name}.{overload}({', '.join([literal(a) for a in args] + keywords)})"


def case_source(case: Case, name: str = "test_case", backends: tuple[str, ...] | None = None) -> str:
    dag = case.dag
    lines = [f"def {name}():", "    builder = GraphBuilder()"]
    for spec in dag.symbols:
        upper = "" if spec.upper is None else f", max={spec.upper}"
        lines.append(f"    {spec.name} = builder.shape_env.create_symbol({spec.hint}, name={spec.name!r}, "
                     f"min={spec.lower}{upper})")
    for index, spec in enumerate(dag.inputs):
        lines.append(f"    x{index} = builder.add_input('x{index}', TensorType.of({literal(list(spec.shape))}, "
                     f"{spec.dtype!r}))")
    lines.append("    with builder:")
    for step in dag.steps:
        targets = ", ".join(r.name for r in step.results)
        call = call_source(step.op, step.bound)
        returns = REGISTRY[step.op].schema.returns
        single = len(returns) == 1 and not returns[0].type.is_list
        lines.append(f"        {targets} = {call}" if single else f"        {targets}{',' * (len(step.results) == 1)} "
                     f"= flat({call})")
    lines.append(f"    program = builder.build([{', '.join(r.name for r in dag.outputs)}])")
    if case.sizes:
        lines.append(f"    # sizes: {', '.join(f'{k}={v}' for k, v in case.sizes.items())}")
    lines.append("    inputs = [")
    lines += [f"        {array_literal(x)}," for x in case.inputs]
    lines.append("    ]")
    lines.append("    check_program(program, inputs" + (f", backends={backends!r})" if backends else ")"))
    return "\n".join(lines)


HEADER = '''import numpy as np

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import ops
from kiln.ir.types import TensorType
from tests.fuzz.differential import check_program
from tests.fuzz.programs import flat

aten = ops.aten
nan, inf = float("nan"), float("inf")
from sympy import Max, Min, Mod, ceiling, floor  # noqa: E402,F401  (symbolic sizes in shapes)
'''
