"""The generated C of zoo models, linked straight into the deploy runner, is clean under AddressSanitizer (with
LeakSanitizer) and UndefinedBehaviorSanitizer at several dynamic shapes, and still computes the same outputs.

`make -C examples/c_deploy sanitize PACKAGE=dir` builds main.c with -DKILN_STATIC_MODEL together with the package's
model.c under -fsanitize=address,undefined. Valgrind (memcheck), where installed, runs one extra shape per model.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import re
import shutil
import subprocess

import numpy as np
import pytest

import kiln
import kiln.models
from kiln.compiler import compile as compile_c
from tests.runtime.test_deploy import make_example, parse_outputs

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("cc") is None or shutil.which("make") is None,
                       reason="needs a C compiler and make"),
]

# dims each model runs at: two batch sizes, and two sequence lengths for the GPT
SHAPES = {
    "cnn": [{"batch": 1}, {"batch": 5}],
    "gpt": [{"batch": 1, "seq": 5}, {"batch": 3, "seq": 16}],
}
SANITIZER_ENV = {
    "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=1",
    "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
    # Two threads even on a one-core runner, so the OpenMP-parallel paths run concurrently. ASan reports nothing
    # spurious in libgomp here (no OMP_NUM_THREADS=1 needed); ThreadSanitizer would, which is why it isn't used.
    "OMP_NUM_THREADS": "2",
}
SANITIZER_ERRORS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:")


@functools.cache
def sanitizer_missing(tmp: pathlib.Path) -> str | None:
    """Why this machine can't build and run an ASan+UBSan+OpenMP program, or None if it can."""
    source = tmp / "probe.c"
    source.write_text("#include <stdlib.h>\nint main(void) { free(malloc(1)); return 0; }\n")
    build = subprocess.run(["cc", "-fsanitize=address,undefined", "-fopenmp", "-o", str(tmp / "probe"), str(source)],
                           capture_output=True, text=True)
    if build.returncode != 0:
        return f"cc cannot build with -fsanitize=address,undefined -fopenmp (libasan/libubsan missing?): " \
               f"{build.stderr.strip()[-300:]}"
    run = subprocess.run([str(tmp / "probe")], capture_output=True, text=True, env={**os.environ, **SANITIZER_ENV})
    if run.returncode != 0:
        return f"an ASan-instrumented program fails to run here: {run.stderr.strip()[-300:]}"
    return None


def strict_source(source: str) -> str:
    """model.c with the 64 bytes of slack removed from its per-run allocations (the temporaries' arena, the per-thread
    scratch), so ASan sees an overrun of even one element past their end (within the slack it would go unnoticed).
    Unchanged if there is no such slack. (Under ASan the generated code gives every temporary its own
    allocation instead of a slot in the arena, so an overrun from one temporary into the next is seen too.)"""
    return re.sub(r"(\b(?:aligned_alloc|malloc)\(.*?) \+ 64\);", r"\1);", source)


def arch_flags(package: pathlib.Path) -> str:
    """The ISA flags the package's model.so was built with (its manifest's cpu_capability), so the sanitized build
    takes the same code paths (e.g. AVX-512 FMA GEMM kernels) and its outputs can be compared bit for bit."""
    capability = json.loads((package / "manifest.json").read_text()).get("cpu_capability")
    try:
        from kiln.codegen.c.build import CAPABILITIES
    except ImportError:
        return ""
    return " ".join(CAPABILITIES[capability][1]) if capability in CAPABILITIES else ""


def inputs_for(name: str, entry, dims: dict[str, int], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    if name == "cnn":
        return {"x": rng.standard_normal((dims["batch"], 3, 16, 16)).astype(np.float32)}
    vocab = entry.model.config.vocab_size
    return {"idx": rng.integers(0, vocab, (dims["batch"], dims["seq"])).astype(np.int64)}


@pytest.fixture(scope="module", params=sorted(SHAPES))
def sanitized(request, tmp_path_factory):
    """(name, zoo entry, exported program, compiled model, package dir, sanitized binary, strict model.c)."""
    name = request.param
    tmp = tmp_path_factory.mktemp(f"sanitize_{name}")
    reason = sanitizer_missing(tmp_path_factory.getbasetemp())
    if reason:
        pytest.skip(reason)
    entry = kiln.models.get(name)
    program = kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes)
    package = tmp / "pkg"
    compiled = compile_c(program, output=package)
    binary = build_sanitized(package, tmp)
    return name, entry, program, compiled, package, binary, tmp / "model_strict.c"


