"""Runtime for compiled artifacts: package format, loader, input validation (issue 7)."""

from kiln.runtime.package import CompiledModel, compile, load

__all__ = ["CompiledModel", "compile", "load"]
