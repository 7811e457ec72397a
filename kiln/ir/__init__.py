"""kiln's IR layer: dtypes, symbolic shapes, the `aten` dialect, the op registry, programs, the interpreter."""

from kiln.ir import dtypes
from kiln.ir.errors import (
    DTypeError, GuardError, InputError, KilnError, OpArgumentError, ParseError, ShapeError, UnknownOpError,
    VerificationError,
)
from kiln.ir.program import (
    ExportedProgram, ExportGraphSignature, GraphBuilder, InputKind, InputSpec, OutputKind, OutputSpec,
)
from kiln.ir.registry import REGISTRY, OpDef, defop, lookup, ops, register_decomposition
from kiln.ir.symbolic import ShapeEnv, ValueRange, symbol
from kiln.ir.types import SymIntType, TensorType

import kiln.ir.ops  # noqa: E402,F401  (registers every op)

__all__ = [
    "dtypes", "KilnError", "DTypeError", "GuardError", "InputError", "OpArgumentError", "ParseError",
    "ShapeError", "UnknownOpError", "VerificationError", "ExportedProgram", "ExportGraphSignature",
    "GraphBuilder", "InputKind", "InputSpec", "OutputKind", "OutputSpec", "REGISTRY", "OpDef", "defop",
    "lookup", "ops", "register_decomposition", "ShapeEnv", "ValueRange", "symbol", "SymIntType", "TensorType",
]
