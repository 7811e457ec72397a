"""Process-wide test set-up, before any test module imports a third-party package."""

import os
import pathlib

import pytest

# Triton decides at its first import whether its own library functions (tl.zeros, ...) run under the interpreter;
# torchao imports it while the quantization tests are collected. The Triton backend's tests run kernels on CPU
# tensors, so the whole test process uses the interpreter (no test runs Triton on a GPU).
os.environ.setdefault("TRITON_INTERPRET", "1")

# Compiled models keep their full OpenMP team even while the other test workers keep the CPUs busy, so every C test
# runs the kernels' multi-thread work splits (tests/runtime/test_c_team_size.py turns adaptation back on).
os.environ.setdefault("KILN_ADAPTIVE_THREADS", "0")

# `make test` runs the suite twice on an AVX-512 CPU: natively, then at KILN_CPU_CAPABILITY=AVX2 as an AMD EPYC runs
# it. Only tests that build C code for the CPU's capability can come out differently in the second pass, so the first
# records them (KILN_RECORD_CAPABILITY_TESTS=<folder>: each test that asked kiln for the capability, and each marked
# `cpu_capability` because it builds in a child process) and the second runs those alone (KILN_CAPABILITY_TESTS=
# <folder>). The other four fifths of the suite gave the same results again in a third of CI's time.
RECORD_FOLDER = os.environ.get("KILN_RECORD_CAPABILITY_TESTS")
SELECT_FOLDER = os.environ.get("KILN_CAPABILITY_TESTS")
_capability_asked: list[bool] = []  # [whether the running test asked], once the lookups are watched


def _watch_capability_requests() -> None:
    """Make every get_cpu_capability call in this process set _capability_asked: it reads this CPU's levels through
    its module's global, so wrapping that name catches every caller, however it imported the function."""
    from kiln.codegen.c import build
    supported = build.supported_capabilities

    def watched() -> list[str]:
        _capability_asked[0] = True
        return supported()
    build.supported_capabilities = watched
    _capability_asked.append(False)


if RECORD_FOLDER:
    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        if not _capability_asked:
            _watch_capability_requests()
        _capability_asked[0] = False
        result = yield
        if _capability_asked[0] or item.get_closest_marker("cpu_capability"):
            folder = pathlib.Path(RECORD_FOLDER)
            folder.mkdir(parents=True, exist_ok=True)
            with open(folder / f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.txt", "a") as record:
                record.write(item.nodeid + "\n")
        return result


if SELECT_FOLDER:
    def pytest_collection_modifyitems(config, items):
        records = sorted(pathlib.Path(SELECT_FOLDER).glob("*.txt"))
        if not records:
            raise pytest.UsageError(f"KILN_CAPABILITY_TESTS={SELECT_FOLDER} holds no record of a first pass; run "
                                    f"the suite with KILN_RECORD_CAPABILITY_TESTS={SELECT_FOLDER} first")
        wanted = {line for record in records for line in record.read_text().splitlines()}
        config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in wanted])
        items[:] = [item for item in items if item.nodeid in wanted]
