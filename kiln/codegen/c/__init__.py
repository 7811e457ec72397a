"""The C backend: renders a kernel schedule to one C11 + OpenMP file and builds it into a shared library."""

from kiln.codegen import LOWERINGS
from kiln.codegen.c.build import build_library
from kiln.codegen.c.render import ABI_VERSION, render
from kiln.codegen.schedule import SUPPORTED_OPS

LOWERINGS["c"] = set(SUPPORTED_OPS)

__all__ = ["ABI_VERSION", "build_library", "render"]
