"""Build generated C with the system compiler into a shared library, cached by content hash.

Code-generation flags come from the CPU capability (like `torch.backends.cpu.get_cpu_capability()`): the ISA
level detected on this machine, or forced with KILN_CPU_CAPABILITY (like ATEN_CPU_CAPABILITY) to build for an
older one. A package records its capability, and loading it on a CPU without that ISA is refused. A large model
builds as several compiler processes at once, one per part of its kernel bodies (`build_parts`), then one link.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import pathlib
import platform
import re
import shutil
import subprocess
import tempfile

from kiln.ir.cpu import cpu_flags, usable_cpus
from kiln.ir.errors import KilnError

# -fno-trapping-math and -fno-math-errno change no value (NaN and inf are kept; kiln reads neither FP exception
# flags nor errno), but without them GCC will not vectorize floorf, sqrt or selects on floats.
BASE_FLAGS = ["-std=c11", "-O3", "-fno-trapping-math", "-fno-math-errno", "-fopenmp", "-shared", "-fPIC"]

# Capability -> (the /proc/cpuinfo flags it needs, the compiler flags it builds with), weakest first.
CAPABILITIES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "DEFAULT": ((), ()),
    "AVX2": (("avx2", "fma", "f16c"), ("-mavx2", "-mfma", "-mf16c")),
    "AVX512": (("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx2", "fma", "f16c"),
               ("-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq",
                "-mprefer-vector-width=512")),
    "AVX512_VNNI": (("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx2", "fma", "f16c"),
                    ("-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq",
                     "-mavx512vnni", "-mprefer-vector-width=512")),
    # AMX's int8 tiles (Sapphire Rapids on) for the integer kernels; float code is AVX512_VNNI's
    "AVX512_AMX": (("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx2", "fma", "f16c", "amx_tile",
                    "amx_int8"),
                   ("-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq",
                    "-mavx512vnni", "-mamx-tile", "-mamx-int8", "-mprefer-vector-width=512")),
}


def supported_capabilities() -> list[str]:
    """The capabilities this CPU runs, weakest first. AMX also needs the OS to grant the tiles' state."""
    flags = cpu_flags()
    return [name for name, (needs, _) in CAPABILITIES.items()
            if all(f in flags for f in needs) and ("amx_tile" not in needs or os_grants_amx())]


@functools.cache
def os_grants_amx() -> bool:
    """Whether Linux gives this process AMX's tile state (arch_prctl ARCH_REQ_XCOMP_PERM, as compiled models ask
    when they are created): kernels before 5.16, and VMs that expose the CPU flags without the state, refuse."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA = 158, 0x1023, 18



def get_cpu_capability() -> str:
    """The ISA level generated code targets: KILN_CPU_CAPABILITY if set, else the strongest this CPU runs."""
    forced = os.environ.get("KILN_CPU_CAPABILITY")
    available = supported_capabilities()
    if forced:
        if forced not in CAPABILITIES:
            raise KilnError(f"KILN_CPU_CAPABILITY={forced!r} is not a capability kiln knows",
                            fix=f"use one of {', '.join(CAPABILITIES)}")
        if forced not in available:
            raise KilnError(f"KILN_CPU_CAPABILITY={forced} but this CPU only runs {', '.join(available)}",
                            fix="unset KILN_CPU_CAPABILITY or pick a weaker level")
        return forced
    return available[-1]


def flags_for(capability: str) -> list[str]:
    return [*BASE_FLAGS, *CAPABILITIES[capability][1]]


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def cache_dir() -> pathlib.Path:
    root = os.environ.get("KILN_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "kiln")
    path = pathlib.Path(root) / "c"
    path.mkdir(parents=True, exist_ok=True)
    return path


def build_library(source: str, capability: str | None = None) -> pathlib.Path:
    """Compile `source` (or reuse the cached build of identical source and flags); return the library path."""
    cc = compiler()
    if cc is None:
        raise KilnError("no C compiler found (looked for $CC, cc, gcc)", fix="install gcc or clang, or set CC")
    flags = flags_for(capability or get_cpu_capability())
    key = hashlib.sha256("\0".join([cc, *flags, source]).encode()).hexdigest()[:24]
    library = cache_dir() / f"kiln_{key}.so"
    if library.exists():
        return library
    with tempfile.TemporaryDirectory(dir=cache_dir()) as work:
        c_file = pathlib.Path(work) / "model.c"
        c_file.write_text(source)
        built = pathlib.Path(work) / "model.so"
        parts = build_parts(source)
        if parts == 1:
            _run_compiler([cc, *flags, str(c_file), "-o", str(built), "-lm"])
        else:  # one compiler process per part, all at once, then one link
            objects = [str(pathlib.Path(work) / f"part{part}.o") for part in range(parts)]
            processes = [subprocess.Popen([cc, *flags, f"-DKILN_PARTS={parts}", f"-DKILN_PART={part}", "-c",
                                           str(c_file), "-o", obj], stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True)
                         for part, obj in enumerate(objects)]
            results = [(proc.communicate()[1], proc.returncode) for proc in processes]
            for stderr, returncode in results:
                if returncode != 0:
                    _compiler_failed(stderr)
            _run_compiler([cc, *flags, *objects, "-o", str(built), "-lm"])
        os.replace(built, library)  # atomic: concurrent builders of the same source agree
    return library


def build_parts(source: str) -> int:
    """How many compiler processes build `source`: its build groups (render's KILN_GROUPS, 1 for small models)
    dealt over this machine's CPUs, a divisor of the groups so every part gets as many."""
    match = re.search(r"^#define KILN_GROUPS (\d+)$", source, re.MULTILINE)
    groups = int(match.group(1)) if match else 1
    parts = min(groups, usable_cpus())
    while groups % parts:
        parts -= 1
    return parts


def _run_compiler(command: list[str]) -> None:
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        _compiler_failed(proc.stderr)


def _compiler_failed(stderr: str) -> None:
    raise KilnError(f"the C compiler failed on generated code:\n{stderr[-4000:]}",
                    fix="this is a kiln bug; please report it with the program")
