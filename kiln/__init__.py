"""kiln: capture Python models as functional ATen programs with symbolic shapes, optimize them, and emit
.pt2, ONNX and compiled C/Triton artifacts.

The user API mirrors PyTorch: `kiln.ops.aten.add.Tensor`, `kiln.float32`, `kiln.ExportedProgram`, ...
"""

import importlib as _importlib
import sys as _sys

from kiln.ir import dtypes as _dtypes
from kiln.ir.dtypes import (
    DType as dtype, bfloat16, complex64, complex128, float16, float32, float64, int8, int16, int32, int64, uint8,
)
from kiln.ir.errors import KilnError
from kiln.ir.program import ExportedProgram, ExportGraphSignature, InputKind, InputSpec, OutputKind, OutputSpec
from kiln.ir.registry import ops
from kiln.ir.retrace import default_decompositions
from kiln.ir.pytree import register_dataclass
from kiln.ir.errors import ConstraintViolationError, DataDependentError
from kiln.frontend.tensor import Size, Tensor
from kiln.frontend.functions import *  # noqa: F401,F403  (kiln.zeros, kiln.cat, kiln.where, ...)
from kiln.frontend.functions import __all__ as _functions
from kiln.frontend.random import manual_seed
from kiln.frontend.dims import Dim, ShapesCollection, dims
from kiln.frontend.export import export, refine_dynamic_shapes_from_suggested_fixes
from kiln.frontend import nn
from kiln.frontend import optim
from kiln.frontend import sparse
from kiln.frontend import fft
from kiln.frontend.sparse import (
    sparse_bsc, sparse_bsc_tensor, sparse_bsr, sparse_bsr_tensor, sparse_compressed_tensor, sparse_coo,
    sparse_coo_tensor, sparse_csc, sparse_csc_tensor, sparse_csr, sparse_csr_tensor, strided,
)
from kiln.frontend import autograd
from kiln.frontend.autograd import (
    enable_grad, inference_mode, is_grad_enabled, is_inference_mode_enabled, no_grad, set_grad_enabled,
)
from kiln.frontend.control_flow import cond, map, scan, while_loop  # noqa: F401,A004  (torch names; map as torch._higher_order_ops.map)
from kiln.ir.serde import load, save
from kiln.frontend.bridge import from_torch

# `import kiln.nn as nn` / `import kiln.nn.functional as F` work like torch's: kiln.nn lives in the frontend.
_sys.modules.update({"kiln.nn": nn, "kiln.nn.functional": nn.functional, "kiln.nn.init": nn.init,
                     "kiln.autograd": autograd, "kiln.optim": optim, "kiln.optim.lr_scheduler": optim.lr_scheduler,
                     "kiln.sparse": sparse, "kiln.fft": fft})

__version__ = "0.1.0"

# Every public subpackage is an attribute of `kiln`, as torch.export and torch.onnx are of torch; these import on
# first use, so `import kiln` pays only for the IR and the frontend.
_LAZY_SUBMODULES = ("cli", "codegen", "compiler", "models", "onnx", "passes", "quantization", "runtime", "testing",
                    "training", "verification")
_LAZY_ATTRIBUTES = {"compile": ("kiln.compiler", "compile"),  # kiln.compile: build a package and load it
                    # kiln.verify: name the first op where a backend disagrees with the reference interpreter
                    "verify": ("kiln.verification", "verify"), "VerifyResult": ("kiln.verification", "VerifyResult")}


def __getattr__(name: str):  # noqa: ANN202  (PEP 562 module attribute)
    if name in _LAZY_SUBMODULES:
        return _importlib.import_module(f"kiln.{name}")
    if name in _LAZY_ATTRIBUTES:
        module, attribute = _LAZY_ATTRIBUTES[name]
        return getattr(_importlib.import_module(module), attribute)
    raise AttributeError(f"module 'kiln' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY_SUBMODULES, *_LAZY_ATTRIBUTES})


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
    "InputSpec", "OutputKind", "OutputSpec", "ops", "promote_types", "result_type", "register_dataclass",
    "ConstraintViolationError", "DataDependentError", "Size", "Tensor", "manual_seed", "Dim", "ShapesCollection",
    "dims", "export", "refine_dynamic_shapes_from_suggested_fixes", "nn", "optim", "no_grad", "inference_mode",
    "autograd", "enable_grad", "set_grad_enabled", "is_grad_enabled", "is_inference_mode_enabled",
    "default_decompositions", "cond", "save", "load", "from_torch", "sparse", "fft", "strided", "sparse_coo",
    "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc", "sparse_coo_tensor", "sparse_csr_tensor",
    "sparse_csc_tensor", "sparse_bsr_tensor", "sparse_bsc_tensor", "sparse_compressed_tensor", *_LAZY_SUBMODULES,
    *_LAZY_ATTRIBUTES, *_functions,
]
