"""The C backend's pointwise rules on hand-picked edge cases: signs, zeros, NaN, ±inf and integer corners.

Each case is compiled and compared with the reference interpreter and, where torch is installed, with torch.
The registry-driven sweep over every claimed op is test_c_backend.py::test_claimed_op_matches_interpreter.
"""

from __future__ import annotations

import shutil
from typing import Any, Callable

import numpy as np
import pytest

import kiln
from tests.modules import FunctionModule
from kiln.ir.errors import UnsupportedError
from kiln.compiler import compile as compile_c

try:
    import torch
    import torch.nn.functional as TF
except ImportError:  # the interpreter comparison still runs
    torch = TF = None

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
RTOL, ATOL = 1.3e-6, 1e-5
NAN, INF = float("nan"), float("inf")
INT64_MIN, INT64_MAX = np.iinfo(np.int64).min, np.iinfo(np.int64).max


def _outputs(value: Any) -> list:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def _check(tmp_path, fn: Callable[..., Any], *inputs: np.ndarray, ops: tuple[str, ...] = (),
           torch_check: bool = True) -> None:
    """fn(F, *tensors) compiled to C matches the interpreter and torch (F: the functional namespace)."""
    program = kiln.export(FunctionModule(fn), tuple(kiln.tensor(x) for x in inputs))
    compiled = compile_c(program, output=tmp_path / "model")
    source = (tmp_path / "model" / "model.c").read_text()
    for op in ops:
        assert op in source, f"{op} was not lowered"
    got, expected = _outputs(compiled(*inputs)), _outputs(program(*inputs))
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        e = np.asarray(e.__kiln_array__() if hasattr(e, "__kiln_array__") else e)
        assert g.shape == e.shape and g.dtype == e.dtype, (g.dtype, e.dtype)
        np.testing.assert_allclose(g, e, rtol=RTOL, atol=ATOL, equal_nan=True)
    if torch is None or not torch_check:
        return
    reference = _outputs(fn(TF, *[torch.from_numpy(x.copy()) for x in inputs]))
    for g, t in zip(got, reference):
        torch.testing.assert_close(torch.from_numpy(np.ascontiguousarray(g)), t, equal_nan=True)


def _f32(*values: float) -> np.ndarray:
    return np.array(values, np.float32)


