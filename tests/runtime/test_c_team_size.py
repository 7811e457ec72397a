"""A compiled model's team size on a machine whose CPUs other processes keep busy (kiln/codegen/c/kiln_threads.h):
the policy on its own, driven through ctypes with hand-computed expectations, and a compiled model beside CPU-bound
processes, which must drop to the CPUs it finds and still give bit-identical results."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import kiln
from tests.runtime.test_c_backend import compile_c

HEADER = Path(kiln.__file__).parent / "codegen" / "c" / "kiln_threads.h"
MS = 1_000_000  # nanoseconds
SECOND = 1000 * MS


class Team(ctypes.Structure):
    """kiln_threads.h's kiln_team, field by field."""
    _fields_ = [("fixed", ctypes.c_int), ("limit", ctypes.c_int), ("last_threads", ctypes.c_int),
                ("window_threads", ctypes.c_int), ("window_cpu_ns", ctypes.c_int64),
                ("window_wall_ns", ctypes.c_int64), ("retry_ns", ctypes.c_int64), ("hold_ns", ctypes.c_int64),
                ("team_end_ns", ctypes.c_int64)]


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    folder = tmp_path_factory.mktemp("team")
    (folder / "policy.c").write_text(
        "#define _POSIX_C_SOURCE 200809L\n"
        f'#include "{HEADER}"\n'
        "int team_size(kiln_team* t, int wanted, int64_t now) { return kiln_team_size(t, wanted, now); }\n"
        "void team_record(kiln_team* t, int threads, int wanted, int64_t cpu, int64_t wall, int64_t start,\n"
        "                 int64_t now)\n"
        "{ kiln_team_record(t, threads, wanted, cpu, wall, start, now); }\n")
    subprocess.run(["cc", "-std=c11", "-O2", "-shared", "-fPIC", "-o", str(folder / "policy.so"),
                    str(folder / "policy.c")], check=True)
    lib = ctypes.CDLL(str(folder / "policy.so"))
    lib.team_size.restype = ctypes.c_int
    lib.team_size.argtypes = [ctypes.POINTER(Team), ctypes.c_int, ctypes.c_int64]
    lib.team_record.restype = None
    lib.team_record.argtypes = [ctypes.POINTER(Team), ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
                                ctypes.c_int64, ctypes.c_int64]
    return _Policy(lib)


class _Policy:
    """The policy's two functions. `team_record` records a run that ends at `now` and started right where the last
    team run ended (back to back: its workers awake), or `gap` later; a team's first run starts as if a run had
    just ended. (The policy reads no start for a one-thread run.)"""

    def __init__(self, lib):
        self.team_size = lib.team_size
        self._record = lib.team_record

    def team_record(self, team, threads, wanted, cpu, wall, now, gap=0):
        if team.team_end_ns == 0 and threads >= 2:
            team.team_end_ns = now - wall
        self._record(team, threads, wanted, cpu, wall, team.team_end_ns + gap, now)


def test_a_team_that_had_its_cpus_keeps_its_size(policy):
    team = Team()
    assert policy.team_size(team, 4, 0) == 4
    policy.team_record(team, 4, 4, 76 * MS, 20 * MS, 10 * MS)  # 3.8 CPUs of 4: rounds to 4
    assert (team.limit, team.last_threads, team.hold_ns) == (0, 4, 0)
    assert policy.team_size(team, 4, 20 * MS) == 4


