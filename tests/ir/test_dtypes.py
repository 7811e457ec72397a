"""Dtype promotion against torch.promote_types / torch.result_type."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from kiln.ir import dtypes
from kiln.ir.errors import DTypeError
from kiln.ir.types import TensorType
from tests.torch_oracle import requires_torch, torch, torch_dtype


@requires_torch
@pytest.mark.parametrize("a,b", list(itertools.product(dtypes.ALL_DTYPES, repeat=2)), ids=str)
def test_promote_types_matches_torch(a, b):
    assert dtypes.promote_types(a, b).name == str(torch.promote_types(torch_dtype(a), torch_dtype(b))).split(".")[1]


# Complex Python scalars are left out: kiln has complex dtypes only for FFT results, and no complex32.
SCALARS = [True, 3, 2.5]


def _kiln_operand(kind, dt):
    shape = {"dim": (2,), "zero_dim": ()}[kind]
    return TensorType.of(shape, dt)


def _torch_operand(kind, dt):
    return torch.zeros({"dim": (2,), "zero_dim": ()}[kind], dtype=torch_dtype(dt))


@requires_torch
@pytest.mark.parametrize("a", dtypes.ALL_DTYPES, ids=str)
@pytest.mark.parametrize("b_kind", ["zero_dim", "scalar"])
def test_result_type_wrapped_numbers_and_zero_dim(a, b_kind):
    """Dimensioned tensor against 0-d tensors and Python scalars of every category."""
    others = dtypes.REAL_DTYPES if b_kind == "zero_dim" else SCALARS
    for b in others:
        if b_kind == "zero_dim":
            kiln_b, torch_b = _kiln_operand("zero_dim", b), _torch_operand("zero_dim", b)
        else:
            kiln_b = torch_b = b
        expected = torch.result_type(_torch_operand("dim", a), torch_b)
        assert dtypes.result_type(_kiln_operand("dim", a), kiln_b).name == str(expected).split(".")[1], (a, b)


@requires_torch
def test_result_type_zero_dim_with_scalars():
    for a, b in itertools.product(dtypes.ALL_DTYPES, SCALARS):
        expected = torch.result_type(_torch_operand("zero_dim", a), b)
        assert dtypes.result_type(_kiln_operand("zero_dim", a), b).name == str(expected).split(".")[1], (a, b)


def test_result_type_examples_by_hand():
    int8_vector = np.zeros(3, np.int8)
    assert dtypes.result_type(int8_vector, 1000) is dtypes.int8  # wrapped ints never widen
    assert dtypes.result_type(int8_vector, 2.5) is dtypes.float32  # but raise the category
    assert dtypes.result_type(np.zeros(3, np.float16), np.zeros((), np.float64)) is dtypes.float16
    assert dtypes.result_type(np.zeros(3, np.int32), np.zeros((), np.float64)) is dtypes.float64
    assert dtypes.result_type(True, 2) is dtypes.int64


def test_dtype_lookup_and_errors():
    assert dtypes.dtype("torch.float32") is dtypes.float32
    assert dtypes.dtype("bf16") is dtypes.bfloat16
    assert dtypes.dtype(np.dtype("int16")) is dtypes.int16
    assert dtypes.dtype(6) is dtypes.float32  # c10::ScalarType code
    with pytest.raises(DTypeError, match="unknown or unsupported dtype"):
        dtypes.dtype("float8")
    with pytest.raises(DTypeError):
        dtypes.dtype(np.dtype("U3"))
