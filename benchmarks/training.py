"""Training steps side by side: kiln's compiled C train step against torch eager, on the same model and data.

Usage: python benchmarks/training.py [--rows digits,mlp,cnn32] [--threads T] [--rounds R] [--accuracy]

A step is zero_grad, forward, cross-entropy loss, backward and an Adam update. Rows (random init, random data):
  digits  the digits CNN of tests/test_training.py (conv 1→8, conv 8→16, linear 256→10) at batch 128, 8×8 images
  mlp     Linear 784→512, ReLU, Linear 512→512, ReLU, Linear 512→10 at batch 128
  cnn32   3×(conv3x3-BN-ReLU-maxpool) 3→32→64→128, Linear 2048→10 at batch 32, 32×32 images
Peers, one process, T threads each (default 2), medians of interleaved rounds: torch eager (torch.optim.Adam, its
default single-tensor path on the CPU), kiln's train step compiled to C (kiln.training.compile_train_step: one call
runs forward, backward and the update), and kiln eager (autograd on the reference kernels, kiln.optim.Adam).

--accuracy trains the digits CNN from scratch (20 epochs, batch 128, Adam lr 1e-2) with torch, kiln eager and kiln's
compiled step, and prints each one's held-out accuracy on scikit-learn's bundled digits and its wall time.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from c_realistic import cpu_name  # noqa: E402  (benchmarks/c_realistic.py)
from timing import interleaved_medians  # noqa: E402


def _digits(nn: Any) -> Any:
    return nn.Sequential(nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(256, 10))


def _mlp(nn: Any) -> Any:
    return nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))


def _cnn32(nn: Any) -> Any:
    layers: list[Any] = []
    for cin, cout in ((3, 32), (32, 64), (64, 128)):
        layers += [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(2)]
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(2048, 10))


ROWS: dict[str, tuple[Callable[[Any], Any], tuple[int, ...]]] = {
    "digits": (_digits, (128, 64)),
    "mlp": (_mlp, (128, 784)),
    "cnn32": (_cnn32, (32, 3, 32, 32)),
}


def _pair(name: str, torch: Any) -> tuple[Any, Any]:
    """The row's model in torch and in kiln, with the same weights."""
    import kiln
    torch.manual_seed(0)
    reference = ROWS[name][0](torch.nn)
    model = ROWS[name][0](kiln.nn)
    model.load_state_dict(reference.state_dict())
    return reference, model


def _data(shape: tuple[int, ...], seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape).astype(np.float32), rng.integers(0, 10, shape[0])


def _torch_step(torch: Any, model: Any, images: np.ndarray, labels: np.ndarray) -> Callable[[], Any]:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.from_numpy(images), torch.from_numpy(labels)

    def step() -> Any:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss
    return step


def _kiln_eager_step(model: Any, images: np.ndarray, labels: np.ndarray) -> Callable[[], Any]:
    import kiln
    optimizer = kiln.optim.Adam(model.parameters(), lr=1e-3)
    x, y = kiln.tensor(images), kiln.tensor(labels)

    def step() -> Any:
        optimizer.zero_grad()
        loss = kiln.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss
    return step


def _kiln_compiled_step(model: Any, images: np.ndarray, labels: np.ndarray, threads: int) -> tuple[Callable, float]:
    import kiln
    from kiln.training import compile_train_step
    start = time.perf_counter()
    step = compile_train_step(model, kiln.nn.functional.cross_entropy, kiln.optim.Adam(model.parameters(), lr=1e-3),
                              (images, labels), num_threads=threads)
    return (lambda: step(images, labels)), time.perf_counter() - start


