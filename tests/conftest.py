"""Process-wide test set-up, before any test module imports a third-party package."""

import os

# Triton decides at its first import whether its own library functions (tl.zeros, ...) run under the interpreter;
# torchao imports it while the quantization tests are collected. The Triton backend's tests run kernels on CPU
# tensors, so the whole test process uses the interpreter (no test runs Triton on a GPU).
os.environ.setdefault("TRITON_INTERPRET", "1")
