"""kiln.testing.assert_close decides and reports like torch.testing.assert_close (the oracle), case by case."""

from __future__ import annotations

import re

import numpy as np
import pytest

import kiln
from kiln.ir.errors import KilnError

torch = pytest.importorskip("torch")

NAN, INF = float("nan"), float("inf")


def _pair(kind: str, values, dtype: str):
    """The same values as (kiln argument, torch argument)."""
    if kind == "number":
        return values, values
    array = np.array(values, dtype=getattr(np, dtype) if dtype != "bfloat16" else kiln.bfloat16.numpy)
    wrapped = kiln.from_numpy(array) if kind == "kiln" else array
    return wrapped, torch.from_numpy(array.astype(np.float32)).to(torch.bfloat16) if dtype == "bfloat16" \
        else torch.from_numpy(array)


CASES = [  # (name, kind, actual, expected, actual dtype, expected dtype, keywords)
    ("float32 equal", "kiln", [1.0, 2.0, 3.0], [1.0, 2.0, 3.0], "float32", "float32", {}),
    ("float32 within default", "kiln", [1.0, 2.0], [1.0, 2.0 + 2e-6], "float32", "float32", {}),
    ("float32 one off", "kiln", [1.0, 2.0, 3.0], [1.0, 2.5, 3.0], "float32", "float32", {}),
    ("float32 atol edge", "numpy", [0.0, 1e-5], [0.0, 0.0], "float32", "float32", {}),
    ("float32 beyond atol", "numpy", [0.0, 2e-5], [0.0, 0.0], "float32", "float32", {}),
    ("float16 default", "numpy", [1.0, 1.0005], [1.0, 1.0], "float16", "float16", {}),
    ("float16 off", "numpy", [1.0, 1.01], [1.0, 1.0], "float16", "float16", {}),
    ("bfloat16 default", "kiln", [1.0, 1.0078125], [1.0, 1.0], "bfloat16", "bfloat16", {}),
    ("bfloat16 off", "kiln", [1.0, 1.25], [1.0, 1.0], "bfloat16", "bfloat16", {}),
    ("float64 tight", "numpy", [1.0], [1.0 + 1e-6], "float64", "float64", {}),
    ("int64 exact", "kiln", [1, 2, 3], [1, 4, 3], "int64", "int64", {}),
    ("bool exact", "kiln", [True, False], [True, True], "bool", "bool", {}),
    ("nan unequal", "kiln", [NAN, 1.0], [NAN, 1.0], "float32", "float32", {}),
    ("nan equal_nan", "kiln", [NAN, 1.0], [NAN, 1.0], "float32", "float32", {"equal_nan": True}),
    ("inf same", "numpy", [INF, -INF], [INF, -INF], "float32", "float32", {}),
    ("inf sign", "numpy", [INF], [-INF], "float32", "float32", {}),
    ("inf vs finite", "numpy", [INF, 1.0], [1.0, 1.0], "float32", "float32", {}),
    ("given tolerances", "kiln", [1.0, 2.0], [1.0, 2.01], "float32", "float32", {"rtol": 1e-2, "atol": 0.0}),
    ("given tolerances off", "kiln", [1.0, 2.0], [1.0, 2.1], "float32", "float32", {"rtol": 1e-2, "atol": 0.0}),
    ("dtype mismatch", "numpy", [1.0], [1.0], "float32", "float64", {}),
    ("dtype unchecked", "numpy", [1.0], [1.0 + 1e-6], "float32", "float64", {"check_dtype": False}),
    ("mixed precision loosest", "kiln", [1.0, 1.0078125], [1.0, 1.0], "bfloat16", "float32", {"check_dtype": False}),
    ("shape mismatch", "numpy", [1.0, 2.0], [[1.0, 2.0]], "float32", "float32", {}),
    ("2d index", "kiln", [[1.0, 2.0], [3.0, 4.0]], [[1.0, 2.0], [3.0, 5.0]], "float32", "float32", {}),
    ("empty", "kiln", [], [], "float32", "float32", {}),
    ("scalar float", "number", 1.0, 1.5, "", "", {}),
    ("scalar float close", "number", 1.0, 1.0 + 1e-8, "", "", {}),
    ("scalar int", "number", 1, 2, "", "", {}),
]


def _outcome(function, actual, expected, keywords) -> str | None:
    try:
        function(actual, expected, **keywords)
    except AssertionError as error:
        return str(error)
    return None


def _normalized(message: str | None) -> str | None:
    """torch names dtypes torch.float32 and shapes torch.Size([2]); kiln says kiln.float32 and [2]."""
    if message is None:
        return None
    message = re.sub(r"torch\.Size\((\[[^\]]*\])\)", r"\1", message).replace("torch.", "kiln.")
    return message


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_same_verdict_and_message_as_torch(case):
    _, kind, actual, expected, actual_dtype, expected_dtype, keywords = case
    kiln_actual, torch_actual = _pair(kind, actual, actual_dtype)
    kiln_expected, torch_expected = _pair(kind, expected, expected_dtype)
    got = _outcome(kiln.testing.assert_close, kiln_actual, kiln_expected, keywords)
    want = _outcome(torch.testing.assert_close, torch_actual, torch_expected, keywords)
    assert _normalized(got) == _normalized(want)


def test_nested_sequences_and_mappings_name_the_item():
    ones, zeros = np.ones(2, np.float32), np.zeros(2, np.float32)
    for actual, expected in [([ones, ones], [ones, zeros]), ({"a": ones}, {"a": zeros}), ([ones], [ones, zeros]),
                             ({"a": ones}, {"b": ones}), ((ones, {"x": [ones]}), (ones, {"x": [zeros]}))]:
        got = _outcome(kiln.testing.assert_close, actual, expected, {})
        as_torch = __import__("torch.utils._pytree", fromlist=["tree_map"]).tree_map
        want = _outcome(torch.testing.assert_close, as_torch(torch.from_numpy, actual),
                        as_torch(torch.from_numpy, expected), {})
        assert got is not None and _normalized(got) == _normalized(want)


def test_msg_replaces_or_maps_the_message():
    one, two = np.ones(1, np.float32), np.full(1, 2, np.float32)
    with pytest.raises(AssertionError, match="^custom$"):
        kiln.testing.assert_close(one, two, msg="custom")
    with pytest.raises(AssertionError, match="^while checking: Tensor-likes are not close!"):
        kiln.testing.assert_close(one, two, msg=lambda text: f"while checking: {text}")


def test_misuse_is_a_kiln_error():
    one = np.ones(1, np.float32)
    with pytest.raises(KilnError, match="both 'rtol' and 'atol'"):
        kiln.testing.assert_close(one, one, rtol=1e-3)
    with pytest.raises(KilnError, match="no comparison for inputs of type Tensor and ndarray"):
        kiln.testing.assert_close(kiln.from_numpy(one), one)
