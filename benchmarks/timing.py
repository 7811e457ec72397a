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
