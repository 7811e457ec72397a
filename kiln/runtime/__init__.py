"""Runtime for compiled artifacts: package loading, input validation, execution (C through ctypes, Triton through
torch). Packages are written by kiln.codegen.driver; `kiln.compile` builds and loads one."""

from kiln.runtime.package import CompiledModel, load

__all__ = ["CompiledModel", "load"]