def _i64(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


# ---------------------------------------------------------------------------------------------
# div with rounding modes, remainder, fmod


def _divisions(F, x, y):
    return (x.div(y, rounding_mode="floor"), x.div(y, rounding_mode="trunc"), x.remainder(y), x.fmod(y),
            x.div(y, rounding_mode=None))


def _scalar_divisions(F, x):
    return (x.div(-3, rounding_mode="floor"), x.div(2, rounding_mode="trunc"), x.remainder(3), x.remainder(-3),
            x.fmod(-3), x.fmod(3))


def test_integer_division_signs(tmp_path):
    x = _i64(-7, 7, -7, 7, 0, -1, 6, -6, INT64_MAX, INT64_MIN + 1)
    y = _i64(2, -2, -2, 2, 5, 3, 3, -3, 7, -1)
    _check(tmp_path / "tensor", _divisions, x, y,
           ops=("aten.div.Tensor_mode", "aten.remainder.Tensor", "aten.fmod.Tensor"))
    _check(tmp_path / "scalar", _scalar_divisions, x,
           ops=("aten.div.Scalar_mode", "aten.remainder.Scalar", "aten.fmod.Scalar"))


def test_integer_division_overflow_wraps(tmp_path):
    """INT64_MIN / -1 wraps like numpy (it would trap in C); torch is not asked, it may trap."""
    _check(tmp_path, _divisions, _i64(INT64_MIN, INT64_MIN), _i64(-1, 1), torch_check=False)


def test_float_division_signs_zeros_and_specials(tmp_path):
    """Not here: fmod(3e38, 1e-3), which torch's vectorized a - trunc(a / b) * b gets wrong (NaN)."""
    x = _f32(-7, 7, -7, 7, 0, -0.0, 5.5, -5.5, NAN, INF, -INF, 1, -1, 7, 1e-30, 3e38)
    y = _f32(2, -2, 3, -3, 3, 3, 0, 0, 1, 2, 2, INF, INF, 0.7, -1e30, 7)
    _check(tmp_path / "tensor", _divisions, x, y)
    _check(tmp_path / "scalar", _scalar_divisions, x)


def test_integer_division_by_a_zero_scalar_is_refused(tmp_path):
    program = kiln.export(FunctionModule(lambda F, x: x.remainder(0)), (kiln.tensor(_i64(1, 2)),))
    with pytest.raises(UnsupportedError, match="division by zero"):
        compile_c(program, output=tmp_path / "model")


# ---------------------------------------------------------------------------------------------
# pow


def test_integer_pow(tmp_path):
    base = _i64(-2, -2, 3, 0, 1, -1, -1, 2, 5, 3, 0)
    exponent = _i64(3, 0, 2, 0, -3, -3, -4, 62, 30, 41, 5)  # 5**30 and 3**41 wrap like ATen's powi
    _check(tmp_path / "tensor", lambda F, b, e: (b ** e, b ** 2, b ** 0, b ** 1, 2 ** e), base, exponent,
           ops=("aten.pow.Tensor_Tensor", "aten.pow.Tensor_Scalar", "aten.pow.Scalar"))


def test_float_pow(tmp_path):
    """Scalar exponents ±0.5 are (r)sqrt in ATen: (-inf) ** 0.5 is NaN and (-0.0) ** -0.5 is -inf."""
    base = _f32(-2, -8, NAN, 1, 0, 0, -0.0, INF, -INF, 2, 0.5, 10)
    exponent = _f32(3, 1 / 3, 0, NAN, -1, 0, -1, -0.5, 3, 0.5, -INF, 38.5)
    _check(tmp_path, lambda F, b, e: (b ** e, b ** 2, b ** -1.5, b ** 0, 3.0 ** e, b ** 2.5, b ** 0.5, b ** -0.5),
           base, exponent)


def test_pow_of_int_by_float_promotes(tmp_path):
    _check(tmp_path, lambda F, b: (b ** 0.5, 2.5 ** b), _i64(-4, 0, 4, 9, 16777217))


# ---------------------------------------------------------------------------------------------
# ceil / floor / round / trunc, sign


def _rounding(F, x):
    return x.round(), x.ceil(), x.floor(), x.trunc(), x.sign()


def test_rounding_and_sign_on_floats(tmp_path):
    x = _f32(2.5, 3.5, -2.5, 0.5, -0.5, 1.4999999, -1.5, -0.0, 0.0, NAN, INF, -INF, 8388609, -3.7, 1e-40)
    _check(tmp_path, _rounding, x, ops=("aten.round.default", "aten.sign.default", "aten.trunc.default"))


def test_rounding_is_the_identity_on_integers(tmp_path):
    """2**53 + 1 does not survive a round trip through double: the integer forms must not take it."""
    _check(tmp_path, _rounding, _i64(2**53 + 1, -(2**53) - 1, -3, 0, 7, INT64_MIN, INT64_MAX))


# ---------------------------------------------------------------------------------------------
# clamp, hardtanh, leaky_relu, elu


def test_clamp_bounds_and_nan(tmp_path):
    x = _f32(-3, -1, 0, 0.5, 1, 3, NAN, -INF, INF)
    _check(tmp_path / "scalar", lambda F, x: (x.clamp(-1, 1), x.clamp(min=0.25), x.clamp(max=0.25),
                                              x.clamp(2, 1), x.clamp(min=NAN), x.clamp(-1, NAN)), x,
           ops=("aten.clamp.default",))
    lo = _f32(0, 0, NAN, 0, 2, 0, 0, 0, 0)
    hi = _f32(1, NAN, 1, 0.25, 1, 1, 1, 1, 1)
    _check(tmp_path / "tensor", lambda F, x, lo, hi: (x.clamp(lo, hi), x.clamp(min=lo), x.clamp(max=hi)),
           x, lo, hi, ops=("aten.clamp.Tensor",))


def test_clamp_of_integers(tmp_path):
    x = _i64(-5, -1, 0, 3, 9, INT64_MAX)
    _check(tmp_path, lambda F, x: (x.clamp(-1, 3), x.clamp(min=0.5), x.clamp(max=-2.5), F.hardtanh(x)), x)


def test_activations(tmp_path):
    x = _f32(-3, -1, -0.0, 0, 0.5, 3, NAN, -INF, INF, -100)
    _check(tmp_path, lambda F, x: (F.hardtanh(x), F.hardtanh(x, -0.5, 2.0), F.leaky_relu(x),
                                   F.leaky_relu(x, 0.2), F.elu(x), F.elu(x, alpha=0.5)), x,
           ops=("aten.hardtanh.default", "aten.leaky_relu.default", "aten.elu.default"))


# ---------------------------------------------------------------------------------------------
# isnan / isinf, logical and bitwise ops


def test_isnan_isinf(tmp_path):
    _check(tmp_path / "float", lambda F, x: (x.isnan(), x.isinf()), _f32(NAN, INF, -INF, 0, -1, 3e38),
           ops=("aten.isnan.default", "aten.isinf.default"))
    _check(tmp_path / "int", lambda F, x: (x.isnan(), x.isinf()), _i64(0, INT64_MAX, INT64_MIN))


def _logical(F, x, y):
    return x.logical_and(y), x.logical_or(y), x.logical_xor(y), x.logical_not()


def test_logical_ops_on_any_dtype(tmp_path):
    _check(tmp_path / "float", _logical, _f32(0, -0.0, NAN, 1, 0.5, 0), _f32(0, 1, 0, NAN, -2, 1e-40),
           ops=("aten.logical_and.default", "aten.logical_xor.default", "aten.logical_not.default"))
    _check(tmp_path / "int", _logical, _i64(0, 2, -1, 0), _i64(0, 0, 4, INT64_MIN))
    _check(tmp_path / "mixed", _logical, _i64(0, 2, -1, 0), np.array([True, False, True, False]))


def _bitwise(F, x, y):
    return x & y, x | y, x ^ y, ~x, x & 6, x | 1, x ^ -1


def test_bitwise_ops(tmp_path):
    _check(tmp_path / "int", _bitwise, _i64(-7, 0, 12, INT64_MIN, -1), _i64(3, -1, 10, -1, INT64_MAX),
           ops=("aten.bitwise_and.Tensor", "aten.bitwise_xor.Scalar", "aten.bitwise_not.default"))
    bools = np.array([True, True, False, False]), np.array([True, False, True, False])
    _check(tmp_path / "bool", lambda F, x, y: (x & y, x | y, x ^ y, ~x, x & True, x ^ True), *bools)


# ---------------------------------------------------------------------------------------------
# floating math: domains, promotion of integers


def _math(F, x):
    return (x.acos(), x.asin(), x.atan(), x.acosh(), x.asinh(), x.atanh(), x.cos(), x.sin(), x.tan(), x.cosh(),
            x.sinh(), x.expm1(), x.log10(), x.log1p(), x.log2(), x.reciprocal())


def test_float_math_domains(tmp_path):
    x = _f32(-2, -1, -0.5, -0.0, 0, 1e-7, 0.5, 1, 2, 10, 89.5, NAN, INF, -INF)
    _check(tmp_path, _math, x, ops=("aten.acosh.default", "aten.expm1.default", "aten.reciprocal.default"))


def test_float_math_promotes_integers(tmp_path):
    """Integers become float32 first (16777217 rounds to 16777216) and the result is float32."""
    _check(tmp_path, _math, _i64(-1, 0, 1, 2, 16777217))


def test_atan2(tmp_path):
    y = _f32(0, -0.0, 0, -0.0, 1, -1, INF, -INF, NAN, 3)
    x = _f32(0, 0, -0.0, -0.0, -INF, INF, INF, -INF, 1, -4)
    _check(tmp_path / "float", lambda F, y, x: y.atan2(x), y, x, ops=("aten.atan2.default",))
    _check(tmp_path / "int", lambda F, y, x: y.atan2(x), _i64(0, 1, -1, 5), _i64(0, -1, -1, 16777217))
