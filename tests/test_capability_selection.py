"""`make test`'s AVX2 pass runs the tests whose C code depends on the CPU capability, as its first pass recorded them
(tests/conftest.py): each test that asked kiln which capability to build for, and each marked `cpu_capability`;
none of the others (listing the levels this CPU runs does not depend on KILN_CPU_CAPABILITY), and nothing at all
without a record."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SAMPLE = '''
import pytest
from kiln.codegen.c import get_cpu_capability, supported_capabilities

def test_asks():
    assert get_cpu_capability() in supported_capabilities()

def test_lists_the_levels():
    assert supported_capabilities()

def test_computes():
    assert 1 + 1 == 2

@pytest.mark.cpu_capability
def test_builds_in_a_child():
    pass
'''


def _pytest(sample: Path, **environment: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items()
           if key not in ("KILN_RECORD_CAPABILITY_TESTS", "KILN_CAPABILITY_TESTS", "PYTEST_XDIST_WORKER")}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider",
                           "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(sample.parent), str(sample)],
                          cwd=ROOT, capture_output=True, text=True, env={**env, **environment}, timeout=300)


def test_the_first_pass_records_the_tests_that_the_second_runs(tmp_path):
    sample = tmp_path / "test_sample.py"
    sample.write_text(SAMPLE)
    record = tmp_path / "record"
    first = _pytest(sample, KILN_RECORD_CAPABILITY_TESTS=str(record))
    assert first.returncode == 0 and "4 passed" in first.stdout, first.stdout[-3000:]
    recorded = {line for path in record.glob("*.txt") for line in path.read_text().splitlines()}
    assert recorded == {"test_sample.py::test_asks", "test_sample.py::test_builds_in_a_child"}

    second = _pytest(sample, KILN_CAPABILITY_TESTS=str(record))
    assert second.returncode == 0 and "2 passed, 2 deselected" in second.stdout, second.stdout[-3000:]


def test_the_second_pass_refuses_to_run_without_a_record(tmp_path):
    sample = tmp_path / "test_sample.py"
    sample.write_text(SAMPLE)
    result = _pytest(sample, KILN_CAPABILITY_TESTS=str(tmp_path / "absent"))
    assert result.returncode != 0
    assert "holds no record of a first pass" in result.stdout + result.stderr