def test_a_busy_machine_limits_the_team_until_the_retry(policy):
    team = Team()
    policy.team_record(team, 2, 2, 26 * MS, 20 * MS, 100 * MS)  # 1.3 CPUs of 2 (a third process on 2 cores)
    assert (team.limit, team.hold_ns, team.retry_ns) == (1, SECOND // 4, 100 * MS + SECOND // 4)
    assert policy.team_size(team, 2, 100 * MS + SECOND // 4 - 1) == 1
    policy.team_record(team, 1, 2, 0, 0, 200 * MS)  # a one-thread run measures nothing
    assert (team.limit, team.last_threads, team.retry_ns) == (1, 1, 100 * MS + SECOND // 4)
    assert policy.team_size(team, 2, 100 * MS + SECOND // 4) == 2  # the retry
    # the machine is still busy: the limit holds twice as long each time, up to 4 s
    now = 100 * MS + SECOND // 4
    for hold in [SECOND // 2, SECOND, 2 * SECOND, 4 * SECOND, 4 * SECOND]:
        policy.team_record(team, 2, 2, 24 * MS, 20 * MS, now)
        assert (team.limit, team.hold_ns, team.retry_ns) == (1, hold, now + hold)
        assert policy.team_size(team, 2, now + hold - 1) == 1
        now += hold
        assert policy.team_size(team, 2, now) == 2
    # the retry finds the CPUs free again: the full team from now on, and the next limit starts short
    policy.team_record(team, 2, 2, 38 * MS, 20 * MS, now)
    assert (team.limit, team.hold_ns) == (0, 0)
    assert policy.team_size(team, 2, now + 1) == 2
    policy.team_record(team, 2, 2, 20 * MS, 20 * MS, now + 2)
    assert (team.limit, team.hold_ns) == (1, SECOND // 4)


def test_a_limited_team_goes_lower_but_only_a_full_team_lifts_the_limit(policy):
    team = Team()
    policy.team_record(team, 8, 8, 90 * MS, 20 * MS, 0)  # 4.5 CPUs of 8: rounds to 5
    assert (team.limit, team.hold_ns) == (5, SECOND // 4)
    assert policy.team_size(team, 8, 1) == 5
    policy.team_record(team, 5, 8, 100 * MS, 20 * MS, 10 * MS)  # the limited team had its 5: the limit stays
    assert (team.limit, team.retry_ns) == (5, SECOND // 4)
    policy.team_record(team, 5, 8, 62 * MS, 20 * MS, 20 * MS)  # fewer now: 3, the hold unchanged
    assert (team.limit, team.hold_ns, team.retry_ns) == (3, SECOND // 4, 20 * MS + SECOND // 4)
    policy.team_record(team, 5, 8, 4 * MS, 20 * MS, 30 * MS)  # 0.2 CPUs still leave the run one thread
    assert team.limit == 1
    assert policy.team_size(team, 1, 40 * MS) == 1  # a run that wants one thread gets one
    assert policy.team_size(team, 3, 30 * MS + SECOND // 4 - 1) == 1
    assert policy.team_size(team, 3, 30 * MS + SECOND // 4) == 3


def test_a_fixed_team_ignores_the_limit(policy):
    team = Team(fixed=1)
    policy.team_record(team, 2, 2, 20 * MS, 20 * MS, 0)
    assert team.limit == 1
    assert policy.team_size(team, 2, 1) == 2


def test_one_slow_run_is_no_evidence_but_a_window_of_them_is(policy):
    team, start = Team(), SECOND  # (a clock reading of 0 would be no run's end)
    policy.team_record(team, 2, 2, 3 * MS, 5 * MS, start)  # a 5 ms run whose worker was away most of it
    assert (team.limit, team.window_wall_ns, team.window_cpu_ns) == (0, 5 * MS, 3 * MS)
    for run in range(1, 15):  # then 1 ms runs on both CPUs: the window's 20 ms end with 1.65 CPUs: 2
        policy.team_record(team, 2, 2, 2 * MS, 1 * MS, start + run * MS)
    assert (team.limit, team.window_wall_ns) == (0, 19 * MS)
    policy.team_record(team, 2, 2, 2 * MS, 1 * MS, start + 15 * MS)
    assert (team.limit, team.window_wall_ns, team.window_cpu_ns) == (0, 0, 0)
    for run in range(19):  # runs that each had 1.4 CPUs
        policy.team_record(team, 2, 2, 14 * MS // 10, 1 * MS, start + (20 + run) * MS)
    assert team.limit == 0
    policy.team_record(team, 2, 2, 14 * MS // 10, 1 * MS, start + 40 * MS)
    assert (team.limit, team.retry_ns) == (1, start + 40 * MS + SECOND // 4)


def test_a_window_holds_runs_of_one_team_size(policy):
    team = Team()
    policy.team_record(team, 4, 4, 2 * MS, 15 * MS, 0)  # 0.13 CPUs of 4 over 15 ms
    policy.team_record(team, 3, 4, 45 * MS, 15 * MS, 0)  # another size: a new window, of 3 CPUs of 3 so far
    assert (team.window_threads, team.window_wall_ns, team.window_cpu_ns, team.limit) == (3, 15 * MS, 45 * MS, 0)
    policy.team_record(team, 3, 4, 15 * MS, 5 * MS, 0)  # the window closes with 3 CPUs (both sizes': 1.8)
    assert (team.window_wall_ns, team.limit) == (0, 0)


def test_a_run_whose_workers_slept_is_no_evidence(policy):
    team = Team()
    policy._record(team, 2, 2, 10 * MS, 10 * MS, 0, 10 * MS)  # the model's first team run: its workers were new
    assert (team.window_wall_ns, team.team_end_ns) == (0, 10 * MS)
    # after a 50 ms pause: a 10 ms run whose worker woke late (1 CPU), with back-to-back runs on both CPUs after it
    policy.team_record(team, 2, 2, 10 * MS, 10 * MS, 70 * MS, gap=50 * MS)
    assert (team.window_wall_ns, team.team_end_ns, team.limit) == (0, 70 * MS, 0)
    for run in range(1, 21):
        policy.team_record(team, 2, 2, 2 * MS, 1 * MS, (70 + run) * MS)
    assert (team.limit, team.window_wall_ns, team.hold_ns) == (0, 0, 0)
    # a pause up to 5 ms leaves the workers spinning: that run counts
    policy.team_record(team, 2, 2, 10 * MS, 10 * MS, 105 * MS, gap=5 * MS)
    assert team.window_wall_ns == 10 * MS
    policy.team_record(team, 2, 2, 10 * MS, 10 * MS, 115 * MS)  # two such runs: 1 CPU of 2 over the window
    assert (team.limit, team.retry_ns) == (1, 115 * MS + SECOND // 4)


# Work enough for two threads (2 x KILN_WORK_PER_THREAD operations a run) and short runs: 4 MFLOP
class _Layers(kiln.nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = kiln.nn.Linear(256, 256), kiln.nn.Linear(256, 256)

    def forward(self, x):
        return self.second(kiln.relu(self.first(x)))


def test_a_model_beside_busy_processes_runs_on_the_cpus_it_finds(tmp_path, monkeypatch):
    kiln.manual_seed(0)
    x = kiln.randn(32, 256)
    compile_c(kiln.export(_Layers(), (x,)), output=tmp_path / "layers")
    monkeypatch.setenv("KILN_ADAPTIVE_THREADS", "0")  # read when a model is created
    fixed = kiln.runtime.load(tmp_path / "layers", num_threads=2)
    monkeypatch.delenv("KILN_ADAPTIVE_THREADS")
    model = kiln.runtime.load(tmp_path / "layers", num_threads=2)
    assert model.last_run_threads == 0
    data = x.numpy()
    alone = kiln.runtime.load(tmp_path / "layers", num_threads=1)
    expected = alone(data)
    assert alone.last_run_threads == 1
    # one CPU-bound process per CPU and one more: the two threads share the CPUs with them
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range((os.cpu_count() or 1) + 1)]
    try:
        time.sleep(0.2)
        seen = set()
        deadline = time.monotonic() + 20
        while 1 not in seen and time.monotonic() < deadline:
            np.testing.assert_array_equal(model(data), expected)
            seen.add(model.last_run_threads)
            np.testing.assert_array_equal(fixed(data), expected)
            assert fixed.last_run_threads == 2
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert 1 in seen, f"a 2-thread model beside {len(hogs)} CPU-bound processes kept {seen} threads"
