"""Clamps with literal bounds in C (pointwise._clamp's kiln_max_bound / kiln_min_bound) and relu against torch eager,
bit for bit on the values where forms of max and min differ: NaN, infinities, both zeros, and values equal to a
bound. assert_close counts -0.0 equal to 0.0, so the sign of each zero is checked apart."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import kiln
from kiln.compiler import compile as compile_c
from tests.modules import LambdaModule

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
VALUES = [-0.0, 0.0, np.nan, np.inf, -np.inf, 6.0, -1.0, 7.0, 1e-45, -1e-45, 0.5]

# name -> (kiln function, torch function), the same ATen op on each side
OPS = {
    "clamp 0..6": (lambda x: kiln.clamp(x, 0.0, 6.0), lambda x: torch.clamp(x, 0.0, 6.0)),
    "clamp -0..0": (lambda x: kiln.clamp(x, -0.0, 0.0), lambda x: torch.clamp(x, -0.0, 0.0)),
    "clamp min only": (lambda x: kiln.clamp(x, min=-1.0), lambda x: torch.clamp(x, min=-1.0)),
    "clamp max only": (lambda x: kiln.clamp(x, max=-0.0), lambda x: torch.clamp(x, max=-0.0)),
    "clamp crossed bounds": (lambda x: kiln.clamp(x, 5.0, 2.0), lambda x: torch.clamp(x, 5.0, 2.0)),
    "clamp infinite bounds": (lambda x: kiln.clamp(x, -float("inf"), float("inf")),
                              lambda x: torch.clamp(x, -float("inf"), float("inf"))),
    "clamp NaN bound": (lambda x: kiln.clamp(x, float("nan"), 1.0), lambda x: torch.clamp(x, float("nan"), 1.0)),
    "relu6": (kiln.nn.functional.relu6, torch.nn.functional.relu6),
    "hardtanh": (kiln.nn.functional.hardtanh, torch.nn.functional.hardtanh),
    "relu": (kiln.relu, torch.relu),
}


def _same_bits(got: np.ndarray, expected: np.ndarray) -> bool:
    """Equal values with equal signs; any NaN matches any NaN."""
    nan = np.isnan(expected)
    return bool((np.isnan(got) == nan).all() and (got[~nan] == expected[~nan]).all()
                and (np.signbit(got[~nan]) == np.signbit(expected[~nan])).all())


@pytest.mark.parametrize("op", OPS)
def test_clamps_match_torch_bit_for_bit(op, tmp_path):
    ours, theirs = OPS[op]
    x = np.array(VALUES * 3, dtype=np.float32).reshape(3, len(VALUES))  # 33 elements: vector lanes and a remainder
    program = kiln.export(LambdaModule(ours), (kiln.tensor(x),))
    got = np.asarray(compile_c(program, output=tmp_path / "model")(x))
    expected = theirs(torch.from_numpy(x)).numpy()
    assert _same_bits(got, expected), f"{op}: got {got[0]}, torch {expected[0]}"
