"""The fuzz run (`make fuzz`): random programs through every backend until the budget is spent, then the figures.

    python -m tests.fuzz --programs 10000 --seed 0 [--batch 50] [--backends onnx c triton pt2 torch] [--no-shrink]

Hypothesis draws batches of DAGs (tests/fuzz/programs.py) and the differential runner checks them (differential.py).
The first failure of each kind is shrunk by hypothesis at once and the run carries on with the next seed; at the end
the figures, and each kind of failure as a pytest test for tests/regressions/. Exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from typing import Any

os.environ.setdefault("TRITON_INTERPRET", "1")  # Triton runs on CPU through its interpreter (before its import)

from hypothesis import HealthCheck, Phase, given, seed, settings

from tests.fuzz.differential import Backend, Failure, Report, run_cases, select_backends
from tests.fuzz.programs import META_CRASHES, Case, batches, fixed_constant_pool, ops_in_scope
from tests.fuzz.reduce import reduce
from tests.fuzz.reproduce import case_source

SUPPRESSED = list(HealthCheck)  # big, slow examples are the point here


class Reproduced(Exception):
    """Raised inside hypothesis for a failure not seen before, so that hypothesis shrinks the batch."""


def regression_test(failure: Failure) -> str:
    """The failure as a pytest test for tests/regressions/, checking only the backend that failed."""
    backend, kind = failure.signature[0], failure.signature[1]
    return case_source(failure.case, name=f"test_{backend.split('[')[0]}_{kind}", backends=(failure.backend,))


def fuzz(budget: int, batch_size: int, first_seed: int, backends: list[Backend], report: Report, shrink: bool,
         log: Any) -> dict[tuple[str, ...], Failure]:
    """Run batches until the oracle has run `budget` programs. The first failure of each kind stops hypothesis's
    generation and is shrunk (checking only its backend); then a run with the next seed carries on. Returns the
    shrunk failure of each kind (the first one seen, where it was not shrunk)."""
    found: dict[tuple[str, ...], Failure] = {}
    shrunk: set[tuple[str, ...]] = set()
    run_seed = first_seed
    while report.programs < budget:
        target: list[Failure] = []  # the failure being shrunk

        @seed(run_seed)
        @settings(max_examples=max(1, (budget - report.programs) * 2 // batch_size + 1), database=None, deadline=None,
                  suppress_health_check=SUPPRESSED, report_multiple_bugs=False,
                  phases=[Phase.generate, Phase.shrink] if shrink else [Phase.generate])
        @given(batches(max_cases=batch_size))
        def run(batch: list[Case]) -> None:
            if target:  # shrinking: only the target's backend, only a failure like the target counts
                signature = target[0].signature
                failures = run_cases(batch, Report(), [b for b in backends if b.name == signature[0]])
                reproduced = next((f for f in failures if f.signature == signature), None)
            elif report.programs < budget:
                started = time.perf_counter()
                failures = run_cases(batch, report, backends)
                print(f"[{report.programs}/{budget} programs, {len(report.ops)} ops] batch of {len(batch)} in "
                      f"{time.perf_counter() - started:.1f}s, {len(failures)} failures", file=log, flush=True)
                for failure in failures:
                    if failure.signature not in found and not shrink:  # now, not only at the end: a long run
                        print(f"new failure: {failure}", file=log, flush=True)  # stopped early keeps it
                    found.setdefault(failure.signature, failure)
                reproduced = next((f for f in failures if f.signature not in shrunk), None) if shrink else None
                if reproduced is not None:
                    target.append(reproduced)
                    shrunk.add(reproduced.signature)
                    print(f"shrinking {reproduced}", file=log, flush=True)
            else:
                reproduced = None
            if reproduced is not None:  # one raise statement: hypothesis tells failures apart by where they raise
                raise Reproduced(reproduced)

        try:
            run()
        except Reproduced as reproduced:
            failure = reduce(reproduced.args[0], backends)
            found[failure.signature] = failure
            print(f"shrunk to {len(failure.case.dag.steps)} ops: {failure}", file=log, flush=True)
            # the reproducer now, not only at the end: a long run that is stopped early keeps it
            print(regression_test(failure), file=log, flush=True)
        run_seed += 1
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=10_000, help="how many programs the oracle runs")
    parser.add_argument("--batch", type=int, default=50, help="most DAGs per batch (one compile per backend)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backends", nargs="*", default=None, help="onnx, c, c[AVX2], pt2, torch (default: all)")
    parser.add_argument("--no-shrink", action="store_true", help="report failures without shrinking them")
    parser.add_argument("--shrink-seconds", type=int, default=120,
                        help="hypothesis's shrinking time per failure (then tests/fuzz/reduce.py cuts by values)")
    args = parser.parse_args(argv)
    from hypothesis.internal.conjecture import engine
    engine.MAX_SHRINKING_SECONDS = args.shrink_seconds  # hypothesis's own cap is 300s; no setting exposes it
    import onnxruntime
    onnxruntime.set_default_logger_severity(3)  # a failing session's own log lines would repeat each failure
    backends = select_backends(args.backends)
    started = time.perf_counter()
    report = Report()
    with fixed_constant_pool():
        found = fuzz(args.programs, args.batch, args.seed, backends, report, not args.no_shrink, sys.stderr)
    print(f"\nfuzz: seed {args.seed}, {time.perf_counter() - started:.0f}s, backends "
          f"{', '.join(b.name for b in backends)}")
    print(report.summary(scope=ops_in_scope()))
    if META_CRASHES:
        print(f"meta rules that raised a non-KilnError while drawing: {META_CRASHES}")
    counts = collections.Counter(f.signature for f in report.failures)
    for signature, count in counts.most_common():
        failure = found[signature]
        print(f"\n{count} x {signature[0]} {signature[1]}: {failure.message}\n")
        print(regression_test(failure))
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
