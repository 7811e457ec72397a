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
                        settle_seconds: float = 0.05) -> dict[str, float]:
    """Median seconds per call of each runner, timed in interleaved rounds so drift on the noisy machine hits every
    peer alike: each round times a batch of calls long enough to measure (sub-millisecond models, sized on the
    first runner), and the peers go first in turn. Every runner is called once untimed first.

    Each batch starts after `settle_seconds` of sleep: thread pools spin-wait after a call (onnxruntime's for
    milliseconds), and on 2 cores the spinning threads of the previous peer halved the speed of whichever peer ran
    next (kiln's MLP row: 2.8 ms alone, 6.5 ms right after onnxruntime, 3.1 ms after a 50 ms pause). Then one
    untimed call wakes the peer's threads and brings its weights back into cache: on this VM the first call after
    the pause took 2-4x as long as the next ones, for every peer alike (the int8 MLP: 10-15 ms against 3-5 ms back
    to back), and batches of two calls timed mostly that."""
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
            runners[name]()
            start = time.perf_counter()
            for _ in range(batch):
                runners[name]()
            times[name].append((time.perf_counter() - start) / batch)
    return {name: statistics.median(t) for name, t in times.items()}
