"""Tracing frontend: kiln.Tensor, kiln.nn, export() with symbolic shapes, the torch bridge (issue 3)."""
