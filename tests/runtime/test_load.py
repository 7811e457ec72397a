"""The C runtime under load: concurrent calls from many threads, loading and unloading many packages, a model
called while its folder is recompiled, and weights mapped from disk rather than copied.

The figures at full scale (8 threads x 1,000 calls, 1,000 packages, 512 MB of weights) come from
benchmarks/runtime_load.py; these tests run the same checks at sizes that fit the suite.
"""

from __future__ import annotations

import shutil
import sys
import threading

import numpy as np
import pytest

import kiln
import kiln.nn as nn
import kiln.runtime

from tests.runtime.support import open_descriptors, process_memory

pytestmark = [pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler"),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="measures through /proc")]


class Mlp(nn.Module):
    def __init__(self, width: int = 256):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, width), nn.Linear(width, 64)

    def forward(self, x):
        return self.fc2(self.fc1(x).relu()).softmax(-1)


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    module = Mlp().eval()
    program = kiln.export(module, (kiln.randn(8, 64),), dynamic_shapes={"x": {0: kiln.Dim("batch", max=256)}})
    folder = tmp_path_factory.mktemp("load") / "mlp"
    kiln.compile(program, output=folder)
    return program, folder


@pytest.mark.parametrize("num_threads", [1, 2])
def test_concurrent_calls_from_eight_threads_are_bit_identical(package, num_threads):
    program, folder = package
    model = kiln.runtime.load(folder, num_threads=num_threads)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((batch, 64)).astype(np.float32) for batch in (1, 8, 33, 128)]
    expected = [model(x) for x in inputs]
    for x, want in zip(inputs, expected):  # the single-threaded results are the interpreter's, within tolerance
        np.testing.assert_allclose(want, np.asarray(program(x)), rtol=1.3e-6, atol=1e-5)
    mismatches: list[str] = []

    def caller(worker: int) -> None:
        for call in range(1000):
            index = (worker + call) % len(inputs)
            if not np.array_equal(model(inputs[index]), expected[index]):
                mismatches.append(f"thread {worker}, call {call}")
                return

    threads = [threading.Thread(target=caller, args=(worker,)) for worker in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert mismatches == []


def test_loading_and_unloading_many_packages_leaks_nothing(package, tmp_path):
    """Each copy of the package is a distinct library file, so each load maps a new library; unloading a model
    unmaps it (dlclose) and closes its files. After a warm-up, 300 more load-call-unload cycles keep the memory and
    file descriptors flat."""
    _, folder = package
    x = np.ones((4, 64), np.float32)

    def cycle(count: int, start: int) -> None:
        for k in range(start, start + count):
            copy = tmp_path / f"copy{k}"
            shutil.copytree(folder, copy)
            model = kiln.runtime.load(copy)
            model(x)
            del model
            shutil.rmtree(copy)

    cycle(50, 0)
    descriptors, memory = open_descriptors(), process_memory()
    cycle(300, 50)
    grown = {kind: process_memory()[kind] - memory[kind] for kind in memory}
    assert open_descriptors() == descriptors
    assert grown["anonymous"] + grown["file"] < 2 << 20, grown


def test_a_model_keeps_running_while_its_folder_is_recompiled(package, tmp_path):
    program, folder = package
    target = tmp_path / "live"
    shutil.copytree(folder, target)
    model = kiln.runtime.load(target)
    x = np.random.default_rng(1).standard_normal((16, 64)).astype(np.float32)
    expected = model(x)
    replacement = Mlp(width=128).eval()
    other = kiln.export(replacement, (kiln.randn(8, 64),), dynamic_shapes={"x": {0: kiln.Dim("batch", max=256)}})
    stop, results = threading.Event(), []

    def keep_calling() -> None:
        while not stop.is_set():
            results.append(np.array_equal(model(x), expected))

    caller = threading.Thread(target=keep_calling)
    caller.start()
    try:
        for _ in range(2):  # recompiling replaces every file in the folder while the model runs from it
            kiln.compile(other, output=target)
    finally:
        stop.set()
        caller.join()
    assert results and all(results)
    np.testing.assert_array_equal(model(x), expected)
    reloaded = kiln.runtime.load(target)
    np.testing.assert_allclose(reloaded(x), np.asarray(other(x)), rtol=1.3e-6, atol=1e-5)


class _Conv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1024, 1024, 3, padding=1, bias=False)  # 36 MB

    def forward(self, x):
        return self.conv(x)


