"""Fixtures for the pass tests."""

from __future__ import annotations

import pytest

import kiln.passes


@pytest.fixture
def registry():
    """The pass registry; passes a test registers are removed after it."""
    before = dict(kiln.passes.PASSES)
    yield kiln.passes.PASSES
    kiln.passes.PASSES.clear()
    kiln.passes.PASSES.update(before)