def build_sanitized(package: pathlib.Path, tmp: pathlib.Path) -> pathlib.Path:
    """The deploy runner linked with the package's model.c (as strict_source makes it) under ASan + UBSan."""
    model_c = tmp / "model_strict.c"
    model_c.write_text(strict_source((package / "model.c").read_text()))
    make_example(tmp / "asan", "sanitize", f"PACKAGE={package}", f"MODEL_C={model_c}",
                 f"ARCH_FLAGS={arch_flags(package)}")
    return tmp / "asan" / "kiln_deploy_sanitize"


def run_runner(command: list[str], package: pathlib.Path, arrays: dict[str, np.ndarray], tmp: pathlib.Path,
               env: dict[str, str], options: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    args = []
    for key, array in arrays.items():
        np.save(tmp / f"{key}.npy", array)
        args.append(f"{key}={tmp / f'{key}.npy'}")
    return subprocess.run([*command, str(package), *args, *options], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


def check_outputs(stdout: str, compiled, program, arrays: dict[str, np.ndarray], exact: bool = True) -> None:
    got = parse_outputs(stdout)
    expected = compiled(*arrays.values())
    expected = expected if isinstance(expected, (tuple, list)) else (expected,)
    reference = program(*arrays.values())
    reference = reference if isinstance(reference, (tuple, list)) else (reference,)
    assert len(got) == len(expected) == len(reference)
    for value, want, ref in zip(got.values(), expected, reference):
        want = np.asarray(want)
        assert value.shape == want.shape and value.dtype == want.dtype
        if exact:  # the same C and ISA (at -O1 instead of -O3, printed with %.9g): bit-identical to model.so
            np.testing.assert_array_equal(value, want)
        else:
            np.testing.assert_allclose(value, want, rtol=1.3e-6, atol=1e-5)
        np.testing.assert_allclose(value, np.asarray(ref), rtol=1.3e-6, atol=1e-5)


def test_sanitized_runner_is_clean_and_correct(sanitized, tmp_path):
    name, entry, program, compiled, package, binary, _ = sanitized
    for seed, dims in enumerate(SHAPES[name]):
        arrays = inputs_for(name, entry, dims, seed)
        result = run_runner([str(binary)], package, arrays, tmp_path, SANITIZER_ENV)
        for marker in SANITIZER_ERRORS:
            assert marker not in result.stderr, f"{name} {dims}:\n{result.stderr[-8000:]}"
        assert result.returncode == 0, f"{name} {dims}: exit {result.returncode}\n{result.stderr[-8000:]}"
        check_outputs(result.stdout, compiled, program, arrays)


def valgrind_arch_flags(package: pathlib.Path) -> str:
    """ISA flags valgrind can run that build the package's tile layout: the package's own (AVX2, or none), or for an
    AVX-512 package none at all, since valgrind doesn't decode AVX-512 and portable C tiles match AVX-512's (12 x 32;
    model.c's #error says so if they ever part). Baseline flags alone fail an AVX2 package's 6 x 16 weights."""
    flags = arch_flags(package)
    return "" if "avx512" in flags else flags


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed (ASan is the main check)")
def test_valgrind_runner_is_clean(sanitized, tmp_path):
    """An extra check with memcheck: the runner and model.c built without sanitizers (valgrind can't run ASan
    binaries) and for an ISA valgrind decodes, so outputs match model.so to tolerance."""
    name, entry, program, compiled, package, _, model_c = sanitized
    make_example(tmp_path / "plain", "sanitize", f"PACKAGE={package}", f"MODEL_C={model_c}", "SANITIZE_FLAGS=-g -O1",
                 f"ARCH_FLAGS={valgrind_arch_flags(package)}")
    dims = SHAPES[name][-1]
    arrays = inputs_for(name, entry, dims, 7)
    command = ["valgrind", "--error-exitcode=99", "--leak-check=full", "--errors-for-leak-kinds=definite",
               "--quiet", str(tmp_path / "plain" / "kiln_deploy_sanitize")]
    result = run_runner(command, package, arrays, tmp_path, {"OMP_NUM_THREADS": "2"})
    assert result.returncode == 0, f"{name} {dims}: exit {result.returncode}\n{result.stderr[-8000:]}"
    check_outputs(result.stdout, compiled, program, arrays, exact=False)
