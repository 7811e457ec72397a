"""Process-wide test set-up, before any test module imports a third-party package."""

import os

# Triton decides at its first import whether its own library functions (tl.zeros, ...) run under the interpreter;
# torchao imports it while the quantization tests are collected. The Triton backend's tests run kernels on CPU
# tensors, so the whole test process uses the interpreter (no test runs Triton on a GPU).
os.environ.setdefault("TRITON_INTERPRET", "1")

# Compiled models keep their full OpenMP team even while the other test workers keep the CPUs busy, so every C test
# runs the kernels' multi-thread work splits (tests/runtime/test_c_team_size.py turns adaptation back on).
os.environ.setdefault("KILN_ADAPTIVE_THREADS", "0")
