"""The Triton backend: renders a kernel schedule as `@triton.jit` kernels plus a launcher (one Python module).
Running the package needs torch and triton; TRITON_INTERPRET=1 runs it on CPU through Triton's interpreter."""

from kiln.codegen import LOWERINGS
from kiln.codegen.triton.target import TARGET

LOWERINGS["triton"] = set(TARGET.ops)
