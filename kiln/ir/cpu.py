"""The CPU's feature flags (/proc/cpuinfo) and usable CPUs: code generators pick ISA levels from them, and numerics
that follow a library's vector width or thread split (torch's float32 kernels: 16 lanes with AVX-512, else 8) read
them too."""

from __future__ import annotations

import functools
import os
import platform


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """x86 feature flags of this CPU (`avx2`, `avx512f`, ...); empty elsewhere or when they cannot be read."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return frozenset()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def usable_cpus() -> int:
    """The CPUs this process may run on (torch's default intra-op thread count, which some of its numerics follow)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
