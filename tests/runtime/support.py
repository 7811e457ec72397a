"""Helpers for the C backend's tests."""

from __future__ import annotations

import pytest


def use_capability(capability: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compile at `capability` for the rest of the test, or skip it where this CPU cannot run that code."""
    from kiln.codegen.c import supported_capabilities
    if capability not in supported_capabilities():
        pytest.skip(f"this CPU does not run {capability}")
    monkeypatch.setenv("KILN_CPU_CAPABILITY", capability)
