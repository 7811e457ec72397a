"""kiln's dtypes and ATen's type-promotion rules (`torch.promote_types`, `torch.result_type`).

A DType is a small immutable object naming one element type; `numpy` gives its numpy (or ml_dtypes)
equivalent. Promotion follows c10's lattice and the category rules that treat Python scalars as
"wrapped numbers" and 0-d tensors as lower priority than dimensioned tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import ml_dtypes
import numpy as np

from kiln.ir.errors import DTypeError


@dataclass(frozen=True, eq=False)
class DType:
    """One element type. Instances are singletons, so `is` and `==` agree."""

    name: str  # torch's name: "float32"
    short: str  # kiln's IR spelling: "f32"
    numpy: Any  # numpy dtype object
    itemsize: int
    is_floating_point: bool
    is_signed: bool
    is_complex: bool
    rank: int  # position in the promotion lattice within its category

    @property
    def is_bool(self) -> bool:
        return self.name == "bool"

    @property
    def is_integral(self) -> bool:
        """Integer types, bool excluded (like `c10::isIntegralType(t, includeBool=false)`)."""
        return not self.is_floating_point and not self.is_bool and not self.is_complex

    def __repr__(self) -> str:
        return f"kiln.{self.name}"

    def __str__(self) -> str:
        return self.name

    def __reduce__(self):  # pickling keeps the singleton
        return (dtype, (self.name,))


def _make(name: str, short: str, np_dtype: Any, floating: bool, signed: bool, rank: int,
          complex_: bool = False) -> DType:
    np_dtype = np.dtype(np_dtype)
    return DType(name, short, np_dtype, np_dtype.itemsize, floating, signed, complex_, rank)


bool_ = _make("bool", "i1", np.bool_, False, False, 0)
uint8 = _make("uint8", "ui8", np.uint8, False, False, 1)
int8 = _make("int8", "i8", np.int8, False, True, 1)
int16 = _make("int16", "i16", np.int16, False, True, 2)
int32 = _make("int32", "i32", np.int32, False, True, 3)
int64 = _make("int64", "i64", np.int64, False, True, 4)
float16 = _make("float16", "f16", np.float16, True, True, 1)
bfloat16 = _make("bfloat16", "bf16", ml_dtypes.bfloat16, True, True, 1)
float32 = _make("float32", "f32", np.float32, True, True, 2)
float64 = _make("float64", "f64", np.float64, True, True, 3)
# Complex types exist for the FFT ops' results; kiln's other ops are real-valued.
complex64 = _make("complex64", "c64", np.complex64, False, True, 2, complex_=True)
complex128 = _make("complex128", "c128", np.complex128, False, True, 3, complex_=True)

ALL_DTYPES: tuple[DType, ...] = (
    bool_, uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64, complex64, complex128,
)
REAL_DTYPES = ALL_DTYPES[:10]
FLOATING_DTYPES = tuple(d for d in ALL_DTYPES if d.is_floating_point)
INTEGRAL_DTYPES = tuple(d for d in ALL_DTYPES if d.is_integral)

_BY_NAME: dict[str, DType] = {}
for _d in ALL_DTYPES:
    _BY_NAME[_d.name] = _d
    _BY_NAME[_d.short] = _d
_BY_NAME.update({"float": float32, "double": float64, "half": float16, "long": int64, "int": int32,
                 "short": int16, "bool_": bool_})
_BY_NUMPY: dict[Any, DType] = {d.numpy: d for d in ALL_DTYPES}

# c10::ScalarType enum values, used by torch's serialized programs and `dtype=4`-style schema defaults.
SCALAR_TYPE_CODES: dict[int, DType] = {
    0: uint8, 1: int8, 2: int16, 3: int32, 4: int64, 5: float16, 6: float32, 7: float64,
    9: complex64, 10: complex128, 11: bool_, 15: bfloat16,
}
_CODE_OF = {d: c for c, d in SCALAR_TYPE_CODES.items()}


def dtype(value: Any) -> DType:
    """Look up a DType from a DType, a name ("float32", "f32"), a ScalarType code, or a numpy dtype."""
    if isinstance(value, DType):
        return value
    if isinstance(value, str):
        found = _BY_NAME.get(value.removeprefix("torch.").removeprefix("kiln."))
        if found is not None:
            return found
    elif isinstance(value, int) and not isinstance(value, bool):
        if value in SCALAR_TYPE_CODES:
            return SCALAR_TYPE_CODES[value]
    else:
        try:
            found = _BY_NUMPY.get(np.dtype(value))
        except TypeError:
            found = None
        if found is not None:
            return found
    raise DTypeError(
        f"unknown or unsupported dtype {value!r}",
        fix="use one of " + ", ".join(d.name for d in ALL_DTYPES),
    )


def scalar_type_code(dt: DType) -> int:
    """The c10::ScalarType number of a dtype."""
    return _CODE_OF[dt]


def complex_to_real(dt: DType) -> DType:
    return {complex64: float32, complex128: float64}.get(dt, dt)


def real_to_complex(dt: DType) -> DType:
    return complex128 if dt is float64 else complex64


def promote_types(a: DType, b: DType) -> DType:
    """`torch.promote_types`: the smallest dtype both a and b convert to without category loss."""
    if a is b:
        return a
    if a.is_complex or b.is_complex:
        reals = [complex_to_real(d) for d in (a, b) if d.is_complex or d.is_floating_point]
        return real_to_complex(promote_all(reals))
    if a.is_bool:
        return b
    if b.is_bool:
        return a
    if a.is_floating_point or b.is_floating_point:
        if not b.is_floating_point:
            return a
        if not a.is_floating_point:
            return b
        if a.rank == b.rank:  # float16 with bfloat16
            return float32
        return a if a.rank > b.rank else b
    # Both integral. uint8 against a signed type needs a signed type wider than 8 bits.
    if a is uint8 or b is uint8:
        other = b if a is uint8 else a
        return int16 if other is int8 else other
    return a if a.rank > b.rank else b


def default_float_dtype() -> DType:
    """The dtype of Python floats in tensor contexts (`torch.get_default_dtype()`)."""
    return float32


def scalar_dtype(value: Any) -> DType:
    """The dtype a Python scalar takes as a *wrapped number* in promotion."""
    if isinstance(value, (bool, np.bool_)):
        return bool_
    if isinstance(value, (int, np.integer)):
        return int64
    if isinstance(value, (float, np.floating)):
        return default_float_dtype()
    if isinstance(value, (complex, np.complexfloating)):
        return complex64
    if hasattr(value, "is_integer") and hasattr(value, "free_symbols"):  # a symbolic size (sympy)
        return int64 if value.is_integer is not False else default_float_dtype()
    raise DTypeError(f"cannot take the dtype of {type(value).__name__} value {value!r}",
                     fix="pass a tensor, bool, int or float")


def _combine_categories(higher: DType | None, lower: DType | None) -> DType | None:
    """c10's combine_categories: a lower-priority operand only matters if it is of a higher category."""
    if higher is None:
        return lower
    if higher.is_complex:
        return higher
    if lower is not None and lower.is_complex:
        return real_to_complex(higher) if higher.is_floating_point else lower
    if higher.is_floating_point:
        return higher
    if lower is not None and (higher.is_bool or lower.is_floating_point):
        return promote_types(higher, lower)
    return higher


