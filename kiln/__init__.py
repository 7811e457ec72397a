"""kiln: capture Python models as functional ATen programs with symbolic shapes, optimize them, and emit
.pt2, ONNX and compiled C/Triton artifacts.

The user API mirrors PyTorch: `kiln.ops.aten.add.Tensor`, `kiln.float32`, `kiln.ExportedProgram`, ...
"""

from kiln.ir import dtypes as _dtypes
from kiln.ir.dtypes import (
    DType as dtype, bfloat16, complex64, complex128, float16, float32, float64, int8, int16, int32, int64, uint8,
)
from kiln.ir.errors import KilnError
from kiln.ir.program import ExportedProgram, ExportGraphSignature, InputKind, InputSpec, OutputKind, OutputSpec
from kiln.ir.registry import ops

__version__ = "0.1.0"

bool = _dtypes.bool_  # noqa: A001  (torch spells it kiln.bool too)
float = float32  # noqa: A001
double = float64
half = float16
long = int64
int = int32  # noqa: A001
short = int16

promote_types = _dtypes.promote_types
result_type = _dtypes.result_type

__all__ = [
    "__version__", "dtype", "bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32",
    "float64", "complex64", "complex128", "KilnError", "ExportedProgram", "ExportGraphSignature", "InputKind",
    "InputSpec", "OutputKind", "OutputSpec", "ops", "promote_types", "result_type",
]
