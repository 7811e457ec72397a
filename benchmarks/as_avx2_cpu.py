"""Run a benchmark as on an AVX2-only CPU, every peer included: `python benchmarks/as_avx2_cpu.py SCRIPT [ARGS...]`.

`KILN_CPU_CAPABILITY=AVX2` alone moves only kiln to its AVX2 code: onnxruntime and torch keep their AVX-512, VNNI and
AMX kernels, so a ratio taken that way says nothing about an AVX2 machine (an AMD EPYC Zen 2/3). This wrapper also
hides those features from CPUID for the whole process (benchmarks/avx2_cpuid.c, an LD_PRELOAD library built here
with the C compiler), so onnxruntime's MLAS, torch's dispatch and oneDNN, and numpy choose their AVX2 kernels, and it
sets the capability variables of kiln, ATen and oneDNN as `make test`'s AVX2 pass does. The kernels then run on this
CPU's cores: the instruction set matches an AVX2 machine, the microarchitecture (cache sizes, ports, clock) does not.

It needs Linux's CPUID faulting (the cpuid_fault flag in /proc/cpuinfo). Before running SCRIPT it checks, in a child
process, that numpy sees AVX2 and no AVX-512, and it exits with a message where it cannot.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SHIM_SOURCE = Path(__file__).resolve().parent / "avx2_cpuid.c"

# What the AVX2 process must see (numpy's own CPUID reading), checked before the benchmark runs.
PROBE = ("from numpy._core._multiarray_umath import __cpu_features__ as f; "
         "assert f['AVX2'] and f['FMA3'] and not f['AVX512F'], f")

AVX2_ENV = {"KILN_CPU_CAPABILITY": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
            # cpu_name() in the benchmarks prints this beside the CPU's name
            "KILN_BENCHMARK_CPU_NOTE": "AVX-512, AVX-VNNI and AMX hidden from CPUID (benchmarks/as_avx2_cpu.py)"}


def cpu_has_cpuid_faulting() -> bool:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return any(line.startswith("flags") and "cpuid_fault" in line.split() for line in cpuinfo)
    except OSError:
        return False


def build_shim() -> Path:
    """The LD_PRELOAD library, built once per source text into a cache folder."""
    source = SHIM_SOURCE.read_bytes()
    digest = hashlib.sha256(source).hexdigest()[:16]
    root = Path(os.environ.get("KILN_CACHE_DIR") or Path.home() / ".cache" / "kiln") / "benchmarks"
    library = root / f"avx2_cpuid-{digest}.so"
    if library.exists():
        return library
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        sys.exit("as_avx2_cpu: no C compiler (cc or gcc) to build benchmarks/avx2_cpuid.c")
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as scratch:
        built = Path(scratch) / library.name
        subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", str(built), str(SHIM_SOURCE), "-ldl"], check=True)
        os.replace(built, library)  # atomic: a concurrent run sees the whole library or none
    return library


def avx2_environment() -> dict[str, str]:
    """os.environ plus the preload and capability variables; exits with the reason where this CPU can't do it."""
    if sys.platform != "linux" or not cpu_has_cpuid_faulting():
        sys.exit("as_avx2_cpu: this machine has no CPUID faulting (cpuid_fault in /proc/cpuinfo), so AVX-512 can't "
                 "be hidden from onnxruntime and torch; use KILN_CPU_CAPABILITY=AVX2 for kiln alone")
    preload = " ".join(filter(None, [str(build_shim()), os.environ.get("LD_PRELOAD")]))
    env = {**os.environ, **AVX2_ENV, "LD_PRELOAD": preload}
    probe = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True)
    if probe.returncode != 0:
        sys.exit(f"as_avx2_cpu: the process still sees AVX-512 or lacks AVX2:\n{probe.stderr.strip()}")
    return env


def main(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if argv else 2)
    env = avx2_environment()
    os.execve(sys.executable, [sys.executable, *argv], env)


if __name__ == "__main__":
    main(sys.argv[1:])
