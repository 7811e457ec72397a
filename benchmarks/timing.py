"""The one timing helper the benchmark scripts share: medians, because this 2-core machine is noisy."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable


def median_time(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """(median seconds over `repeat` calls, the last call's result)."""
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def median_seconds(fn: Callable[[], Any], repeat: int) -> float:
    return median_time(fn, repeat)[0]


def interleaved_medians(runners: dict[str, Callable[[], Any]], rounds: int, round_seconds: float = 0.02,
                        settle_seconds: float = 0.05, warm_seconds: float = 0.01) -> dict[str, float]:
    """Median seconds per call of each runner, timed in interleaved rounds so drift on the noisy machine hits every
    peer alike: each round times a batch of calls long enough to measure (sub-millisecond models, sized on the
    first runner), and the peers go first in turn. Every runner is called once untimed first.

    Each batch starts after `settle_seconds` of sleep: thread pools spin-wait after a call (onnxruntime's for
    milliseconds), and on 2 cores the spinning threads of the previous peer halved the speed of whichever peer ran
    next (kiln's MLP row: 2.8 ms alone, 6.5 ms right after onnxruntime, 3.1 ms after a 50 ms pause). Then untimed
    calls, for `warm_seconds` and two calls at least, wake the peer's threads and bring its weights back into cache:
    on this VM the first calls after the pause are slow for every peer, and one call was not enough (the int8 MLP
    at batch 1, whose calls take 0.23 ms back to back: 4.1, 0.68, 0.39, then 0.23 ms; onnxruntime's 2.7, 0.68,
    0.45, then 0.27), so batches of a few calls timed mostly the waking."""
    for run in runners.values():
        run()
    first = next(iter(runners.values()))
    first()
    start = time.perf_counter()
    first()
    batch = max(3, int(round_seconds / max(time.perf_counter() - start, 1e-6)))
    order, times = list(runners), {name: [] for name in runners}
    for round_index in range(rounds):
        for name in order if round_index % 2 == 0 else order[::-1]:
            time.sleep(settle_seconds)
            warm_until, warm_calls = time.perf_counter() + warm_seconds, 0
            while warm_calls < 2 or time.perf_counter() < warm_until:
                runners[name]()
                warm_calls += 1
            start = time.perf_counter()
            for _ in range(batch):
                runners[name]()
            times[name].append((time.perf_counter() - start) / batch)
    return {name: statistics.median(t) for name, t in times.items()}
