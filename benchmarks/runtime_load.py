"""The C runtime under load, at full scale (tests/runtime/test_load.py checks the same at suite-sized scale):

- 8 threads x 1,000 calls on one compiled model, at 1 and 2 OpenMP threads per call: results bit-identical to a
  single caller's, and the calls per second;
- 1,000 distinct packages loaded, called once and unloaded in one process: resident memory and open file
  descriptors before and after;
- a model called from a thread while its folder is recompiled 5 times: every call's result;
- 512 MB of weights: resident memory (anonymous vs file-backed) after loading and after one call, for an embedding
  table (read in place from the mapped weights.bin) and for a linear layer (read in the GEMM's panel layout, which
  the compiler packed into weights.bin).

Run: .venv/bin/python benchmarks/runtime_load.py   (Linux: it reads /proc/self)
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kiln  # noqa: E402
import kiln.nn as nn  # noqa: E402
import kiln.runtime  # noqa: E402
from tests.runtime.support import open_descriptors, process_memory  # noqa: E402

MB = 1 << 20


class Mlp(nn.Module):
    def __init__(self, width: int = 256):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, width), nn.Linear(width, 64)

    def forward(self, x):
        return self.fc2(self.fc1(x).relu()).softmax(-1)


def _mlp_program(width: int = 256) -> kiln.ExportedProgram:
    return kiln.export(Mlp(width).eval(), (kiln.randn(8, 64),),
                       dynamic_shapes={"x": {0: kiln.Dim("batch", max=256)}})


def concurrent_calls(folder: Path) -> None:
    inputs = [np.random.default_rng(batch).standard_normal((batch, 64)).astype(np.float32) for batch in (1, 8, 33)]
    for num_threads in (1, 2):
        model = kiln.runtime.load(folder, num_threads=num_threads)
        expected = [model(x) for x in inputs]
        mismatches = []

        def caller(worker: int) -> None:
            for call in range(1000):
                index = (worker + call) % len(inputs)
                if not np.array_equal(model(inputs[index]), expected[index]):
                    mismatches.append((worker, call))

        threads = [threading.Thread(target=caller, args=(worker,)) for worker in range(8)]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        seconds = time.perf_counter() - start
        print(f"8 threads x 1000 calls, {num_threads} OpenMP thread(s) per call: {len(mismatches)} mismatches, "
              f"{8000 / seconds:,.0f} calls/s")


def load_unload(folder: Path, scratch: Path, count: int = 1000) -> None:
    x = np.ones((4, 64), np.float32)

    def cycle(first: int, number: int) -> None:
        for k in range(first, first + number):
            copy = scratch / f"copy{k}"
            shutil.copytree(folder, copy)
            model = kiln.runtime.load(copy)
            model(x)
            del model
            shutil.rmtree(copy)

    cycle(0, 20)  # warm-up: allocator pools and the first library's pages
    descriptors, memory = open_descriptors(), process_memory()
    start = time.perf_counter()
    cycle(20, count)
    seconds = time.perf_counter() - start
    after = process_memory()
    print(f"{count} packages loaded, called and unloaded: {seconds / count * 1e3:.2f} ms per cycle (copy included); "
          f"file descriptors {descriptors} -> {open_descriptors()}; resident anonymous "
          f"{(after['anonymous'] - memory['anonymous']) / MB:+.1f} MB, file-backed "
          f"{(after['file'] - memory['file']) / MB:+.1f} MB")


def recompile_while_calling(folder: Path, scratch: Path) -> None:
    target = scratch / "live"
    shutil.copytree(folder, target)
    model = kiln.runtime.load(target)
    x = np.random.default_rng(1).standard_normal((16, 64)).astype(np.float32)
    expected = model(x)
    other = _mlp_program(width=128)
    stop, results = threading.Event(), []

    def keep_calling() -> None:
        while not stop.is_set():
            results.append(np.array_equal(model(x), expected))

    caller = threading.Thread(target=keep_calling)
    caller.start()
    for _ in range(5):
        kiln.compile(other, output=target)
    stop.set()
    caller.join()
    reloaded_ok = np.allclose(kiln.runtime.load(target)(x), np.asarray(other(x)), rtol=1.3e-6, atol=1e-5)
    print(f"5 recompiles of the folder during {len(results)} calls: {results.count(False)} wrong results; the "
          f"reloaded package runs the new model: {reloaded_ok}")


def large_weights(scratch: Path) -> None:
    cases = {
        "embedding 2,097,152 x 64": (nn.Embedding(2_097_152, 64), kiln.tensor([[1, 2, 3]]),
                                     np.array([[5, 2_097_151, 0]], np.int64)),
        "linear 11,585 x 11,585": (nn.Linear(11_585, 11_585, bias=False), kiln.randn(1, 11_585),
                                   np.ones((1, 11_585), np.float32)),
    }
    for name, (module, example, x) in cases.items():
        folder = scratch / name.split()[0]
        kiln.compile(kiln.export(module.eval(), (example,)), output=folder)
        del module
        size = (folder / "weights.bin").stat().st_size
        before = process_memory()
        start = time.perf_counter()
        model = kiln.runtime.load(folder)
        load_seconds = time.perf_counter() - start
        loaded = process_memory()
        model(x)
        called = process_memory()
        print(f"{name} ({size / MB:.0f} MB weights.bin): load {load_seconds * 1e3:.0f} ms; resident anonymous "
              f"{(loaded['anonymous'] - before['anonymous']) / MB:+.1f} MB after load, "
              f"{(called['anonymous'] - before['anonymous']) / MB:+.1f} MB after a call; file-backed "
              f"{(called['file'] - before['file']) / MB:+.1f} MB after a call")
        del model
        shutil.rmtree(folder)


def main() -> None:
    with tempfile.TemporaryDirectory() as directory:
        scratch = Path(directory)
        folder = scratch / "mlp"
        kiln.compile(_mlp_program(), output=folder)
        concurrent_calls(folder)
        load_unload(folder, scratch)
        recompile_while_calling(folder, scratch)
        large_weights(scratch)


if __name__ == "__main__":
    main()