def benchmark(rows: list[str], threads: int, rounds: int) -> None:
    import torch
    torch.set_num_threads(threads)
    print(f"CPU: {cpu_name()}; {threads} thread(s); KILN_CPU_CAPABILITY={os.environ.get('KILN_CPU_CAPABILITY', '')}"
          "(native if empty); medians of interleaved rounds, ms per training step")
    print("| row | torch eager | kiln C step | kiln C / torch | kiln eager | kiln eager / torch | C build s |")
    print("|---|---|---|---|---|---|---|")
    for name in rows:
        images, labels = _data(ROWS[name][1])
        reference, model = _pair(name, torch)
        _, compiled_twin = _pair(name, torch)
        compiled, build_seconds = _kiln_compiled_step(compiled_twin, images, labels, threads)
        peers = {"torch": _torch_step(torch, reference, images, labels), "kiln C": compiled,
                 "kiln eager": _kiln_eager_step(model, images, labels)}
        times = interleaved_medians(peers, rounds)
        ms = {k: v * 1e3 for k, v in times.items()}
        print(f"| {name} {ROWS[name][1]} | {ms['torch']:.2f} | {ms['kiln C']:.2f} | "
              f"{ms['kiln C'] / ms['torch']:.2f} | {ms['kiln eager']:.1f} | {ms['kiln eager'] / ms['torch']:.1f} | "
              f"{build_seconds:.1f} |")


def accuracy(threads: int, epochs: int = 20) -> None:
    import torch
    from sklearn.datasets import load_digits

    import kiln
    from kiln.training import compile_train_step
    torch.set_num_threads(threads)
    images, labels = load_digits(return_X_y=True)
    images = (images / 16.0).astype(np.float32)
    order = np.random.default_rng(0).permutation(len(images))
    images, labels = images[order], labels[order]
    split = len(images) // 2
    train_x, train_y, test_x, test_y = images[:split], labels[:split], images[split:], labels[split:]

    def batches():
        rng = np.random.default_rng(0)
        for _ in range(epochs):
            chosen = rng.permutation(len(train_x))
            for start in range(0, len(chosen) - 127, 128):
                yield train_x[chosen[start:start + 128]], train_y[chosen[start:start + 128]]

    def held_out(predict: Callable[[np.ndarray], np.ndarray]) -> float:
        return float((predict(test_x).argmax(axis=1) == test_y).mean() * 100)

    print(f"CPU: {cpu_name()}; {threads} thread(s); digits CNN, {epochs} epochs, batch 128, Adam lr 1e-2")
    reference, model = _pair("digits", torch)
    _, compiled_model = _pair("digits", torch)
    start = time.perf_counter()
    optimizer = torch.optim.Adam(reference.parameters(), lr=1e-2)
    for x, y in batches():
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(reference(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        optimizer.step()
    seconds = time.perf_counter() - start
    with torch.no_grad():
        print(f"torch eager: {held_out(lambda a: reference(torch.from_numpy(a)).numpy()):.2f}% in {seconds:.1f} s")

    start = time.perf_counter()
    optimizer = kiln.optim.Adam(model.parameters(), lr=1e-2)
    for x, y in batches():
        optimizer.zero_grad()
        kiln.nn.functional.cross_entropy(model(kiln.tensor(x)), kiln.tensor(y)).backward()
        optimizer.step()
    seconds = time.perf_counter() - start
    with kiln.no_grad():
        print(f"kiln eager: {held_out(lambda a: model(kiln.tensor(a)).numpy()):.2f}% in {seconds:.1f} s")

    all_batches = list(batches())
    start = time.perf_counter()
    optimizer = kiln.optim.Adam(compiled_model.parameters(), lr=1e-2)
    step = compile_train_step(compiled_model, kiln.nn.functional.cross_entropy, optimizer, all_batches[0],
                              num_threads=threads)
    built = time.perf_counter() - start
    for x, y in all_batches:
        step(x, y)
    seconds = time.perf_counter() - start - built
    step.copy_to(compiled_model, optimizer)
    with kiln.no_grad():
        print(f"kiln C step: {held_out(lambda a: compiled_model(kiln.tensor(a)).numpy()):.2f}% in {seconds:.1f} s "
              f"(+ {built:.1f} s to export and build)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--accuracy", action="store_true")
    args = parser.parse_args()
    if args.accuracy:
        accuracy(args.threads)
    else:
        benchmark([r for r in args.rows.split(",") if r], args.threads, args.rounds)


if __name__ == "__main__":
    main()