# (module, example input, call input): 36-64 MB of weights read in place (an embedding table), or read by a GEMM or
# a convolution in the layout the compiler packed them into.
LARGE_WEIGHTS = {
    "embedding": lambda: (nn.Embedding(262_144, 64), kiln.tensor([[1, 2, 3]]), np.array([[5, 262_143, 0]])),
    "linear": lambda: (nn.Linear(4096, 4096, bias=False), kiln.randn(1, 4096),
                       np.random.default_rng(0).standard_normal((3, 4096)).astype(np.float32)),
    "conv": lambda: (_Conv(), kiln.randn(1, 1024, 4, 4),
                     np.random.default_rng(0).standard_normal((1, 1024, 4, 4)).astype(np.float32)),
}


@pytest.mark.parametrize("kind", LARGE_WEIGHTS)
def test_weights_are_mapped_not_copied(kind, tmp_path):
    """Loading maps weights.bin, and neither loading nor calling copies the weights into anonymous memory (their
    pages are file-backed, shared with the page cache): an embedding reads its table in place, and GEMMs and
    convolutions read the layout the compiler packed their weights into."""
    module, example, x = LARGE_WEIGHTS[kind]()
    module.eval()
    dynamic = {"input": {0: kiln.Dim("batch", max=64)}} if kind == "linear" else None
    program = kiln.export(module, (example,), dynamic_shapes=dynamic)
    kiln.compile(program, output=tmp_path / kind)
    weight_bytes = sum(p.numel() * 4 for p in module.parameters())
    assert (tmp_path / kind / "weights.bin").stat().st_size < weight_bytes * 1.05  # stored once
    before = process_memory()["anonymous"]
    model = kiln.runtime.load(tmp_path / kind)
    got = model(x)
    grown = process_memory()["anonymous"] - before
    assert grown < 4 << 20, f"{grown / 2**20:.1f} MB of anonymous memory for {weight_bytes / 2**20:.0f} MB of weights"
    np.testing.assert_allclose(got, np.asarray(program(x)), rtol=1.3e-6, atol=1e-5)


class _Wide(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 8192), nn.Linear(8192, 16)

    def forward(self, x):
        return self.fc2(self.fc1(x).relu())


def test_a_model_keeps_its_arena_between_calls(tmp_path):
    """The hidden activations at batch 1536 (48 MB) are above glibc's largest mmap threshold (32 MB): an arena
    allocated per call came from a fresh mmap each time and faulted in every 4 KB page of it, 12,000 faults a call.
    The model keeps its arena (kiln_arena.h), grown for the largest call, whatever the order of the sizes."""
    import resource
    kiln.manual_seed(0)
    program = kiln.export(_Wide().eval(), (kiln.randn(8, 16),),
                          dynamic_shapes={"x": {0: kiln.Dim("batch", max=2048)}})
    kiln.compile(program, output=tmp_path / "wide")
    model = kiln.runtime.load(tmp_path / "wide")
    rng = np.random.default_rng(0)
    small, big = (rng.standard_normal((batch, 16)).astype(np.float32) for batch in (3, 1536))
    for x in (small, big, small, big):
        np.testing.assert_allclose(model(x), np.asarray(program(x)), rtol=1.3e-6, atol=1e-5)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(3):
        model(big)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 3
    assert faults < 1000, f"{faults:.0f} page faults a call"
