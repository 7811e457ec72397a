"""The C backend: renders a kernel schedule to one C11 + OpenMP file and builds it into a shared library."""

from kiln.codegen import LOWERINGS
from kiln.codegen.c.build import build_library, get_cpu_capability, supported_capabilities
from kiln.codegen.c.render import ABI_VERSION, MAX_ALLOCATED_RANK, render, runtime_memory, stamp_build_id
from kiln.codegen.c.target import TARGET

LOWERINGS["c"] = set(TARGET.ops)

__all__ = ["ABI_VERSION", "MAX_ALLOCATED_RANK", "build_library", "get_cpu_capability", "render", "runtime_memory",
           "stamp_build_id", "supported_capabilities"]
