"""benchmarks/as_avx2_cpu.py, which the AVX2 figures in the issue notes come from: a process under it sees an AVX2-only
CPU in every library's own CPUID reading (numpy's, torch's), kiln builds for AVX2 there, onnxruntime and kiln still
compute right, and a real crash still reaches Python's faulthandler."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WRAPPER = ROOT / "benchmarks" / "as_avx2_cpu.py"
_spec = importlib.util.spec_from_file_location("as_avx2_cpu", WRAPPER)  # (benchmarks/ is not a package)
as_avx2_cpu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(as_avx2_cpu)

pytestmark = pytest.mark.skipif(sys.platform != "linux" or not as_avx2_cpu.cpu_has_cpuid_faulting() or
                                not shutil.which("cc"),
                                reason="needs Linux's CPUID faulting (cpuid_fault) and a C compiler")

PROBE = textwrap.dedent("""
    import faulthandler, json
    faulthandler.enable()  # installs a SIGSEGV handler, which the preload keeps behind its own
    import numpy as np
    import onnxruntime as ort
    import torch
    from numpy._core._multiarray_umath import __cpu_features__ as features
    import kiln
    from kiln.codegen.c import get_cpu_capability

    class Product(kiln.nn.Module):
        def forward(self, x, y):
            return x @ y

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 96), np.float32), rng.standard_normal((96, 48), np.float32)
    program = kiln.export(Product(), (kiln.tensor(a), kiln.tensor(b)))
    session = ort.InferenceSession(kiln.onnx.export(program, (a, b)).model_proto.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    ort_result = session.run(None, dict(zip([value.name for value in session.get_inputs()], (a, b))))[0]
    compiled = kiln.compile(program)
    print(json.dumps({"numpy": {k: bool(features[k]) for k in ("AVX2", "FMA3", "AVX512F", "AVX512_SKX")},
                      "torch": torch.backends.cpu.get_cpu_capability(), "kiln": get_cpu_capability(),
                      "onnxruntime_error": float(np.abs(ort_result - a.astype(np.float64) @ b).max()),
                      "kiln_error": float(np.abs(compiled(a, b) - a.astype(np.float64) @ b).max())}))
""")


def _under_wrapper(tmp_path: Path, script: str) -> subprocess.CompletedProcess:
    path = tmp_path / "script.py"
    path.write_text(script)
    return subprocess.run([sys.executable, str(WRAPPER), str(path)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)


def test_a_process_under_the_wrapper_sees_an_avx2_cpu(tmp_path):
    result = _under_wrapper(tmp_path, PROBE)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["numpy"] == {"AVX2": True, "FMA3": True, "AVX512F": False, "AVX512_SKX": False}
    assert (seen["torch"], seen["kiln"]) == ("AVX2", "AVX2")
    assert seen["onnxruntime_error"] < 1e-4 and seen["kiln_error"] < 1e-4


def test_a_real_segfault_still_reaches_faulthandler(tmp_path):
    crash = "import ctypes, faulthandler\nfaulthandler.enable()\nctypes.string_at(0)\n"
    result = _under_wrapper(tmp_path, crash)
    assert result.returncode == -11, (result.returncode, result.stderr)  # SIGSEGV, after the handler ran
    assert "Segmentation fault" in result.stderr
