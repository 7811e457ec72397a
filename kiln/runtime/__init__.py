"""Runtime for compiled artifacts: package format, loader, input validation (issue 7)."""

import kiln.codegen.c  # noqa: F401  (registers LOWERINGS["c"] for `kiln ops`)
from kiln.runtime.package import CompiledModel, compile, load

__all__ = ["CompiledModel", "compile", "load"]