def convert_scalar(value: Any, dtype: DType | None) -> Any:
    """A Python scalar converted to `dtype` as ATen converts an operand to an op's common dtype: integers wrap,
    floats round (as is without a dtype)."""
    if dtype is None:
        return value
    with np.errstate(all="ignore"):
        converted = np.asarray(value).astype(dtype.numpy)
    return bool(converted) if dtype.is_bool else float(converted) if dtype.is_floating_point else int(converted)


def result_type(*operands: Any) -> DType:
    """`torch.result_type` over tensors (anything with `.dtype` and `.shape`), Python scalars or dtypes.

    Dimensioned tensors outrank 0-d tensors, which outrank wrapped Python scalars; a lower rank only
    raises the category (bool < integral < floating), never the width within a category.
    """
    dim_result: DType | None = None
    zero_dim_result: DType | None = None
    wrapped_result: DType | None = None
    for operand in operands:
        if operand is None:
            continue
        shape = getattr(operand, "shape", None)
        if shape is not None and hasattr(operand, "dtype"):
            operand_dtype = dtype(operand.dtype)
            if len(shape) > 0:
                dim_result = operand_dtype if dim_result is None else promote_types(dim_result, operand_dtype)
            else:
                zero_dim_result = (operand_dtype if zero_dim_result is None
                                   else promote_types(zero_dim_result, operand_dtype))
        elif isinstance(operand, DType):
            dim_result = operand if dim_result is None else promote_types(dim_result, operand)
        else:
            operand_dtype = scalar_dtype(operand)
            wrapped_result = (operand_dtype if wrapped_result is None
                              else promote_types(wrapped_result, operand_dtype))
    combined = _combine_categories(dim_result, _combine_categories(zero_dim_result, wrapped_result))
    if combined is None:
        raise DTypeError("result_type needs at least one tensor or scalar operand")
    return combined


REDUCED_FLOATS = (float16, bfloat16)  # the floats ATen computes in float32 (opmath)


def opmath_dtype(dt: DType) -> DType:
    """The dtype ATen computes in for dt: reduced-precision floats compute in float32."""
    return float32 if dt in REDUCED_FLOATS else dt


def promote_all(dtypes: Iterable[DType]) -> DType:
    result: DType | None = None
    for d in dtypes:
        result = d if result is None else promote_types(result, d)
    if result is None:
        raise DTypeError("cannot promote an empty list of dtypes")
    return result


# 4-bit values are held in int8 / uint8 tensors in programs, as torch and torchao hold them (torch 2.13 has no
# kernels for torch.int4, and the .pt2 schema no 4-bit ScalarType); files store them two per byte.
INT4_RANGE, UINT4_RANGE = (-8, 7), (0, 15)


def pack_nibbles(array: np.ndarray) -> np.ndarray:
    """4-bit values (int8 or uint8 storage) two per byte, element 2m in the low nibble of byte m: the layout of
    ONNX's INT4/UINT4 tensors and of kiln's packaged int4 weights. An odd count ends with a zero nibble."""
    flat = np.asarray(array).ravel().astype(np.int8).view(np.uint8) & 0x0F
    if flat.size % 2:
        flat = np.append(flat, np.uint8(0))
    return (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8)
