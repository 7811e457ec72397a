"""Reducing a shrunk failure further, by values. Hypothesis shrinks the drawing; then the case is cut to one output,
and intermediate values become inputs holding what the interpreter computed for them, for as long as the case still
fails the same way, until the failing op stands alone with its exact operands (delta debugging over values)."""

from __future__ import annotations

import re
import time
from typing import Sequence

import sympy

from kiln.ir.interpreter import run_program
from kiln.ir.program import GraphBuilder

from tests.fuzz.differential import Backend, Failure, Report, run_cases
from tests.fuzz.programs import Case, Dag, InputSpec, Ref, Step, _map, emit_dag, prune


def reproduce(case: Case, like: Failure, backends: Sequence[Backend]) -> Failure | None:
    """The failure `case` shows on `like`'s backend that looks like `like`, if any."""
    chosen = [b for b in backends if b.name == like.backend]
    return next((f for f in run_cases([case], Report(), chosen) if f.signature == like.signature), None)


def as_input(case: Case, ref: Ref) -> Case | None:
    """`case` with value `ref` made an input holding the interpreter's value for it (None for a data-dependent
    shape, which no input can have, or a value the pruned piece cannot compute alone)."""
    piece = prune(case, [ref])
    builder = GraphBuilder()
    [value] = emit_dag(builder, piece.dag)
    type_ = value.type
    symbols = {s.name for s in case.dag.symbols}
    if any(str(s) not in symbols for d in type_.shape if isinstance(d, sympy.Basic) for s in d.free_symbols):
        return None
    try:
        [array] = run_program(builder.build([value]), piece.inputs)
    except Exception:  # noqa: BLE001  (the piece alone lacks a binding a pruned input gave, or it is the crash)
        return None
    dag = case.dag
    new = Ref(f"x{len(dag.inputs)}")

    def rename(leaf: object) -> object:
        return new if leaf == ref else leaf
    replaced = Dag(dag.symbols, [*dag.inputs, InputSpec(type_.dtype, tuple(type_.shape))],
                   [Step(s.op, _map(s.bound, rename), s.results) for s in dag.steps], [rename(r) for r in dag.outputs])
    return prune(Case(replaced, case.sizes, [*case.inputs, array]), replaced.outputs)


def reduce(failure: Failure, backends: Sequence[Backend], seconds: float = 300) -> Failure:
    """`failure` on the smallest case found within `seconds`: one output's cut (the mismatching output, or each in
    turn for a crash), then values nearest the outputs first made inputs, while the failure stays."""
    deadline = time.perf_counter() + seconds
    best = failure
    named = re.match(r"output (\d+):", failure.message)
    outputs = failure.case.dag.outputs
    if named and failure.kind == "mismatch":
        outputs = [outputs[int(named.group(1))]]
    for cut in sorted((prune(failure.case, [ref]) for ref in outputs), key=lambda c: len(c.dag.steps)):
        if len(cut.dag.steps) < len(best.case.dag.steps) and (found := reproduce(cut, failure, backends)):
            best = found
            break
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        dag = best.case.dag
        for ref in reversed([r for step in dag.steps for r in step.results if r not in dag.outputs]):
            if time.perf_counter() > deadline:
                break
            candidate = as_input(best.case, ref)
            if candidate is None or len(candidate.dag.steps) >= len(dag.steps):
                continue
            found = reproduce(candidate, failure, backends)
            if found is not None:
                best, improved = found, True
                break
    return best
